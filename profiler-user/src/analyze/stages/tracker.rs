//! [`StageTracker`]: turns the entry/exit stream into stage intervals, one
//! run per occurrence of the scenario's root stage, and derives nesting.
//!
//! Rules:
//! - `NAME=FUNC` (start and end function equal) starts at the outermost
//!   entry of FUNC on a thread and ends at that thread's matching
//!   outermost exit; recursion never starts it twice. While it is open,
//!   calls on other threads are ignored.
//! - `NAME=A..B` starts at an entry of A (if not already open) and ends at
//!   an outermost exit of B, on any thread.
//! - A run lasts from the root stage's start to its end. Other stages are
//!   only measured inside a run; one still open when the run ends is
//!   reported as overlapping the root and not timed.
//! - An exit with no traced entry (the call began before probes were live)
//!   counts as outermost.
use std::collections::HashMap;

use super::{
    run::{ActiveRun, Occ, Open},
    Interval, ResolvedStage, StagesResult,
};

/// Occurrences of one stage measured per run; later ones are only counted.
pub const MAX_OCCURRENCES: u32 = 64;

/// Measures one scenario. Feed it every traced entry and exit, in order.
#[derive(Debug)]
pub struct StageTracker {
    stages: Vec<ResolvedStage>,
    root: usize,
    runs_wanted: usize,
    funcs: Vec<u32>,
    depth: HashMap<(u32, u32), u32>,
    run: Option<ActiveRun>,
    runs: Vec<ActiveRun>,
    dropped: u64,
}

impl StageTracker {
    /// A tracker for the scenario rooted at `stages[scenario_root]`,
    /// complete after `runs_wanted` runs. Every stage is measured inside the
    /// root's runs; stages that never occur there are left out.
    pub fn new(stages: Vec<ResolvedStage>, scenario_root: usize, runs_wanted: usize) -> Self {
        assert!(scenario_root < stages.len(), "scenario root out of range");
        let mut funcs: Vec<u32> = stages
            .iter()
            .flat_map(|s| [s.start_func, s.end_func])
            .collect();
        funcs.sort_unstable();
        funcs.dedup();
        StageTracker {
            stages,
            root: scenario_root,
            runs_wanted: runs_wanted.max(1),
            funcs,
            depth: HashMap::new(),
            run: None,
            runs: Vec::new(),
            dropped: 0,
        }
    }

    /// True once `runs_wanted` runs are complete; later events are ignored.
    pub fn done(&self) -> bool {
        self.runs.len() >= self.runs_wanted
    }

    /// A function entry.
    pub fn on_entry(&mut self, tid: u32, func: u32, ts_ns: u64) {
        if self.done() || self.funcs.binary_search(&func).is_err() {
            return;
        }
        let d = self.depth.entry((tid, func)).or_default();
        let outermost = *d == 0;
        *d += 1;
        let r = &self.stages[self.root];
        let root_opens = r.start_func == func && (outermost || r.start_func != r.end_func);
        if self.run.is_none() && root_opens {
            self.run = Some(ActiveRun {
                start_ns: ts_ns,
                tid,
                open: vec![None; self.stages.len()],
                counts: vec![0; self.stages.len()],
                occs: Vec::new(),
                abandoned: Vec::new(),
                seq: 1,
            });
        }
        let Some(run) = self.run.as_mut() else {
            return;
        };
        for (i, s) in self.stages.iter().enumerate() {
            let opens = s.start_func == func && (outermost || s.start_func != s.end_func);
            if i == self.root || !opens || run.open[i].is_some() {
                continue;
            }
            if run.counts[i] >= MAX_OCCURRENCES {
                self.dropped += 1;
                continue;
            }
            run.open[i] = Some(Open {
                tid,
                start_ns: ts_ns,
                occ: run.counts[i],
                seq: run.seq,
            });
            run.counts[i] += 1;
            run.seq += 1;
        }
    }

    /// A function exit.
    pub fn on_exit(&mut self, tid: u32, func: u32, ts_ns: u64) {
        if self.done() || self.funcs.binary_search(&func).is_err() {
            return;
        }
        let d = self.depth.entry((tid, func)).or_default();
        let outermost = *d <= 1;
        *d = d.saturating_sub(1);
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let closes = |s: &ResolvedStage, opener: u32| {
            s.end_func == func && outermost && (s.start_func != s.end_func || opener == tid)
        };
        for (i, s) in self.stages.iter().enumerate() {
            let Some(o) = run.open[i] else { continue };
            if i == self.root || !closes(s, o.tid) {
                continue;
            }
            run.open[i] = None;
            run.occs.push(Occ {
                stage: i,
                occ: o.occ,
                seq: o.seq,
                iv: Interval {
                    start_ns: o.start_ns.saturating_sub(run.start_ns),
                    end_ns: ts_ns.saturating_sub(run.start_ns),
                },
            });
        }
        if closes(&self.stages[self.root], run.tid) {
            let mut run = self.run.take().expect("run is active");
            run.occs.push(Occ {
                stage: self.root,
                occ: 0,
                seq: 0,
                iv: Interval {
                    start_ns: 0,
                    end_ns: ts_ns.saturating_sub(run.start_ns),
                },
            });
            for i in 0..run.open.len() {
                if let Some(o) = run.open[i].take() {
                    run.abandoned.push((i, o.occ));
                }
            }
            self.runs.push(run);
        }
    }

    /// The scenario's result: intervals per run, derived nesting, overlaps.
    pub fn finish(self) -> StagesResult {
        let mut res = StagesResult {
            scenario: self.stages[self.root].name.clone(),
            runs_wanted: self.runs_wanted,
            runs: self.runs.len(),
            stages: Vec::new(),
            overlaps: Vec::new(),
            incomplete_run: self.run.is_some(),
            dropped_occurrences: self.dropped,
            run_starts_ns: self.runs.iter().map(|r| r.start_ns).collect(),
        };
        super::derive::derive(&self.stages, self.root, &self.runs, &mut res);
        res
    }
}
