//! Escalation (issue 43, item 1): sample to find, trace to explain. When a
//! group of stalls is first seen in a watched process, the native functions
//! on its stall's samples (those of the main executable with symbols, and
//! the functions that tail-call them, chosen as `record`'s presample chooses:
//! `select::select_among`) get uprobes on the worker's own eBPF object,
//! whose entry, exit and return-site programs are loaded but unattached
//! until then (`Probes::attach_from`). The group's next stalls carry an
//! exact call tree (`"tree": "traced"`); after `--trace-stalls` of them the
//! probes come off (`Probes::detach_funcs`). Meanwhile `record`'s overhead
//! estimator holds the watched thread's probe time under `--max-overhead`,
//! detaching the hottest functions; when it has detached them all, the
//! escalation is done. One group is traced at a time per process; a group
//! first seen meanwhile waits its turn (`queued`).
//!
//! The functions are appended to a selection that only grows (a function's
//! index is its probe cookie, and the pipeline's aggregates grow with it,
//! told through a `ProbedRecord`); their probes' removal is told through a
//! `DetachRecord`, as the governor's, so frames still open close there.
//!
//! `budget.rs` holds what keeps the probes within `--max-overhead` (the
//! calibration, how often the estimate is judged, which stalls ran over,
//! the functions too hot to probe again); `probes.rs` the stall's sampled
//! offsets and the detach.
mod budget;
mod probes;

use std::{
    collections::{HashSet, VecDeque},
    sync::mpsc::Sender,
    time::{Duration, Instant},
};

use self::{
    budget::{calibrate_soon, governed_in, without_too_hot, CALIBRATED, EVERY},
    probes::{detach, stall_offsets},
};
use super::Msg;
use crate::{
    analyze::overhead::{Estimator, ExitKind, FuncCost, ThreadSample},
    attach::{
        calibrate::{self, EntryKind, HitCost},
        probes::Probes,
    },
    cli::{ExitProbes, SelectArgs},
    clock::monotonic_ns,
    output::watch::Escalation,
    session::{probed::ProbedRecord, sinks::Sinks},
    tracee::{exits::ExitProbe, process, select},
};

/// Most functions probed for one group: the heaviest on its samples first
/// (each probed call costs a trap or two).
pub const MAX_FUNCS_PER_GROUP: usize = 64;
/// Groups waiting for another group's probes to come off, at most.
const MAX_QUEUED: usize = 16;
/// A traced group without a stall for this long is unprobed.
const IDLE: Duration = Duration::from_secs(60);

/// The group being traced.
struct Traced {
    group: String,
    key: String,
    /// Its functions still probed (indices into the selection).
    live: Vec<usize>,
    /// Functions probed for it.
    functions: usize,
    traced_stalls: u32,
    governed: usize,
    /// CLOCK_MONOTONIC when the overhead governor last detached some of
    /// its functions: a stall running then ran over the budget, its tree
    /// not whole, and is not one of its traced stalls.
    governed_ns: Option<u64>,
    /// CLOCK_MONOTONIC once its probes were on: a stall begun before is
    /// not traced whole.
    attached_ns: u64,
    /// When it was last seen stalling (or was attached).
    last_seen: Instant,
    est: Option<Estimator>,
    last_eval: Instant,
    peak_pct: f64,
    settled_pct: f64,
}

/// A group waiting for its turn, with the file offsets (and weights) of
/// its first stall's samples in the main executable.
struct Queued {
    group: String,
    key: String,
    offsets: Vec<(u64, u64)>,
}

/// One watched process's escalations.
pub struct Escalator {
    pid: u32,
    /// `--trace-stalls` (0: off).
    trace_stalls: u32,
    /// `--max-overhead` (0: no governor).
    max_overhead: f64,
    /// Every function probed in this process so far.
    sel: select::Selection,
    current: Option<Traced>,
    queue: VecDeque<Queued>,
    /// Groups escalated, queued or refused here: each once.
    decided: HashSet<String>,
    /// Functions the overhead governor detached here, by name: too hot to
    /// probe within the budget in this process, never probed again for a
    /// later group (an interpreter's evaluator runs in every stall).
    too_hot: HashSet<String>,
    tx: Sender<Msg>,
}

