//! `cargo xtask fuzz` target: see `profiler::fuzzing::unwind_table`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzzing::unwind_table(data));
