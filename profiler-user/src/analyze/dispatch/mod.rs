//! Slow main-thread dispatches (BlockCanary and Matrix, done with exact
//! timings). A dispatch is one outermost call of a dispatch function on the
//! watched thread. While one is open, its thread's calls, samples and
//! scheduler transitions are buffered; when it ends, a fast dispatch only
//! updates constant-size statistics and its buffer is cleared, while a slow
//! one is explained: call tree, on-CPU/blocked/runnable split, sampled and
//! blocked frames, key, verdict. Hangs are noticed while still running.
//! What should be told at once (a slow dispatch, a hang) is queued as a
//! [`Notice`] for the session to print and log; nothing here writes.
//!
//! With [`Config::wait_loop`], a dispatch is instead one iteration of the
//! thread's event loop, from the return of the loop's own wait syscall to
//! its next entry ([`loop_wait`]); traced calls inside it make its tree.
mod deferred;
mod explain;
mod frames;
mod hang;
mod iterations;
mod key;
mod loop_wait;
mod own_cost;
pub mod quality;
pub mod retain;
pub mod sched;
mod source;
pub mod stats;
mod told;
pub mod tree;
pub mod wakers;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use profiler_common::{Event, KIND_ENTRY};

pub use self::retain::Group;
pub use self::told::{hang_stack_text, Hang, Notice, Slow, Streamed};
use self::{
    deferred::Deferred,
    quality::SampleQuality,
    sched::SchedTracker,
    stats::{Stats, Worst},
};
use crate::{
    analyze::stacks::{is_dead, same_frame},
    symbolize::Symbolizer,
    tracee::exits::ProbeCost,
};

/// Most buffered records per dispatch; beyond it the tree is marked truncated.
const MAX_RECORDS: usize = 2_000_000;
/// Most hangs kept; later ones are counted in `hangs_dropped`.
const MAX_HANGS: usize = 1_000;

/// How dispatches are found and judged.
#[derive(Debug, Clone)]
pub struct Config {
    /// The watched thread.
    pub tid: u32,
    /// Its name.
    pub thread_name: String,
    /// How dispatches are recognised, in words.
    pub rule: String,
    /// Slow from this long.
    pub threshold_ns: u64,
    /// Reported as a hang, while running, from this long.
    pub hang_ns: u64,
    /// One frame, for dropped-frame statistics.
    pub frame_interval_ns: u64,
    /// Keep whole trees instead of trimming them.
    pub full_tree: bool,
    /// Time one sample stands for (0: sampling off).
    pub sample_period_ns: u64,
    /// Wakers were recorded (not `--no-wakers`).
    pub wakers: bool,
    /// Dispatches are the iterations of the thread's event loop, bounded
    /// by its wait syscalls (no dispatch function known).
    pub wait_loop: bool,
    /// With `wait_loop`: the dispatch functions are a preset's, which
    /// count only if the watched thread calls them ([`iterations`]).
    pub preset: bool,
}

/// One buffered record of an open dispatch.
#[derive(Debug, Clone)]
pub enum Rec {
    /// A traced entry or exit.
    Call(Event),
    /// The end of a frame whose function the overhead governor detached:
    /// an exit made by the agent, at the detach (or when the traced call
    /// above it returned).
    Detached(Event),
    /// A cpu-clock sample: time, and user and kernel stacks, innermost
    /// first (the kernel's empty when it ran in user mode).
    Sample(u64, Box<[u64]>, Box<[u64]>),
    /// Switched out blocked, with user and kernel stacks.
    Block(u64, Box<[u64]>, Box<[u64]>),
    /// Woken or switched back in.
    Resume(u64),
    /// A traced event at stack level `.0` (at `.1`) proved the innermost
    /// open frames at or below it gone: they ended without a return seen.
    Unwound(u64, u64),
    /// Who woke the thread (written just before its wake-up).
    Waker(Box<wakers::WakeRec>),
    /// A sample of another thread while this one was blocked.
    Peer(wakers::PeerRec),
    /// Who woke the loop out of the wait before the iteration: its source
    /// ([`source`]).
    Source(Box<wakers::WakeRec>),
}