impl Escalator {
    /// Escalations in process `pid` (`trace_stalls` 0: none), whose loop's
    /// waits are watched with `waits`.
    pub fn new(
        pid: u32,
        (trace_stalls, max_overhead): (u32, f64),
        waits: calibrate::WaitTracepoints,
        tx: Sender<Msg>,
    ) -> Self {
        if trace_stalls > 0 {
            calibrate_soon(waits);
        }
        Escalator {
            pid,
            trace_stalls,
            max_overhead,
            sel: select::Selection::default(),
            current: None,
            queue: VecDeque::new(),
            decided: HashSet::new(),
            too_hot: HashSet::new(),
            tx,
        }
    }

    /// Whether a stall of group `gid` from `start_ns` to `end_ns`
    /// (CLOCK_MONOTONIC) whose tree has traced frames (`has_traced`) is a
    /// traced stall: its group's probes were on for the whole of it, and
    /// the overhead governor detached none of them while it ran (it ran
    /// over the budget, and its tree lacks their calls from then on), and
    /// its time in probes (`probe_pct` of its on-CPU time, from its
    /// samples in uprobe handling or the calibrated cost of its hits) is
    /// within `--max-overhead`.
    pub fn is_traced(&self, gid: &str, span: (u64, u64), has_traced: bool, probe_pct: f64) -> bool {
        self.current.as_ref().is_some_and(|t| {
            t.group == gid
                && span.0 >= t.attached_ns
                && has_traced
                && !governed_in(t, span)
                && !self.over(probe_pct)
        })
    }

    /// Whether `probe_pct` of a stall's on-CPU time in probes is over the
    /// budget.
    fn over(&self, probe_pct: f64) -> bool {
        self.max_overhead > 0.0 && probe_pct > self.max_overhead
    }

    /// What a stall of group `gid` from `start_ns` to `end_ns` says of its
    /// probes (`traced`: it is a traced stall): the functions traced all
    /// through it, or that the governor took some off while it ran.
    pub fn stall_note(
        &self,
        gid: &str,
        span: (u64, u64),
        traced: bool,
        probe_pct: f64,
    ) -> Option<String> {
        let t = self.current.as_ref().filter(|t| t.group == gid)?;
        if span.0 < t.attached_ns {
            return None;
        }
        if traced {
            let names: Vec<&str> = t
                .live
                .iter()
                .take(8)
                .map(|&i| self.sel.funcs[i].name.as_str())
                .collect();
            return Some(format!(
                "traced: {} function(s) probed all through it: {}{}",
                t.live.len(),
                names.join(", "),
                if t.live.len() > 8 { ", …" } else { "" }
            ));
        }
        if governed_in(t, span) {
            return Some(format!(
                "not traced: its probes ran over --max-overhead {}% in it, and the overhead governor detached {} of its group's functions",
                self.max_overhead, t.governed
            ));
        }
        self.over(probe_pct).then(|| {
            format!(
                "not traced: {probe_pct:.0}% of its time on the CPU was in its group's probes, over --max-overhead {}%",
                self.max_overhead
            )
        })
    }

