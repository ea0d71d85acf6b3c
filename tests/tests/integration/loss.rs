//! Ring buffer overflow: losses are counted exactly (reliability.md #1).
use profiler_tests::*;

const N: u64 = 200_000;

/// Runs `burst n` under `--ring-size ring`; with `pause`, the profiler is
/// stopped (SIGSTOP) for the whole burst, so its consumer drains nothing.
fn burst(ring: &str, n: u64, pause: bool) -> (Outputs, Finished) {
    let out = TempDir::new("loss");
    let mut fx = Fixture::spawn(calls_exe(), &["burst", &n.to_string()]);
    // The governor would detach burst_tiny: this test wants every hit.
    let args = [
        "--func",
        "burst_tiny",
        "--ring-size",
        ring,
        "--max-overhead",
        "0",
    ];
    let rec = Recording::start(fx.pid, out.path(), &args);
    if pause {
        rec.signal(libc::SIGSTOP);
    }
    let truth = fx.run();
    if pause {
        rec.signal(libc::SIGCONT);
    }
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
    // A call whose exit was lost is still counted (closed by stack pointer,
    // `unwound`); a call closed by its return took two events.
    let calls = o.sum("burst_tiny", "calls");
    let unwound = o.sum("burst_tiny", "unwound");
    assert!(
        calls <= n && 2 * (calls - unwound) <= events,
        "calls {calls} ({unwound} unwound), events {events}"
    );
    (o, fin)
}

/// reliability.md #1 and #3: with the consumer paused, a 4 KiB ring (about
/// 170 events) overflows; the drops must equal the real losses exactly.
#[test]
fn tiny_ring_paused_consumer_counts_losses_exactly() {
    require_root!();
    let (o, fin) = burst("4096", N, true);
    let lost = o.get("lost_events");
    let most = 2 * N - 4096 / 16;
    assert!(
        lost >= most,
        "a paused 4 KiB ring cannot hold {N} calls: only {lost} lost"
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

/// The consumer running free on a 4 KiB ring: whatever is lost, the
/// accounting is exact.
#[test]
fn tiny_ring_running_consumer_accounting_holds() {
    require_root!();
    burst("4096", N, false);
}

#[test]
fn ring_size_suffix_accepted_and_accounting_holds() {
    require_root!();
    burst("64K", 20_000, false);
}
