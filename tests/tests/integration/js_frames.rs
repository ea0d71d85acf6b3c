//! JavaScript frames by PID (issue 22): node started without flags (no
//! perf map), attached by PID. The kernel finds each JavaScript frame's
//! function from V8's frame layout, and the agent names it from the
//! binary's postmortem metadata: the samples carry the script's functions
//! with their lines and columns, checked against its known call structure,
//! and a slow dispatch's verdict names the JavaScript function.
use profiler_tests::*;
use std::path::Path;
use std::process::Command;

/// `tick` (line 10) calls `middle` (line 6), which calls `leaf` (line 1),
/// every 5 ms; every 8th tick also calls `slowRoute` (line 14), about
/// 150 ms of work.
const SCRIPT: &str = concat!(
    "function leaf(n) {\n",
    "  let s = 0;\n",
    "  for (let i = 0; i < n; i++) s += Math.sqrt(i);\n",
    "  return s;\n",
    "}\n",
    "function middle(n) {\n",
    "  return leaf(n) + 1;\n",
    "}\n",
    "let ticks = 0;\n",
    "function tick() {\n",
    "  middle(SIZE);\n",
    "  if (SLOW && ++ticks % 8 === 0) slowRoute();\n",
    "}\n",
    "function slowRoute() {\n",
    "  const end = Date.now() + 150;\n",
    "  let s = 0;\n",
    "  while (Date.now() < end) s += Math.sin(s);\n",
    "  return s;\n",
    "}\n",
    "setInterval(tick, 5);\n",
    "console.log('ready', process.pid);\n",
);

fn node_script(dir: &Path, size: u32, slow: bool) -> std::path::PathBuf {
    let path = dir.join("app.js");
    let text = SCRIPT
        .replace("SIZE", &size.to_string())
        .replace("SLOW", if slow { "true" } else { "false" });
    std::fs::write(&path, text).expect("write app.js");
    path
}

fn node() -> Option<std::path::PathBuf> {
    let ok = Command::new("node").arg("--version").output().ok()?;
    ok.status
        .success()
        .then(|| std::fs::canonicalize("/usr/bin/node").unwrap_or_else(|_| "node".into()))
}

/// Of the samples with a JavaScript frame, the share that walk
/// `tick` → `middle` → `leaf` with the perf map's names (no tier), and
/// how many had one.
fn named_share(stacks: &[(Vec<String>, u64)], script: &Path) -> (f64, u64) {
    let s = script.display();
    let chain = [
        format!("JS:tick {s}:10:14"),
        format!("JS:middle {s}:6:16"),
        format!("JS:leaf {s}:1:14"),
    ];
    let (mut in_js, mut named) = (0, 0);
    for (frames, n) in stacks {
        if !frames.iter().any(|f| f.starts_with("JS:")) {
            continue;
        }
        in_js += n;
        if frames
            .windows(3)
            .any(|w| w.iter().zip(&chain).all(|(a, b)| a == b))
        {
            named += n;
        }
    }
    (named as f64 / in_js.max(1) as f64, in_js)
}

