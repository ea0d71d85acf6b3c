//! A Swing app's event-dispatch thread (issue 44). `fixtures/java/
//! SwingApp.java`, run by OpenJDK under Xvfb, ticks a `javax.swing.Timer`
//! every 300 ms on `AWT-EventQueue-0`; every 3rd tick spends 300 ms in
//! `slowLayout()`, logged by its own clock. The Java main thread returns
//! once the window is up and waits in `DestroyJavaVM`, and the launcher's
//! main thread in `pthread_join`: by default the profiler watches the
//! event-dispatch thread, says so, and finds each stall as exactly one
//! slow dispatch, started by the Timer's thread (`TimerQueue`) that woke
//! the loop; `--thread AWT-EventQueue-0` (16 characters, seen as its first
//! 15) watches the same thread. Skipped with a printed reason without
//! java, javac or Xvfb.
use profiler_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Why the test cannot run here, if it cannot.
pub(super) fn missing() -> Option<String> {
    for tool in ["java", "javac"] {
        if Command::new(tool).arg("-version").output().is_err() {
            return Some(format!(
                "no {tool} (apt-get install openjdk-17-jdk-headless)"
            ));
        }
    }
    None
}

/// `SwingApp.class`, compiled into a directory of its own.
pub(super) fn compiled(dir: &Path) -> PathBuf {
    let src = workspace().join("tests/fixtures/java/SwingApp.java");
    let out = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(&src)
        .output()
        .expect("javac");
    assert!(out.status.success(), "javac: {out:?}");
    dir.to_path_buf()
}

/// Records the app by PID for 8 s with `extra`; returns stderr and
/// `dispatches.json`, with the session's CLOCK_MONOTONIC span.
pub(super) fn record(pid: u32, extra: &[&str]) -> (String, Value, u64, u64) {
    let out = TempDir::new("swing-out");
    let mut args = vec!["--duration", "8s"];
    args.extend_from_slice(extra);
    let rec = Recording::start(pid, out.path(), &args);
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    let d = read_json(out.path(), "dispatches.json");
    let start = num(&d, "session_start_ns");
    let duration = num(&read_json(out.path(), "functions.json"), "duration_ns");
    (fin.stderr.join("\n"), d, start, start + duration)
}

/// Each slow dispatch holds exactly one of the app's stalls, every stall
/// well inside the session is one, and each was started by `TimerQueue`.
pub(super) fn assert_each_stall_is_one_dispatch(d: &Value, stalls: &[Value], start: u64, end: u64) {
    // Its whole name, from the JVM (Linux keeps `AWT-EventQueue-`).
    assert_eq!(d["thread"]["name"], "AWT-EventQueue-0", "{}", d["thread"]);
    let slow = d["slow"].as_array().expect("slow array");
    let mut matched = Vec::new();
    for s in slow {
        let a = start + num(s, "start_ns");
        let inside = stalls_within(stalls, a, a + num(s, "measured_ns"));
        assert_eq!(
            inside.len(),
            1,
            "one stall of the app's log: {s} ({stalls:?})"
        );
        matched.push(inside[0]);
        // (The first iteration's wait began before the attach: its
        // wake-up is not one out of a loop wait seen.)
        if num(s, "index") > 0 {
            assert_eq!(s["source"]["comm"], "TimerQueue", "who woke the loop: {s}");
        }
    }
    let mut unique = matched.clone();
    unique.dedup();
    assert_eq!(unique, matched, "one dispatch per stall");
    let margin = 50_000_000;
    let want: Vec<usize> = (0..stalls.len())
        .filter(|&i| {
            num(&stalls[i], "start_ns") >= start + margin
                && num(&stalls[i], "end_ns") + margin <= end
        })
        .collect();
    assert!(
        want.len() >= 4,
        "a stall every 0.9-1.2 s in 8 s: {stalls:?}"
    );
    for i in &want {
        assert!(
            matched.contains(i),
            "stall {i} ({:?}) is a slow dispatch",
            stalls[*i]
        );
    }
    assert!(
        matched.len() <= want.len() + 2,
        "{} dispatches for {} stalls",
        matched.len(),
        want.len()
    );
}

#[test]
fn a_swing_apps_event_thread_is_watched_by_default_and_each_stall_is_one_dispatch() {
    require_root!();
    if let Some(why) = missing() {
        eprintln!("SKIP {}: {why}", module_path!());
        return;
    }
    let Some(x) = Xvfb::start() else {
        eprintln!("SKIP {}: Xvfb did not start", module_path!());
        return;
    };
    let dir = TempDir::new("swing");
    let classes = compiled(&dir.join("classes"));
    let log = dir.join("stalls.log");
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(&classes)
        .arg("SwingApp")
        .arg(&log)
        .env("DISPLAY", &x.display);
    let mut fx = Fixture::spawn_cmd(cmd, Path::new("java"));
    // Let the Timer run before attaching, as a user would.
    std::thread::sleep(Duration::from_millis(1000));
    let (err, d, start, end) = record(fx.pid, &[]);
    let told = err
        .lines()
        .filter(|l| {
            l.contains("is a JVM and its Java main thread is parked: watching thread")
                && l.contains("(AWT-EventQueue-)")
        })
        .count();
    assert_eq!(told, 1, "the default thread, said once: {err}");
    assert!(
        !err.contains("preset"),
        "no native loop preset on trial in a JVM: {err}"
    );
    assert_each_stall_is_one_dispatch(&d, &stall_log(&log), start, end);
    let (err, d, start, end) = record(fx.pid, &["--thread", "AWT-EventQueue-0"]);
    assert!(!err.contains("is a JVM"), "{err}");
    assert_each_stall_is_one_dispatch(&d, &stall_log(&log), start, end);
    assert!(fx.alive(), "the app died while profiled");
}
