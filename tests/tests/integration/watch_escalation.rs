//! `profiler watch --trace-stalls N` (issue 43, item 1: sample to find,
//! trace to explain): a group's first stall is told from samples; its
//! functions are then probed, its next N stalls carry an exact call tree
//! (`"tree": "traced"`), and the probes come off. Every stall stays one
//! line throughout.
use crate::watch::{lines_of, Server};
use profiler_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// `fixtures/escalation.c`, built as the brief of its test says: -O0 -g,
/// frame pointers, its request path noinline.
fn escalation_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "escalation.c",
            "escalation",
            &["-O0", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

/// CLOCK_MONOTONIC now, ns: the clock of the fixtures' and the profiler's
/// timestamps.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts the escalation fixture with `args`.
fn start_app(args: &[&str]) -> Server {
    Server::spawn(escalation_exe(), args)
}

/// Its stalls (start, duration, ns) until `done`.
fn stalls_to_end(app: &mut Server, limit: Duration) -> Vec<(u64, u64)> {
    app.lines_to_end(limit)
        .iter()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f[0], "stall", "{line}");
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

/// The app's stalls a watcher attached at `attached_ns` (when its
/// attached line was read) must report: every one that began after it,
/// and one that began before only where a line starts within 5 ms before
/// it (the attach finished a little before its line was read). A stall
/// already running at the attach, on a loaded machine slower than the
/// app's first 4 s, began before there was anything to see it.
fn stalls_watched(all: &[(u64, u64)], attached_ns: u64, lines: &[Value]) -> Vec<(u64, u64)> {
    all.iter()
        .copied()
        .filter(|&(s, _)| {
            s >= attached_ns
                || lines.iter().any(|l| {
                    let ls = l["start_ns"].as_u64().unwrap_or(u64::MAX);
                    ls <= s && s - ls < 5_000_000
                })
        })
        .collect()
}

/// The path of first children from the root of a line's `call_tree`,
/// below its `(loop iteration)` node: (name, calls, kind).
fn first_path(line: &Value) -> Vec<(String, u64, String)> {
    let mut out = Vec::new();
    let mut node = &line["call_tree"];
    while let Some(c) = node["children"].as_array().and_then(|c| c.first()) {
        if c["name"] != "(loop iteration)" {
            out.push((
                c["name"].as_str().unwrap_or_default().to_string(),
                c["calls"].as_u64().unwrap_or(0),
                c["kind"].as_str().unwrap_or_default().to_string(),
            ));
        }
        node = c;
    }
    out
}

/// The group's escalation in `groups.json`, by the group's key.
fn escalation_of(out: &Path, key_part: &str) -> Value {
    let g = read_json(out, "groups.json");
    g["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"].as_str().unwrap_or_default().contains(key_part))
        .unwrap_or_else(|| panic!("no group with {key_part:?}: {g}"))["escalation"]
        .clone()
}