struct Open {
    index: u64,
    start_ns: u64,
    calls: Vec<(u32, u64)>,
    truncated: bool,
    /// Its entry in `hangs`, if kept there.
    hang: Option<usize>,
    /// Reported as a hang (kept or counted).
    hang_told: bool,
    /// Frames closed because their function was detached.
    detached: u32,
    /// The last traced event inside it, and the on-CPU/blocked/runnable
    /// split then: where it ends if its outermost return is never seen.
    last: (u64, sched::Split),
    samples: u32,
    /// The last on-CPU sample's user stack, and when.
    last_sample: Option<(u64, Box<[u64]>)>,
    /// The user stack where it last blocked, and when.
    last_block: Option<(u64, Box<[u64]>)>,
    /// The probe hits inside it so far, in ns (see [`Dispatcher::set_costs`]).
    probe_ns: u64,
    /// Why it is not the program's own stall, when something else held it
    /// ([`Dispatcher::not_the_programs`]).
    not_the_programs: Option<String>,
    /// Its source (who woke the loop before it) is recorded.
    sourced: bool,
}

/// How long past `--hang` a hang's notice may wait for the names of the
/// frames past its traced calls.
const HANG_NAMES_WAIT_NS: u64 = 400_000_000;
/// In a hang's stack, in place of frames whose names were not read in time.
const NAMES_PENDING: &str = "[frames whose names were still being read]";

/// Finds, times and explains dispatches of the watched thread.
pub struct Dispatcher {
    /// Settings.
    pub cfg: Config,
    names: Vec<String>,
    is_dispatch: Vec<bool>,
    session_start_ns: u64,
    open: Option<Open>,
    recs: Vec<Rec>,
    sched: SchedTracker,
    /// Statistics over all dispatches.
    pub stats: Stats,
    /// Slow dispatches kept in detail, in order (see [`retain`]).
    pub slow: Vec<Slow>,
    /// Slow dispatches let go from detail, counted only (their groups
    /// have them).
    pub slow_dropped: u64,
    kept: retain::Kept,
    /// Groups by key.
    pub groups: HashMap<String, Group>,
    /// Slow dispatches whose key came after [`retain::MAX_GROUPS`] others,
    /// counted in the group [`retain::OTHER_GROUP`].
    pub groups_merged: u64,
    /// Hangs in order, the first [`MAX_HANGS`].
    pub hangs: Vec<Hang>,
    /// Hangs beyond [`MAX_HANGS`], counted only.
    pub hangs_dropped: u64,
    /// How complete the in-dispatch sampler's stacks were.
    pub quality: SampleQuality,
    symbolizer: Symbolizer,
    /// Other processes whose mappings `on_waker` read during this dispatch.
    waker_pids: Vec<u32>,
    /// Who last woke the loop out of its wait, until an iteration takes it
    /// as its source ([`source`]).
    loop_source: Option<Box<wakers::WakeRec>>,
    pid: u32,
    next_index: u64,
    /// When the first dispatch began (startup's default "ready").
    pub first_start_ns: Option<u64>,
    notices: Vec<Notice>,
    /// The loop's wait, learnt, and its idle time ([`Config::wait_loop`]).
    pub loop_wait: loop_wait::LoopWait,
    /// The thread has waited in its loop: iterations are bounded by waits.
    waits_seen: bool,
    /// A preset's functions on trial ([`Config::preset`]).
    preset: iterations::PresetTrial,
    /// Keys are picked from the samples and blocked stacks alone
    /// ([`Dispatcher::keys_from_samples`]).
    keys_from_samples: bool,
    /// Per function, when the governor's detach of it was done (`u64::MAX`:
    /// not): a frame of it can never see its return after that. A time, not
    /// a flag, so that a dispatch explained late (its names read meanwhile)
    /// is explained as at its end, as a replay does.
    gone: Vec<u64>,
    /// Per function, when the governor chose to detach it (`u64::MAX`:
    /// never): a frame of it proven gone after that closed unprobed.
    detaching: Vec<u64>,
    /// Dispatches that ended when the governor detached the dispatch
    /// function of their outermost frame (their end is the detach time).
    pub ended_by_detach: u64,
    /// Dispatches whose outermost return was never seen: a later call's
    /// stack pointer proved the frame gone. They end at their last traced
    /// event (a lower bound).
    pub ended_unseen: u64,
    /// Per function, what its probe hits cost (empty: durations as
    /// measured).
    costs: Vec<ProbeCost>,
    /// The probes' cost taken out of all dispatches' durations, in ns.
    pub probe_ns: u64,
    /// Slow dispatches (wall time over the threshold) that are under it
    /// once the probes' estimated cost is out: counted slow, flagged
    /// ([`Slow::probes_mainly`]).
    pub slow_only_with_probes: u64,
    /// When the session stopped (`u64::MAX`: not yet).
    stop_ns: u64,
    /// Dispatches that began after the stop, while the probes were being
    /// detached: not analysed, as what explains them was going away.
    pub started_after_stop: u64,
    /// Slow dispatches waiting for their frames' names (the symbolizer
    /// was still reading a binary when they ended), oldest first.
    deferred: VecDeque<Deferred>,
    /// The in-dispatch sampler's early rate (`watch`): one tick in `.0`
    /// while an iteration is younger than `.1` ns ([`Self::set_early_rate`]).
    early: (u64, u64),
    /// Slow dispatches explained and not taken yet ([`Self::stream`]).
    streamed: Option<Vec<Streamed>>,
    /// Dispatches that ended after something other than the program held
    /// them ([`Self::not_the_programs`]), by reason.
    pub excluded: Vec<(String, u64)>,
    /// Samples whose outermost frame waits for its name (as `deferred`):
    /// (frames, the walk's end, that frame's address).
    quality_deferred: Vec<(usize, u32, u64)>,
}

