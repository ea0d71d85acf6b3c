//! Ring buffer overflow: losses are counted exactly (reliability.md #1).
use profiler_tests::*;

const N: u64 = 200_000;

/// Runs `burst n` under `--ring-size ring`; with `pause`, the profiler is
/// stopped (SIGSTOP) for the whole burst, so its consumer drains nothing.
fn burst(ring: &str, n: u64, pause: bool) -> (Outputs, Finished) {
    burst_mode("burst", n, n, ring, pause, &[])
}

/// The fixture's threads for `burst-cpus`: one per online CPU, at most 7.
fn burst_threads() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).clamp(1, 7) as u64
}

/// [`burst`] for any burst `mode` of the calls fixture, given `arg` and
/// making `n` calls in all, with `extra` profiler arguments; checks that
/// events + lost = 2 x n.
fn burst_mode(
    mode: &str,
    arg: u64,
    n: u64,
    ring: &str,
    pause: bool,
    extra: &[&str],
) -> (Outputs, Finished) {
    let out = TempDir::new("loss");
    let mut fx = Fixture::spawn(calls_exe(), &[mode, &arg.to_string()]);
    // The governor would detach burst_tiny: this test wants every hit.
    let mut args = vec![
        "--func",
        "burst_tiny",
        "--ring-size",
        ring,
        "--max-overhead",
        "0",
    ];
    args.extend_from_slice(extra);
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
    // One 4 KiB ring per CPU; the burst may move between CPUs.
    // SAFETY: sysconf has no preconditions.
    let cpus = (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).max(1) as u64;
    let most = 2 * N - cpus * 4096 / 16;
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

/// Events a paused 4 KiB ring can hold: 32 bytes each (24-byte event and
/// the ring's 8-byte header), less the thread's name record.
const RING_4K_EVENTS: u64 = 4096 / 32;

/// Issue 12: one ring per CPU. A thread pinned to each CPU bursts while the
/// consumer is paused: each CPU's 4 KiB ring fills, and the losses of all
/// rings add up exactly (events + lost = emitted). More events arrive than
/// one ring can hold, so each CPU wrote to a ring of its own.
#[test]
fn per_cpu_rings_paused_consumer_count_losses_exactly() {
    require_root!();
    let threads = burst_threads();
    let (o, _) = burst_mode("burst-cpus", N, threads * N, "4096", true, &[]);
    let events = o.get("events");
    assert!(
        o.get("lost_events") > 0,
        "the paused rings did not overflow"
    );
    if threads > 1 {
        assert!(
            events > RING_4K_EVENTS,
            "{threads} per-CPU rings of 4 KiB kept only {events} events: one ring?"
        );
    }
    assert!(events <= threads * RING_4K_EVENTS, "{events} events");
}

/// `--rings shared`: the same burst into one shared 4 KiB ring; the losses
/// are exact and at most one ring's worth of events arrives.
#[test]
fn shared_ring_paused_consumer_counts_losses_exactly() {
    require_root!();
    let threads = burst_threads();
    let (o, _) = burst_mode(
        "burst-cpus",
        N,
        threads * N,
        "4096",
        true,
        &["--rings", "shared"],
    );
    let events = o.get("events");
    assert!(
        events <= RING_4K_EVENTS,
        "one shared 4 KiB ring kept {events} events"
    );
}

/// Per-CPU rings with the consumer running: threads on every CPU, and the
/// accounting stays exact.
#[test]
fn per_cpu_rings_running_consumer_accounting_holds() {
    require_root!();
    let threads = burst_threads();
    burst_mode("burst-cpus", N, threads * N, "64K", false, &[]);
}

/// Issue 12: a thread that moves to another CPU inside every call writes
/// its entry to one CPU's ring and its exit to another's; the agent's merge
/// puts them back in order, so every call pairs: exact count, no orphan
/// exit, no unfinished or unwound frame; each call's time holds the
/// fixture's own measurement of its body, plus at most 1 ms on average
/// (the probes' own cost, and preemption on a busy machine).
#[test]
fn calls_that_migrate_between_cpus_pair_exactly() {
    require_root!();
    const HOPS: u64 = 2_000;
    let out = TempDir::new("migrate");
    let mut fx = Fixture::spawn(calls_exe(), &["migrate", &HOPS.to_string()]);
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &["--func", "hop", "--max-overhead", "0"],
    );
    let truth = fx.run();
    let t = truth_fn(&truth, "hop");
    assert_eq!(num(t, "calls"), HOPS);
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let o = Outputs::load(out.path());
    assert_eq!(o.get("lost_events"), 0);
    assert_eq!(o.get("events"), 2 * HOPS);
    assert_eq!(o.sum("hop", "calls"), HOPS);
    for key in ["orphan_exits", "unfinished_frames"] {
        assert_eq!(o.get(key), 0, "{key}");
    }
    assert_eq!(o.sum("hop", "unwound"), 0);
    let (got, want) = (o.sum("hop", "total_ns"), num(t, "total_ns"));
    assert!(
        got >= want && (got - want) / HOPS <= 1_000_000,
        "hop total {got} ns, fixture {want} ns"
    );
}
