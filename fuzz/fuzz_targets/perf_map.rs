//! `cargo xtask fuzz` target: see `profiler::fuzzing::perf_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzzing::perf_map(data));