    /// A stall of group `gid` (key `key`) was told, `traced` or not, from
    /// `start_ns` to `end_ns`: counted for the traced group (its probes off
    /// after `--trace-stalls`), or, for a group first seen, its functions
    /// probed (or queued). A stall that is not traced but has traced
    /// frames (`has_traced`: another group's probed functions ran in it)
    /// starts nothing: those frames can move its key (a sampled Python
    /// frame hung under a traced native one loses its Python callers), and
    /// its group, so named, is no new kind of stall.
    #[expect(clippy::too_many_arguments, reason = "one stall's facts")]
    pub fn on_stall(
        &mut self,
        probes: &mut Probes,
        sinks: &mut Sinks,
        gid: &str,
        key: &str,
        (start_ns, end_ns): (u64, u64),
        (traced, has_traced, probe_pct): (bool, bool, f64),
        exe: &str,
    ) {
        if self.trace_stalls == 0 {
            return;
        }
        let over = self.over(probe_pct);
        if let Some(t) = &mut self.current {
            if t.group == gid {
                t.last_seen = Instant::now();
                if !has_traced && start_ns >= t.attached_ns {
                    // Its functions still probed explain nothing: none ran
                    // in a stall of its own (the governor detached those
                    // that did, or they ran only before).
                    let why = match t.governed {
                        0 => "none of its probed functions ran in its last stall".to_string(),
                        n => format!(
                            "the overhead governor detached {n} of its functions (over --max-overhead {}%), and none of the others ran in its last stall: nothing left to trace within the budget",
                            self.max_overhead
                        ),
                    };
                    self.finish(probes, sinks, why);
                    return;
                }
                if start_ns >= t.attached_ns && over && !governed_in(t, (start_ns, end_ns)) {
                    // Over the budget, and the governor's estimate did
                    // not see it (its hits dearer than calibrated): the
                    // stall's own samples say so, and the probes go.
                    let why = format!(
                        "its last stall spent {probe_pct:.0}% of its time on the CPU in the probes \
                         (its samples in uprobe handling), over --max-overhead {}%",
                        self.max_overhead
                    );
                    let hot: Vec<String> = t
                        .live
                        .iter()
                        .map(|&i| self.sel.funcs[i].name.clone())
                        .collect();
                    self.too_hot.extend(hot);
                    self.finish(probes, sinks, why);
                    return;
                }
                if traced {
                    t.traced_stalls += 1;
                    if t.traced_stalls >= self.trace_stalls {
                        let why = format!("after {} traced stalls", t.traced_stalls);
                        self.finish(probes, sinks, why);
                    } else {
                        self.tell(None);
                    }
                }
                return;
            }
        }
        if has_traced || !self.decided.insert(gid.to_string()) {
            return;
        }
        let offsets = sinks
            .flight
            .as_ref()
            .map(|f| stall_offsets(f, self.pid, exe, start_ns, end_ns))
            .unwrap_or_default();
        let q = Queued {
            group: gid.to_string(),
            key: key.to_string(),
            offsets,
        };
        if self.current.is_none() {
            self.start(probes, sinks, q);
            return;
        }
        if self.queue.len() >= MAX_QUEUED {
            self.refuse(&q, "too many groups waiting for their turn".into());
            return;
        }
        let why = format!(
            "group {} is traced now; this one is next after {} other(s)",
            self.current.as_ref().map_or("", |t| t.group.as_str()),
            self.queue.len()
        );
        self.send(&q.key, "queued", 0, Some(why));
        self.queue.push_back(q);
    }

    /// Every drain tick: the overhead governor's estimate, and a traced
    /// group gone quiet unprobed.
    pub fn on_tick(&mut self, probes: &mut Probes, sinks: &mut Sinks) {
        let Some(t) = &mut self.current else { return };
        if t.last_seen.elapsed() >= IDLE {
            let why = format!("no stall of the group in {} s", IDLE.as_secs());
            self.finish(probes, sinks, why);
            return;
        }
        let Some(est) = &mut t.est else { return };
        if t.last_eval.elapsed() < EVERY {
            return;
        }
        t.last_eval = Instant::now();
        let pid = self.pid;
        let threads: Vec<ThreadSample> = sinks
            .stacks
            .threads()
            .filter(|s| s.exited_threads == 0)
            .map(|s| ThreadSample {
                tid: s.tid,
                events: s.events,
                cpu_ns: process::thread_cpu_ns(pid, s.tid),
            })
            .collect();
        let decided_ns = monotonic_ns();
        let decision = est.evaluate(decided_ns, &sinks.hits, threads.into_iter());
        let peak = est.peak_pct;
        let grew = peak > t.peak_pct + 1.0;
        t.peak_pct = t.peak_pct.max(peak);
        t.settled_pct = est.settled_pct();
        let Some(d) = decision else {
            if grew {
                self.tell(None);
            }
            return;
        };
        let gone: Vec<usize> = d
            .funcs
            .iter()
            .map(|f| f.0 as usize)
            .filter(|i| t.live.contains(i))
            .collect();
        if gone.is_empty() {
            return;
        }
        let names: Vec<&str> = gone
            .iter()
            .take(5)
            .map(|&i| self.sel.funcs[i].name.as_str())
            .collect();
        eprintln!(
            "profiler: PID {pid}: overhead governor: thread {} spent an estimated {:.1}% of its CPU time in probes (--max-overhead {}%): {} of group {}'s functions detached ({}{})",
            d.tid,
            d.thread_pct,
            self.max_overhead,
            gone.len(),
            t.group,
            names.join(", "),
            if gone.len() > 5 { ", …" } else { "" }
        );
        if let Err(e) = detach(probes, sinks, &self.sel, pid, &gone, decided_ns) {
            eprintln!(
                "profiler: warning: PID {pid}: detaching probes: {}",
                crate::error::chain(&e)
            );
        }
        t.live.retain(|i| !gone.contains(i));
        t.governed += gone.len();
        t.governed_ns = Some(decided_ns);
        self.too_hot
            .extend(gone.iter().map(|&i| self.sel.funcs[i].name.clone()));
        if t.live.is_empty() {
            self.finish(
                probes,
                sinks,
                format!(
                    "the overhead governor detached every function (over --max-overhead {}%)",
                    self.max_overhead
                ),
            );
        } else {
            self.tell(None);
        }
    }

