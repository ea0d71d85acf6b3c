//! Process trees and several targets: `--follow` (fork, vfork, posix_spawn
//! and an exec'd helper, in launch mode and by PID), a forking target
//! without `--follow` (its children counted, never paired with it),
//! `--pid` repeated and `--pid-of`, and their bad input. Per-process counts
//! are exact against the fixture's own (`fixtures/forkserver.c`).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use profiler_tests::*;
use serde_json::Value;

const FLAGS: &[&str] = &["-O1", "-g", "-fno-omit-frame-pointer"];

fn server_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c("forkserver.c", "forkserver", FLAGS))
}

fn helper_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c("forkhelper.c", "forkhelper", FLAGS))
}

const FUNCS: &[&str] = &[
    "--func",
    "handle",
    "--func",
    "vfork_work",
    "--func",
    "helper_work",
];

/// How long the exec'd helper waits after it sees its function probed,
/// for the rest of its probes (`fixtures/forkhelper.c`): none, but a
/// second under software emulation, where one perf event per probe goes
/// on a few hundred milliseconds after the other.
fn settle_ms() -> &'static str {
    if relaxed("the exec'd helper waits 1 s more after its function is first probed") {
        "1000"
    } else {
        "0"
    }
}

/// The `processes` entry of `pid`.
fn process(o: &Outputs, pid: u64) -> &Value {
    o.json["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes array: {}", o.json))
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("no process {pid} in {}", o.json["processes"]))
}

