//! Benchmarks a and b: the cost of one traced call (entry + exit), against
//! bpftrace on the same fixture in the same run.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::median;
use super::run::{run, Run, With};

/// One fixture build measured untraced and under each tracer.
pub struct Case {
    pub label: &'static str,
    pub untraced: Result<f64>,
    pub tracers: Vec<(&'static str, Result<Traced>)>,
}

pub struct Traced {
    pub ns_per_iter: f64,
    /// Calls seen by the tracer and calls made, from the last run.
    pub calls: Option<(u64, u64)>,
    /// Largest lost_events over the runs (profiler only).
    pub lost: Option<u64>,
}

/// Calls per fixture iteration: mid once, leaf twice.
const CALLS_PER_ITER: f64 = 3.0;

/// Measure `bin` untraced, under the profiler and under bpftrace.
pub fn measure(label: &'static str, bin: &Path, iters: u64, repeat: usize, work: &Path) -> Case {
    let args = vec![iters.to_string()];
    eprintln!("bench: per-call cost, {label}, {iters} iterations x {repeat}");
    let untraced = repeated(repeat, || run(bin, &args, With::Nothing)).map(|t| t.ns_per_iter);
    let out = work.join(format!(
        "prof-{}",
        label.split_whitespace().next().unwrap_or("x")
    ));
    // Both exit-probe mechanisms, side by side: a uprobe on each `ret`
    // (the stack is left alone) and a return uprobe (it rewrites the
    // return address, like bpftrace's uretprobe).
    let profiler = |how: &str| {
        let extra = ["--exit-probes".to_string(), how.to_string()];
        repeated(repeat, || {
            run(
                bin,
                &args,
                With::Profiler {
                    out: out.clone(),
                    extra: &extra,
                },
            )
        })
    };
    let ret = profiler("ret");
    let uretprobe = profiler("uretprobe");
    let bpftrace = repeated(repeat, || run(bin, &args, With::Bpftrace));
    Case {
        label,
        untraced,
        tracers: vec![
            ("profiler, ret sites", ret),
            ("profiler, uretprobe", uretprobe),
            ("bpftrace", bpftrace),
        ],
    }
}

/// uftrace (mcount) on the `-pg` build, with the nop build's untraced time as
/// the baseline: both are the same code but for the entry hook.
pub fn measure_uftrace(bin: &Path, iters: u64, repeat: usize, work: &Path) -> Result<Traced> {
    let args = vec![iters.to_string()];
    eprintln!("bench: per-call cost, uftrace on the mcount build");
    repeated(repeat, || {
        run(
            bin,
            &args,
            With::Uftrace {
                dir: work.join("uftrace.data"),
            },
        )
    })
}

fn repeated(repeat: usize, mut f: impl FnMut() -> Result<Run>) -> Result<Traced> {
    let mut times = Vec::new();
    let mut calls = None;
    let mut lost: Option<u64> = None;
    for _ in 0..repeat.max(1) {
        let r = f().inspect_err(|e| eprintln!("bench: run failed: {e:#}"))?;
        times.push(r.get("ns_per_iter"));
        calls = r.seen_calls.map(|seen| (seen, r.expected_calls()));
        if let Some(l) = r.lost {
            lost = Some(lost.unwrap_or(0).max(l));
        }
    }
    Ok(Traced {
        ns_per_iter: median(times),
        calls,
        lost,
    })
}

/// Cost of one traced call in µs, given the traced and untraced ns/iteration.
pub fn cost_us(traced: f64, untraced: f64) -> f64 {
    (traced - untraced) / CALLS_PER_ITER / 1000.0
}

/// Markdown rows for the per-call table.
pub fn rows(cases: &[Case], uftrace: Option<(&Result<Traced>, f64)>) -> String {
    let mut s = String::from(
        "| fixture (probe site) | tracer | ns / iteration (3 calls) | cost / call, entry + exit | vs bpftrace | calls seen / made | lost events |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for case in cases {
        let base = match &case.untraced {
            Ok(ns) => {
                writeln!(s, "| {} | none | {ns:.1} | — | — | — | — |", case.label).unwrap();
                *ns
            }
            Err(e) => {
                writeln!(
                    s,
                    "| {} | none | error: {} | | | | |",
                    case.label,
                    one_line(e)
                )
                .unwrap();
                continue;
            }
        };
        let bpf_cost = case
            .tracers
            .iter()
            .find(|(n, _)| *n == "bpftrace")
            .and_then(|(_, r)| r.as_ref().ok())
            .map(|t| cost_us(t.ns_per_iter, base));
        for (name, r) in &case.tracers {
            match r {
                Ok(t) => {
                    let c = cost_us(t.ns_per_iter, base);
                    let ratio = bpf_cost.map_or("—".into(), |b| format!("{:.2}×", c / b));
                    writeln!(
                        s,
                        "| {} | {name} | {:.1} | {c:.3} µs | {ratio} | {} | {} |",
                        case.label,
                        t.ns_per_iter,
                        calls_cell(t.calls),
                        t.lost.map_or("—".into(), |l| l.to_string()),
                    )
                    .unwrap();
                }
                Err(e) => writeln!(
                    s,
                    "| {} | {name} | error: {} | | | | |",
                    case.label,
                    one_line(e)
                )
                .unwrap(),
            }
        }
    }
    if let Some((r, base)) = uftrace {
        match r {
            Ok(t) => writeln!(
                s,
                "| `-pg` mcount call (baseline: nop build untraced) | uftrace record | {:.1} | {:.3} µs | — | — | — |",
                t.ns_per_iter,
                cost_us(t.ns_per_iter, base)
            )
            .unwrap(),
            Err(e) => writeln!(s, "| `-pg` mcount call | uftrace record | error: {} | | | | |", one_line(e)).unwrap(),
        }
    }
    s
}

fn calls_cell(calls: Option<(u64, u64)>) -> String {
    match calls {
        Some((seen, made)) if seen == made => format!("{seen} / {made} ✓"),
        Some((seen, made)) => format!("**{seen} / {made}**"),
        None => "—".into(),
    }
}

/// The first line of an error chain, for a table cell.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .replace('|', "/")
}