/// How long the collector's thread waits for a name while recording. A
/// binary's symbols read for the first time can take seconds (a large
/// one, or a slow machine: 10 s in an emulated VM), and the thread that
/// reads the rings must not stop meanwhile: a hang that began then would
/// be told only after it ended. What is not named in time is explained
/// on a later tick, in order.
const LIVE_PATIENCE: Duration = Duration::from_millis(20);

impl Dispatcher {
    /// Functions were added to the session (probed after an exec).
    pub fn add_functions(&mut self, names: &[String], is_dispatch: &[bool]) {
        self.names.extend_from_slice(names);
        self.is_dispatch.extend_from_slice(is_dispatch);
    }

    /// A dispatcher for target `pid`; `names[i]` and `is_dispatch[i]` describe
    /// probed function `i`.
    pub fn new(
        cfg: Config,
        pid: u32,
        names: Vec<String>,
        is_dispatch: Vec<bool>,
        session_start_ns: u64,
    ) -> Self {
        Dispatcher {
            cfg,
            names,
            is_dispatch,
            session_start_ns,
            open: None,
            recs: Vec::new(),
            sched: SchedTracker::default(),
            stats: Stats::default(),
            slow: Vec::new(),
            slow_dropped: 0,
            kept: retain::Kept::default(),
            groups: HashMap::new(),
            groups_merged: 0,
            hangs: Vec::new(),
            hangs_dropped: 0,
            quality: SampleQuality::default(),
            symbolizer: Symbolizer::new(pid),
            waker_pids: Vec::new(),
            loop_source: None,
            pid,
            next_index: 0,
            first_start_ns: None,
            notices: Vec::new(),
            loop_wait: loop_wait::LoopWait::new(session_start_ns),
            waits_seen: false,
            preset: iterations::PresetTrial::default(),
            keys_from_samples: false,
            gone: Vec::new(),
            detaching: Vec::new(),
            ended_by_detach: 0,
            ended_unseen: 0,
            costs: Vec::new(),
            probe_ns: 0,
            slow_only_with_probes: 0,
            stop_ns: u64::MAX,
            started_after_stop: 0,
            deferred: VecDeque::new(),
            early: (1, 0),
            streamed: None,
            excluded: Vec::new(),
            quality_deferred: Vec::new(),
        }
    }

