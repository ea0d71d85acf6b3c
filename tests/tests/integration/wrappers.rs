//! One group per cause (issue 21): `fixtures/wrappers.c` blocks in two
//! unprobed handlers, `handle_nap` in `nanosleep` and `handle_wait` in
//! `poll`, four times each, both woken by a timer. Only `dispatch_message`
//! is probed, so the tree below it is made of blocked frames, innermost
//! the C library's. The keys and verdicts must name the two handlers and
//! the calls they made, not the library's wrappers: two groups of four.
use profiler_tests::*;
use serde_json::Value;

#[test]
fn handlers_blocking_in_libc_are_two_groups_named_by_the_handlers() {
    require_root!();
    let exe = build_c(
        "wrappers.c",
        "wrappers",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let out = TempDir::new("wrappers");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(&exe, &[]);
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &[
            "--dispatch",
            "dispatch_message",
            "--func",
            "dispatch_message",
            "--threshold",
            "50ms",
        ],
    );
    let ours = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[ours]);
    fx.release();
    let d = read_json(out.path(), "dispatches.json");
    let slow = d["slow"].as_array().expect("slow array");
    let want = truth["dispatches"].as_array().expect("truth dispatches");
    let indices = |v: &[Value]| -> Vec<u64> { v.iter().map(|s| num(s, "index")).collect() };
    assert_eq!(indices(slow), indices(want), "the slow dispatches, exactly");
    for (handler, kind, call) in [
        ("handle_nap", "nap", "nanosleep"),
        ("handle_wait", "wait", "poll"),
    ] {
        let of_kind: Vec<&Value> = want.iter().filter(|t| t["type"] == kind).collect();
        assert_eq!(of_kind.len(), 4);
        for t in &of_kind {
            let s = slow
                .iter()
                .find(|s| num(s, "index") == num(t, "index"))
                .unwrap();
            let (key, verdict) = (s["key"].as_str().unwrap(), s["verdict"].as_str().unwrap());
            // `nanosleep <- handle_nap | woken in timer`: the call the
            // handler made, then the handler.
            let named = format!(" <- {handler} |");
            assert!(
                key.contains(&named) && key.contains(call),
                "{kind} key {key:?} names {call} <- {handler}"
            );
            assert!(
                verdict.contains("blocked") && verdict.contains(&format!(" <- {handler}")),
                "{kind} verdict {verdict:?} names {handler}"
            );
            // The trimmed tree keeps the path down to what the verdict names.
            let tree = s["tree"].as_array().unwrap();
            assert!(
                tree.iter().any(|n| n["name"] == handler),
                "{kind} tree has {handler}: {tree:?}"
            );
            assert_close(
                "slow dispatch duration",
                num(s, "duration_ns"),
                num(t, "duration_ns"),
            );
        }
    }
    let groups = d["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2, "one group per cause: {groups:?}");
    for handler in ["handle_nap", "handle_wait"] {
        let g: Vec<&Value> = groups
            .iter()
            .filter(|g| g["key"].as_str().unwrap().contains(handler))
            .collect();
        assert_eq!(g.len(), 1, "one group for {handler}: {groups:?}");
        assert_eq!(num(g[0], "count"), 4, "{handler}: {}", g[0]);
    }
}