/// Calls of `func` in process `pid`'s section (0 when absent).
fn calls_in(o: &Outputs, pid: u64, func: &str) -> u64 {
    process(o, pid)["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == func)
        .map(|f| num(f, "calls"))
        .sum()
}

/// Every process of the tree, with exact counts, parents and exit codes;
/// the server's main thread has `server_dispatches` dispatches.
fn assert_tree(o: &Outputs, truth: &Value, server_dispatches: u64) {
    let server = num(truth, "pid");
    let procs = o.json["processes"].as_array().expect("processes");
    assert_eq!(
        procs.len(),
        7,
        "server, 4 workers, vfork and spawn children"
    );
    assert_eq!(calls_in(o, server, "handle"), 9, "the server's own calls");
    let mut handle_total = 9;
    for w in truth["workers"].as_array().unwrap() {
        let pid = num(w, "pid");
        let p = process(o, pid);
        assert_eq!(calls_in(o, pid, "handle"), num(w, "handle"), "worker {pid}");
        assert_eq!(num(p, "ppid"), server, "worker {pid}'s parent");
        assert_eq!(
            p["exit_code"].as_u64(),
            w["code"].as_u64(),
            "worker {pid} exit"
        );
        assert_eq!(p["child"], true);
        // No dispatch function known: every outermost traced call on the
        // process's main thread is one (the helper's too, after the exec).
        let extra = if pid == num(truth, "exec_pid") { 7 } else { 0 };
        assert_eq!(
            num(&p["dispatches"], "count"),
            num(w, "handle") + extra,
            "worker {pid}'s main-thread dispatches"
        );
        handle_total += num(w, "handle");
    }
    assert_eq!(
        num(&process(o, server)["dispatches"], "count"),
        server_dispatches
    );
    let exec_pid = num(truth, "exec_pid");
    assert_eq!(
        calls_in(o, exec_pid, "helper_work"),
        num(truth, "exec_calls"),
        "the exec'd helper's calls count under its process"
    );
    // Both the exec'ing worker and the posix_spawn child exec the helper:
    // the first exec handled gets its function probed (and says when), the
    // other finds it probed already.
    let spawn = num(truth, "spawn_pid");
    let mut probed = 0;
    for pid in [exec_pid, spawn] {
        // The path, or the kernel's name for it when the process exited
        // before the agent read /proc/PID/exe (the helper only waits for
        // its probes when they are not there yet).
        let execs = process(o, pid)["execs"].as_array().unwrap();
        assert!(
            execs.len() == 1
                && [helper_exe().to_str().unwrap(), "forkhelper"]
                    .contains(&execs[0]["exe"].as_str().unwrap_or_default()),
            "process {pid}'s exec: {execs:?}"
        );
        if execs[0]["probed_ns"].as_u64().is_some() {
            assert_eq!(execs[0]["probed_functions"], 1);
            probed += 1;
        }
    }
    assert_eq!(probed, 1, "helper_work probed once, at the first exec");
    let vfork = num(truth, "vfork_pid");
    assert_eq!(calls_in(o, vfork, "vfork_work"), 5, "vfork child");
    assert_eq!(process(o, vfork)["exit_code"], 5);
    assert_eq!(calls_in(o, spawn, "helper_work"), 3, "posix_spawn child");
    assert_eq!(process(o, spawn)["exit_code"], 3);
    assert_eq!(num(process(o, spawn), "ppid"), server);
    // The top-level functions sum every process.
    assert_eq!(o.sum("handle", "calls"), handle_total);
    assert_eq!(o.sum("helper_work", "calls"), 7 + 3);
    assert_eq!(o.sum("vfork_work", "calls"), 5);
    assert_eq!(o.get("orphan_exits") + o.get("unfinished_frames"), 0);
    assert!(
        o.report.contains("Processes: 7 (--follow"),
        "report.txt per-process table:\n{}",
        o.report
    );
    assert!(o
        .report
        .lines()
        .any(|l| l.contains(&format!(" {exec_pid} ")) && l.contains("helper_work 7")));
    assert!(
        o.report.contains("functions probed") && o.report.contains("after the exec"),
        "when probing started, in report.txt:\n{}",
        o.report
    );
}

#[test]
fn follow_launch_traces_every_process_of_the_tree() {
    require_root!();
    let out = TempDir::new("follow-launch");
    let before = prof_prog_ids();
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["record", "--follow", "--out"])
        .arg(out.path())
        .args(FUNCS)
        .arg("--")
        .arg(server_exe())
        .arg("auto")
        .arg(helper_exe())
        .env("FOLLOW_SETTLE_MS", settle_ms());
    let fin = Recording::spawn(cmd).wait();
    assert!(fin.status.success(), "profiler: {fin:?}");
    assert_none_left_since(&before, &[]);
    let truth = truth_line(&fin.stdout);
    let o = Outputs::load(out.path());
    assert_eq!(o.json["stop_reason"], "every traced process exited");
    // Launch mode also probes `main` (startup timing): the server's one
    // outermost call, its one dispatch.
    assert_tree(&o, &truth, 1);
    assert_eq!(
        process(&o, num(&truth, "pid"))["exit_code"],
        0,
        "the server exits 0"
    );
    // trace.json: each process is its own group of tracks, its calls there.
    let trace = read_json(out.path(), "trace.json");
    let events = trace["traceEvents"]
        .as_array()
        .or_else(|| trace.as_array())
        .expect("trace events");
    for w in truth["workers"].as_array().unwrap() {
        let pid = num(w, "pid");
        let calls = events
            .iter()
            .filter(|e| e["cat"] == "call" && e["pid"].as_u64() == Some(pid))
            .count() as u64;
        let extra = if pid == num(&truth, "exec_pid") { 7 } else { 0 };
        assert_eq!(
            calls,
            num(w, "handle") + extra,
            "worker {pid}'s calls in trace.json"
        );
    }
    // The replay carries the processes: the same bytes.
    let again = replay(out.path(), "follow-replay");
    assert_eq!(
        read(out.path(), "functions.json"),
        read(again.path(), "functions.json")
    );
    assert_eq!(
        read(out.path(), "report.txt"),
        read(again.path(), "report.txt")
    );
}

#[test]
fn follow_by_pid_traces_children_made_after_attach() {
    require_root!();
    let out = TempDir::new("follow-pid");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn_env(
        server_exe(),
        &["follow", helper_exe().to_str().unwrap()],
        &[("FOLLOW_SETTLE_MS", settle_ms())],
    );
    let mut args = vec!["--follow"];
    args.extend_from_slice(FUNCS);
    let rec = Recording::start(fx.pid, out.path(), &args);
    let truth = fx.run();
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler: {fin:?}");
    assert_none_left_since(&before, &[]);
    let o = Outputs::load(out.path());
    assert_tree(&o, &truth, 9);
    let server = process(&o, fx.pid as u64);
    assert_eq!(server["child"], false);
    assert_eq!(server["exit_code"], 0);
}