    /// Picks each slow dispatch's key from its samples and blocked stacks
    /// alone ([`tree::Tree::samples_key_node_given`]): `watch`, whose
    /// escalation probes a group's functions for a while, keeps each
    /// stall in the group its samples make.
    pub fn keys_from_samples(&mut self) {
        self.keys_from_samples = true;
    }

    /// The in-dispatch sampler takes one tick in `every` while an iteration
    /// is younger than `full_after_ns` (`watch`): each of those samples
    /// stands for `every` of the later ones in a tree.
    pub fn set_early_rate(&mut self, every: u32, full_after_ns: u64) {
        self.early = (u64::from(every.max(1)), full_after_ns);
    }

    /// How many of the sampler's periods a sample at `ts_ns` of the
    /// iteration that began at `start_ns` stands for.
    fn sample_periods(&self, start_ns: u64, ts_ns: u64) -> u64 {
        match ts_ns.saturating_sub(start_ns) < self.early.1 {
            true => self.early.0,
            false => 1,
        }
    }

    /// Keeps every slow dispatch as it is explained, for
    /// [`Self::take_streamed`] (a session that tells each as it happens).
    pub fn stream(&mut self) {
        self.streamed.get_or_insert_with(Vec::new);
    }

    /// The dispatch open now is held by something other than the program
    /// (`reason`: it was stopped, or the system suspended): when it ends it
    /// is told as [`Notice::Excluded`], neither slow nor counted, and it is
    /// not reported as a hang. False when no dispatch is open.
    pub fn not_the_programs(&mut self, reason: &str) -> bool {
        match &mut self.open {
            Some(open) => {
                open.not_the_programs
                    .get_or_insert_with(|| reason.to_string());
                true
            }
            None => false,
        }
    }

    /// Names a sampled user stack (innermost first) as the trees do.
    pub fn name_user_stack(&mut self, user: &[u64]) -> Vec<String> {
        self.symbolizer
            .user_stack(user)
            .iter()
            .map(|n| frames::display(n).to_string())
            .collect()
    }

    /// Recording: names that take long to read do not stop the caller
    /// ([`LIVE_PATIENCE`]); what they hold up is done on a later tick, or
    /// by [`Self::finish`].
    pub fn live(&mut self) {
        self.symbolizer.set_patience(Some(LIVE_PATIENCE));
    }

    /// The session stopped at `ts_ns`: its probes, samplers and scheduler
    /// watch are detached from then on, each at its own moment. The
    /// dispatch open then runs to its end; none begins after it (an
    /// iteration bounded by waits still watched would have lost its
    /// frames, samples and blocked stacks, and be keyed `(loop iteration)`).
    pub fn stop_at(&mut self, ts_ns: u64) {
        self.stop_ns = ts_ns;
        self.loop_wait.stop_at(ts_ns);
    }

    /// Sets what each function's probe hits cost (by index): a dispatch's
    /// duration, and the slow decision, leave out the hits inside it (its
    /// own function's share of its own two, and every traced call's whole
    /// hits). All zero (`--raw-durations`, or no calibration): durations
    /// as measured, the probes' time in them included.
    pub fn set_costs(&mut self, mut costs: Vec<ProbeCost>) {
        if costs.iter().all(|c| *c == ProbeCost::default()) {
            costs.clear();
        }
        self.costs = costs;
    }

    /// A sample of the probes' own time, left out of a dispatch's tree as
    /// its time is out of the dispatch's (durations corrected only).
    fn probe_sample(&mut self, kernel: &[u64]) -> bool {
        !self.costs.is_empty() && own_cost::in_uprobe(&mut self.symbolizer, kernel)
    }

    /// What function `func`'s probe hits cost.
    fn cost(&self, func: u32) -> ProbeCost {
        self.costs.get(func as usize).copied().unwrap_or_default()
    }

