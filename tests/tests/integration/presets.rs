//! Dispatch presets: a real GLib `GMainLoop`, recorded without `--dispatch`,
//! is split into dispatches by the GLib preset (`g_main_context_dispatch`,
//! exported by Debian's stripped libglib), and its slow iterations are
//! flagged and explained.
use profiler_tests::*;
use std::path::PathBuf;

/// `fixtures/glib_loop.c`, built against GLib.
fn glib_loop() -> PathBuf {
    build_glib(
        "glib_loop.c",
        "glib_loop",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    )
}

#[test]
fn glib_main_loop_is_split_by_the_preset() {
    require_root!();
    let exe = glib_loop();
    let out = TempDir::new("glib");
    let mut fx = Fixture::spawn(&exe, &[]);
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &[
            "--func",
            "on_tick",
            "--func",
            "render_scene",
            "--threshold",
            "50ms",
        ],
    );
    let truth = fx.run();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let d = read_json(out.path(), "dispatches.json");
    let rule = d["rule"].as_str().unwrap();
    assert!(rule.contains("preset GLib"), "rule: {rule}");

    // One dispatch per loop iteration that had a ready source: one per tick.
    let ticks = truth["ticks"].as_u64().unwrap();
    let n = d["dispatches"].as_u64().unwrap();
    assert!(
        (ticks..=ticks + 1).contains(&n),
        "{n} dispatches for {ticks} ticks"
    );

    let want: Vec<u64> = truth["slow_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let slow = d["slow"].as_array().unwrap();
    assert_eq!(slow.len(), want.len(), "slow dispatches: {slow:?}");
    for (s, w) in slow.iter().zip(&want) {
        let dur = s["duration_ns"].as_u64().unwrap();
        // The dispatch holds the slow callback plus GLib's own bookkeeping.
        assert!(
            dur >= *w && dur - w <= (w / 20).max(500_000),
            "dispatch {dur} ns vs callback {w} ns"
        );
        let key = s["key"].as_str().unwrap();
        assert!(key.starts_with("render_scene <- on_tick"), "key {key}");
    }
    let groups = d["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "one cause, one group: {groups:?}");
    assert_eq!(groups[0]["count"].as_u64(), Some(want.len() as u64));
}
