//! Pury-style stages in launch mode: `fixtures/stages.c` runs the "Open
//! Document" scenario 5 times with known, varying stage durations, measured
//! by the fixture itself. The profiler must derive the nesting, match the
//! fixture's per-run numbers, render Pury's layout, and end the session by
//! itself once the 5 runs are in (detaching while the command still runs).
use profiler_tests::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const RUNS: usize = 5;
/// How long the fixture sleeps after its runs before exiting (ms): the
/// window in which the profiler must already have stopped by itself.
const POST_MS: u64 = 2000;

/// [`POST_MS`], and how long the test waits for the session's end: ten
/// times longer under emulation, where the profiler's detach and outputs
/// take seconds.
fn post_ms_and_limit() -> (u64, Duration) {
    match relaxed("the command sleeps 20 s after its runs, and the session may take 600 s to end") {
        true => (POST_MS * 10, Duration::from_secs(600)),
        false => (POST_MS, Duration::from_secs(60)),
    }
}

fn stage_args(out: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = vec!["record".into(), "--out".into()];
    v.push(out.display().to_string());
    for a in [
        "--scenario",
        "Open Document",
        "--runs",
        "5",
        "--stage",
        "Open Document=open_document",
        "--stage",
        "Load=load_file",
        "--stage",
        "Parse=parse_begin..parse_end",
        "--stage",
        "Render=render_first_frame",
        "--",
    ] {
        v.push(a.into());
    }
    v.push(stages_exe().display().to_string());
    v.push(post_ms_and_limit().0.to_string());
    v
}

/// Within 2 % or 0.5 ms, whichever is larger, plus a scheduler slice for
/// each time the fixture was preempted in the runs concerned (a wait for
/// a CPU inside a probe's handling is in the profiler's figure alone).
/// Under emulation, 50% or 10 ms: a probe's first hits translate code, 7 ms
/// of a 22-ms stage in the 6.1 VM.
fn assert_near(what: &str, got: u64, want: u64, preempted: u64) {
    let mut tol = (want / 50).max(500_000) + preempted * SCHED_SLICE_NS;
    if got.abs_diff(want) > tol
        && relaxed(&format!(
            "{what}: {got} ns against the fixture's {want} ns: 50% or 10 ms allowed (a probe's \
             first hits translate code)"
        ))
    {
        tol = (want / 2).max(10_000_000);
    }
    assert!(
        got.abs_diff(want) <= tol,
        "{what}: profiler says {got} ns, fixture measured {want} ns (tolerance {tol} ns; \
         preempted {preempted} times)"
    );
}

fn stage<'a>(scenario: &'a Value, name: &str) -> &'a Value {
    scenario["stages"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no stage {name:?} in {scenario}"))
}

/// Whether process `pid` has a live child (the launched command), whichever
/// of its threads forked it.
fn has_child(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("children")).is_ok_and(|c| !c.trim().is_empty())
    })
}