    /// Probes group `q`'s functions, or refuses it (and then tries the
    /// next queued group).
    fn start(&mut self, probes: &mut Probes, sinks: &mut Sinks, q: Queued) {
        let began = Instant::now();
        match self.attach(probes, sinks, &q) {
            Ok(live) => {
                let names: Vec<&str> = live
                    .iter()
                    .take(8)
                    .map(|&i| self.sel.funcs[i].name.as_str())
                    .collect();
                eprintln!(
                    "profiler: PID {}: escalation: attached {} functions in {} ms for group {} ({}): {}{}; its next {} stalls are traced",
                    self.pid,
                    live.len(),
                    began.elapsed().as_millis(),
                    q.group,
                    q.key,
                    names.join(", "),
                    if live.len() > 8 { ", …" } else { "" },
                    self.trace_stalls
                );
                let est = (self.max_overhead > 0.0).then(|| self.estimator(sinks).without_hold());
                self.current = Some(Traced {
                    group: q.group,
                    key: q.key,
                    functions: live.len(),
                    live,
                    traced_stalls: 0,
                    governed: 0,
                    governed_ns: None,
                    attached_ns: monotonic_ns(),
                    last_seen: Instant::now(),
                    est,
                    last_eval: Instant::now(),
                    peak_pct: 0.0,
                    settled_pct: 0.0,
                });
                self.tell(None);
            }
            Err(why) => {
                self.refuse(&q, why);
                if let Some(next) = self.queue.pop_front() {
                    self.start(probes, sinks, next);
                }
            }
        }
    }

    /// Chooses and attaches group `q`'s functions, telling the pipeline;
    /// returns their indices, or why none could be.
    fn attach(
        &mut self,
        probes: &mut Probes,
        sinks: &mut Sinks,
        q: &Queued,
    ) -> std::result::Result<Vec<usize>, String> {
        let pid = self.pid;
        if q.offsets.is_empty() {
            return Err(
                "none of its stall's on-CPU samples is in a function of the main executable \
                 (a stall that blocked has its blocked stacks in its report already)"
                    .into(),
            );
        }
        let target = process::Target::open(pid).map_err(|e| crate::error::chain(&e))?;
        let args = SelectArgs {
            funcs: Vec::new(),
            excludes: Vec::new(),
            libs: Vec::new(),
            dispatch: Vec::new(),
            max_funcs: Some(MAX_FUNCS_PER_GROUP),
            exit_probes: ExitProbes::Auto,
        };
        let mut new = select::select_among(&target, &args, &[], Some(&q.offsets))
            .map_err(|e| crate::error::chain(&e))?;
        // A preset's dispatch functions and CPython's collections are not
        // on the stall's stacks: only those that are, and their tail
        // callers, none of them a dispatch function (iterations are the
        // loop's, from its waits).
        if !new.dispatch_fallback {
            new.funcs.retain(|f| !f.dispatch);
        }
        new.funcs
            .retain(|f| f.semaphores == [0; 2] && f.binary == 0);
        for f in &mut new.funcs {
            f.dispatch = false;
        }
        if new.funcs.is_empty() {
            return Err(format!(
                "no function of {} with a symbol on its samples",
                target.exe.display()
            ));
        }
        let hot = without_too_hot(&mut new.funcs, &self.too_hot);
        if new.funcs.is_empty() {
            return Err(format!(
                "every function on its samples ({}) ran over --max-overhead {}% in an earlier \
                 escalation here and was detached by the overhead governor: none is left to \
                 trace within the budget",
                hot.join(", "),
                self.max_overhead
            ));
        }
        // Not calibrated yet: durations keep the probes' cost, and the
        // governor assumes `record`'s fallback.
        if let Some(cost) = CALIBRATED.get() {
            calibrate::set_costs(&mut new, cost);
        }
        let first_binary = self.sel.binaries.len();
        match self.sel.binaries.first() {
            None => self.sel.binaries = new.binaries.drain(..1).collect(),
            Some(b) if b.path == new.binaries[0].path => {}
            Some(_) => return Err("the process runs another executable now".into()),
        }
        let first = self.sel.funcs.len();
        if first + new.funcs.len() > profiler_common::MAX_FUNCS as usize {
            return Err("too many functions probed in this process already".into());
        }
        self.sel.funcs.extend(new.funcs);
        let failed = probes.failed.len();
        if let Err(e) = probes.attach_from(&self.sel, first, pid) {
            self.sel.funcs.truncate(first);
            self.sel.binaries.truncate(first_binary.max(1));
            return Err(crate::error::chain(&e));
        }
        let refused: HashSet<&str> = probes.failed[failed..]
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        let live: Vec<usize> = (first..self.sel.funcs.len())
            .filter(|&i| !refused.contains(self.sel.funcs[i].name.as_str()))
            .collect();
        let rec = ProbedRecord::new(
            pid,
            monotonic_ns(),
            target.exe.display().to_string(),
            &self.sel.binaries[first_binary.min(self.sel.binaries.len())..],
            &self.sel.funcs[first..],
        );
        sinks.inject(&rec.encode());
        sinks.hits.resize(self.sel.funcs.len(), 0);
        sinks.dedup.get_or_insert_with(Default::default);
        Ok(live)
    }