#[test]
fn without_follow_children_are_counted_not_traced() {
    require_root!();
    let out = TempDir::new("no-follow");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(server_exe(), &["tree", helper_exe().to_str().unwrap()]);
    let mut args = FUNCS.to_vec();
    args.extend_from_slice(&["--func", "main"]);
    let rec = Recording::start(fx.pid, out.path(), &args);
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler: {fin:?}");
    assert_none_left_since(&before, &[]);
    assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
    let o = Outputs::load(out.path());
    // The server's own calls only, exactly; no child's call pairs with its
    // frames (main stays one call, open across every fork).
    assert_eq!(o.sum("handle", "calls"), num(&truth, "handle"));
    assert!(o.functions("helper_work").is_empty() && o.functions("vfork_work").is_empty());
    assert_eq!(o.get("orphan_exits"), 0);
    assert_eq!(
        o.get("untraced_children"),
        6,
        "4 workers, vfork, posix_spawn"
    );
    assert!(o.json.get("processes").is_none());
    assert!(
        o.report
            .contains("the traced processes started 6 child processes that were not traced"),
        "{}",
        o.report
    );
}

#[test]
fn several_pids_and_pid_of_each_get_a_section() {
    require_root!();
    // A copy under a name nothing else has, for --pid-of.
    let solo = build_c("forkserver.c", "fsolo_target", FLAGS);
    for by_name in [false, true] {
        let out = TempDir::new("several");
        let before = prof_prog_ids();
        let mut a = Fixture::spawn(&solo, &["solo", "17"]);
        let mut b = Fixture::spawn(&solo, &["solo", "29"]);
        let mut cmd = Command::new(profiler_bin());
        cmd.args(["record", "--out"])
            .arg(out.path())
            .args(["--func", "handle"]);
        if by_name {
            cmd.args(["--pid-of", "fsolo_target"]);
        } else {
            cmd.args(["--pid", &a.pid.to_string(), "--pid", &b.pid.to_string()]);
        }
        let rec = Recording::spawn(cmd);
        let (ta, tb) = (a.run(), b.run());
        a.release();
        b.release();
        let fin = rec.wait();
        assert!(fin.status.success(), "profiler: {fin:?}");
        assert_none_left_since(&before, &[]);
        let o = Outputs::load(out.path());
        assert_eq!(o.json["stop_reason"], "every traced process exited");
        assert_eq!(o.json["processes"].as_array().unwrap().len(), 2);
        assert_eq!(calls_in(&o, a.pid as u64, "handle"), num(&ta, "handle"));
        assert_eq!(calls_in(&o, b.pid as u64, "handle"), num(&tb, "handle"));
        assert_eq!(o.sum("handle", "calls"), 17 + 29);
        assert_eq!(process(&o, a.pid as u64)["exit_code"], 0);
    }
}

#[test]
fn pid_of_matching_nothing_is_one_line() {
    require_root!();
    let out = TempDir::new("pidof-none");
    let before = prof_prog_ids();
    let o = out.path().to_str().unwrap();
    let fin = profiler(&["record", "--pid-of", "no-such-proc-xyz", "--out", o]);
    assert_error(&fin, "no running process has that name", true);
    let fin = profiler(&[
        "record",
        "--follow",
        "--pid-of",
        "no-such-proc-xyz",
        "--out",
        o,
    ]);
    assert_error(&fin, "no tree to follow", true);
    assert_none_left_since(&before, &[]);
}

/// The governor and the exec prober both change the probes while a session
/// runs: asking for the governor with `--follow` is one line, before
/// anything is attached, and the target runs on as without the profiler.
#[test]
fn max_overhead_with_follow_is_one_line() {
    require_root!();
    let out = TempDir::new("follow-governor");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(server_exe(), &["solo", "5"]);
    let pid = fx.pid.to_string();
    let o = out.path().to_str().unwrap();
    let fin = profiler(&[
        "record",
        "--pid",
        &pid,
        "--follow",
        "--max-overhead",
        "5",
        "--func",
        "handle",
        "--out",
        o,
    ]);
    assert_error(&fin, "--max-overhead does not work with --follow", true);
    assert_none_left_since(&before, &[]);
    let truth = fx.run();
    assert_eq!(num(&truth, "handle"), 5, "{truth}");
    assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
}

#[test]
fn follow_teardown_leaves_the_target_text_unchanged() {
    require_root!();
    let out = TempDir::new("follow-teardown");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(server_exe(), &["solo", "5"]);
    let rec = Recording::start(fx.pid, out.path(), &["--follow", "--func", "handle"]);
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler: {fin:?}");
    assert_none_left_since(&before, &[]);
    assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
    let o = Outputs::load(out.path());
    assert_eq!(calls_in(&o, fx.pid as u64, "handle"), num(&truth, "handle"));
    assert!(
        process(&o, fx.pid as u64)["end_ns"].is_null(),
        "still running at the stop"
    );
}
