//! `stages.txt` in Pury's layout, and `stages.json`. Field names in the
//! JSON are a contract other tools read; add fields, never rename them.
use std::fmt::Write;

use serde::Serialize;

use super::{Overlap, StageResult, StagesResult, Summary};
use crate::text::line_if;

/// Milliseconds with two decimals, Pury-style: `120.31ms`.
pub fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

fn spread(values: &[u64], runs: usize, missing: &[usize]) -> String {
    let s = Summary::of(values).unwrap_or(Summary {
        avg: 0,
        min: 0,
        max: 0,
        p50: 0,
        p95: 0,
    });
    let mut out = format!(
        "avg = {}, min = {}, max = {}, for {} runs",
        fmt_ms(s.avg),
        fmt_ms(s.min),
        fmt_ms(s.max),
        values.len()
    );
    if !missing.is_empty() && runs > 1 {
        let list: Vec<String> = missing.iter().map(|r| r.to_string()).collect();
        let word = if missing.len() == 1 { "run" } else { "runs" };
        let _ = write!(out, ", missing in {word} {}", list.join(", "));
    }
    out
}

fn children(r: &StagesResult, i: usize) -> impl Iterator<Item = usize> + '_ {
    (0..r.stages.len()).filter(move |&c| r.stages[c].parent == Some(i))
}

/// The `-->`/`<--` tree: offsets for one run, avg/min/max for several.
fn tree(r: &StagesResult, i: usize, out: &mut String) {
    let s: &StageResult = &r.stages[i];
    let pad = "  ".repeat(s.depth);
    let missing = s.missing_runs();
    if i == 0 {
        let _ = writeln!(out, "{} --> 0ms", s.name);
    } else if r.runs == 1 {
        let _ = writeln!(out, "{pad}{} --> {}", s.name, fmt_ms(s.starts()[0]));
    } else {
        let _ = writeln!(
            out,
            "{pad}{} --> {}",
            s.name,
            spread(&s.starts(), r.runs, &missing)
        );
    }
    for c in children(r, i) {
        tree(r, c, out);
    }
    if r.runs > 1 {
        let _ = writeln!(
            out,
            "{pad}{} <-- {}",
            s.name,
            spread(&s.ends(), r.runs, &missing)
        );
    } else if i == 0 {
        let _ = writeln!(out, "{} <-- {}", s.name, fmt_ms(s.ends()[0]));
    } else {
        let (end, dur) = (s.ends()[0], s.durations()[0]);
        let _ = writeln!(
            out,
            "{pad}{} <-- {}, execution = {}",
            s.name,
            fmt_ms(end),
            fmt_ms(dur)
        );
    }
}