    /// The estimator over every function of the selection, its first
    /// window starting now.
    fn estimator(&self, sinks: &Sinks) -> Estimator {
        let file = self
            .sel
            .binaries
            .first()
            .and_then(|b| std::fs::File::open(&b.open_path).ok());
        let funcs: Vec<FuncCost> = self
            .sel
            .funcs
            .iter()
            .map(|f| FuncCost {
                entry: file.as_ref().map_or(EntryKind::Step, |file| {
                    calibrate::entry_kind(file, f.entry_offset())
                }),
                exit: match f.exit {
                    ExitProbe::Sites(_) => ExitKind::Sites,
                    ExitProbe::Uretprobe => ExitKind::Uretprobe,
                    ExitProbe::EntryOnly(_) => ExitKind::None,
                },
                protected: false,
            })
            .collect();
        let mut est = Estimator::new(
            self.max_overhead,
            CALIBRATED.get().copied().unwrap_or(HitCost::FALLBACK),
            &funcs,
        );
        let threads: Vec<ThreadSample> = sinks
            .stacks
            .threads()
            .map(|s| ThreadSample {
                tid: s.tid,
                events: s.events,
                cpu_ns: process::thread_cpu_ns(self.pid, s.tid),
            })
            .collect();
        est.evaluate(monotonic_ns(), &sinks.hits, threads.into_iter());
        est
    }

    /// The traced group's probes come off, for `why`; the next queued
    /// group's go on.
    fn finish(&mut self, probes: &mut Probes, sinks: &mut Sinks, why: String) {
        let Some(t) = &mut self.current else { return };
        if let Some(est) = &t.est {
            t.settled_pct = est.settled_pct();
        }
        let decided_ns = monotonic_ns();
        let gone = t.live.clone();
        if let Err(e) = detach(probes, sinks, &self.sel, self.pid, &gone, decided_ns) {
            eprintln!(
                "profiler: warning: PID {}: detaching probes: {}",
                self.pid,
                crate::error::chain(&e)
            );
        }
        eprintln!(
            "profiler: PID {}: escalation: detached {} functions of group {} ({}) {why}",
            self.pid,
            gone.len(),
            t.group,
            t.key,
        );
        if let Some(t) = &mut self.current {
            t.live.clear();
        }
        self.tell(Some(why));
        self.current = None;
        if let Some(next) = self.queue.pop_front() {
            self.start(probes, sinks, next);
        }
    }

    /// The watch of the process ends (its probes go with it): the traced
    /// group is done, and the queued ones never had their turn.
    pub fn end(&mut self, why: &str) {
        if let Some(t) = &mut self.current {
            t.live.clear();
        }
        self.tell(Some(format!("the watch of the process ended ({why})")));
        self.current = None;
        for q in std::mem::take(&mut self.queue) {
            let why = format!("the watch of the process ended ({why}) before its turn");
            self.send(&q.key, "refused", 0, Some(why));
        }
    }

