//! `cargo xtask fuzz` target: see `profiler::fuzzing::cfi_section`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzzing::cfi_section(data));
