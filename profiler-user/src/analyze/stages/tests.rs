//! Synthetic entry/exit sequences through [`StageTracker`] and the renderers.
use super::{
    render::{render_json, render_text},
    *,
};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

fn st(name: &str, start: u32, end: u32) -> ResolvedStage {
    ResolvedStage {
        name: name.into(),
        start_func: start,
        end_func: end,
    }
}

/// `(is_entry, tid, func, ts_ns)`
type Ev = (bool, u32, u32, u64);

fn feed(t: &mut StageTracker, evs: &[Ev]) {
    for &(entry, tid, func, ts) in evs {
        if entry {
            t.on_entry(tid, func, ts);
        } else {
            t.on_exit(tid, func, ts);
        }
    }
}

fn e(func: u32, ts: u64) -> Ev {
    (true, 1, func, ts)
}

fn x(func: u32, ts: u64) -> Ev {
    (false, 1, func, ts)
}

fn stage<'a>(r: &'a StagesResult, name: &str) -> &'a StageResult {
    r.stages.iter().find(|s| s.name == name).unwrap()
}

fn parent_of<'a>(r: &'a StagesResult, name: &str) -> Option<&'a str> {
    stage(r, name).parent.map(|p| r.stages[p].name.as_str())
}

// Functions: 0 open, 1 load, 2 parse, 3 tokenize, 4 draw, 5 flush.
fn document_stages() -> Vec<ResolvedStage> {
    // Deliberately not in nesting order: nesting is derived.
    vec![
        st("Parse", 2, 2),
        st("Load", 1, 1),
        st("Open Document", 0, 0),
    ]
}

#[test]
fn single_run_prints_pury_layout() {
    let mut t = StageTracker::new(document_stages(), 2, 1);
    let t0 = 5_000 * MS;
    feed(
        &mut t,
        &[
            e(0, t0),
            e(1, t0 + 50 * US),
            x(1, t0 + 120_310 * US),
            e(2, t0 + 120_400 * US),
            x(2, t0 + 180_020 * US),
            x(0, t0 + 250_100 * US),
        ],
    );
    assert!(t.done());
    let r = t.finish();
    assert_eq!(
        render_text(std::slice::from_ref(&r)),
        "Open Document --> 0ms\n\
         \x20 Load --> 0.05ms\n\
         \x20 Load <-- 120.31ms, execution = 120.26ms\n\
         \x20 Parse --> 120.40ms\n\
         \x20 Parse <-- 180.02ms, execution = 59.62ms\n\
         Open Document <-- 250.10ms\n"
    );
}

#[test]
fn nesting_is_derived_and_majority_wins() {
    let stages = vec![
        st("Tokenize", 3, 3),
        st("Open", 0, 0),
        st("Parse", 2, 2),
        st("Load", 1, 1),
    ];
    let mut t = StageTracker::new(stages, 1, 3);
    // Run 1: Load inside Parse (once); runs 2-3: Load before Parse.
    // Tokenize is always inside Parse; recursion in Parse starts it once.
    let mut evs = vec![e(0, 0), e(2, 10), e(1, 11), x(1, 12), e(2, 13), e(3, 14)];
    evs.extend([x(3, 15), x(2, 16), x(2, 20), x(0, 30)]);
    for base in [100, 200] {
        evs.extend([e(0, base), e(1, base + 1), x(1, base + 2), e(2, base + 3)]);
        evs.extend([
            e(3, base + 4),
            x(3, base + 5),
            x(2, base + 6),
            x(0, base + 9),
        ]);
    }
    feed(&mut t, &evs);
    let r = t.finish();
    assert_eq!(r.runs, 3);
    let names: Vec<_> = r
        .stages
        .iter()
        .map(|s| (s.name.as_str(), s.depth))
        .collect();
    assert_eq!(
        names,
        [("Open", 0), ("Load", 1), ("Parse", 1), ("Tokenize", 2)]
    );
    assert_eq!(parent_of(&r, "Load"), Some("Open"));
    assert_eq!(parent_of(&r, "Tokenize"), Some("Parse"));
    assert_eq!(stage(&r, "Parse").per_run[0].unwrap().duration_ns(), 10);
    assert!(r.overlaps.is_empty());
}