#[test]
fn javascript_frames_by_pid_for_node_started_without_flags() {
    require_root!();
    let Some(node) = node() else {
        eprintln!("SKIP javascript_frames_by_pid_for_node_started_without_flags: no node");
        return;
    };
    let dir = TempDir::new("jsframes");
    let script = node_script(dir.path(), 2_000_000, false);
    let mut cmd = Command::new(&node);
    // TurboFan inlines functions into their callers once they are hot
    // enough, and an inlined function has no frame of its own to name
    // (docs/sampling.md). Under emulation it did so between the by-PID
    // session and the --all one (6.12: every sample of the second in
    // `JS:listOnTimeout`). The flag is V8's optimizer, not a profiling
    // one: node still starts without `--perf-basic-prof` or the like.
    if relaxed("node runs with --no-turbo-inlining: under emulation TurboFan inlined tick, middle and leaf into listOnTimeout before the --all session") {
        cmd.arg("--no-turbo-inlining");
    }
    cmd.arg(&script);
    let fx = Fixture::spawn_cmd(cmd, &node);
    // Let the JIT compile `leaf` first (the case that matters most).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = TempDir::new("jsframes-out");
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    let stacks = folded(&read(out.path(), "cpu.folded"));
    let (share, total) = named_share(&stacks, &script);
    eprintln!(
        "tick;middle;leaf with their lines in {:.1}% of {total} samples in JavaScript",
        share * 100.0
    );
    assert!(total >= 500, "only {total} samples in JavaScript");
    assert!(share >= 0.95, "{share:.3} of {total}: {stacks:?}");
    let unnamed: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|n| n.starts_with("[unknown] 0x")))
        .map(|(_, n)| n)
        .sum();
    assert!(
        unnamed * 100 <= total,
        "{unnamed} samples with an unnamed JIT frame of {total}"
    );
    let txt = read(out.path(), "cpu.txt");
    let line = txt
        .lines()
        .find(|l| l.starts_with("JavaScript: "))
        .unwrap_or_else(|| panic!("cpu.txt counts JavaScript samples: {txt}"));
    let pct: f64 = line
        .rsplit('(')
        .next()
        .and_then(|p| p.strip_suffix("%)"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a share in {line:?}"));
    assert!(pct >= 90.0, "{line}");

    // System-wide, the same names (through the names that stand for the
    // process's own across processes).
    let out = TempDir::new("jsframes-all");
    let fin = profiler(&[
        "sample",
        "--all",
        "--hz",
        "499",
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    // Other node processes may run on the machine: only stacks in this
    // script count.
    let mine = script.display().to_string();
    let stacks: Vec<(Vec<String>, u64)> = folded(&read(out.path(), "cpu.folded"))
        .into_iter()
        .filter(|(f, _)| f.iter().any(|n| n.starts_with("JS:") && n.contains(&mine)))
        .collect();
    let (share, total) = named_share(&stacks, &script);
    eprintln!(
        "--all: tick;middle;leaf in {:.1}% of {total} samples in JavaScript",
        share * 100.0
    );
    assert!(total >= 200 && share >= 0.95, "{share:.3} of {total}");
}

#[test]
fn a_slow_javascript_handler_attached_by_pid_is_named() {
    require_root!();
    let Some(node) = node() else {
        eprintln!("SKIP a_slow_javascript_handler_attached_by_pid_is_named: no node");
        return;
    };
    let dir = TempDir::new("jsslow");
    let script = node_script(dir.path(), 20_000, true);
    let mut cmd = Command::new(&node);
    // TurboFan may inline a function into its caller, which is then the
    // one frame named (docs/sampling.md). On this host it has not by the
    // time the session ends; in the 6.1 VM node ran minutes first and
    // every slow dispatch read `JS:listOnTimeout`, slowRoute inlined in it
    // (`--interrupt-budget=2000` shows the same here).
    if relaxed("node runs with --no-turbo-inlining: under emulation TurboFan inlined slowRoute into listOnTimeout before the session") {
        cmd.arg("--no-turbo-inlining");
    }
    cmd.arg(&script);
    let fx = Fixture::spawn_cmd(cmd, &node);
    let out = dir.join("out");
    let pid = fx.pid.to_string();
    // Under emulation node's 100-MB binary is read for minutes (its
    // symbols for the selection, its tables at the first tick), and 250
    // functions attached and detached one perf event each take minutes
    // more: the 6.1 and 6.12 VMs passed the 5-minute limit.
    // The governor also takes seconds there to detach the functions the
    // probes made too dear (6.1: the last at 4.2 s of a 4-s session), and
    // until it has, ordinary ticks can pass the threshold: 8 s.
    let (duration, limit, cap) = match relaxed(
        "node by PID: 40 functions, 8 s recorded and 15 minutes (its binary is read for minutes under emulation)",
    ) {
        true => ("8s", std::time::Duration::from_secs(900), Some("40")),
        false => ("4s", timeout(), None),
    };
    let mut args = vec![
        "record",
        "--pid",
        &pid,
        "--duration",
        duration,
        "--threshold",
        "100ms",
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(cap) = cap {
        args.extend(["--max-funcs", cap]);
    }
    let fin = profiler_within(&args, limit);
    assert!(fin.status.success(), "{fin:?}");
    let d = read_json(&out, "dispatches.json");
    let slow_list = d["slow"].as_array().expect("slow");
    let slow = slow_list.len();
    let groups = d["groups"].as_array().expect("groups");
    let want = format!("JS:slowRoute {}:14:19", script.display());
    // Every 8th tick of 5 ms or more: one slow dispatch every 0.2-0.35 s.
    let named = slow_list
        .iter()
        .filter(|s| s["key"].as_str().unwrap_or_default().starts_with(&want))
        .count();
    assert!(
        named >= 6,
        "{named} slow dispatches of slowRoute: {groups:?}"
    );
    // Until the governor detaches the hottest functions (its first round
    // comes in the first second, the rest after its 2.5-s hold), an
    // ordinary tick that calls them thousands of times can last over the
    // threshold: the user felt it, so it is reported, flagged as slow
    // mainly because of the probes (`probes_mainly`, said in its verdict).
    // Every other slow dispatch is slowRoute's.
    let mut others = 0u64;
    for s in slow_list {
        let key = s["key"].as_str().unwrap_or_default();
        let verdict = s["verdict"].as_str().unwrap_or_default();
        let mainly = s["probes_mainly"].as_bool().expect("probes_mainly");
        assert_eq!(
            mainly,
            verdict.contains("slow mainly because of them"),
            "the flag and the verdict agree: {s}"
        );
        if !key.starts_with(&want) && !mainly {
            others += 1;
        }
    }
    // Under emulation a probe hit costs 20 µs and more, and the
    // calibrated cost taken out can leave an ordinary tick just over the
    // threshold, unflagged (6.1: 2 of 15 at 101-105 ms, keyed
    // `uv__run_timers`). A fifth of them may be.
    let allowed = match relaxed("node by PID: a fifth of the slow dispatches may be ordinary ticks the probes made slow before the governor detached them") {
        true => slow as u64 / 5,
        false => 0,
    };
    assert!(
        others <= allowed,
        "every slow dispatch not flagged as the probes' is slowRoute's, named {want:?}: {others} others, {allowed} allowed: {groups:?}"
    );
    let counted: u64 = groups.iter().map(|g| num(g, "count")).sum();
    assert_eq!(counted, slow as u64, "{groups:?}");
    let txt = read(&out, "dispatches.txt");
    assert!(
        txt.lines()
            .any(|l| l.contains("verdict:") && l.contains("in JS:slowRoute ")),
        "the verdict names slowRoute: {txt}"
    );
}

/// A launched node script whose slow handler is its last: node exits 20 ms
/// after it, before the agent reports it. The slow dispatch's JavaScript
/// function is still named: the kernel tells the agent of each function
/// when a stack first holds it, and the agent names it then, while node
/// runs, not when the dispatch is reported.
#[test]
fn a_javascript_handler_is_named_after_node_exits() {
    require_root!();
    let Some(node) = node() else {
        eprintln!("SKIP a_javascript_handler_is_named_after_node_exits: no node");
        return;
    };
    let dir = TempDir::new("jsexit");
    let script = dir.join("last.js");
    std::fs::write(
        &script,
        concat!(
            "function slowLast() {\n",
            "  const end = Date.now() + 300;\n",
            "  let s = 0;\n",
            "  while (Date.now() < end) s += Math.sin(s);\n",
            "  return s;\n",
            "}\n",
        ),
    )
    .expect("write last.js");
    // Under emulation the agent reads node's V8 metadata seconds after the
    // exec (6.12: slowLast ran before, and its dispatch had no JavaScript
    // frame): the handler runs later there. Node still exits 20 ms after it.
    let delay_ms = match relaxed("slowLast runs 8 s after node starts, not 1 s: the agent reads node's V8 metadata seconds after the exec") {
        true => 8000,
        false => 1000,
    };
    let mut text = std::fs::read_to_string(&script).expect("read last.js");
    text.push_str(&format!(
        "setTimeout(() => {{ slowLast(); setTimeout(() => process.exit(0), 20); }}, {delay_ms});\n"
    ));
    std::fs::write(&script, text).expect("write last.js");
    let out = dir.join("out");
    let fin = profiler(&[
        "record",
        "--threshold",
        "100ms",
        "--out",
        out.to_str().unwrap(),
        "--",
        node.to_str().unwrap(),
        script.to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    let d = read_json(&out, "dispatches.json");
    let groups = d["groups"].as_array().expect("groups");
    let want = format!("JS:slowLast {}:1:18", script.display());
    assert_eq!(
        d["slow"].as_array().expect("slow").len(),
        1,
        "one slow dispatch: {groups:?}"
    );
    let key = groups[0]["key"].as_str().unwrap_or_default();
    assert!(key.starts_with(&want), "named {want:?}: {key:?}");
}
