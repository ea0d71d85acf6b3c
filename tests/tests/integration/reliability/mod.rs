//! The rows of the failure-mode matrix (`ROWS` in xtask/src/reliability.rs)
//! that no topic module covers,
//! one test each, named `rowNN_…`, grouped as the matrix's rows are:
//! accounting (loss and pairing), target safety, lifecycle (exit, exec, PID
//! reuse, signals, ptrace), input, resources (memory and CPU limits).
//! Every test ends with the matrix's teardown check: nothing of ours left
//! loaded ([`Teardown::check`]), the target's text equal to its ELF while
//! it still runs, and its output and exit status those of an untraced run.
//! The row-to-test table is `xtask/src/reliability.rs` (`cargo xtask
//! reliability` writes RELIABILITY.md from a run).

mod accounting;
mod input;
mod lifecycle;
mod resources;
mod safety;

use profiler_tests::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::OnceLock;

/// Prints `SKIP rowNN: reason` (counted by `cargo xtask test`, shown in
/// RELIABILITY.md) and returns from the test.
macro_rules! skip_row {
    ($row:literal, $($why:tt)+) => {{
        eprintln!("SKIP row{:02}: {}", $row, format!($($why)+));
        return;
    }};
}
pub(crate) use skip_row;

/// `target/fixtures/lifecycle` (fixtures/lifecycle.c).
pub fn lifecycle_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "lifecycle.c",
            "lifecycle",
            &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
        )
    })
}

/// The matrix's teardown check, from a snapshot of the loaded programs
/// taken before the profiler started.
pub struct Teardown {
    before: BTreeSet<u64>,
}

impl Teardown {
    /// Takes the snapshot.
    pub fn begin() -> Teardown {
        Teardown {
            before: prof_prog_ids(),
        }
    }

    /// No program or link loaded since [`Teardown::begin`] is left (held
    /// by our profilers `ours`, by the target, or by nobody), and, for a
    /// target still running, its text equals its ELF file.
    pub fn check(&self, ours: &[u32], target: Option<(u32, &Path)>) {
        assert_none_left_since(&self.before, ours);
        if let Some((pid, exe)) = target {
            assert_text_unchanged(pid, exe);
        }
    }
}

/// What an untraced run of `exe args` prints and how it ends: its truth
/// lines (one per `go`, `runs` of them), then its exit status and the lines
/// printed after the second line.
pub fn untraced(exe: &Path, args: &[&str], runs: usize) -> (Vec<Value>, ExitStatus, Vec<String>) {
    let mut fx = Fixture::spawn(exe, args);
    let truths = (0..runs).map(|_| fx.run()).collect();
    let (status, rest) = fx.finish();
    (truths, status, rest)
}

/// `VmHWM` (peak resident set) and `VmRSS` of `pid`, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Asserts the loss accounting of a recording: every call of `func` the
/// fixture made (`calls`) gave an entry and an exit event, each either
/// seen or counted lost.
pub fn assert_accounting(o: &Outputs, func: &str, calls: u64) {
    let (events, lost) = (o.get("events"), o.get("lost_events"));
    assert_eq!(
        events + lost,
        2 * calls,
        "events {events} + lost {lost} = 2 x {calls} calls of {func}"
    );
    let counted = if o.functions(func).is_empty() {
        0
    } else {
        o.sum(func, "calls")
    };
    assert!(counted <= calls, "{counted} calls of {func} > {calls} made");
}