#[test]
fn a_native_group_is_sampled_then_traced_exactly_then_sampled_again() {
    require_root!();
    let before = prof_prog_ids();
    let out = TempDir::new("watch-esc");
    // 16 requests, one every ~300 ms (100 ms in
    // handle_request -> parse_body -> tokenize, then 200 ms of fast ticks),
    // the first 4 s after the start: the watcher's attach, its programs
    // verified and loaded, takes 2-3 s here.
    let mut app = start_app(&["16", "4000", "200", "100"]);
    let pid = app.pid.to_string();
    let mut w = Recording::spawn_until(
        {
            let mut cmd = Command::new(profiler_bin());
            cmd.args(["watch", "--out"]).arg(out.path()).args([
                "--pid",
                &pid,
                "--trace-stalls",
                "3",
                "--threshold",
                "50ms",
                "--max-reports-per-hour",
                "1000",
            ]);
            cmd
        },
        &format!("watching PID {pid} ("),
    );
    let attached_ns = monotonic_ns();
    let all = stalls_to_end(&mut app, Duration::from_secs(60));
    w.wait_for_line(
        &format!("stopped watching PID {pid}: it exited"),
        Duration::from_secs(10),
    );
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    let lines = lines_of(out.path(), app.pid);
    let truth = stalls_watched(&all, attached_ns, &lines);
    assert!(
        truth.len() >= 14,
        "the app's stalls mostly after the attach: {all:?}"
    );
    let summary: Vec<String> = lines
        .iter()
        .map(|l| format!("{} {:?}", l["tree"], first_path(l)))
        .collect();
    eprintln!("lines: {summary:#?}");
    // Exactly one line per stall, each starting with its stall.
    assert_eq!(lines.len(), truth.len(), "{summary:#?}\n{truth:?}");
    for (l, &(start, dur)) in lines.iter().zip(&truth) {
        let s = l["start_ns"].as_u64().unwrap();
        assert!(s <= start && start - s < 5_000_000, "{l} vs {start}");
        let d = l["duration_ns"].as_u64().unwrap();
        assert!(d >= dur, "{l} lasts less than its stall ({dur} ns)");
        assert!(l["key"].as_str().unwrap().contains("tokenize"), "{l}");
    }
    // The first is told from samples, at once.
    assert_eq!(lines[0]["tree"], "sampled", "{summary:#?}");
    // Then exactly 3 traced, one after the other, and sampled again after.
    let traced: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i]["tree"] == "traced")
        .collect();
    assert_eq!(traced.len(), 3, "{summary:#?}");
    assert_eq!(traced[2] - traced[0], 2, "consecutive: {summary:#?}");
    assert!(traced[2] + 1 < lines.len(), "stalls after: {summary:#?}");
    for l in &lines[traced[2] + 1..] {
        assert_eq!(l["tree"], "sampled", "{summary:#?}");
    }
    // The traced trees: the chain, exactly one call at each level (below
    // tokenize, samples may land in the C library's clock_gettime, the
    // vDSO's, or the kernel's where the clock source needs a syscall).
    for &i in &traced {
        let path = first_path(&lines[i]);
        let chain: Vec<(&str, u64, &str)> = path
            .iter()
            .filter(|(_, _, k)| k != "sampled")
            .map(|(n, c, k)| (n.as_str(), *c, k.as_str()))
            .collect();
        assert_eq!(
            chain,
            [
                ("handle_request", 1, "traced"),
                ("parse_body", 1, "traced"),
                ("tokenize", 1, "traced"),
            ],
            "{}",
            lines[i]
        );
    }
    // The sampled ones have samples, not calls, in tokenize.
    let sampled = first_path(&lines[0]);
    assert!(
        sampled
            .iter()
            .any(|(n, _, k)| n == "tokenize" && k == "sampled"),
        "{sampled:?}"
    );
    // Each step said on stderr, and in groups.json.
    let attached = fin
        .stderr
        .iter()
        .find(|l| l.contains("escalation: attached"))
        .unwrap_or_else(|| panic!("{:?}", fin.stderr));
    assert!(attached.contains("tokenize"), "{attached}");
    assert!(
        fin.stderr
            .iter()
            .any(|l| l.contains("escalation: detached") && l.contains("after 3 traced stalls")),
        "{:?}",
        fin.stderr
    );
    let e = escalation_of(out.path(), "tokenize");
    assert_eq!(e["state"], "done", "{e}");
    assert_eq!(e["traced_stalls"], 3, "{e}");
    assert_eq!(e["pid"], app.pid, "{e}");
    assert!(e["functions"].as_u64().unwrap() >= 3, "{e}");
    assert_eq!(e["reason"], "after 3 traced stalls", "{e}");
    let g = read_json(out.path(), "groups.json");
    assert_eq!(g["stalls"], truth.len() as u64, "{g}");
    assert_none_left_since(&before, &[]);
}

#[test]
fn trace_stalls_0_probes_nothing() {
    require_root!();
    let out = TempDir::new("watch-esc-off");
    let mut app = start_app(&["4", "4000", "200", "100"]);
    let pid = app.pid.to_string();
    let mut w = Recording::spawn_until(
        {
            let mut cmd = Command::new(profiler_bin());
            cmd.args(["watch", "--out"]).arg(out.path()).args([
                "--pid",
                &pid,
                "--trace-stalls",
                "0",
                "--threshold",
                "50ms",
            ]);
            cmd
        },
        &format!("watching PID {pid} ("),
    );
    let attached_ns = monotonic_ns();
    let all = stalls_to_end(&mut app, Duration::from_secs(30));
    w.wait_for_line(
        &format!("stopped watching PID {pid}: it exited"),
        Duration::from_secs(10),
    );
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    assert!(
        fin.stderr.iter().any(|l| l.ends_with("; no uprobes")),
        "{:?}",
        fin.stderr
    );
    assert!(
        !fin.stderr.iter().any(|l| l.contains("escalation:")),
        "{:?}",
        fin.stderr
    );
    let lines = lines_of(out.path(), app.pid);
    let truth = stalls_watched(&all, attached_ns, &lines);
    assert!(
        truth.len() >= 3,
        "the app's stalls mostly after the attach: {all:?}"
    );
    assert_eq!(lines.len(), truth.len(), "{lines:?}\n{all:?}");
    assert!(lines.iter().all(|l| l["tree"] == "sampled"));
    assert!(escalation_of(out.path(), "tokenize").is_null());
}