    /// The governor chose to detach `func` at `ts_ns`: its frames proven
    /// gone from then on are counted as closed by the detach.
    pub fn detach_from(&mut self, func: u32, ts_ns: u64) {
        self.detaching.resize(self.names.len(), u64::MAX);
        if let Some(d) = self.detaching.get_mut(func as usize) {
            *d = (*d).min(ts_ns);
        }
    }

    /// True when a frame of `func` ending unseen at `ts_ns` ended because
    /// the function was being detached.
    fn closed_by_detach(&self, func: u32, ts_ns: u64) -> bool {
        let i = func as usize;
        self.gone.get(i).is_some_and(|&at| ts_ns >= at)
            || self.detaching.get(i).is_some_and(|&from| ts_ns >= from)
    }

    /// Every probe of `funcs` was gone at `ts_ns` and every event before it
    /// has been applied: the open dispatch's frames of them close there
    /// (those under a traced call still open, when it returns). If that
    /// closes its outermost frame, the dispatch ends at `ts_ns`.
    pub fn on_detached(&mut self, funcs: &[u32], ts_ns: u64) {
        self.gone.resize(self.names.len(), u64::MAX);
        for &f in funcs {
            if let Some(g) = self.gone.get_mut(f as usize) {
                *g = (*g).min(ts_ns);
            }
        }
        self.close_detached(ts_ns);
    }

    /// Closes the innermost frames of the open dispatch while they are of
    /// detached functions, at `ts_ns`; ends the dispatch if none is left.
    fn close_detached(&mut self, ts_ns: u64) {
        let Some(open) = &mut self.open else { return };
        let mut closed = Vec::new();
        while let Some(&(func, sp)) = open.calls.last() {
            if self
                .gone
                .get(func as usize)
                .is_none_or(|&at| at == u64::MAX)
            {
                break;
            }
            open.calls.pop();
            open.detached += 1;
            closed.push(Event {
                ts_ns,
                tid: self.cfg.tid,
                word: Event::pack(profiler_common::KIND_EXIT, func),
                sp: if sp == 0 { 0 } else { sp + 8 },
            });
        }
        // An event-loop iteration ends only at the loop's wait.
        let ended = open.calls.is_empty() && !closed.is_empty() && !self.by_waits();
        for ev in closed {
            self.record(Rec::Detached(ev));
        }
        if ended {
            self.ended_by_detach += 1;
            self.end(ts_ns);
        }
    }

    /// CLOCK_MONOTONIC at the session start (dispatch times count from it).
    pub fn session_start_ns(&self) -> u64 {
        self.session_start_ns
    }

    fn record(&mut self, rec: Rec) {
        let Some(open) = &mut self.open else { return };
        if self.recs.len() < MAX_RECORDS {
            self.recs.push(rec);
        } else {
            open.truncated = true;
        }
    }

    /// Closes the open dispatch's innermost frames that an event at stack
    /// level `level` (at `ts_ns`) proves gone, as the shadow stacks do. If
    /// that is every frame, its outermost return was never seen: it ends
    /// at its last traced event, with the split it had then.
    fn unwind_to(&mut self, level: u64, ts_ns: u64) {
        let Some(open) = &self.open else { return };
        let mut popped = Vec::new();
        for &(func, sp) in open.calls.iter().rev() {
            if !is_dead(sp, level) {
                break;
            }
            popped.push(func);
        }
        if popped.is_empty() {
            return;
        }
        let by_detach: Vec<bool> = popped
            .iter()
            .map(|&f| self.closed_by_detach(f, ts_ns))
            .collect();
        let by_waits = self.by_waits();
        let Some(open) = &mut self.open else { return };
        open.calls.truncate(open.calls.len() - popped.len());
        open.detached += by_detach.iter().filter(|&&d| d).count() as u32;
        // An event-loop iteration ends only at the loop's wait.
        let empty = open.calls.is_empty() && !by_waits;
        let (last_ns, split) = open.last;
        self.record(Rec::Unwound(level, if empty { last_ns } else { ts_ns }));
        if empty {
            match by_detach.last() {
                Some(true) => self.ended_by_detach += 1,
                _ => self.ended_unseen += 1,
            }
            self.end_with(last_ns, Some(split));
        } else {
            self.close_detached(ts_ns);
        }
    }

