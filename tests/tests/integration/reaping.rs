//! Thousands of threads that exit: their state is folded by name as they
//! go (memory bounded by distinct names), and nothing is lost or mis-paired.
use profiler_tests::*;

#[test]
fn exited_threads_fold_into_one_entry_per_name() {
    require_root!();
    let exe = build_c("many_threads.c", "many_threads", &["-O1", "-g", "-pthread"]);
    let out = TempDir::new("reaping");
    let mut fx = Fixture::spawn(&exe, &["3000"]);
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &["--func", "work", "--trace-events", "0"],
    );
    let truth = fx.run();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let json = read_json(out.path(), "functions.json");
    let calls = truth["calls"].as_u64().unwrap();
    let o = Outputs::load(out.path());
    assert_eq!(o.sum("work", "calls"), calls, "every call of 3000 threads");
    assert_eq!(json["orphan_exits"].as_u64(), Some(0));
    assert_eq!(json["unfinished_frames"].as_u64(), Some(0));
    let threads = json["threads"].as_array().unwrap();
    let short: Vec<_> = threads
        .iter()
        .filter(|t| t["name"] == "short-lived")
        .collect();
    assert_eq!(
        short.len(),
        1,
        "one aggregate for the exited threads: {threads:?}"
    );
    assert_eq!(short[0]["exited_threads"].as_u64(), Some(3000));
    let folded = read(out.path(), "trace.folded");
    assert!(
        folded.lines().any(|l| l.starts_with("short-lived;work ")),
        "{folded}"
    );
}