/// `event_loops.rs`'s asyncio app, its log lines also saying how much
/// work each stall did (`work`: `blocking_parse`'s rounds of 1,000 steps)
/// on how much of its thread's CPU time (`cpu_ns`, `time.thread_time_ns`,
/// which holds the probes' hits): the app's own truth of what the probes
/// cost it, which a stall bound by a deadline does not show in its length.
fn asyncio_app_with_work() -> String {
    let mut app = crate::event_loops::ASYNCIO_APP.to_string();
    for (from, to) in [
        (
            "    x = 0\n",
            "    x = 0\n    n = 0\n    c = time.thread_time_ns()\n",
        ),
        (
            "        for i in range(1000):",
            "        n += 1\n        for i in range(1000):",
        ),
        ("    return x", "    return n, time.thread_time_ns() - c"),
        (
            "            blocking_parse()",
            "            work, cpu = blocking_parse()",
        ),
        (
            "            time.sleep(0.22)",
            "            time.sleep(0.22)\n            work, cpu = 0, 0",
        ),
        (
            r#""end_ns": time.monotonic_ns()}"#,
            r#""end_ns": time.monotonic_ns(), "work": work, "cpu_ns": cpu}"#,
        ),
    ] {
        assert!(app.contains(from), "ASYNCIO_APP changed: no {from:?}");
        app = app.replace(from, to);
    }
    app
}