    /// A traced entry or exit on the watched thread.
    pub fn on_call(&mut self, ev: &Event) {
        let func = ev.func();
        if func as usize >= self.names.len() {
            // Not a probed function (a damaged recording): the shadow
            // stacks count it as invalid; it must not reach the trees.
            return;
        }
        if ev.kind() == KIND_ENTRY {
            if ev.sp != 0 {
                self.unwind_to(ev.sp, ev.ts_ns);
            }
            self.preset
                .called(self.is_dispatch.get(func as usize) == Some(&true));
            if self.open.is_none() {
                if self.by_waits()
                    || !self
                        .is_dispatch
                        .get(func as usize)
                        .copied()
                        .unwrap_or(false)
                {
                    return;
                }
                self.begin(ev.ts_ns);
            }
            self.record(Rec::Call(*ev));
            let (cost, by_waits) = (self.cost(func), self.by_waits());
            if let Some(open) = &mut self.open {
                // The dispatch function's own hits count at its end.
                if !open.calls.is_empty() || by_waits {
                    open.probe_ns += u64::from(cost.entry_ns);
                }
                open.calls.push((func, ev.sp));
                open.last = (ev.ts_ns, self.sched.split_at(ev.ts_ns));
            }
            return;
        }
        let (cost, by_waits) = (self.cost(func), self.by_waits());
        let Some(open) = &mut self.open else { return };
        let Some(pos) = open
            .calls
            .iter()
            .rposition(|&(f, sp)| f == func && same_frame(sp, ev.sp))
        else {
            // The returning frame was never seen entering, yet frames at
            // or below its level are gone.
            if ev.sp != 0 {
                self.unwind_to(ev.sp.wrapping_sub(8), ev.ts_ns);
            }
            return;
        };
        open.calls.truncate(pos);
        open.last = (ev.ts_ns, self.sched.split_at(ev.ts_ns));
        open.probe_ns += match pos == 0 && !by_waits {
            true => u64::from(cost.inside_ns),
            false => u64::from(cost.exit_ns),
        };
        self.record(Rec::Call(*ev));
        if pos == 0 && !by_waits {
            self.end(ev.ts_ns);
        } else {
            self.close_detached(ev.ts_ns);
        }
    }

    fn begin(&mut self, ts_ns: u64) {
        if ts_ns >= self.stop_ns {
            self.started_after_stop += 1;
            return;
        }
        self.open = Some(Open {
            index: self.next_index,
            start_ns: ts_ns,
            calls: Vec::new(),
            truncated: false,
            hang: None,
            hang_told: false,
            detached: 0,
            last: (ts_ns, sched::Split::default()),
            samples: 0,
            last_sample: None,
            last_block: None,
            probe_ns: 0,
            not_the_programs: None,
            sourced: false,
        });
        self.take_source(ts_ns);
        self.next_index += 1;
        self.first_start_ns.get_or_insert(ts_ns);
        self.sched.open(ts_ns);
    }

    /// The watched thread left the CPU; stacks are present when it blocked
    /// during a dispatch.
    pub fn on_switch_out(&mut self, ts_ns: u64, blocked: bool, stacks: Option<(&[u64], &[u64])>) {
        self.sched.switched_out(ts_ns, blocked);
        if let Some((user, kernel)) = stacks {
            if let Some(open) = &mut self.open {
                open.last_block = Some((ts_ns, user.into()));
            }
            self.record(Rec::Block(ts_ns, user.into(), kernel.into()));
        }
    }

    /// The watched thread was woken.
    pub fn on_wakeup(&mut self, ts_ns: u64) {
        let was_blocked = self.sched.state() == sched::State::Blocked;
        self.sched.woken(ts_ns);
        if was_blocked {
            self.record(Rec::Resume(ts_ns));
        }
    }

