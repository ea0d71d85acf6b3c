//! Ring buffer overflow: losses are counted exactly (reliability.md #1).
use profiler_tests::*;

const N: u64 = 200_000;

fn burst(ring: &str, n: u64) -> (Outputs, Finished) {
    let out = TempDir::new("loss");
    let mut fx = Fixture::spawn(calls_exe(), &["burst", &n.to_string()]);
    let args = ["--func", "burst_tiny", "--ring-size", ring];
    let rec = Recording::start(fx.pid, out.path(), &args);
    let truth = fx.run();
    assert_eq!(num(truth_fn(&truth, "burst_tiny"), "calls"), n);
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    let o = Outputs::load(out.path());
    assert_eq!(o.json["stop_reason"], "target exited");
    let (events, lost) = (o.get("events"), o.get("lost_events"));
    assert_eq!(
        events + lost,
        2 * n,
        "events {events} + lost {lost} = 2 x {n} calls"
    );
    let calls = o.sum("burst_tiny", "calls");
    assert!(
        calls <= n && 2 * calls <= events,
        "calls {calls}, events {events}"
    );
    (o, fin)
}

#[test]
fn tiny_ring_counts_losses_exactly() {
    require_root!();
    let (o, fin) = burst("4096", N);
    let lost = o.get("lost_events");
    assert!(
        lost > 0,
        "a 4 KiB ring cannot hold a {N}-call burst, yet nothing was lost"
    );
    let lost_s = lost.to_string();
    assert!(
        o.report.contains(&lost_s),
        "report.txt lacks lost count {lost}:\n{}",
        o.report
    );
    assert!(
        fin.stdout.contains(&lost_s),
        "stdout report lacks lost count {lost}"
    );
}

#[test]
fn ring_size_suffix_accepted_and_accounting_holds() {
    require_root!();
    burst("64K", 20_000);
}
