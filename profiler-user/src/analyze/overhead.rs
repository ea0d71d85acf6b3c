//! The overhead governor's estimates: what the probes cost the target, from
//! hit rates and the per-hit cost measured at attach
//! (`attach/calibrate.rs`), and which functions to detach to get under
//! `--max-overhead`.
//!
//! Each function's events cost its calibrated hit cost (entry: int3 or
//! 5-byte nop; exit: return site or return uprobe). Each thread's probe
//! time is its events times the dearest hit cost in use, against the
//! window's wall time. When the worst thread is over the budget, the
//! functions that cost most in that window are detached until the excess is
//! covered (as if every hit of theirs were on that thread; if they were
//! not, the next window detaches more).
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::attach::calibrate::{EntryKind, HitCost};

/// How one probed function is observed, for its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// Return-site probes.
    Sites,
    /// A return uprobe.
    Uretprobe,
    /// No exit probe.
    None,
}

/// One function as the governor sees it.
#[derive(Debug, Clone, Copy)]
pub struct FuncCost {
    /// How its entry probe is handled (its first instruction).
    pub entry: EntryKind,
    /// How its returns are probed.
    pub exit: ExitKind,
    /// Never detached: a dispatch or stage function the session needs.
    pub protected: bool,
}

/// A function the governor detached, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Detached {
    /// Function index.
    pub func: u32,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// When its probes were gone, in ns after the session's start.
    pub at_ns: u64,
    /// When it was chosen (CLOCK_MONOTONIC): its exits with no entry from
    /// then on are calls entered after its entry probe went, not orphans.
    #[serde(default)]
    pub decided_ns: u64,
    /// Its calls per second in the window that decided.
    pub calls_per_s: f64,
    /// Its estimated probe time in that window, in % of one thread's time.
    pub overhead_pct: f64,
    /// The thread over the budget.
    pub tid: u32,
    /// That thread's estimated probe time, in % of its wall time.
    pub thread_pct: f64,
}

/// What the governor did in a session, for the reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GovernorReport {
    /// `--max-overhead`, in %.
    pub max_overhead_pct: f64,
    /// The calibrated cost of one hit.
    pub cost: HitCost,
    /// Functions detached, in order.
    pub detached: Vec<Detached>,
    /// The highest per-thread estimate seen in any window, in %.
    pub peak_pct: f64,
    /// Over budget, but every remaining hot function is protected.
    pub protected_hot: Vec<u32>,
}

/// A decision: detach these functions.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// (function, calls per second, its overhead in %).
    pub funcs: Vec<(u32, f64, f64)>,
    /// The worst thread and its estimate in %.
    pub tid: u32,
    /// Its estimated probe time, in % of its wall time.
    pub thread_pct: f64,
}

/// Hit counts between evaluations, and the budget.
#[derive(Debug)]
pub struct Estimator {
    max_pct: f64,
    /// Mean ns per event of each function.
    per_event: Vec<f64>,
    /// Events per call of each function (2 with an exit probe, else 1).
    per_call: Vec<f64>,
    protected: Vec<bool>,
    detached: Vec<bool>,
    prev_funcs: Vec<u64>,
    prev_threads: HashMap<u32, u64>,
    prev_ns: Option<u64>,
    /// The highest per-thread estimate seen, in %.
    pub peak_pct: f64,
    /// Hot functions that could not be detached (protected).
    pub protected_hot: Vec<u32>,
}

impl Estimator {
    /// A budget of `max_pct` % of each thread's time, for `funcs`.
    pub fn new(max_pct: f64, cost: HitCost, funcs: &[FuncCost]) -> Self {
        let (per_event, per_call) = funcs
            .iter()
            .map(|f| {
                let entry = match f.entry {
                    EntryKind::Step => cost.entry_ns,
                    EntryKind::Push => cost.entry_push_ns,
                    EntryKind::Nop => cost.entry_nop_ns,
                };
                match f.exit {
                    ExitKind::Sites => ((entry + cost.ret_site_ns) / 2.0, 2.0),
                    ExitKind::Uretprobe => ((entry + cost.uretprobe_ns) / 2.0, 2.0),
                    ExitKind::None => (entry, 1.0),
                }
            })
            .unzip();
        Estimator {
            max_pct,
            per_event,
            per_call,
            protected: funcs.iter().map(|f| f.protected).collect(),
            detached: vec![false; funcs.len()],
            prev_funcs: vec![0; funcs.len()],
            prev_threads: HashMap::new(),
            prev_ns: None,
            peak_pct: 0.0,
            protected_hot: Vec::new(),
        }
    }

    /// The dearest per-event cost among the functions still probed.
    fn thread_hit_ns(&self) -> f64 {
        self.per_event
            .iter()
            .zip(&self.detached)
            .filter(|(_, d)| !**d)
            .map(|(c, _)| *c)
            .fold(0.0, f64::max)
    }

