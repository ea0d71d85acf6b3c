//! Tail calls as written (issue 25, item 4): `fixtures/tailcall.c`'s
//! `handle_request` ends in `jmp process_request`, as redis's
//! `evalCommand` ends in `jmp evalGenericCommand`. With return sites the
//! jump is one of `handle_request`'s exits; with return uprobes there is no
//! event at the jump, and `process_request` enters at its caller's level.
//! Either way the profiler keeps `handle_request` open until
//! `process_request` returns, and marks the callee, so the slow
//! dispatches' keys, trees and durations read `handle_request →
//! process_request [tail call]`, as the source does. Both mechanisms are
//! run, with exact counts, and `handle_request`'s time against the
//! fixture's own clock.
use profiler_tests::*;
use serde_json::Value;

/// Messages the fixture dispatches, and the slow ones (NMSG, slow[]).
const MESSAGES: u64 = 12;
const SLOW: [u64; 3] = [2, 6, 9];

/// `per_probe`: each probe a perf event of its own (`PROFILER_PER_PROBE=1`),
/// as on kernels before 6.10, where the tail call's bit rides the event's
/// cookie, not a uprobe_multi link's.
fn run(exit_probes: &str, per_probe: bool) {
    let exe = build_c(
        "tailcall.c",
        "tailcall",
        &["-O2", "-g", "-fno-omit-frame-pointer"],
    );
    let out = TempDir::new(&format!("tailcall-{exit_probes}-{per_probe}"));
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(&exe, &[]);
    let mut cmd = Recording::command(
        fx.pid,
        out.path(),
        &[
            "--dispatch",
            "dispatch_message",
            "--func",
            "handle_request",
            "--func",
            "process_request",
            "--threshold",
            "50ms",
            "--exit-probes",
            exit_probes,
            "--max-overhead",
            "0",
        ],
    );
    if per_probe {
        cmd.env("PROFILER_PER_PROBE", "1");
    }
    let rec = Recording::spawn(cmd);
    let ours = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[ours]);
    fx.release();
    let what = format!("--exit-probes {exit_probes} (per probe: {per_probe})");
    let o = Outputs::load(out.path());
    for f in ["dispatch_message", "handle_request", "process_request"] {
        assert_eq!(o.sum(f, "calls"), MESSAGES, "{what}: {f} calls");
        assert_eq!(
            o.sum(f, "unwound"),
            0,
            "{what}: {f} closed without a return"
        );
        assert_eq!(o.sum(f, "unfinished"), 0, "{what}: {f} unfinished");
    }
    // handle_request's time is process_request's and a little more, and
    // matches the fixture's clock around the call.
    let messages = truth["messages"].as_array().expect("truth messages");
    let want: u64 = messages.iter().map(|m| num(m, "duration_ns")).sum();
    let (handle, process) = (
        o.sum("handle_request", "total_ns"),
        o.sum("process_request", "total_ns"),
    );
    assert!(
        handle >= process,
        "{what}: handle_request {handle} ns < process_request {process} ns"
    );
    assert_close("handle_request total", handle, want);
    let d = read_json(out.path(), "dispatches.json");
    let slow = d["slow"].as_array().expect("slow array");
    let indices: Vec<u64> = slow.iter().map(|s| num(s, "index")).collect();
    assert_eq!(indices, SLOW, "{what}: the slow dispatches, exactly");
    for s in slow {
        let key = s["key"].as_str().unwrap();
        assert!(
            key.contains("process_request <- handle_request"),
            "{what}: key {key:?} names handle_request"
        );
        let tree = s["tree"].as_array().unwrap();
        let node = |name: &str| -> &Value {
            tree.iter()
                .find(|n| n["name"] == name)
                .unwrap_or_else(|| panic!("{what}: no {name} in {tree:?}"))
        };
        let (h, p) = (node("handle_request"), node("process_request"));
        assert_eq!(
            num(p, "depth"),
            num(h, "depth") + 1,
            "{what}: process_request under handle_request: {tree:?}"
        );
        let index = num(s, "index") as usize;
        assert_close(
            "slow handle_request",
            num(h, "total_ns"),
            num(&messages[index], "duration_ns"),
        );
        let marked = p.get("tail_calls").map_or(0, |v| v.as_u64().unwrap());
        assert_eq!(
            marked, 1,
            "{what}: process_request marked as tail-called: {p}"
        );
    }
    let text = read(out.path(), "dispatches.txt");
    assert!(
        text.lines()
            .any(|l| l.contains("process_request 1x") && l.ends_with("[tail call]")),
        "{what}: dispatches.txt marks the tail call:\n{text}"
    );
}

#[test]
fn a_tail_call_keeps_its_caller_open_with_return_sites() {
    require_root!();
    run("ret", false);
}

#[test]
fn a_tail_call_keeps_its_caller_open_with_return_sites_one_perf_event_a_probe() {
    require_root!();
    run("ret", true);
}

#[test]
fn a_tail_call_keeps_its_caller_open_with_return_uprobes() {
    require_root!();
    run("uretprobe", false);
}