#[test]
fn overlap_is_reported_not_hidden() {
    // Render = draw..flush starts inside Parse and ends after it; Late =
    // draw..flush-like range still open when the root ends.
    let stages = vec![
        st("Open", 0, 0),
        st("Parse", 2, 2),
        st("Render", 4, 5),
        st("Late", 3, 3),
    ];
    let mut t = StageTracker::new(stages, 0, 1);
    feed(
        &mut t,
        &[
            e(0, 0),
            e(2, 10),
            e(4, 20),
            x(4, 21),
            x(2, 30),
            e(5, 35),
            x(5, 40),
            e(3, 45),
            x(0, 50),
            x(3, 60),
        ],
    );
    let r = t.finish();
    assert_eq!(parent_of(&r, "Render"), Some("Open"));
    assert_eq!(stage(&r, "Render").per_run[0].unwrap().start_ns, 20);
    assert!(r.stages.iter().all(|s| s.name != "Late"));
    let ov: Vec<_> = r
        .overlaps
        .iter()
        .map(|o| (o.stage.as_str(), o.starts_inside.as_str(), o.count))
        .collect();
    assert_eq!(ov, [("Render", "Parse", 1), ("Late", "Open", 1)]);
    let text = render_text(&[r]);
    assert!(
        text.contains("Render starts inside Parse and ends after it, in 1 run"),
        "{text}"
    );
}

#[test]
fn range_stage_spans_functions_and_threads() {
    // Request = submit..on_reply: submit on thread 1, reply on thread 2.
    // Root A..B too: entry of 0 .. exit of 9.
    let stages = vec![st("Session", 0, 9), st("Request", 4, 5)];
    let mut t = StageTracker::new(stages, 0, 1);
    feed(
        &mut t,
        &[
            e(0, 100),
            x(0, 110),
            e(4, 120),
            e(4, 121), // already open: not restarted
            x(4, 125),
            x(4, 126),
            (true, 2, 5, 150),
            (true, 2, 5, 151), // recursive reply
            (false, 2, 5, 160),
            (false, 2, 5, 170), // outermost exit ends it
            (true, 2, 9, 180),
            (false, 2, 9, 200),
        ],
    );
    let r = t.finish();
    assert_eq!(r.runs, 1);
    let req = stage(&r, "Request").per_run[0].unwrap();
    assert_eq!((req.start_ns, req.end_ns), (20, 70));
    assert_eq!(r.stages[0].per_run[0].unwrap().end_ns, 100);
}

#[test]
fn recursion_and_other_threads_do_not_restart_a_function_stage() {
    let mut t = StageTracker::new(vec![st("Open", 0, 0), st("Walk", 1, 1)], 0, 1);
    feed(
        &mut t,
        &[
            e(0, 0),
            e(1, 10),
            e(1, 11),
            (true, 7, 1, 12),
            (false, 7, 1, 13), // another thread: ignored while open
            x(1, 14),
            x(1, 20),
            x(0, 30),
        ],
    );
    let r = t.finish();
    let w = stage(&r, "Walk");
    assert_eq!(w.per_run[0].unwrap().duration_ns(), 10);
    assert_eq!(r.stages.len(), 2);
}

fn multi_run() -> StagesResult {
    let mut t = StageTracker::new(vec![st("Get Next Page", 0, 0), st("Load", 1, 1)], 0, 5);
    let load = [(1, 244), (2, 250), (3, 278), (1, 260), (2, 260)];
    let root_end = [300, 310, 320, 330, 340];
    for (i, (&(s, end), &re)) in load.iter().zip(&root_end).enumerate() {
        let b = i as u64 * 1_000 * MS;
        feed(
            &mut t,
            &[
                e(0, b),
                e(1, b + s * MS),
                x(1, b + end * MS),
                x(0, b + re * MS),
            ],
        );
    }
    assert!(t.done());
    feed(&mut t, &[e(0, 9_000 * MS)]); // ignored: done
    t.finish()
}

