//! A Tkinter app's loop, which waits on a futex (issue 44): with a
//! threaded Tcl, the notifier thread polls the descriptors and the main
//! thread waits on a condition variable between events.
//! `fixtures/tk_app.py`, run by Debian's python3.11 under Xvfb, updates a
//! label every 100 ms and every 3 s spends 300 ms in `blocking_parse()`
//! from an `after` callback, logging each stall by its own clock. Recorded
//! by PID with default options: each stall is exactly one slow dispatch,
//! named by the Python function, and the loop is idle between them.
//! Skipped with a printed reason without python3.11, python3-tk or Xvfb.
use profiler_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const PYTHON: &str = "/usr/bin/python3.11";

/// Why the test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !Path::new(PYTHON).exists() {
        return Some(format!("no {PYTHON}"));
    }
    let tk = Command::new(PYTHON)
        .args(["-c", "import tkinter"])
        .stderr(Stdio::null())
        .status();
    if !tk.is_ok_and(|s| s.success()) {
        return Some("python3-tk is not installed (cargo xtask setup installs it)".into());
    }
    let xvfb = Command::new("Xvfb")
        .arg("-help")
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status();
    if xvfb.is_err() {
        return Some("Xvfb is not installed (cargo xtask setup installs xvfb)".into());
    }
    None
}

#[test]
fn a_tkinter_loop_waits_on_a_futex_and_each_stall_is_one_dispatch() {
    require_root!();
    if let Some(why) = missing() {
        eprintln!("SKIP a_tkinter_loop_waits_on_a_futex_and_each_stall_is_one_dispatch: {why}");
        return;
    }
    let Some(x) = Xvfb::start() else {
        eprintln!(
            "SKIP a_tkinter_loop_waits_on_a_futex_and_each_stall_is_one_dispatch: Xvfb did not \
             start"
        );
        return;
    };
    let dir = TempDir::new("tk");
    let log = dir.join("stalls.log");
    let app = workspace().join("tests/fixtures/tk_app.py");
    let mut cmd = Command::new(PYTHON);
    cmd.arg(&app).arg(&log).env("DISPLAY", &x.display);
    let mut fx = Fixture::spawn_cmd(cmd, Path::new(PYTHON));
    // Let the loop run before attaching, as a user would.
    std::thread::sleep(Duration::from_millis(700));
    let out = TempDir::new("tk-out");
    let rec = Recording::start(fx.pid, out.path(), &["--duration", "12s"]);
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    assert!(fx.alive(), "the app died while profiled");
    drop(fx);
    let d = read_json(out.path(), "dispatches.json");
    let rule = d["rule"].as_str().unwrap_or_default();
    assert!(
        rule.contains("the loop's wait is futex"),
        "the loop's wait is the condition variable's futex: {rule}"
    );
    let session_start = num(&d, "session_start_ns");
    let duration = num(&read_json(out.path(), "functions.json"), "duration_ns");
    let session_end = session_start + duration;
    let stalls = stall_log(&log);
    let slow = d["slow"].as_array().expect("slow array");
    // Each slow dispatch holds exactly one of the app's stalls, and is
    // named by the Python function that stalled.
    let mut matched = Vec::new();
    for g in slow {
        let s = session_start + num(g, "start_ns");
        let e = s + num(g, "measured_ns");
        let inside = stalls_within(&stalls, s, e);
        assert_eq!(
            inside.len(),
            1,
            "a slow dispatch holds one stall of the app's log: {g} ({stalls:?})"
        );
        matched.push(inside[0]);
        let key = g["key"].as_str().unwrap_or_default();
        assert!(
            key.contains("py:blocking_parse ("),
            "named by the Python function: {g}"
        );
    }
    let mut unique = matched.clone();
    unique.dedup();
    assert_eq!(unique, matched, "one dispatch per stall");
    // Every stall well inside the session is one of them (one at an edge
    // may be cut by the attach or the stop).
    let margin = 50_000_000;
    let want: Vec<usize> = (0..stalls.len())
        .filter(|&i| {
            num(&stalls[i], "start_ns") >= session_start + margin
                && num(&stalls[i], "end_ns") + margin <= session_end
        })
        .collect();
    assert!(want.len() >= 3, "about 4 stalls in 12 s: {stalls:?}");
    for i in &want {
        assert!(
            matched.contains(i),
            "stall {} of the app's log is a slow dispatch: {:?} in {slow:?}",
            i,
            stalls[*i]
        );
    }
    assert!(
        matched.len() <= want.len() + 2,
        "no more slow dispatches than stalls: {} for {}",
        matched.len(),
        want.len()
    );
    // The loop idles in its wait between callbacks: a 300-ms stall every
    // 3 s and a label update every 100 ms keep it busy about 10%.
    let idle: u64 = d["event_loop"]["idle_ns_per_second"]
        .as_array()
        .expect("idle per second")
        .iter()
        .map(|v| v.as_u64().unwrap_or(0))
        .sum();
    let busy = 100.0 - idle as f64 * 100.0 / duration as f64;
    assert!(
        busy < 30.0,
        "the idle loop is reported idle: busy {busy:.1}%"
    );
    let txt = read(out.path(), "dispatches.txt");
    assert!(txt.contains("event loop: idle (in its wait)"), "{txt}");
}
