//! `cargo xtask fuzz` target: see `profiler::fuzzing::profile_data`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzzing::profile_data(data));
