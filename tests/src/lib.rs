//! Root-only integration tests for `profiler`: see tests/README.md.
//!
//! The helpers here build the fixture programs, drive them through their
//! stdin/stdout handshake, run the profiler, and check the kernel's state
//! (nothing attached, target text unchanged) after it has gone.
// The integration tests' dev-dependencies; the library's own (empty) test
// target sees them too.
#[cfg(test)]
use {flate2 as _, profiler as _, roxmltree as _};

pub mod browser;
pub mod build;
pub mod cgroup;
pub mod fixture;
pub mod kernel;
pub mod outputs;
pub mod prometheus;
pub mod recording;
pub mod xvfb;

pub use build::{
    build_c, build_c_world, build_glib, build_with, calls_exe, plugin_exes, rust_fixture_exe,
    stages_exe, Mangling,
};
pub use cgroup::{cgroup2_mount, Cgroup};
pub use fixture::{Fixture, TempDir};
pub use kernel::{
    assert_none_left_since, assert_nothing_attached, assert_text_unchanged, is_root, prof_prog_ids,
    text_unchanged,
};
pub use outputs::{
    assert_close, assert_close_probed, complete_share, complete_share_beside, folded, num,
    preempted, read, read_json, stall_log, stalls_within, truth_fn, truth_line, u64s, Outputs,
    SCHED_SLICE_NS,
};
pub use recording::{
    assert_error, profiler, profiler_bin, profiler_within, profiler_wrapped, record_fixture,
    replay, timeout, Finished, Recording,
};
pub use xvfb::Xvfb;

use std::path::PathBuf;

/// The workspace root (the parent of this crate's directory).
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Whether the tests run under software CPU emulation (QEMU without KVM):
/// `cargo xtask kernels` sets `PROFILER_TEST_EMULATED` there. Traps and
/// context switches then cost tens of times more, and the guest's speed
/// moves from one second to the next, so timing assertions are widened
/// ([`relaxed`]); behaviour assertions are not.
pub fn emulated() -> bool {
    std::env::var_os("PROFILER_TEST_EMULATED").is_some()
}

/// Under emulation, prints `RELAXED what` (gathered into KERNELS.md) and
/// returns true: the caller then asserts a wider bound, or none, for a
/// timing that emulation cannot meet. Outside emulation, false.
pub fn relaxed(what: &str) -> bool {
    if emulated() {
        eprintln!("RELAXED {what}");
        true
    } else {
        false
    }
}

/// How many seconds, as a fixture's argument, a fixture the test kills
/// when done runs for: `secs`, or ten times that under emulation, where
/// loading the sampler took longer than a 10- or 15-s fixture's life in
/// the 6.1 VM (it had exited before the first sample).
pub fn lifetime(secs: u32) -> String {
    match relaxed("fixtures killed at the end run ten times longer: the sampler loads in tens of seconds under emulation") {
        true => (secs * 10).to_string(),
        false => secs.to_string(),
    }
}

/// The running kernel's (major, minor) version.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut p = release.trim().split(|c: char| !c.is_ascii_digit());
    let major: u32 = p.next().and_then(|n| n.parse().ok()).expect("major");
    let minor: u32 = p.next().and_then(|n| n.parse().ok()).expect("minor");
    (major, minor)
}

/// Under software emulation QEMU's one TCG thread runs the vCPUs in turn,
/// and may leave one stalled for up to its kick period (100 ms) while the
/// other runs: the task there is on-CPU by the guest's clock all along. A
/// fixture's fast message holding such a stall, inside its own clock or
/// outside it (in a probe hit, a third of a fast dispatch's time there),
/// may pass a dispatch threshold.
pub const TCG_STALL_NS: u64 = 100_000_000;

/// The longest a fixture's "fast" message may take for the fixture to
/// have run as designed, with a dispatch threshold of `threshold_ns`: a
/// fifth of it, or half of it under emulation (a 1-ms handler there
/// takes 10 ms and more), still far from a slow one.
pub fn fast_message_bound(threshold_ns: u64) -> u64 {
    match relaxed("fast messages may take half the threshold, not a fifth") {
        true => threshold_ns / 2,
        false => threshold_ns / 5,
    }
}

/// Returns early from a test, printing why, unless running as root.
/// A skipped test says so on stderr; it never passes silently.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::is_root() {
            eprintln!(
                "SKIP {}: needs root (eBPF uprobes); run the tests with sudo",
                module_path!()
            );
            return;
        }
    };
}
