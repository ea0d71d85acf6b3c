//! Pury-style stage timing without touching the target: a stage is a
//! function's entry..exit (`--stage NAME=FUNC`) or the entry of one
//! function to the exit of another (`--stage NAME=A..B`). A scenario is
//! measured over `--runs N` occurrences of its root stage.
//!
//! Unlike Pury, nesting is never numbered by hand: a stage's parent is the
//! smallest stage interval that contains it in a run, and across runs the
//! most frequent such parent. Intervals that overlap without nesting are
//! reported, not hidden.
//!
//! - [`spec`]: parsing `--stage`/`--scenario`/`--runs`, resolving names;
//! - [`tracker`]: [`StageTracker`], fed every traced entry/exit, one per
//!   scenario;
//! - [`render`]: `stages.txt` (Pury's layout) and `stages.json`.
mod derive;
pub mod render;
mod run;
mod spec;
mod tracker;

#[cfg(test)]
mod tests;

use serde::Serialize;

pub use spec::{ResolvedStage, StagesConfig};
pub use tracker::StageTracker;

/// A stage occurrence's start and end, as offsets from its run's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// Start offset, ns.
    pub start_ns: u64,
    /// End offset, ns.
    pub end_ns: u64,
}

impl Interval {
    /// End minus start.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// One stage of a scenario (one occurrence slot: the k-th time the stage
/// ran within a run), across all runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageResult {
    /// Display name: the stage name, with ` #k` when the stage ran more
    /// than once in some run.
    pub name: String,
    /// The stage name as given in `--stage`.
    pub stage: String,
    /// Which occurrence within a run, from 1.
    pub occurrence: u32,
    /// Derived parent, as an index into [`StagesResult::stages`].
    pub parent: Option<usize>,
    /// Derived depth: 0 for the root.
    pub depth: usize,
    /// The interval in each complete run; `None` where it did not occur.
    pub per_run: Vec<Option<Interval>>,
}

impl StageResult {
    /// Durations of the runs where the stage occurred.
    pub fn durations(&self) -> Vec<u64> {
        self.per_run
            .iter()
            .flatten()
            .map(Interval::duration_ns)
            .collect()
    }

    /// Start offsets of the runs where the stage occurred.
    pub fn starts(&self) -> Vec<u64> {
        self.per_run.iter().flatten().map(|i| i.start_ns).collect()
    }

    /// End offsets of the runs where the stage occurred.
    pub fn ends(&self) -> Vec<u64> {
        self.per_run.iter().flatten().map(|i| i.end_ns).collect()
    }

    /// Runs (numbered from 1) where the stage did not occur.
    pub fn missing_runs(&self) -> Vec<usize> {
        (1..=self.per_run.len())
            .filter(|r| self.per_run[r - 1].is_none())
            .collect()
    }
}

/// Two stages that overlap without nesting: `stage` starts inside
/// `starts_inside` and ends after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The stage that starts later and ends later.
    pub stage: String,
    /// The stage it starts inside of.
    pub starts_inside: String,
    /// In how many runs this happened.
    pub count: u64,
}

/// Everything measured for one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagesResult {
    /// Scenario name: its root stage's name.
    pub scenario: String,
    /// `--runs`.
    pub runs_wanted: usize,
    /// Complete runs measured.
    pub runs: usize,
    /// Stages in report order: the root first, then depth-first with
    /// children in start order. Empty when no run completed.
    pub stages: Vec<StageResult>,
    /// Overlap that is not nesting.
    pub overlaps: Vec<Overlap>,
    /// A run had started but not ended when recording stopped; it is not
    /// counted.
    pub incomplete_run: bool,
    /// Occurrences beyond the per-run limit, not measured.
    pub dropped_occurrences: u64,
    /// CLOCK_MONOTONIC at the start of each complete run.
    pub run_starts_ns: Vec<u64>,
}

/// Avg/min/max/p50/p95 of a set of values (nearest-rank percentiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Mean, rounded down.
    pub avg: u64,
    /// Smallest.
    pub min: u64,
    /// Largest.
    pub max: u64,
    /// Median (nearest rank).
    pub p50: u64,
    /// 95th percentile (nearest rank).
    pub p95: u64,
}

impl Summary {
    /// Summarises `values`; `None` when empty.
    pub fn of(values: &[u64]) -> Option<Summary> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let rank = |p: usize| v[(v.len() * p).div_ceil(100).max(1) - 1];
        let sum: u128 = v.iter().map(|&x| x as u128).sum();
        Some(Summary {
            avg: (sum / v.len() as u128) as u64,
            min: v[0],
            max: v[v.len() - 1],
            p50: rank(50),
            p95: rank(95),
        })
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn summary_uses_nearest_rank() {
        assert_eq!(Summary::of(&[]), None);
        let s = Summary::of(&[5]).unwrap();
        assert_eq!((s.avg, s.min, s.max, s.p50, s.p95), (5, 5, 5, 5, 5));
        let s = Summary::of(&[3, 1, 2, 4]).unwrap();
        assert_eq!((s.avg, s.min, s.max, s.p50, s.p95), (2, 1, 4, 2, 4));
        let v: Vec<u64> = (1..=100).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!((s.p50, s.p95), (50, 95));
    }
}
