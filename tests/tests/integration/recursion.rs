//! A recursive function (depth 10, under the kernel's 64-deep uretprobe
//! limit): every call counted, outermost time not double counted.
use profiler_tests::*;

#[test]
fn recursion_counts_and_outermost_total() {
    require_root!();
    let (truth, o) = record_fixture(calls_exe(), &["recursion"], &["--func", "rec_fn"]);
    let t = truth_fn(&truth, "rec_fn");
    assert_eq!(num(t, "calls"), 200, "fixture: 20 outer calls of depth 10");
    o.assert_matches_truth(&truth, true);
    assert_eq!(o.get("unfinished_frames"), 0);
    assert_eq!(o.get("orphan_exits"), 0);
    let f = o.functions("rec_fn")[0];
    let total = num(f, "total_ns");
    // rec_fn has no other traced child: its self time over all invocations
    // adds up to the outermost inclusive time.
    let self_ns = num(f, "self_ns");
    assert!(
        self_ns.abs_diff(total) <= total / 100,
        "self {self_ns} vs total {total}"
    );
    // max is an outermost call, min an innermost one (a tenth of it or so).
    let (max, want) = (num(f, "max_ns"), num(t, "max_ns"));
    // Under emulation the probes' hits, outside the fixture's clock, may
    // hold a stalled vCPU (TCG_STALL_NS).
    let stall = match relaxed("recursion: the longest call may be a vCPU stall past the fixture's")
    {
        true => TCG_STALL_NS,
        false => 0,
    };
    // A preemption inside a probe's handling, where the fixture's clock
    // does not run, lengthens the profiler's figure alone (CI once had
    // 6.37 ms against 3.80 ms): each the fixture counted may add a slice.
    let preempted = preempted(&truth);
    let slack = stall + preempted * SCHED_SLICE_NS;
    assert!(
        max.abs_diff(want) <= (want / 10).max(100_000) + slack,
        "max {max} vs fixture {want} (preempted {preempted} times)"
    );
    assert!(
        num(f, "min_ns") < max / 5,
        "min {} vs max {max}",
        num(f, "min_ns")
    );
    let chain = format!("calls{}", ";rec_fn".repeat(10));
    assert!(
        o.folded
            .lines()
            .any(|l| l.starts_with(&format!("{chain} "))),
        "no 10-deep rec_fn chain in trace.folded:\n{}",
        o.folded
    );
    assert!(
        !o.folded.contains(&format!("{chain};rec_fn")),
        "chain deeper than 10"
    );
}
