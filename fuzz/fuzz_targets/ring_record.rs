//! `cargo xtask fuzz` target: see `profiler::fuzzing::ring_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzzing::ring_record(data));