/// Debian's python3.11 running `event_loops.rs`'s asyncio app by PID: its
/// stall on the CPU in Python code is escalated, and every stall the app
/// logs is exactly one line throughout. The probes on the interpreter's
/// hot functions (`PyLong_FromLong`, `PyNumber_Remainder`, …) run over
/// `--max-overhead` in the first stall they are on for; the governor takes
/// them off, and that stall is not traced (its line says why). A stall
/// that is traced ran within the budget by the app's own measure: its
/// length within 10% (and 5 ms) of the longest untraced one of its kind,
/// and its work per CPU-ms at least half the untraced median (half, not
/// 90%: unprobed, the host alone spread it 19.6-35.7 rounds per CPU-ms in
/// one run; probed over the budget it fell to 2.7-7.3). The blocked
/// stall's group may be escalated too (a few of its samples are on the
/// CPU): its traced stalls are held to the same length. The stall on the
/// CPU is traced in most runs; in others none of the functions the
/// governor left ran in it, and its escalation must say that the budget
/// left nothing to trace.
#[test]
fn asyncio_stalls_stay_counted_exactly_and_python_stalls_are_traced_within_budget() {
    require_root!();
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        eprintln!("SKIP watch_escalation: no /usr/bin/python3.11 (Debian's python3.11)");
        return;
    }
    let dir = TempDir::new("watch-esc-py");
    let app = dir.join("app.py");
    let log = dir.join("stalls.log");
    std::fs::write(&app, asyncio_app_with_work()).expect("write app.py");
    let mut cmd = Command::new(python);
    cmd.arg(&app).arg(&log);
    let mut fx = Fixture::spawn_cmd(cmd, python);
    std::thread::sleep(Duration::from_millis(500));
    let out = TempDir::new("watch-esc-py-out");
    let pid = fx.pid.to_string();
    let w = Recording::spawn_until(
        {
            let mut cmd = Command::new(profiler_bin());
            cmd.args(["watch", "--out"]).arg(out.path()).args([
                "--pid",
                &pid,
                "--trace-stalls",
                "3",
                "--threshold",
                "100ms",
                "--max-reports-per-hour",
                "1000",
            ]);
            cmd
        },
        &format!("watching PID {pid} ("),
    );
    let watched_from = monotonic_ns();
    std::thread::sleep(Duration::from_secs(11));
    let fin = w.stop(libc::SIGTERM);
    let stopped_at = monotonic_ns();
    assert!(fin.status.success(), "{fin:?}");
    assert!(fx.alive(), "the app died while watched");
    drop(fx);
    let stalls = stall_log(&log);
    let lines = lines_of(out.path(), pid.parse().unwrap());
    let summary: Vec<String> = lines
        .iter()
        .map(|l| {
            format!(
                "{} {} {} {}",
                l["tree"], l["duration_ns"], l["key"], l["escalation"]
            )
        })
        .collect();
    eprintln!("lines: {summary:#?}");
    // Every line holds exactly one of the app's stalls, none twice.
    let mut held = vec![0u32; stalls.len()];
    let mut line_of = vec![None; stalls.len()];
    for (j, l) in lines.iter().enumerate() {
        let s = num(l, "start_ns");
        // Its wall time: its duration and the probes' time taken out.
        let e = s + num(l, "duration_ns") + l["probe_ns"].as_u64().unwrap_or(0);
        let hit = stalls_within(&stalls, s, e + 1_000_000);
        assert_eq!(hit.len(), 1, "line {l} holds one stall of {stalls:?}");
        held[hit[0]] += 1;
        line_of[hit[0]] = Some(j);
    }
    // Every stall of the app while watched is one line (its first 250 ms
    // and its last second left out: the loop's wait is learnt, the last
    // lines flushed).
    for (i, st) in stalls.iter().enumerate() {
        let (s, e) = (num(st, "start_ns"), num(st, "end_ns"));
        if s < watched_from + 250_000_000 || e + 1_000_000_000 > stopped_at {
            assert!(held[i] <= 1, "{st}");
            continue;
        }
        assert_eq!(held[i], 1, "stall {st} is one line: {summary:#?}");
    }
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["stalls"], lines.len() as u64, "{groups}");
    // The stall on the CPU in Python code is escalated: its functions are
    // probed, and it is traced, or its escalation says the budget ended it.
    assert!(
        fin.stderr
            .iter()
            .any(|l| l.contains("escalation: attached") && l.contains("py:blocking_parse")),
        "{:?}",
        fin.stderr
    );
    let e = escalation_of(out.path(), "blocking_parse");
    // (The blocked stall's group, `time_sleep`, may be escalated too, and
    // first: a few of its samples are on the CPU.)
    let traced: Vec<usize> = (0..stalls.len())
        .filter(|&i| line_of[i].is_some_and(|j| lines[j]["tree"] == "traced"))
        .collect();
    let traced_cpu = traced
        .iter()
        .filter(|&&i| stalls[i]["kind"] == "cpu")
        .count();
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        e["traced_stalls"].as_u64() == Some(traced_cpu as u64)
            && (traced_cpu > 0 || reason.contains("--max-overhead")),
        "{e} {summary:#?}"
    );
    eprintln!("python stall's escalation: {e}, {traced_cpu} traced");
    // What was probed is on each line begun with the probes on: a traced
    // one names its functions; one the governor detached in says so.
    for &i in &traced {
        let l = &lines[line_of[i].unwrap()];
        let function = match stalls[i]["kind"] == "cpu" {
            true => "blocking_parse",
            false => "time_sleep",
        };
        assert!(l["key"].as_str().unwrap().contains(function), "{l}");
        let note = l["escalation"].as_str().unwrap_or_default();
        assert!(note.starts_with("traced: "), "{l}");
    }
    for l in &lines {
        if let Some(note) = l["escalation"].as_str() {
            assert!(
                note.starts_with("traced: ") == (l["tree"] == "traced"),
                "{l}"
            );
        }
    }
    // Traced stalls against the untraced ones of their kind, by the app's
    // own clocks.
    let probed = |i: usize| line_of[i].is_some_and(|j| !lines[j]["escalation"].is_null());
    let untraced = |kind: &Value| -> Vec<usize> {
        (0..stalls.len())
            .filter(|&i| &stalls[i]["kind"] == kind && !probed(i))
            .collect()
    };
    let length = |i: usize| num(&stalls[i], "end_ns") - num(&stalls[i], "start_ns");
    let rate =
        |i: usize| num(&stalls[i], "work") as f64 / num(&stalls[i], "cpu_ns").max(1) as f64 * 1e6;
    for &i in &traced {
        let untraced = untraced(&stalls[i]["kind"]);
        assert!(untraced.len() >= 2, "{stalls:?}");
        let longest = untraced.iter().map(|&i| length(i)).max().unwrap();
        let mut rates: Vec<f64> = untraced.iter().map(|&i| rate(i)).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let (len, r) = (length(i), rate(i));
        eprintln!(
            "traced stall: {:.1} ms (untraced: at most {:.1}), {r:.2} rounds per CPU-ms (untraced median {median:.2})",
            len as f64 / 1e6,
            longest as f64 / 1e6
        );
        // A stall on the CPU that had it less than half its length waited
        // for it (the host's load: 40 ms of CPU in 430 ms, once, while a
        // build ran), which its work per CPU-ms below still judges.
        let waited = stalls[i]["kind"] == "cpu" && num(&stalls[i], "cpu_ns") * 2 < len;
        assert!(
            waited || len as f64 <= longest as f64 * 1.10 + 5e6,
            "traced stall {} ran {len} ns, untraced at most {longest}",
            stalls[i]
        );
        assert!(
            r >= median * 0.5,
            "traced stall {} did {r:.2} rounds per CPU-ms, untraced median {median:.2}: {rates:?}",
            stalls[i]
        );
    }
}
