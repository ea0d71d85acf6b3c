//! The overhead governor's estimates: what the probes cost the target, from
//! hit rates and the per-hit cost measured at attach
//! (`attach/calibrate.rs`), and which functions to detach to get under
//! `--max-overhead`.
//!
//! Each function's events cost its calibrated hit cost (entry: int3 or
//! 5-byte nop; exit: return site or return uprobe). Each thread's probe
//! time is its events times the window's mean cost per event (over every
//! function's events in the window), against the thread's own CPU time in
//! the window: probe hits run on the thread's CPU time, so a share `p` of
//! it in probes makes each request cost `1 / (1 - p)` times its CPU, and a
//! saturated thread serves `1 - p` of its untraced rate. A thread idle most
//! of the window is held against [`BUSY_FLOOR`] of the wall time instead,
//! so that a few hits on an idle thread do not count as a large share. When
//! the worst thread is over the budget, the functions that cost most in that
//! window are detached until the excess is covered (as if every hit of
//! theirs were on that thread; if they were not, the next window detaches
//! more).
//!
//! A detach in the first [`HOLD_UNTIL_NS`] after attach holds the next one
//! until then: the windows meanwhile are judged as they come, and what
//! they decide is detached in one round at the hold's end. A program
//! runs its phases one after another (an asyncio app's ticker, then a
//! stall on the CPU, then one asleep), each with functions of its own, and
//! 50-ms windows judged apart detached a phase's hot functions one round
//! at a time: six rounds of 93 functions in 1.4 s on python3.11, each round
//! rewriting the target's code while every probe hit waited for it
//! (issue 44, item 9). Held, they are two rounds.
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

/// A thread idle for most of a window is held against this share of the
/// window's wall time rather than its CPU time.
pub const BUSY_FLOOR: f64 = 0.05;

/// The shortest window the floor is taken of: a short window (the
/// governor's first ones) holds an idle thread against as much as a
/// 250-ms one would, so that a burst on a thread otherwise idle is not
/// taken for a hot function. A thread busy through a short window is held
/// against its CPU time as always.
pub const FLOOR_WINDOW_NS: f64 = 250e6;

/// After a detach this soon after attach (the estimator's first
/// evaluation), the next waits until this long after attach, with every
/// function the windows meanwhile chose.
pub const HOLD_UNTIL_NS: u64 = 2_500_000_000;

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
    /// Since the last detach (or attach): the busiest thread's estimated
    /// probe time over its CPU time, summed over windows, in %.
    #[serde(default)]
    pub settled_pct: f64,
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
    /// Its estimated probe time, in % of its CPU time.
    pub thread_pct: f64,
}

/// One live thread at an evaluation: cumulative counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadSample {
    pub tid: u32,
    /// Its events so far.
    pub events: u64,
    /// Its CPU time so far in ns, if known (else the wall time is used).
    pub cpu_ns: Option<u64>,
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
    prev_threads: HashMap<u32, (u64, Option<u64>)>,
    prev_ns: Option<u64>,
    /// The first evaluation (attach).
    start_ns: Option<u64>,
    /// No detach before this (a detach soon after attach:
    /// [`HOLD_UNTIL_NS`]); what is decided meanwhile waits in `pending`.
    hold_until_ns: u64,
    /// How long after attach a detach holds the next ([`HOLD_UNTIL_NS`];
    /// 0: never held, [`Estimator::without_hold`]).
    hold_ns: u64,
    pending: Option<Decision>,
    /// The highest per-thread estimate seen, in %.
    pub peak_pct: f64,
    /// Since the last detach: the worst thread's probe ns and CPU ns.
    settled: (f64, f64),
    /// Hot functions that could not be detached (protected).
    pub protected_hot: Vec<u32>,
}

