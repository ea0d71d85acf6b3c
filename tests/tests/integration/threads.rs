//! Several named threads calling probed functions at once: exact per-thread
//! counts and times, thread names, and stopping when the target exits.
use profiler_tests::*;

#[test]
fn per_thread_counts_names_and_target_exit() {
    require_root!();
    let out = TempDir::new("threads");
    let mut fx = Fixture::spawn(calls_exe(), &["threads"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "thr_*"]);
    let truth = fx.run();
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();

    let o = Outputs::load(out.path());
    assert_eq!(o.json["stop_reason"], "target exited");
    assert_eq!(o.get("lost_events"), 0);
    assert_eq!(o.get("orphan_exits"), 0);
    assert_eq!(o.get("unfinished_frames"), 0);
    o.assert_matches_truth(&truth, true);

    let truth_threads = truth["threads"].as_array().unwrap();
    assert_eq!(truth_threads.len(), 4, "main + 3 workers");
    let mut events = 0;
    for t in truth_threads {
        let got = o.thread(num(t, "tid"));
        assert_eq!(got["name"], t["name"], "name of thread {}", t["tid"]);
        let calls: u64 = t["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| num(f, "calls"))
            .sum();
        assert_eq!(
            num(got, "events"),
            2 * calls,
            "events of thread {}",
            t["tid"]
        );
        events += num(got, "events");
        let chain = format!("{};thr_work;thr_inner ", t["name"].as_str().unwrap());
        assert!(
            o.folded.lines().any(|l| l.starts_with(&chain)),
            "no {chain:?} in trace.folded"
        );
    }
    assert_eq!(o.get("events"), events, "events = sum over threads");
    // thr_inner is thr_work's only child, and every call of it is traced.
    let work = o.sum("thr_work", "total_ns");
    let want = work - o.sum("thr_inner", "total_ns");
    let got = o.sum("thr_work", "self_ns");
    assert!(
        got.abs_diff(want) <= work / 100,
        "self of thr_work {got} vs {want}"
    );
}
