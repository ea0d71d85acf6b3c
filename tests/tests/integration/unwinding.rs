//! Exceptions, panics and longjmp through probed frames (reliability.md #6,
//! issue 11 item 1): the target behaves as it does untraced, every call is
//! counted, frames left without a return are marked unwound, and self time
//! never exceeds total time.
//!
//! The overhead governor is off (`--max-overhead 0`) in the recordings that
//! count every call: a throw's frames cost two single-stepped return-site
//! hits, and on a slow host the governor detached `middle` halfway, as its
//! rule says (`governor.rs` tests it).
use profiler_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn cpp_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_with("g++", &["-O1", "-g"], "unwind.cpp", "unwind_cpp"))
}

fn rust_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        build_with(
            &rustc,
            &["-O", "-C", "debuginfo=1", "--crate-name", "unwind_rs"],
            "unwind_rs.rs",
            "unwind_rs",
        )
    })
}

fn longjmp_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c("longjmp.c", "longjmp", &["-O1", "-g"]))
}

/// Calls of `name` in the fixture's truth.
fn truth_calls(truth: &Value, name: &str) -> u64 {
    num(truth_fn(truth, name), "calls")
}

/// No function's self time exceeds its total time, and calls closed
/// without a return are fewer than calls.
fn assert_self_within_total(o: &Outputs) {
    for f in o.json["functions"].as_array().expect("functions") {
        let (total, self_ns) = (num(f, "total_ns"), num(f, "self_ns"));
        assert!(
            self_ns <= total,
            "{}: self {self_ns} ns > total {total} ns",
            f["name"]
        );
        assert!(num(f, "unwound") <= num(f, "calls"), "{f}");
    }
}

/// Attaches to the fixture `exe` by PID with `args`, runs its workload and
/// checks it behaved as untraced; returns its truth and the outputs.
fn traced_by_pid(exe: &Path, args: &[&str]) -> (Value, Outputs) {
    let (truth, o) = record_fixture(exe, &[], args);
    assert_eq!(num(&truth, "caught"), 500, "the target caught every throw");
    (truth, o)
}

/// The counts of a caught-exception workload: `outer` exactly, and the
/// two frames the exception went through counted in full with 500 unwound.
fn assert_exception_counts(o: &Outputs, [outer, middle, thrower]: [&str; 3]) {
    assert_eq!(o.sum(outer, "calls"), 1000, "{}", o.json);
    assert_eq!(o.sum(outer, "unwound"), 0);
    for f in [middle, thrower] {
        assert_eq!(o.sum(f, "calls"), 1000, "{f}: {}", o.json);
        assert_eq!(o.sum(f, "unwound"), 500, "{f}: {}", o.json);
        assert_eq!(o.sum(f, "unfinished"), 0, "{f}");
    }
    assert_eq!(o.get("orphan_exits"), 0);
    assert_eq!(o.get("unwound_frames"), 1000);
    assert!(o.report.contains("unwound"), "{}", o.report);
    assert_self_within_total(o);
}

/// With `--raw-durations`: the totals are compared with the fixture's own
/// clock, which runs with the probes.
const CPP_FUNCS: [&str; 9] = [
    "-f",
    "thrower*",
    "-f",
    "middle*",
    "-f",
    "outer*",
    "--raw-durations",
    "--max-overhead",
    "0",
];
/// Their demangled names.
const CPP_NAMES: [&str; 3] = ["outer(int)", "middle(int)", "thrower(int)"];

#[test]
fn cpp_exception_through_probed_frames_by_pid() {
    require_root!();
    let (truth, o) = traced_by_pid(cpp_exe(), &CPP_FUNCS);
    assert_eq!(truth_calls(&truth, "outer"), 1000);
    assert_exception_counts(&o, CPP_NAMES);
    for f in o.json["functions"].as_array().unwrap() {
        assert_eq!(f["exit_probe"], "ret", "{f}");
    }
    assert_close_probed(
        "outer total",
        o.sum("outer(int)", "total_ns"),
        num(truth_fn(&truth, "outer"), "total_ns"),
        1000,
        o.own_probes_ns(),
    );
}

/// Launches `exe launch` under the profiler with `funcs`: the command must
/// print `caught 500` and exit 0, as it does untraced.
fn launched(exe: &Path, funcs: &[&str]) -> Outputs {
    let out = TempDir::new("unwind-launch");
    let mut args = vec!["record", "--out", out.path().to_str().unwrap()];
    args.extend_from_slice(funcs);
    args.extend(["--", exe.to_str().unwrap(), "launch"]);
    let fin = profiler(&args);
    assert_eq!(
        fin.status.code(),
        Some(0),
        "target or profiler failed: {fin:?}"
    );
    assert!(fin.stdout.contains("caught 500"), "{fin:?}");
    assert_nothing_attached();
    Outputs::load(out.path())
}