impl Estimator {
    /// A budget of `max_pct` % of each thread's time, for `funcs`.
    pub fn new(max_pct: f64, cost: HitCost, funcs: &[FuncCost]) -> Self {
        let (per_event, per_call) = funcs
            .iter()
            .map(|f| {
                let entry = cost.entry_cost(f.entry);
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
            start_ns: None,
            hold_until_ns: 0,
            hold_ns: HOLD_UNTIL_NS,
            pending: None,
            peak_pct: 0.0,
            settled: (0.0, 0.0),
            protected_hot: Vec::new(),
        }
    }

    /// An estimator whose every decision is detached at once, none held
    /// ([`HOLD_UNTIL_NS`]). A held decision's functions count as detached
    /// while their probes are still on (their hits are taken for gone, so
    /// the estimate reads them as free until the hold ends): `watch`'s
    /// escalation, whose traced stalls last a fraction of the hold, would
    /// run one whole at full probe cost, estimated as next to nothing.
    pub fn without_hold(mut self) -> Self {
        self.hold_ns = 0;
        self
    }

    /// Since the last detach: the worst thread's estimated probe time over
    /// its CPU time, in % (0 before any window with hits).
    pub fn settled_pct(&self) -> f64 {
        match self.settled {
            (_, d) if d <= 0.0 => 0.0,
            (p, d) => p / d * 100.0,
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
        threads: impl Iterator<Item = ThreadSample>,
    ) -> Option<Decision> {
        let start_ns = *self.start_ns.get_or_insert(now_ns);
        let decided = self.judge(now_ns, func_events, threads);
        if now_ns < self.hold_until_ns {
            // Held: decided, but detached with the rest at the hold's end
            // (its functions' events count as gone meanwhile, as they
            // would once detached).
            if let Some(d) = decided {
                match &mut self.pending {
                    Some(p) => {
                        p.funcs.extend(d.funcs);
                        if d.thread_pct > p.thread_pct {
                            (p.tid, p.thread_pct) = (d.tid, d.thread_pct);
                        }
                    }
                    None => self.pending = Some(d),
                }
            }
            return None;
        }
        let decided = match (self.pending.take(), decided) {
            (Some(mut p), Some(d)) => {
                p.funcs.extend(d.funcs);
                (p.tid, p.thread_pct) = (d.tid, d.thread_pct);
                Some(p)
            }
            (p, d) => p.or(d),
        };
        if decided.is_some() && now_ns.saturating_sub(start_ns) < self.hold_ns {
            self.hold_until_ns = start_ns + self.hold_ns;
        }
        decided
    }

    /// The window since the last call: the functions to detach, if the
    /// worst thread is over budget (marked detached from now on).
    fn judge(
        &mut self,
        now_ns: u64,
        func_events: &[u64],
        threads: impl Iterator<Item = ThreadSample>,
    ) -> Option<Decision> {
        let threads: Vec<ThreadSample> = threads.collect();
        let prev_ns = self.prev_ns.replace(now_ns);
        let deltas: Vec<u64> = func_events
            .iter()
            .zip(&self.prev_funcs)
            .map(|(n, p)| n.saturating_sub(*p))
            .collect();
        self.prev_funcs = func_events.to_vec();
        // Events of functions already detached cost nothing from now on.
        let (mut gone, mut live, mut live_ns) = (0u64, 0u64, 0.0);
        for (i, &d) in deltas.iter().enumerate() {
            match self.detached[i] {
                true => gone += d,
                false => {
                    live += d;
                    live_ns += d as f64 * self.per_event[i];
                }
            }
        }
        let per_event = match live {
            0 => self.thread_hit_ns(),
            n => live_ns / n as f64,
        };
        let window = prev_ns.map_or(0, |p| now_ns.saturating_sub(p)) as f64;
        // (tid, probe ns, the time it is held against)
        let mut worst = (0u32, 0.0, 1.0);
        let mut seen = HashMap::with_capacity(threads.len());
        for t in threads {
            let (events, cpu) = self.prev_threads.get(&t.tid).copied().unwrap_or((0, None));
            let d = t.events.saturating_sub(events).saturating_sub(gone);
            let cpu_ns = match (t.cpu_ns, cpu) {
                (Some(now), Some(then)) => now.saturating_sub(then) as f64,
                _ => window,
            };
            let probe_ns = d as f64 * per_event;
            let held = cpu_ns
                .min(window)
                .max(BUSY_FLOOR * window.max(FLOOR_WINDOW_NS));
            if probe_ns / held > worst.1 / worst.2 {
                worst = (t.tid, probe_ns, held);
            }
            seen.insert(t.tid, (t.events, t.cpu_ns));
        }
        self.prev_threads = seen;
        if window <= 0.0 {
            return None;
        }
        let (tid, probe_ns, held) = worst;
        // A thread spends at most all its time in probes: an estimate past
        // it (hits dearer at calibration than here) would ask to detach
        // more than every probe it hit.
        let probe_ns = probe_ns.min(held);
        self.settled.0 += probe_ns;
        self.settled.1 += held;
        let thread_pct = probe_ns / held * 100.0;
        self.peak_pct = self.peak_pct.max(thread_pct);
        if thread_pct <= self.max_pct {
            return None;
        }
        // Detaching R ns of probes takes R off the CPU time too:
        // (P - R) <= b (C - R) when R >= (P - b C) / (1 - b).
        let b = (self.max_pct / 100.0).min(0.99);
        let mut excess = (probe_ns - b * held) / (1.0 - b);
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
            funcs.push((i as u32, calls_per_s, cost / held * 100.0));
        }
        if funcs.is_empty() {
            return None;
        }
        self.settled = (0.0, 0.0);
        Some(Decision {
            funcs,
            tid,
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
        entry_endbr_ns: 4000.0,
        entry_nopl_ns: 4000.0,
        ret_site_ns: 4000.0,
        uretprobe_ns: 2000.0,
        inside_ns: [0.0; 6],
        inside_spread_pct: 0.0,
    };

    /// Threads whose CPU time is unknown: held against the wall time.
    fn wall(t: &[(u32, u64)]) -> impl Iterator<Item = ThreadSample> + '_ {
        t.iter().map(|&(tid, events)| ThreadSample {
            tid,
            events,
            cpu_ns: None,
        })
    }

    /// Threads with their CPU time so far.
    fn cpu(t: &[(u32, u64, u64)]) -> impl Iterator<Item = ThreadSample> + '_ {
        t.iter().map(|&(tid, events, cpu_ns)| ThreadSample {
            tid,
            events,
            cpu_ns: Some(cpu_ns),
        })
    }

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
        assert_eq!(e.evaluate(0, &[0, 0, 0], wall(&[(1, 0)])), None);
        // 250 ms: f0 50,000 events (200 ms of probes), f1 100 (0.4 ms), f2 none.
        let d = e
            .evaluate(250_000_000, &[50_000, 100, 0], wall(&[(1, 50_100)]))
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
            e.evaluate(500_000_000, &[80_000, 200, 0], wall(&[(1, 80_200)])),
            None
        );
        assert!((e.peak_pct - 80.16).abs() < 0.01);
    }

    #[test]
    fn a_detach_soon_after_attach_holds_the_next_until_one_window_covers_the_rest() {
        // f0 at 20% of a busy thread in the first 250 ms (12,500 events at
        // 4 µs) goes at once. Then two phases, 0.25-0.5 s and 0.5-0.75 s,
        // each spent in the probes of a function of its own (12,500
        // events every 50 ms): not judged apart, but in one window up to
        // 2.5 s, where both go in one round (250 ms each of 2.25 s: one
        // alone leaves the thread over 10%).
        let funcs = [func(ExitKind::Sites); 3];
        let mut e = Estimator::new(10.0, COST, &funcs);
        let ms = 1_000_000;
        e.evaluate(0, &[0, 0, 0], cpu(&[(1, 0, 0)]));
        let first = e
            .evaluate(250 * ms, &[12_500, 0, 0], cpu(&[(1, 12_500, 250 * ms)]))
            .expect("f0 over budget");
        assert_eq!(first.funcs.iter().map(|f| f.0).collect::<Vec<_>>(), [0]);
        let mut t = 250;
        let mut counts = [12_500u64, 0, 0];
        while t < 2_500 {
            t += 50;
            if t <= 500 {
                counts[1] += 12_500;
            } else if t <= 750 {
                counts[2] += 12_500;
            }
            let events = counts.iter().sum();
            let d = e.evaluate(t * ms, &counts, cpu(&[(1, events, t * ms)]));
            match t {
                2_500 => {
                    let d = d.expect("one round at the end of the hold");
                    assert_eq!(d.funcs.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 2]);
                }
                _ => assert_eq!(d, None, "held at {t} ms"),
            }
        }
        // After the hold, windows are judged as they come.
        let events: u64 = counts.iter().sum();
        assert_eq!(
            e.evaluate(2_550 * ms, &counts, cpu(&[(1, events, 2_550 * ms)])),
            None
        );
    }

    #[test]
    fn without_hold_a_stall_hot_after_a_first_detach_is_seen_and_detached_at_once() {
        // Escalation of python3.11's asyncio app, as measured: f0 (the
        // evaluator) over budget in the ticker's first window goes at
        // once; a second later a stall spends 96% of the thread in f1's
        // and f2's probes (4,800 events each per 100 ms at 10 µs an event).
        // Held, f1 and f2 were chosen but their hits read as gone until
        // 2.5 s: the estimate said 0% through the whole stall.
        let funcs = [func(ExitKind::Sites); 3];
        let ms = 1_000_000;
        let cost = HitCost {
            entry_ns: 10_000.0,
            ret_site_ns: 10_000.0,
            ..COST
        };
        for hold in [true, false] {
            let mut e = Estimator::new(10.0, cost, &funcs);
            if !hold {
                e = e.without_hold();
            }
            e.evaluate(0, &[0, 0, 0], cpu(&[(1, 0, 0)]));
            let first = e.evaluate(50 * ms, &[2_000, 0, 0], cpu(&[(1, 2_000, 50 * ms)]));
            assert_eq!(first.expect("f0 over budget").funcs[0].0, 0);
            let mut counts = [2_000u64, 0, 0];
            let mut detached = Vec::new();
            for t in (1_000..=1_200).step_by(20) {
                if detached.is_empty() {
                    counts[1] += 960;
                    counts[2] += 960;
                }
                let events = counts.iter().sum();
                if let Some(d) = e.evaluate(t * ms, &counts, cpu(&[(1, events, t * ms)])) {
                    detached.extend(d.funcs.iter().map(|f| f.0));
                }
            }
            match hold {
                true => assert!(detached.is_empty(), "{detached:?}"),
                false => assert_eq!(detached, [1, 2]),
            }
        }
    }

    #[test]
    fn an_estimate_past_all_the_threads_time_detaches_only_what_it_hit() {
        // 250 ms of CPU, f0 80,000 events at 4 µs (320 ms: past the whole
        // window), f1 one event: f0 alone covers everything the thread did.
        let funcs = [func(ExitKind::Sites); 2];
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0, 0], wall(&[(1, 0)]));
        let d = e
            .evaluate(250_000_000, &[80_000, 1], wall(&[(1, 80_001)]))
            .expect("over budget");
        assert_eq!(d.funcs.iter().map(|f| f.0).collect::<Vec<_>>(), vec![0]);
        assert!((d.thread_pct - 100.0).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn protected_functions_stay_and_are_named() {
        let mut funcs = [func(ExitKind::Sites); 2];
        funcs[0].protected = true;
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0, 0], std::iter::empty());
        let d = e
            .evaluate(1_000_000_000, &[100_000, 50_000], wall(&[(7, 150_000)]))
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

    #[test]
    fn a_thread_busy_a_fifth_of_the_time_is_held_against_its_cpu_time() {
        // A server thread on the CPU 20% of the time (200 ms of each
        // second), 10,000 probe events/s at 4 µs: 40 ms of probes, 4% of
        // the wall time but 20% of its CPU time: over a 10% budget.
        let funcs = [func(ExitKind::Sites); 2];
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0, 0], cpu(&[(3, 0, 0)]));
        let d = e
            .evaluate(
                1_000_000_000,
                &[8_000, 2_000],
                cpu(&[(3, 10_000, 200_000_000)]),
            )
            .expect("20% of its CPU time");
        assert!((d.thread_pct - 20.0).abs() < 1e-9, "{d:?}");
        // R >= (40 - 0.1 * 200) / 0.9 = 22.2 ms: f0 (32 ms) covers it.
        assert_eq!(d.funcs.iter().map(|f| f.0).collect::<Vec<_>>(), vec![0]);
        assert!((d.funcs[0].2 - 16.0).abs() < 1e-9, "{d:?}");
        // The same hits held against the wall time: 4%, under budget.
        let mut w = Estimator::new(10.0, COST, &funcs);
        w.evaluate(0, &[0, 0], wall(&[(3, 0)]));
        assert_eq!(
            w.evaluate(1_000_000_000, &[8_000, 2_000], wall(&[(3, 10_000)])),
            None
        );
    }

    #[test]
    fn detaching_counts_the_cpu_time_it_gives_back() {
        // Ten functions of 2 ms each in a 100 ms window of CPU: 20 ms of
        // probes, 20%. Under 10% needs (P - R) <= 0.1 (C - R): R >= 11.1 ms,
        // six functions, not the five that 10 ms of excess would suggest.
        let funcs = [func(ExitKind::None); 10];
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0; 10], cpu(&[(1, 0, 0)]));
        let d = e
            .evaluate(500_000_000, &[500; 10], cpu(&[(1, 5_000, 100_000_000)]))
            .expect("over budget");
        assert!((d.thread_pct - 20.0).abs() < 1e-9, "{d:?}");
        assert_eq!(d.funcs.len(), 6, "{d:?}");
    }

    #[test]
    fn an_idle_thread_is_held_against_a_floor_of_the_wall_time() {
        // 1 s window, the thread on the CPU 1 ms; 100 events at 4 µs:
        // 0.4 ms, 40% of its CPU but 0.8% of the 50 ms floor.
        let funcs = [func(ExitKind::Sites)];
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0], cpu(&[(1, 0, 0)]));
        assert_eq!(
            e.evaluate(1_000_000_000, &[100], cpu(&[(1, 100, 1_000_000)])),
            None
        );
        assert!((e.peak_pct - 0.8).abs() < 1e-9, "{}", e.peak_pct);
    }

    #[test]
    fn a_short_window_detaches_a_busy_threads_hot_function_not_an_idle_threads_burst() {
        let funcs = [func(ExitKind::Sites)];
        // 50 ms, the thread on the CPU throughout: 2,000 events at 4 µs
        // are 8 ms, 16% of its CPU time: over budget.
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0], cpu(&[(1, 0, 0)]));
        let d = e
            .evaluate(50_000_000, &[2_000], cpu(&[(1, 2_000, 50_000_000)]))
            .expect("over budget");
        assert!((d.thread_pct - 16.0).abs() < 1e-9, "{d:?}");
        // 50 ms, the thread on the CPU 2 ms: 250 events are 1 ms, half
        // its CPU time, but 8% of the floor a 250-ms window has (12.5 ms).
        let mut e = Estimator::new(10.0, COST, &funcs);
        e.evaluate(0, &[0], cpu(&[(1, 0, 0)]));
        assert_eq!(
            e.evaluate(50_000_000, &[250], cpu(&[(1, 250, 2_000_000)])),
            None
        );
        assert!((e.peak_pct - 8.0).abs() < 1e-9, "{}", e.peak_pct);
    }

    #[test]
    fn a_thread_costs_the_mean_of_the_hits_in_the_window_not_the_dearest() {
        // 90,000 nop-entry events (uretprobe exits: 1,150 ns each) and
        // 10,000 int3 events (4,000 ns) on one thread in 1 s of CPU:
        // 103.5 ms + 40 ms = 14.35%, where the dearest cost would say 40%.
        let funcs = [
            FuncCost {
                entry: EntryKind::Nop,
                exit: ExitKind::Uretprobe,
                protected: false,
            },
            func(ExitKind::Sites),
        ];
        let mut e = Estimator::new(20.0, COST, &funcs);
        e.evaluate(0, &[0, 0], cpu(&[(1, 0, 0)]));
        assert_eq!(
            e.evaluate(
                1_000_000_000,
                &[90_000, 10_000],
                cpu(&[(1, 100_000, 1_000_000_000)])
            ),
            None
        );
        assert!((e.peak_pct - 14.35).abs() < 1e-9, "{}", e.peak_pct);
    }

    #[test]
    fn the_settled_estimate_restarts_at_each_detach() {
        let funcs = [func(ExitKind::None); 2];
        let mut e = Estimator::new(10.0, COST, &funcs);
        // Past the hold after attach ([`HOLD_UNTIL_NS`]).
        let at = HOLD_UNTIL_NS;
        e.evaluate(0, &[0, 0], cpu(&[(1, 0, 0)]));
        e.evaluate(at, &[0, 0], cpu(&[(1, 0, 0)]));
        // 50% of 100 ms CPU: f0 goes.
        assert!(e
            .evaluate(
                at + 100_000_000,
                &[12_500, 0],
                cpu(&[(1, 12_500, 100_000_000)])
            )
            .is_some());
        assert_eq!(e.settled_pct(), 0.0);
        // Then f1: 2 ms in 100 ms, then 4 ms in 100 ms: 3% since.
        for (t, f1) in [(200_000_000, 500), (300_000_000, 1_500)] {
            let ev = 12_500 + f1;
            assert_eq!(e.evaluate(at + t, &[12_500, f1], cpu(&[(1, ev, t)])), None);
        }
        assert!((e.settled_pct() - 3.0).abs() < 1e-9, "{}", e.settled_pct());
    }
}