    /// The watched thread got a CPU.
    pub fn on_switch_in(&mut self, ts_ns: u64) {
        let was_blocked = self.sched.state() == sched::State::Blocked;
        self.sched.switched_in(ts_ns);
        if was_blocked {
            self.record(Rec::Resume(ts_ns));
        }
    }

    /// A cpu-clock sample of the watched thread, with its user and kernel
    /// stacks; `end` says why the walk of `user` ended (an `unwind_end`
    /// reason, 0 for frame pointers).
    pub fn on_sample(&mut self, ts_ns: u64, user: &[u64], kernel: &[u64], end: u32) {
        if self.open.is_none() {
            return;
        }
        // Only the outermost frame is named, and only when the walk itself
        // does not say it reached the root.
        let native_outermost = user
            .iter()
            .rev()
            .find(|&&a| !profiler_common::is_runtime_frame(a));
        match native_outermost {
            Some(&pc)
                if profiler_common::unwind_end::reason(end)
                    != profiler_common::unwind_end::ROOT =>
            {
                let name = self.symbolizer.user_stack(&[pc]).pop();
                match self.symbolizer.take_missed() {
                    true => self.quality_deferred.push((user.len(), end, pc)),
                    false => self.quality.add(user.len(), end, name.as_deref()),
                }
            }
            _ => self.quality.add(user.len(), end, None),
        }
        if user.iter().any(|&a| profiler_common::python::is_frame(a)) {
            self.quality.python += 1;
        }
        if user.iter().any(|&a| profiler_common::v8::is_frame(a)) {
            self.quality.javascript += 1;
        }
        let Some(open) = &mut self.open else { return };
        open.samples += 1;
        open.last_sample = Some((ts_ns, user.into()));
        self.record(Rec::Sample(ts_ns, user.into(), kernel.into()));
    }

    /// Who woke the watched thread, while it was blocked in a dispatch.
    /// Another process's mappings are remembered now, while it most
    /// likely still runs.
    pub fn on_waker(&mut self, w: wakers::WakeRec) {
        if w.loop_wake {
            return self.on_loop_waker(w);
        }
        if self.open.is_none() {
            return;
        }
        if w.pid != 0 && w.pid != self.pid && !w.kernel_thread && !self.symbolizer.knows(w.pid) {
            self.symbolizer.remember_maps(w.pid);
            self.waker_pids.push(w.pid);
        }
        self.record(Rec::Waker(Box::new(w)));
    }

    /// A sample of another thread of the target while the watched thread
    /// was blocked in a dispatch.
    pub fn on_peer_sample(&mut self, ts_ns: u64, tid: u32, user: &[u64]) {
        if self.open.is_none() {
            return;
        }
        self.record(Rec::Peer(wakers::PeerRec {
            ts_ns,
            tid,
            user: user.into(),
        }));
    }

    /// The notices queued since the last call, oldest first.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// The addresses the analysis symbolized, for `profile.data`.
    pub fn symbol_journal(&self) -> Vec<(u32, u64, Vec<String>)> {
        self.symbolizer.journal()
    }

    /// Replaces the symbolizer (offline replay answers from a journal).
    pub fn set_symbolizer(&mut self, s: Symbolizer) {
        self.symbolizer = s;
    }

    /// Refreshes the symbolizer's snapshot of the target's mappings (after
    /// exec, after dlopen), so stacks still resolve once the target exits.
    pub fn remember_maps(&mut self) {
        let pid = self.symbolizer_pid();
        self.symbolizer.remember_maps(pid);
    }

    fn symbolizer_pid(&self) -> u32 {
        self.pid
    }

    /// Name of probed function `func`.
    pub fn name(&self, func: u32) -> &str {
        &self.names[func as usize]
    }

    /// True while a dispatch is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Groups sorted by total time, largest first.
    pub fn sorted_groups(&self) -> Vec<&Group> {
        let mut g: Vec<&Group> = self.groups.values().collect();
        g.sort_by(|a, b| b.total_ns().cmp(&a.total_ns()).then(a.key.cmp(&b.key)));
        g
    }
}

#[cfg(test)]
mod tests;