#[test]
fn cpp_exception_through_probed_frames_launched() {
    require_root!();
    let o = launched(cpp_exe(), &CPP_FUNCS);
    assert_exception_counts(&o, CPP_NAMES);
}

const RUST_FUNCS: [&str; 8] = [
    "-f",
    "unwind_rs::panicker",
    "-f",
    "unwind_rs::middle",
    "-f",
    "unwind_rs::outer",
    "--max-overhead",
    "0",
];

const RUST_NAMES: [&str; 3] = [
    "unwind_rs::outer",
    "unwind_rs::middle",
    "unwind_rs::panicker",
];

#[test]
fn rust_panic_inside_catch_unwind_by_pid() {
    require_root!();
    let (truth, o) = traced_by_pid(rust_exe(), &RUST_FUNCS);
    assert_eq!(truth_calls(&truth, "panicker"), 1000);
    assert_exception_counts(&o, RUST_NAMES);
}

#[test]
fn rust_panic_inside_catch_unwind_launched() {
    require_root!();
    let o = launched(rust_exe(), &RUST_FUNCS);
    assert_exception_counts(&o, RUST_NAMES);
}

#[test]
fn longjmp_out_of_probed_frames_keeps_self_within_total() {
    require_root!();
    // As measured: compared with the fixture's own clock.
    let (truth, o) = record_fixture(
        longjmp_exe(),
        &[],
        &[
            "-f",
            "jumper",
            "-f",
            "via",
            "--raw-durations",
            "--max-overhead",
            "0",
        ],
    );
    assert_eq!(o.sum("jumper", "calls"), truth_calls(&truth, "jumper"));
    assert_eq!(o.sum("via", "calls"), truth_calls(&truth, "via"));
    assert_eq!(o.sum("via", "calls"), 800);
    assert_eq!(
        o.sum("via", "unwound"),
        800,
        "every via frame is left by longjmp"
    );
    assert_eq!(o.sum("jumper", "unwound"), 0);
    assert_self_within_total(&o);
    assert_close_probed(
        "jumper total",
        o.sum("jumper", "total_ns"),
        num(truth_fn(&truth, "jumper"), "total_ns"),
        truth_calls(&truth, "jumper"),
        o.own_probes_ns(),
    );
    // The unwound via frames fit inside jumper's time.
    assert!(o.sum("via", "total_ns") <= o.sum("jumper", "total_ns"));
}

/// What return uprobes do to the same C++ program: documented, not
/// required (the default never uses them where an unwinder walks frames).
#[test]
fn cpp_exception_with_uretprobes_is_documented() {
    require_root!();
    let out = TempDir::new("unwind-uret");
    let mut args = vec![
        "record",
        "--exit-probes",
        "uretprobe",
        "--out",
        out.path().to_str().unwrap(),
    ];
    args.extend_from_slice(&CPP_FUNCS);
    args.extend(["--", cpp_exe().to_str().unwrap(), "launch"]);
    let fin = profiler(&args);
    eprintln!(
        "with --exit-probes uretprobe the C++ fixture exits with {:?} (134 = std::terminate); \
         stdout {:?}",
        fin.status.code(),
        fin.stdout.lines().find(|l| l.starts_with("caught"))
    );
    assert_nothing_attached();
}

/// A plain C program that cancels threads (glibc unwinds a cancelled
/// thread's frames) keeps return sites under `--exit-probes auto`, where a
/// program with nothing that unwinds gets return uprobes (issue 25): it runs
/// to its end, and each of the 20 cancelled `work` frames is entered once.
#[test]
fn a_c_program_that_cancels_threads_keeps_return_sites() {
    require_root!();
    let exe = build_c("cancel.c", "cancel", &["-O1", "-g", "-pthread"]);
    let out = TempDir::new("cancel");
    let fin = profiler(&[
        "record",
        "-f",
        "work",
        "-f",
        "wait_here",
        "--out",
        out.path().to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert_eq!(
        fin.status.code(),
        Some(0),
        "the program's own status: {fin:?}"
    );
    let report = read(out.path(), "report.txt");
    assert!(
        report.contains("0 with return uprobes") && report.contains("(auto: the target has"),
        "return sites, and why: {report}"
    );
    let o = Outputs::load(out.path());
    let entered = o.sum("work", "calls") + o.sum("work", "unfinished");
    assert_eq!(
        entered,
        20,
        "work entered once per cancelled thread: {}",
        o.names()
    );
}
