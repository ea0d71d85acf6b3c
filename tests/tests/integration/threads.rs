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

/// Issue 44: `--thread NAME` with a name longer than the 15 characters
/// Linux keeps (`AWT-EventQueue-0`) watches the thread whose name is its
/// truncation, and says so once; each of that thread's 5 slow dispatches
/// is found, exactly. A name whose truncation no thread has is refused.
#[test]
fn a_thread_name_longer_than_linux_keeps_matches_its_truncation() {
    require_root!();
    let exe = build_c(
        "long_thread_name.c",
        "long_thread_name",
        &["-O1", "-g", "-pthread"],
    );
    let mut fx = Fixture::spawn(&exe, &[]);
    // The worker names itself as it starts.
    let named = (0..100).any(|_| {
        let found = std::fs::read_dir(format!("/proc/{}/task", fx.pid))
            .map(|d| {
                d.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "AWT-EventQueue-")
                })
            })
            .unwrap_or(false);
        if !found {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        found
    });
    assert!(named, "the worker never named itself");
    // Refused: no thread's name is the first 15 characters of this one.
    let out = TempDir::new("long-name-refused");
    let pid = fx.pid.to_string();
    let fin = profiler(&[
        "record",
        "--pid",
        &pid,
        "--thread",
        "AWT-EventQueuX-0",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert_error(&fin, "has no thread named \"AWT-EventQueuX-0\"", false);
    let out = TempDir::new("long-name");
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &[
            "--thread",
            "AWT-EventQueue-0",
            "--dispatch",
            "edt_dispatch",
            "--threshold",
            "100ms",
        ],
    );
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    fx.release();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let tid = num(&truth, "tid");
    let notes: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("Linux keeps a thread's first 15 characters"))
        .collect();
    assert_eq!(notes.len(), 1, "said once: {:?}", fin.stderr);
    assert!(
        notes[0].contains(&format!("watching thread {tid}, named \"AWT-EventQueue-\"")),
        "{}",
        notes[0]
    );
    let d = read_json(out.path(), "dispatches.json");
    assert_eq!(
        num(&d["thread"], "tid"),
        tid,
        "the worker is watched: {}",
        d["thread"]
    );
    assert_eq!(num(&d, "dispatches"), num(&truth, "dispatches"), "{d}");
    let slow = d["slow"].as_array().expect("slow dispatches");
    assert_eq!(slow.len() as u64, num(&truth, "slow"), "{slow:?}");
}