    fn refuse(&self, q: &Queued, why: String) {
        eprintln!(
            "profiler: PID {}: escalation: group {} ({}) not traced: {why}",
            self.pid, q.group, q.key
        );
        self.send(&q.key, "refused", 0, Some(why));
    }

    /// Tells the journal the traced group's state; `done` once its probes
    /// are off, with `why`.
    fn tell(&self, why: Option<String>) {
        let Some(t) = &self.current else { return };
        let state = match t.live.is_empty() {
            true => "done",
            false => "traced",
        };
        let _ = self.tx.send(Msg::Escalation {
            key: t.key.clone(),
            escalation: Escalation {
                pid: self.pid,
                state: state.into(),
                functions: t.functions,
                traced_stalls: t.traced_stalls,
                governed: t.governed,
                peak_overhead_pct: (t.peak_pct * 10.0).round() / 10.0,
                settled_overhead_pct: (t.settled_pct * 10.0).round() / 10.0,
                reason: why,
            },
        });
    }

    fn send(&self, key: &str, state: &str, functions: usize, why: Option<String>) {
        let _ = self.tx.send(Msg::Escalation {
            key: key.to_string(),
            escalation: Escalation {
                pid: self.pid,
                state: state.into(),
                functions,
                reason: why,
                ..Escalation::default()
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traced(group: &str, attached_ns: u64) -> Traced {
        Traced {
            group: group.into(),
            key: "k".into(),
            live: vec![0],
            functions: 1,
            traced_stalls: 0,
            governed: 0,
            governed_ns: None,
            attached_ns,
            last_seen: Instant::now(),
            est: None,
            last_eval: Instant::now(),
            peak_pct: 0.0,
            settled_pct: 0.0,
        }
    }

    #[test]
    fn a_stall_is_traced_only_in_its_group_begun_once_its_probes_were_on() {
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut e = Escalator::new(1, (0, 10.0), Default::default(), tx);
        assert!(!e.is_traced("g", (200, 200), true, 0.0));
        e.current = Some(traced("g", 100));
        assert!(e.is_traced("g", (100, 100), true, 0.0));
        assert!(e.is_traced("g", (200, 200), true, 0.0));
        // Begun before the probes went on: only part of it was seen.
        assert!(!e.is_traced("g", (99, 99), true, 0.0));
        // No traced frame in it (none of the functions was called).
        assert!(!e.is_traced("g", (200, 200), false, 0.0));
        // Another group's stall, though it called probed functions.
        assert!(!e.is_traced("h", (200, 200), true, 0.0));
    }

    #[test]
    fn a_stall_the_governor_detached_in_or_over_budget_by_its_samples_is_not_traced() {
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut e = Escalator::new(1, (0, 10.0), Default::default(), tx);
        let mut t = traced("g", 100);
        t.governed_ns = Some(300);
        e.current = Some(t);
        // The governor detached while it ran: not traced, and said so.
        assert!(!e.is_traced("g", (200, 400), true, 5.0));
        let note = e.stall_note("g", (200, 400), false, 5.0).unwrap();
        assert!(note.starts_with("not traced"), "{note}");
        // After the detach, within the budget: traced.
        assert!(e.is_traced("g", (301, 400), true, 9.9));
        // Over the budget by its own samples.
        assert!(!e.is_traced("g", (301, 400), true, 12.0));
        let note = e.stall_note("g", (301, 400), false, 12.0).unwrap();
        assert!(note.contains("12% of its time on the CPU"), "{note}");
        // Begun before the probes: nothing to say.
        assert_eq!(e.stall_note("g", (50, 400), false, 12.0), None);
    }

    #[test]
    fn a_group_escalation_in_groups_json_is_absent_until_it_has_one() {
        let entry = crate::output::watch::GroupEntry::default();
        let json = serde_json::to_value(&entry).unwrap();
        assert!(json.get("escalation").is_none(), "{json}");
        let entry = crate::output::watch::GroupEntry {
            escalation: Some(Escalation {
                pid: 7,
                state: "done".into(),
                functions: 3,
                traced_stalls: 5,
                reason: Some("after 5 traced stalls".into()),
                ..Escalation::default()
            }),
            ..Default::default()
        };
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["escalation"]["state"], "done");
        assert_eq!(json["escalation"]["traced_stalls"], 5);
        let back: crate::output::watch::GroupEntry = serde_json::from_value(json).unwrap();
        assert_eq!(back.escalation, entry.escalation);
    }
}
