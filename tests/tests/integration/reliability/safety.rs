//! Target safety (rows 12, 23): other processes sharing a probed library
//! are untouched; a signal handler's probed calls nest inside the call they
//! interrupted.
use super::lifecycle::libc_of;
use super::*;

/// Row 12: `nanosleep` in libc, probed with `--pid A`, while process B runs
/// the same program on the same libc. B's copy of libc keeps its bytes (no
/// breakpoint, so no event and no slowdown), A's does not while attached
/// (the check can fail), and only A's calls are counted, exactly.
#[test]
fn row12_library_probe_with_pid_leaves_other_processes_alone() {
    require_root!();
    let out = TempDir::new("row12");
    let mut a = Fixture::spawn(calls_exe(), &["tree"]);
    let mut b = Fixture::spawn(calls_exe(), &["tree"]);
    let lib = libc_of(a.pid);
    assert_eq!(lib, libc_of(b.pid), "one libc for both");
    let teardown = Teardown::begin();
    let rec = Recording::start(
        a.pid,
        out.path(),
        // The governor off: at 17 µs a hit on a slow host, nanosleep's
        // probes came to 10.5% of A's thread and were detached two calls
        // before its end (118 of 120 counted); this row is about B.
        &[
            "--lib",
            lib.to_str().unwrap(),
            "-f",
            "nanosleep",
            "--max-overhead",
            "0",
        ],
    );
    assert!(
        text_unchanged(a.pid, &lib).is_err(),
        "the probed process's libc carries the probes"
    );
    text_unchanged(b.pid, &lib).expect("the other process's libc is untouched");
    let truth_b = b.run();
    let truth_a = a.run();
    text_unchanged(b.pid, &lib).expect("the other process's libc is untouched");
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    teardown.check(&[], Some((a.pid, &lib)));
    assert_text_unchanged(b.pid, &lib);
    a.release();
    b.release();

    // tree_leaf sleeps once per call, through nanosleep.
    let leaf = |t: &Value| num(truth_fn(t, "tree_leaf"), "calls");
    assert_eq!(leaf(&truth_b), 120, "B ran its workload");
    let o = Outputs::load(out.path());
    assert_eq!(o.sum("nanosleep", "calls"), leaf(&truth_a), "{}", o.json);
    assert_eq!(o.get("events"), 2 * leaf(&truth_a), "A's calls only");
    for t in o.json["threads"].as_array().unwrap() {
        assert_eq!(t["tid"].as_u64(), Some(u64::from(a.pid)), "{t}");
    }
}

/// Row 23: SIGALRM every millisecond while `outer_work` (20 ms of CPU, 20
/// calls) runs; the handler calls the probed `handler_fn`. Counts are exact,
/// the handler's frames nest inside the interrupted `outer_work`, nothing is
/// orphaned or unwound, and `outer_work` keeps its duration.
#[test]
fn row23_signal_handler_calls_nest_inside_the_interrupted_call() {
    require_root!();
    let out = TempDir::new("row23");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["signal"]);
    let teardown = Teardown::begin();
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &["-f", "outer_work", "-f", "handler_fn"],
    );
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    teardown.check(&[], Some((fx.pid, &fx.exe)));
    fx.release();

    let o = Outputs::load(out.path());
    let handled = num(&truth, "handler_fn");
    assert!(handled > 0, "the timer fired");
    assert_eq!(o.sum("outer_work", "calls"), 20);
    assert_eq!(o.sum("handler_fn", "calls"), handled, "{}", o.json);
    assert_eq!(o.get("orphan_exits"), 0);
    assert_eq!(o.get("unwound_frames") + o.get("unfinished_frames"), 0);
    let nested = o
        .folded
        .lines()
        .any(|l| l.contains("outer_work;handler_fn "));
    assert!(
        nested,
        "no outer_work;handler_fn in trace.folded:\n{}",
        o.folded
    );
    assert!(
        !o.folded.contains("handler_fn;outer_work"),
        "outer_work paired under a handler:\n{}",
        o.folded
    );
    // outer_work's time (handlers included) is what it measured itself.
    let total = o.sum("outer_work", "total_ns");
    assert_close("outer_work total", total, num(&truth, "outer_ns"));
    assert!(o.sum("outer_work", "self_ns") <= total);
}
