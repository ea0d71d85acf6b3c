//! Benchmarks a and b: the cost of one traced call (entry + exit), against
//! bpftrace on the same fixture in the same run.
//!
//! The tracers run in interleaved rounds: each round runs the fixture once
//! untraced and once under each tracer, in an order that rotates from round
//! to round, so that the host's speed, which moves by tens of percent over
//! seconds on a shared VM, weighs on every tracer alike. Each round's ratio
//! to bpftrace is taken within the round; the table gives their median and
//! range.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::median;
use super::run::{run, Run, With};

/// One fixture build measured untraced and under each tracer.
pub struct Case {
    pub label: &'static str,
    pub untraced: Result<Traced>,
    pub tracers: Vec<(&'static str, Result<Traced>)>,
}

pub struct Traced {
    /// The median over the rounds.
    pub ns_per_iter: f64,
    /// Each round's ns per iteration, in round order (NaN: that round
    /// failed).
    pub rounds: Vec<f64>,
    /// Calls seen by the tracer and calls made, from the last run.
    pub calls: Option<(u64, u64)>,
    /// Largest lost_events over the runs (profiler only).
    pub lost: Option<u64>,
}

/// Calls per fixture iteration: mid once, leaf twice.
const CALLS_PER_ITER: f64 = 3.0;

/// The tracers of a case, in the table's order. The profiler records with
/// default options but for the governor (every hit measured), once with
/// return-site probes forced (what a program that unwinds through frames
/// gets).
const TRACERS: [&str; 3] = ["profiler, ret sites", "profiler, default", "bpftrace"];

/// Measures `bin` untraced, under the profiler (default exit probes, and
/// return sites) and under bpftrace, in `repeat` interleaved rounds.
pub fn measure(label: &'static str, bin: &Path, iters: u64, repeat: usize, work: &Path) -> Case {
    let args = vec![iters.to_string()];
    eprintln!("bench: per-call cost, {label}, {iters} iterations, {repeat} interleaved rounds");
    let out = work.join(format!(
        "prof-{}",
        label
            .split(|c: char| !c.is_ascii_alphanumeric())
            .find(|w| !w.is_empty())
            .unwrap_or("x")
    ));
    let ret_sites = ["--exit-probes".to_string(), "ret".to_string()];
    let configs = 1 + TRACERS.len();
    let mut runs: Vec<Vec<Result<Run>>> = (0..configs).map(|_| Vec::new()).collect();
    for round in 0..repeat.max(1) {
        for k in 0..configs {
            // Rotated: the config that ran first in one round runs last in
            // the next.
            let c = (k + round) % configs;
            // A config that failed once is not run again.
            if runs[c].iter().any(|r| r.is_err()) {
                continue;
            }
            let with = match c {
                0 => With::Nothing,
                1 => With::Profiler {
                    out: out.clone(),
                    extra: &ret_sites,
                },
                2 => With::Profiler {
                    out: out.clone(),
                    extra: &[],
                },
                _ => With::Bpftrace,
            };
            let r = run(bin, &args, with).inspect_err(|e| eprintln!("bench: run failed: {e:#}"));
            runs[c].push(r);
        }
    }
    let mut it = runs.into_iter().map(summarize);
    let untraced = it.next().expect("untraced runs");
    Case {
        label,
        untraced,
        tracers: TRACERS.iter().copied().zip(it).collect(),
    }
}

/// One config's runs: the first error, or their figures.
fn summarize(runs: Vec<Result<Run>>) -> Result<Traced> {
    let mut rounds = Vec::new();
    let mut calls = None;
    let mut lost: Option<u64> = None;
    for r in runs {
        let r = r?;
        rounds.push(r.get("ns_per_iter"));
        calls = r.seen_calls.map(|seen| (seen, r.expected_calls()));
        if let Some(l) = r.lost {
            lost = Some(lost.unwrap_or(0).max(l));
        }
    }
    Ok(Traced {
        ns_per_iter: median(rounds.clone()),
        rounds,
        calls,
        lost,
    })
}

/// uftrace (mcount) on the `-pg` build, with the nop build's untraced time as
/// the baseline: both are the same code but for the entry hook.
pub fn measure_uftrace(bin: &Path, iters: u64, repeat: usize, work: &Path) -> Result<Traced> {
    let args = vec![iters.to_string()];
    eprintln!("bench: per-call cost, uftrace on the mcount build");
    summarize(
        (0..repeat.max(1))
            .map(|_| {
                run(
                    bin,
                    &args,
                    With::Uftrace {
                        dir: work.join("uftrace.data"),
                    },
                )
            })
            .collect(),
    )
}

/// Cost of one traced call in µs, given the traced and untraced ns/iteration.
pub fn cost_us(traced: f64, untraced: f64) -> f64 {
    (traced - untraced) / CALLS_PER_ITER / 1000.0
}

/// `t`'s cost per call over bpftrace's, round by round (each against its
/// own round's untraced time): (median, min, max, rounds).
pub fn ratio_to(t: &Traced, bpf: &Traced, untraced: &Traced) -> Option<(f64, f64, f64, usize)> {
    let r: Vec<f64> = t
        .rounds
        .iter()
        .zip(&bpf.rounds)
        .zip(&untraced.rounds)
        .map(|((t, b), u)| cost_us(*t, *u) / cost_us(*b, *u))
        .filter(|x| x.is_finite())
        .collect();
    if r.is_empty() {
        return None;
    }
    let min = r.iter().copied().fold(f64::INFINITY, f64::min);
    let max = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((median(r.clone()), min, max, r.len()))
}

/// Markdown rows for the per-call table.
pub fn rows(cases: &[Case], uftrace: Option<(&Result<Traced>, f64)>) -> String {
    let mut s = String::from(
        "| fixture (probe site) | tracer | ns / iteration (3 calls) | cost / call, entry + exit | vs bpftrace, per round: median (min–max) | calls seen / made | lost events |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for case in cases {
        let base = match &case.untraced {
            Ok(t) => {
                writeln!(
                    s,
                    "| {} | none | {:.1} | — | — | — | — |",
                    case.label, t.ns_per_iter
                )
                .unwrap();
                t
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
        let bpf = case
            .tracers
            .iter()
            .find(|(n, _)| *n == "bpftrace")
            .and_then(|(_, r)| r.as_ref().ok());
        for (name, r) in &case.tracers {
            match r {
                Ok(t) => {
                    let c = cost_us(t.ns_per_iter, base.ns_per_iter);
                    let ratio = match bpf.and_then(|b| ratio_to(t, b, base)) {
                        Some((m, lo, hi, n)) if n > 1 => {
                            format!("{m:.2}× ({lo:.2}–{hi:.2})")
                        }
                        Some((m, ..)) => format!("{m:.2}×"),
                        None => "—".into(),
                    };
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