#[test]
fn open_document_stages() {
    require_root!();
    let out = TempDir::new("stages");
    let args = stage_args(out.path());
    let mut cmd = std::process::Command::new(profiler_bin());
    cmd.args(&args);
    let before = prof_prog_ids();
    let started = Instant::now();
    let rec = Recording::spawn(cmd);
    let profiler_pid = rec.pid();

    // The outputs are written after the probes are detached: once
    // stages.json exists, the command (sleeping POST_MS after its runs) must
    // still be running and nothing of ours attached. (Scoped to the programs
    // this profiler loaded: other sessions may be profiling on this machine.)
    let stages_json = out.join("stages.json");
    let limit = post_ms_and_limit().1;
    while !stages_json.exists() {
        assert!(
            started.elapsed() < limit,
            "no stages.json within {limit:?}: the session did not end after {RUNS} runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let child_before = has_child(profiler_pid);
    assert_none_left_since(&before, &[profiler_pid]);
    let child_after = has_child(profiler_pid);
    if child_before && child_after {
        eprintln!("detached while the command still ran: checked");
    } else {
        // Detaching took longer than the command's post-run sleep (uprobe
        // teardown waits for RCU grace periods, slow when other sessions
        // attach thousands of probes): the check proves nothing, say so.
        eprintln!(
            "NOTE: the command had exited before the detach check (before {child_before}, \
             after {child_after}); the teardown-while-running check was not made"
        );
    }

    let fin = rec.wait();
    assert_eq!(
        fin.status.code(),
        Some(3),
        "the profiler exits with the command's status (3); stderr {:?}",
        fin.stderr
    );
    assert!(
        fin.stderr
            .iter()
            .any(|l| l.contains("every scenario has its runs")),
        "no `every scenario has its runs` on stderr: {:?}",
        fin.stderr
    );
    let functions = read_json(out.path(), "functions.json");
    assert_eq!(functions["stop_reason"], "runs complete", "stop_reason");
    let truth = truth_line(&fin.stdout);

    // stages.json: one scenario, 5 runs, derived nesting.
    let json = read_json(out.path(), "stages.json");
    let scenarios = json["scenarios"].as_array().expect("scenarios");
    assert_eq!(scenarios.len(), 1, "one scenario: {json}");
    let sc = &scenarios[0];
    assert_eq!(sc["name"], "Open Document");
    assert_eq!(sc["runs"], RUNS, "runs");
    assert_eq!(sc["overlaps"], serde_json::json!([]), "no overlaps");
    assert_eq!(sc["incomplete_run"], false);
    let root = stage(sc, "Open Document");
    assert_eq!(root["parent"], Value::Null, "root stage has no parent");
    assert_eq!(root["depth"], 0);
    for name in ["Load", "Parse", "Render"] {
        let s = stage(sc, name);
        assert_eq!(s["parent"], "Open Document", "parent of {name} (derived)");
        assert_eq!(s["depth"], 1, "depth of {name}");
        assert_eq!(s["missing_runs"], serde_json::json!([]), "{name} missing");
    }

    // Per-run durations and their summaries against the fixture's clock.
    let preempted = u64s(&truth, "preempted");
    let all_preempted: u64 = preempted.iter().sum();
    for (name, key) in [
        ("Open Document", "open_document"),
        ("Load", "load_file"),
        ("Parse", "parse"),
        ("Render", "render_first_frame"),
    ] {
        let want = u64s(&truth, key);
        let s = stage(sc, name);
        let got = u64s(s, "per_run_ns");
        assert_eq!(got.len(), RUNS, "{name} per_run_ns: {s}");
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert_near(&format!("{name} run {}", i + 1), g, w, preempted[i]);
        }
        let d = &s["duration_ns"];
        let avg = want.iter().sum::<u64>() / RUNS as u64;
        let p = all_preempted;
        assert_near(
            &format!("{name} avg"),
            num(d, "avg"),
            avg,
            p.div_ceil(RUNS as u64),
        );
        assert_near(
            &format!("{name} min"),
            num(d, "min"),
            *want.iter().min().unwrap(),
            p,
        );
        assert_near(
            &format!("{name} max"),
            num(d, "max"),
            *want.iter().max().unwrap(),
            p,
        );
    }
    // Load grows by 5 ms a run: the per-run order is the runs' order.
    let load = u64s(stage(sc, "Load"), "per_run_ns");
    if relaxed("Load's runs must grow where the fixture's clock says they grew by 3 ms or more, not each by 3 ms: a stalled vCPU stretches the fixture's own runs unevenly") {
        // 6.12: the fixture's own clock read 23.3 ms for run 1 and
        // 36.9 ms for run 4, and 1.3 ms between two of them.
        let truth_load = u64s(&truth, "load_file");
        for (g, w) in load.windows(2).zip(truth_load.windows(2)) {
            assert!(
                w[1] <= w[0] + 3_000_000 || g[1] > g[0],
                "Load per run should grow as the fixture's did: {load:?} against {truth_load:?}"
            );
        }
    } else {
        assert!(
            load.windows(2).all(|w| w[1] > w[0] + 3_000_000),
            "Load per run should grow by ~5 ms: {load:?}"
        );
    }

    // stages.txt in Pury's layout (also printed on stdout).
    let text = read(out.path(), "stages.txt");
    assert!(
        fin.stdout.contains(text.trim()),
        "stages.txt not printed on stdout:\n{}",
        fin.stdout
    );
    check_pury_layout(&text);
}

/// `Open Document --> 0ms`, then for each child in order `  NAME --> avg =
/// …ms, min = …ms, max = …ms, for 5 runs` and the same with `<--`, then the
/// root's `<--` line and the duration table.
fn check_pury_layout(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let find = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix:?} in stages.txt:\n{text}"))
    };
    assert_eq!(lines[0], "Open Document --> 0ms", "first line:\n{text}");
    let mut last = 0;
    let mut heads = vec![];
    for name in ["Load", "Parse", "Render"] {
        heads.push(format!("  {name} --> "));
        heads.push(format!("  {name} <-- "));
    }
    heads.push("Open Document <-- ".into());
    for head in &heads {
        let i = find(head);
        assert!(i > last, "{head:?} out of order in stages.txt:\n{text}");
        last = i;
        check_spread(lines[i], head);
    }
    let t = find("Durations over 5 runs (ms):");
    assert!(t > last, "duration table after the tree:\n{text}");
    let header: Vec<&str> = lines[t + 1].split_whitespace().collect();
    assert_eq!(
        header,
        ["stage", "avg", "min", "max", "p50", "p95", "per", "run"],
        "table header"
    );
    for name in ["Open Document", "  Load", "  Parse", "  Render"] {
        let row = lines[t + 2..]
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no table row {name:?}:\n{text}"));
        let nums: Vec<f64> = row[name.len()..]
            .split_whitespace()
            .map(|x| x.parse().unwrap_or_else(|_| panic!("row {row:?}: {x:?}")))
            .collect();
        assert_eq!(
            nums.len(),
            5 + RUNS,
            "5 summary columns + 5 runs in {row:?}"
        );
    }
}

/// `HEAD avg = 1.23ms, min = 1.00ms, max = 2.00ms, for 5 runs`, with
/// min <= avg <= max.
fn check_spread(line: &str, head: &str) {
    let rest = line
        .strip_prefix(head)
        .and_then(|r| r.strip_suffix(", for 5 runs"))
        .unwrap_or_else(|| panic!("{line:?} should end `, for 5 runs`"));
    let vals: Vec<f64> = rest
        .split(", ")
        .zip(["avg = ", "min = ", "max = "])
        .map(|(part, key)| {
            part.strip_prefix(key)
                .and_then(|v| v.strip_suffix("ms"))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{line:?}: expected `{key}N.NNms`, got {part:?}"))
        })
        .collect();
    assert_eq!(vals.len(), 3, "avg, min, max in {line:?}");
    assert!(
        vals[1] <= vals[0] && vals[0] <= vals[2],
        "min <= avg <= max in {line:?}"
    );
}
