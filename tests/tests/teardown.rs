//! The target survives the profiler: SIGKILL mid-workload and recursion past
//! the kernel's uretprobe nesting limit (reliability.md #5, #11).
use profiler_tests::*;
use std::time::Duration;

#[test]
fn sigkill_during_calls_leaves_target_unharmed() {
    require_root!();
    let out = TempDir::new("sigkill");
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "tree_*"]);
    fx.go();
    std::thread::sleep(Duration::from_millis(15));
    let fin = rec.stop(libc::SIGKILL);
    assert_eq!(fin.status.code(), None, "killed by a signal");
    let truth = fx.truth();
    assert_eq!(
        num(truth_fn(&truth, "tree_leaf"), "calls"),
        120,
        "workload completed"
    );
    assert_nothing_attached();
    assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
}

#[test]
fn recursion_past_uretprobe_limit_leaves_target_unharmed() {
    require_root!();
    let out = TempDir::new("deep");
    let mut fx = Fixture::spawn(calls_exe(), &["deep"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "rec_fn"]);
    let truth = fx.run();
    assert_eq!(
        num(truth_fn(&truth, "rec_fn"), "calls"),
        500,
        "the target ran normally"
    );
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
    let o = Outputs::load(out.path());
    let calls = o.sum("rec_fn", "calls");
    assert!(calls <= 500, "{calls} calls of rec_fn");
    // The kernel drops the returns nested deeper than 64: those frames can't
    // be given durations, and the omission must be reported.
    let missing = o.get("unfinished_frames") + o.get("orphan_exits");
    assert!(
        calls < 500 && missing > 0,
        "omitted returns not reported: calls {calls}, {}",
        o.json
    );
    assert_eq!(o.get("lost_events"), 0);
}