#[test]
fn multi_run_stats_and_table() {
    let r = multi_run();
    assert!(!r.incomplete_run);
    let text = render_text(std::slice::from_ref(&r));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "Get Next Page --> 0ms",
            "  Load --> avg = 1.80ms, min = 1.00ms, max = 3.00ms, for 5 runs",
            "  Load <-- avg = 258.40ms, min = 244.00ms, max = 278.00ms, for 5 runs",
            "Get Next Page <-- avg = 320.00ms, min = 300.00ms, max = 340.00ms, for 5 runs",
        ]
    );
    assert_eq!(lines[5], "Durations over 5 runs (ms):");
    assert!(lines[6].starts_with("stage") && lines[6].ends_with("p95  per run"));
    let load: Vec<&str> = lines[8].split_whitespace().collect();
    assert_eq!(load[0], "Load");
    assert_eq!(
        load[1..6],
        ["256.60", "243.00", "275.00", "258.00", "275.00"]
    );
    assert_eq!(
        load[6..],
        ["243.00", "248.00", "275.00", "259.00", "258.00"]
    );
}

#[test]
fn json_has_the_contract_fields() {
    let r = multi_run();
    let v: serde_json::Value = serde_json::from_str(&render_json(&[r])).unwrap();
    let sc = &v["scenarios"][0];
    assert_eq!(sc["name"], "Get Next Page");
    assert_eq!(sc["runs"], 5);
    assert!(sc["overlaps"].as_array().unwrap().is_empty());
    let load = &sc["stages"][1];
    assert_eq!(load["name"], "Load");
    assert_eq!(load["parent"], "Get Next Page");
    assert_eq!(load["depth"], 1);
    assert_eq!(load["duration_ns"]["min"], 243 * MS);
    assert_eq!(load["duration_ns"]["p95"], 275 * MS);
    assert_eq!(load["start_offset_ns"]["avg"], 1_800_000);
    assert_eq!(load["per_run_ns"].as_array().unwrap().len(), 5);
    assert!(load["missing_runs"].as_array().unwrap().is_empty());
    assert_eq!(sc["stages"][0]["parent"], serde_json::Value::Null);
}

#[test]
fn missing_runs_repeats_and_incomplete_runs_are_noted() {
    let stages = vec![st("Open", 0, 0), st("Load", 1, 1), st("Cache", 2, 2)];
    let mut t = StageTracker::new(stages, 0, 3);
    feed(
        &mut t,
        &[e(0, 0), e(1, 1), x(1, 2), e(1, 3), x(1, 5), x(0, 9)],
    );
    feed(
        &mut t,
        &[e(0, 10), e(1, 11), x(1, 12), e(2, 13), x(2, 14), x(0, 19)],
    );
    feed(&mut t, &[e(0, 20), e(1, 21)]);
    assert!(!t.done());
    let r = t.finish();
    assert_eq!((r.runs, r.runs_wanted, r.incomplete_run), (2, 3, true));
    let names: Vec<_> = r.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Open", "Load #1", "Load #2", "Cache"]);
    assert_eq!(stage(&r, "Load #2").missing_runs(), [2]);
    let text = render_text(&[r]);
    assert!(
        text.contains(
            "  Load #2 --> avg = 0.00ms, min = 0.00ms, max = 0.00ms, for 1 runs, missing in run 2"
        ),
        "{text}"
    );
    assert!(text.contains("Only 2 of 3 runs completed."), "{text}");
    assert!(text.contains("had started but not ended"), "{text}");
}

#[test]
fn no_run_is_said_plainly() {
    let t = StageTracker::new(vec![st("Open", 0, 0)], 0, 1);
    let r = t.finish();
    assert!(render_text(&[r]).starts_with("Open: no complete run recorded"));
}