    /// Evaluates the window since the last call at `now_ns`, given the
    /// cumulative events of every function and of every live thread.
    /// Returns the functions to detach, if the worst thread is over budget.
    pub fn evaluate(
        &mut self,
        now_ns: u64,
        func_events: &[u64],
        threads: impl Iterator<Item = (u32, u64)>,
    ) -> Option<Decision> {
        let threads: Vec<(u32, u64)> = threads.collect();
        let prev_ns = self.prev_ns.replace(now_ns);
        let deltas: Vec<u64> = func_events
            .iter()
            .zip(&self.prev_funcs)
            .map(|(n, p)| n.saturating_sub(*p))
            .collect();
        self.prev_funcs = func_events.to_vec();
        // Events of functions already detached cost nothing from now on.
        let gone: u64 = deltas
            .iter()
            .zip(&self.detached)
            .filter(|(_, d)| **d)
            .map(|(n, _)| n)
            .sum();
        let mut worst = (0u32, 0u64);
        let mut seen = HashMap::with_capacity(threads.len());
        for (tid, events) in threads {
            let d = events
                .saturating_sub(self.prev_threads.get(&tid).copied().unwrap_or(0))
                .saturating_sub(gone);
            if d > worst.1 {
                worst = (tid, d);
            }
            seen.insert(tid, events);
        }
        self.prev_threads = seen;
        let window = now_ns.saturating_sub(prev_ns?) as f64;
        if window <= 0.0 {
            return None;
        }
        let thread_pct = worst.1 as f64 * self.thread_hit_ns() / window * 100.0;
        self.peak_pct = self.peak_pct.max(thread_pct);
        if thread_pct <= self.max_pct {
            return None;
        }
        let mut excess = (thread_pct - self.max_pct) / 100.0 * window;
        let mut hot: Vec<(usize, f64)> = deltas
            .iter()
            .enumerate()
            .filter(|&(i, &d)| d > 0 && !self.detached[i])
            .map(|(i, &d)| (i, d as f64 * self.per_event[i]))
            .collect();
        hot.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut funcs = Vec::new();
        for (i, cost) in hot {
            if excess <= 0.0 {
                break;
            }
            if self.protected[i] {
                if !self.protected_hot.contains(&(i as u32)) {
                    self.protected_hot.push(i as u32);
                }
                continue;
            }
            self.detached[i] = true;
            excess -= cost;
            let calls_per_s = deltas[i] as f64 / self.per_call[i] / window * 1e9;
            funcs.push((i as u32, calls_per_s, cost / window * 100.0));
        }
        (!funcs.is_empty()).then_some(Decision {
            funcs,
            tid: worst.0,
            thread_pct,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COST: HitCost = HitCost {
        entry_ns: 4000.0,
        entry_push_ns: 1000.0,
        entry_nop_ns: 300.0,
        ret_site_ns: 4000.0,
        uretprobe_ns: 2000.0,
    };

    fn func(exit: ExitKind) -> FuncCost {
        FuncCost {
            entry: EntryKind::Step,
            exit,
            protected: false,
        }
    }

    #[test]
    fn the_hottest_function_goes_first_and_only_as_many_as_needed() {
        let funcs = [func(ExitKind::Sites); 3];
        let mut e = Estimator::new(5.0, COST, &funcs);
        assert_eq!(e.evaluate(0, &[0, 0, 0], [(1, 0)].into_iter()), None);
        // 250 ms: f0 50,000 events (200 ms of probes), f1 100 (0.4 ms), f2 none.
        let d = e
            .evaluate(250_000_000, &[50_000, 100, 0], [(1, 50_100)].into_iter())
            .expect("over budget");
        assert_eq!(d.funcs.len(), 1);
        assert_eq!(d.funcs[0].0, 0);
        assert!((d.funcs[0].1 - 100_000.0).abs() < 1.0, "{d:?}");
        assert!((d.funcs[0].2 - 80.0).abs() < 0.01, "{d:?}");
        assert_eq!(d.tid, 1);
        assert!((d.thread_pct - 80.16).abs() < 0.01, "{d:?}");
        // Next window: f0's last events before its probes went, and f1's:
        // f0 no longer counts, f1 is 0.16% < 5%: nothing more.
        assert_eq!(
            e.evaluate(500_000_000, &[80_000, 200, 0], [(1, 80_200)].into_iter()),
            None
        );
        assert!((e.peak_pct - 80.16).abs() < 0.01);
    }

    #[test]
    fn protected_functions_stay_and_are_named() {
        let mut funcs = [func(ExitKind::Sites); 2];
        funcs[0].protected = true;
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0, 0], std::iter::empty());
        let d = e
            .evaluate(
                1_000_000_000,
                &[100_000, 50_000],
                [(7, 150_000)].into_iter(),
            )
            .expect("over budget");
        assert_eq!(d.funcs.iter().map(|f| f.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(e.protected_hot, vec![0]);
    }

    #[test]
    fn nop_entries_and_entry_only_functions_cost_less() {
        let funcs = [
            FuncCost {
                entry: EntryKind::Nop,
                exit: ExitKind::Uretprobe,
                protected: false,
            },
            func(ExitKind::None),
            FuncCost {
                entry: EntryKind::Push,
                exit: ExitKind::Sites,
                protected: false,
            },
        ];
        let e = Estimator::new(10.0, COST, &funcs);
        assert_eq!(e.per_event, vec![1150.0, 4000.0, 2500.0]);
        assert_eq!(e.per_call, vec![2.0, 1.0, 2.0]);
        assert_eq!(e.thread_hit_ns(), 4000.0);
    }
}