/// Durations per stage over several runs, in milliseconds.
fn table(r: &StagesResult, out: &mut String) {
    let label = |s: &StageResult| format!("{}{}", "  ".repeat(s.depth), s.name);
    let w = r
        .stages
        .iter()
        .map(|s| label(s).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(out, "\nDurations over {} runs (ms):", r.runs);
    let _ = writeln!(
        out,
        "{:<w$} {:>9} {:>9} {:>9} {:>9} {:>9}  per run",
        "stage", "avg", "min", "max", "p50", "p95"
    );
    let ms = |ns: u64| format!("{:.2}", ns as f64 / 1e6);
    for s in &r.stages {
        let Some(d) = Summary::of(&s.durations()) else {
            continue;
        };
        let per: Vec<String> = s
            .per_run
            .iter()
            .map(|iv| iv.map_or("-".into(), |iv| ms(iv.duration_ns())))
            .collect();
        let _ = writeln!(
            out,
            "{:<w$} {:>9} {:>9} {:>9} {:>9} {:>9}  {}",
            label(s),
            ms(d.avg),
            ms(d.min),
            ms(d.max),
            ms(d.p50),
            ms(d.p95),
            per.join(" ")
        );
    }
}

fn scenario_text(r: &StagesResult, out: &mut String) {
    if r.stages.is_empty() {
        let _ = writeln!(
            out,
            "{}: no complete run recorded (its stage never started and ended while recording)",
            r.scenario
        );
    } else {
        tree(r, 0, out);
        if r.runs > 1 {
            table(r, out);
        }
    }
    if !r.overlaps.is_empty() {
        let _ = writeln!(out, "\nOverlapping stages (not nested):");
        for o in &r.overlaps {
            let word = if o.count == 1 { "run" } else { "runs" };
            let _ = writeln!(
                out,
                "  {} starts inside {} and ends after it, in {} {word}",
                o.stage, o.starts_inside, o.count
            );
        }
    }
    line_if(
        out,
        r.runs < r.runs_wanted,
        format_args!("\nOnly {} of {} runs completed.", r.runs, r.runs_wanted),
    );
    line_if(
        out,
        r.incomplete_run,
        format_args!(
            "A run of {} had started but not ended when recording stopped; it is not counted.",
            r.scenario
        ),
    );
    line_if(
        out,
        r.dropped_occurrences > 0,
        format_args!(
            "{} stage occurrences beyond {} per run were not measured.",
            r.dropped_occurrences,
            super::tracker::MAX_OCCURRENCES
        ),
    );
}

/// `stages.txt`: every scenario, separated by a blank line.
pub fn render_text(results: &[StagesResult]) -> String {
    let mut out = String::new();
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        scenario_text(r, &mut out);
    }
    out
}

#[derive(Serialize)]
struct StagesJson<'a> {
    scenarios: Vec<ScenarioJson<'a>>,
}

#[derive(Serialize)]
struct ScenarioJson<'a> {
    name: &'a str,
    runs: usize,
    runs_wanted: usize,
    incomplete_run: bool,
    dropped_occurrences: u64,
    overlaps: &'a [Overlap],
    stages: Vec<StageJson<'a>>,
}

#[derive(Serialize)]
struct Spread {
    avg: u64,
    min: u64,
    max: u64,
}

#[derive(Serialize)]
struct StageJson<'a> {
    name: &'a str,
    stage: &'a str,
    occurrence: u32,
    parent: Option<&'a str>,
    depth: usize,
    duration_ns: Option<Summary>,
    start_offset_ns: Option<Spread>,
    end_offset_ns: Option<Spread>,
    per_run_ns: Vec<Option<u64>>,
    missing_runs: Vec<usize>,
}

fn spread_json(values: &[u64]) -> Option<Spread> {
    Summary::of(values).map(|s| Spread {
        avg: s.avg,
        min: s.min,
        max: s.max,
    })
}

/// `stages.json`.
pub fn render_json(results: &[StagesResult]) -> String {
    let scenarios = results
        .iter()
        .map(|r| ScenarioJson {
            name: &r.scenario,
            runs: r.runs,
            runs_wanted: r.runs_wanted,
            incomplete_run: r.incomplete_run,
            dropped_occurrences: r.dropped_occurrences,
            overlaps: &r.overlaps,
            stages: r
                .stages
                .iter()
                .map(|s| StageJson {
                    name: &s.name,
                    stage: &s.stage,
                    occurrence: s.occurrence,
                    parent: s.parent.map(|p| r.stages[p].name.as_str()),
                    depth: s.depth,
                    duration_ns: Summary::of(&s.durations()),
                    start_offset_ns: spread_json(&s.starts()),
                    end_offset_ns: spread_json(&s.ends()),
                    per_run_ns: s
                        .per_run
                        .iter()
                        .map(|iv| iv.map(|iv| iv.duration_ns()))
                        .collect(),
                    missing_runs: s.missing_runs(),
                })
                .collect(),
        })
        .collect();
    serde_json::to_string_pretty(&StagesJson { scenarios }).expect("stages JSON serializes") + "\n"
}
