//! Loss and pairing (rows 2, 3, 4): drops counted exactly and shown, the
//! agent stopped under load, an entry the profiler never saw.
use super::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every `lost N` of the live status line in `tty` (the output of the
/// profiler run on a terminal).
fn live_lost_counts(tty: &str) -> Vec<u64> {
    tty.split("events/s  lost ")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Row 2: four threads call a probed function at full speed into a 4 KiB
/// ring. The profiler runs on a terminal (under `script`), where its live
/// status line shows the drops; the final report shows them too, and seen
/// plus dropped equals what the threads emitted.
#[test]
fn row02_many_threads_full_speed_drops_shown_live_and_in_report() {
    require_root!();
    let out = TempDir::new("row02");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["tburst", "4", "1000"]);
    let teardown = Teardown::begin();
    let line = format!(
        "{} record --pid {} --out {} -f burst_work --ring-size 4096 --duration 4s --max-overhead 0",
        profiler_bin().display(),
        fx.pid,
        out.path().display()
    );
    let mut script = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the profiler on a terminal");
    let tty = Arc::new(Mutex::new(String::new()));
    let mut pipe = script.stdout.take().unwrap();
    let sink = tty.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let deadline = Instant::now() + profiler_tests::recording::timeout();
    while !tty.lock().unwrap().contains("attached") {
        assert!(
            Instant::now() < deadline,
            "never attached: {}",
            tty.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let truth = fx.run();
    let status = loop {
        if let Some(s) = script.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "profiler did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    reader.join().unwrap();
    let tty = tty.lock().unwrap().clone();
    assert!(status.success(), "profiler on a terminal: {status}\n{tty}");
    teardown.check(&[], Some((fx.pid, &fx.exe)));
    fx.release();

    let o = Outputs::load(out.path());
    let calls = num(&truth, "burst_work");
    super::assert_accounting(&o, "burst_work", calls);
    let lost = o.get("lost_events");
    assert!(lost > 0, "4 threads at full speed overflow a 4 KiB ring");
    let live = live_lost_counts(&tty);
    assert!(
        live.iter().any(|&n| n > 0),
        "the live status line never showed a drop: {live:?}"
    );
    assert!(
        live.iter().all(|&n| n <= lost),
        "live {live:?} above final {lost}"
    );
    let lost_s = lost.to_string();
    assert!(o.report.contains(&lost_s), "report.txt lacks {lost}");
    let printed = tty.rsplit("events/s").next().unwrap_or_default();
    assert!(printed.contains(&lost_s), "printed report lacks {lost}");
    assert_eq!(
        o.json["threads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("burst-")))
            .count(),
        4,
        "the four burst threads"
    );
}

/// Row 3: the agent SIGSTOPped for 5 s while two threads keep emitting
/// events into a 64 KiB ring, then continued: it catches up without
/// hanging, counts every loss, and its peak memory stays under 256 MiB.
#[test]
fn row03_agent_stopped_5s_under_load_counts_losses() {
    require_root!();
    let out = TempDir::new("row03");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["tburst", "2", "6000"]);
    let teardown = Teardown::begin();
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &[
            "-f",
            "burst_work",
            "--ring-size",
            "64K",
            "--data-limit",
            "64M",
            // Every hit is needed to overflow the ring: no governor.
            "--max-overhead",
            "0",
        ],
    );
    let agent = rec.pid();
    fx.go();
    std::thread::sleep(Duration::from_millis(300));
    rec.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(5));
    rec.signal(libc::SIGCONT);
    let truth = fx.truth();
    std::thread::sleep(Duration::from_millis(500));
    let (hwm, rss) = memory_kib(agent);
    let t0 = Instant::now();
    let fin = rec.stop(libc::SIGINT);
    let stop = t0.elapsed();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert!(stop < Duration::from_secs(10), "stopping took {stop:?}");
    teardown.check(&[agent], Some((fx.pid, &fx.exe)));
    fx.release();

    let o = Outputs::load(out.path());
    let calls = num(&truth, "burst_work");
    super::assert_accounting(&o, "burst_work", calls);
    let lost = o.get("lost_events");
    eprintln!(
        "row03: {calls} calls, {} events seen, {lost} lost; agent peak RSS {} MiB \
         (RSS {} MiB); stopped in {stop:?}",
        o.get("events"),
        hwm / 1024,
        rss / 1024
    );
    assert!(lost > 0, "5 s stopped under load must lose events");
    assert!(o.report.contains(&lost.to_string()), "report lacks {lost}");
    assert!(hwm < 256 * 1024, "agent peak RSS {} MiB", hwm / 1024);
}

/// Row 4: the profiler attaches while `inflight_outer` is running, so its
/// entry is never seen. Its return is an orphan exit, counted and paired
/// with nothing; the 20 calls of `inflight_inner` inside it keep their
/// exact counts and durations, and no `inflight_outer` call is invented.
#[test]
fn row04_missed_entry_is_an_orphan_exit_not_a_mispairing() {
    require_root!();
    let (want, status, _) = untraced(lifecycle_exe(), &["inflight"], 2);
    assert!(status.success());
    let out = TempDir::new("row04");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["inflight"]);
    let inside = fx.run();
    assert_eq!(inside, want[0], "the fixture waits inside inflight_outer");
    let teardown = Teardown::begin();
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &["-f", "inflight_*", "--exit-probes", "ret"],
    );
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    teardown.check(&[], Some((fx.pid, &fx.exe)));
    let (status, _) = fx.finish();
    assert!(status.success(), "fixture exit {status}");
    assert_eq!(truth["inflight_inner"], want[1]["inflight_inner"]);

    let o = Outputs::load(out.path());
    assert_eq!(o.sum("inflight_inner", "calls"), 20, "{}", o.json);
    assert_close(
        "inflight_inner total",
        o.sum("inflight_inner", "total_ns"),
        num(&truth, "inner_ns"),
    );
    let outer: u64 = o
        .functions("inflight_outer")
        .iter()
        .map(|f| num(f, "calls"))
        .sum();
    assert_eq!(outer, 0, "a call whose entry was not seen is not invented");
    assert_eq!(o.get("orphan_exits"), 1, "{}", o.json);
    assert_eq!(o.get("unwound_frames"), 0);
    assert_eq!(o.get("unfinished_frames"), 0);
}

/// Row 21: two profilers record the same PID at once. Both count every
/// call exactly, with the right durations; neither loses an event.
#[test]
fn row21_two_profilers_on_one_pid_both_exact() {
    require_root!();
    let (one, two) = (TempDir::new("row21a"), TempDir::new("row21b"));
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let teardown = Teardown::begin();
    let first = Recording::start(fx.pid, one.path(), &["-f", "tree_*"]);
    let second = Recording::start(fx.pid, two.path(), &["-f", "tree_*"]);
    let truth = fx.run();
    let pids = [first.pid(), second.pid()];
    for rec in [first, second] {
        let fin = rec.stop(libc::SIGINT);
        assert!(fin.status.success(), "profiler failed: {fin:?}");
    }
    teardown.check(&pids, Some((fx.pid, &fx.exe)));
    fx.release();
    for dir in [&one, &two] {
        let o = Outputs::load(dir.path());
        o.assert_matches_truth(&truth, true);
        assert_eq!(o.get("lost_events") + o.get("orphan_exits"), 0);
        assert_eq!(o.get("events"), 2 * (20 + 40 + 120));
    }
}
