//! Rebuilds each thread's call stack from entry/exit events (a shadow stack
//! per thread) and aggregates completed calls per function and per path.
//!
//! Pairing rule: an exit pairs with the nearest open entry of the same
//! function made from the same stack frame (the entry's stack pointer is 8
//! bytes below the exit's: the return address was popped). If there is none,
//! the exit is an orphan: counted, and the stack is left intact (never "pop
//! until match").
//!
//! Frames left without a return (an exception, `longjmp`, a tail call
//! through a pointer, a return the kernel skipped) are closed by stack
//! pointer: an event whose frame sits at or above an open frame's (a
//! higher or equal stack pointer; the stack grows down) proves that frame
//! gone. It is closed then, *unwound*: counted as a call, with its time up
//! to that event, and marked so the reports say how many. Counts stay
//! exact, and a frame's time never exceeds its parent's, so self time never
//! exceeds total time. Frames still open at the end are unfinished and get
//! no invented duration.
//!
//! Frames of a function the overhead governor detached can never see their
//! return: once every event up to the detach is in, they close at the
//! detach time, marked *detached* (counted as calls, like unwound ones). A
//! detached frame with a traced call still open above it closes when that
//! call does, so a frame's time still never exceeds its parent's.
//!
//! Durations are the probes' cost taken out ([`FuncStats::cost`], from the
//! calibration at attach): a call's measured time holds its own two hits'
//! share ([`ProbeCost::inside_ns`]) and both whole hits of every traced
//! call inside it, which are taken out of it and of all its callers'. A
//! function's self time then excludes the probes too. What was taken out is
//! kept per function ([`FuncStats::probe_ns`]), so the measured figures can
//! be shown beside the corrected ones.
use std::collections::HashMap;

use profiler_common::{CommEvent, Event, KIND_ENTRY, KIND_EXIT};

use crate::{
    analyze::calltree::{CallTree, NodeId, ROOT},
    tracee::exits::ProbeCost,
};

/// Aggregate of one function's completed invocations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FuncStats {
    /// Completed invocations.
    pub calls: u64,
    /// Inclusive time of outermost invocations (recursion is not counted twice).
    pub total_ns: u64,
    /// Self time (inclusive minus traced children), all invocations.
    pub self_ns: u64,
    /// Shortest inclusive duration of one invocation.
    pub min_ns: u64,
    /// Longest inclusive duration of one invocation.
    pub max_ns: u64,
    /// Sum of every invocation's inclusive duration (for the average).
    pub sum_ns: u64,
    /// Invocations that never completed (still open, or their exit was lost).
    pub unfinished: u64,
    /// Invocations closed by stack pointer, without a return (included in
    /// `calls`): an exception or `longjmp` went through them, or a return
    /// was not seen.
    pub unwound: u64,
    /// Invocations closed when the overhead governor detached the function
    /// (included in `calls`): their return could no longer be seen.
    pub detached: u64,
    /// What its probe hits cost, taken out of the durations (zero: they
    /// are as measured).
    pub cost: ProbeCost,
    /// The probes' cost taken out of its invocations' inclusive durations,
    /// summed like `sum_ns` (measured: `sum_ns + probe_ns`).
    pub probe_ns: u64,
}

impl FuncStats {
    fn complete(&mut self, dur: u64, self_ns: u64, outermost: bool) {
        self.min_ns = if self.calls == 0 {
            dur
        } else {
            self.min_ns.min(dur)
        };
        self.max_ns = self.max_ns.max(dur);
        self.calls += 1;
        // Saturating: timestamps are the kernel's, but a damaged record
        // must not wrap a sum (or panic a checked build).
        self.sum_ns = self.sum_ns.saturating_add(dur);
        self.self_ns = self.self_ns.saturating_add(self_ns);
        if outermost {
            self.total_ns = self.total_ns.saturating_add(dur);
        }
    }

    /// Mean inclusive duration per invocation.
    pub fn avg_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.calls).unwrap_or(0)
    }

    /// Mean inclusive duration as measured, the probes' cost in it.
    pub fn measured_avg_ns(&self) -> u64 {
        (self.sum_ns + self.probe_ns)
            .checked_div(self.calls)
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    func: u32,
    node: NodeId,
    entry_ns: u64,
    /// Stack pointer at entry (0 if unknown).
    sp: u64,
    child_ns: u64,
    /// The probe hits of the traced calls inside it, in ns.
    probe_ns: u64,
    outermost: bool,
}

/// True when an exit at `exit_sp` returns from an entry at `entry_sp`
/// (x86-64: `ret` pops the 8-byte return address). Unknown (0) matches.
#[inline]
pub fn same_frame(entry_sp: u64, exit_sp: u64) -> bool {
    entry_sp == 0 || exit_sp == 0 || entry_sp.wrapping_add(8) == exit_sp
}

/// How far above an open frame an event's stack pointer may be and still
/// prove that frame gone: one thread stack (8 MiB, the usual limit). An
/// event further up runs on another stack (a signal handler on a
/// `sigaltstack`), and nests instead.
const STACK_SPAN: u64 = 8 << 20;

/// True when an event whose frame is at `level` (the stack pointer at its
/// function's entry) proves the frame entered at `sp` gone.
#[inline]
pub fn is_dead(sp: u64, level: u64) -> bool {
    sp != 0 && sp <= level && level - sp < STACK_SPAN
}

/// A call that just completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// Function index.
    pub func: u32,
    /// Entry time.
    pub start_ns: u64,
    /// Inclusive duration, without the probes' cost.
    pub dur_ns: u64,
    /// Inclusive duration as measured, from entry to exit (for a
    /// timeline, where calls must nest as they ran).
    pub measured_ns: u64,
}

/// One thread's state.
#[derive(Debug, Default)]
pub struct ThreadState {
    /// Thread id.
    pub tid: u32,
    /// Events seen from this thread.
    pub events: u64,
    /// Exits that matched no open entry.
    pub orphan_exits: u64,
    /// Frames that never completed.
    pub unfinished_frames: u64,
    /// Frames closed by stack pointer, without a return.
    pub unwound_frames: u64,
    /// Frames closed when the governor detached their function.
    pub detached_frames: u64,
    /// The thread's name when first seen.
    pub name: Option<String>,
    /// For the aggregate of exited threads of one name: how many it holds
    /// (0 for a live thread).
    pub exited_threads: u64,
    /// The thread's call paths.
    pub tree: CallTree,
    stack: Vec<Frame>,
}

impl ThreadState {
    /// Current depth of the shadow stack.
    #[expect(dead_code, reason = "no caller in the crate")]
    pub fn depth(&self) -> usize {
        self.stack.len()
    }

    /// Completes the innermost open frame at `ts_ns` (`how`: by its
    /// return, unwound, or detached), then the detached frames under it
    /// that it leaves on top (see [`Stacks::detached`]).
    fn close_top(
        &mut self,
        funcs: &mut [FuncStats],
        gone: &[bool],
        ts_ns: u64,
        how: Closed,
    ) -> Frame {
        let f = self.close_one(funcs, ts_ns, how);
        self.close_detached(funcs, gone, ts_ns);
        f
    }

    fn close_one(&mut self, funcs: &mut [FuncStats], ts_ns: u64, how: Closed) -> Frame {
        let f = self.stack.pop().expect("an open frame");
        let measured = ts_ns.saturating_sub(f.entry_ns);
        let stats = &mut funcs[f.func as usize];
        let cost = stats.cost;
        // Never so much that the call ends shorter than its traced calls
        // (a tail call's callee ends with it: `tail_calls.rs`).
        let removed = cost
            .removed(measured, f.probe_ns)
            .min(measured.saturating_sub(f.child_ns));
        let dur = measured - removed;
        let self_ns = dur.saturating_sub(f.child_ns);
        stats.probe_ns = stats.probe_ns.saturating_add(removed);
        stats.complete(dur, self_ns, f.outermost);
        match how {
            Closed::Returned => {}
            Closed::Unwound => {
                stats.unwound += 1;
                self.unwound_frames += 1;
            }
            Closed::Detached => {
                stats.detached += 1;
                self.detached_frames += 1;
            }
        }
        self.tree.complete(f.node, dur, self_ns);
        if let Some(parent) = self.stack.last_mut() {
            parent.child_ns += dur;
            parent.probe_ns += f.probe_ns + cost.hits_ns();
        }
        // Returned with what was taken out of it.
        Frame {
            probe_ns: removed,
            ..f
        }
    }

    /// Closes at `ts_ns`, detached, the innermost frames while they are of
    /// functions `gone` (detached, so their return will never be seen).
    fn close_detached(&mut self, funcs: &mut [FuncStats], gone: &[bool], ts_ns: u64) {
        while self
            .stack
            .last()
            .is_some_and(|f| gone.get(f.func as usize).copied().unwrap_or(false))
        {
            self.close_one(funcs, ts_ns, Closed::Detached);
        }
    }

    /// Closes, as unwound, the open frames that an event whose frame sits
    /// at stack level `level` proves gone (as detached, those of functions
    /// being detached by then: their return was no longer probed).
    fn unwind_to(&mut self, funcs: &mut [FuncStats], det: Detaching, level: u64, ts_ns: u64) {
        while self.stack.last().is_some_and(|f| is_dead(f.sp, level)) {
            let how = det.how(self.stack[self.stack.len() - 1].func, ts_ns);
            self.close_top(funcs, det.gone, ts_ns, how);
        }
    }
}

/// What is known of the governor's detaches: when each function's began
/// (`from`, `u64::MAX`: never), and which are done (`gone`).
#[derive(Clone, Copy)]
struct Detaching<'a> {
    from: &'a [u64],
    gone: &'a [bool],
}

impl Detaching<'_> {
    /// How a frame of `func` closed without a return at `ts_ns` is marked.
    fn how(&self, func: u32, ts_ns: u64) -> Closed {
        let i = func as usize;
        match self.gone.get(i).copied().unwrap_or(false)
            || self.from.get(i).is_some_and(|&from| ts_ns >= from)
        {
            true => Closed::Detached,
            false => Closed::Unwound,
        }
    }
}

/// How a frame was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// By its return.
    Returned,
    /// Proven gone by the stack pointer, without a return.
    Unwound,
    /// Its function was detached: its return can no longer be seen.
    Detached,
}

/// Shadow stacks of every thread, plus per-function aggregates.
#[derive(Debug)]
pub struct Stacks {
    /// Per function index.
    pub funcs: Vec<FuncStats>,
    /// Events decoded.
    pub events: u64,
    /// Events whose function index was out of range (should stay 0).
    pub invalid_events: u64,
    /// By tid (foldhash: looked up on every event).
    threads: foldhash::HashMap<u32, ThreadState>,
    /// Exited threads, folded together by name, so memory is bounded by the
    /// distinct thread names rather than by how many threads ever ran.
    exited: HashMap<String, ThreadState>,
    /// Threads found dead at the last reap, folded at the next one.
    seen_dead: std::collections::HashSet<u32>,
    new_tids: Vec<u32>,
    /// Functions with no exit probe: an entry is a call with no duration,
    /// and opens no frame.
    entry_only: Vec<bool>,
    /// Per function, when the overhead governor chose to detach it
    /// (CLOCK_MONOTONIC; empty or `u64::MAX`: never).
    detached_from: Vec<u64>,
    /// Exits of detached functions with no open entry: calls entered after
    /// the entry probe was gone and before the exit probe was (not orphans).
    pub exits_after_detach: u64,
    /// Per function, true once its probes are all gone ([`Stacks::detached`]):
    /// its open frames can never see their return.
    gone: Vec<bool>,
    /// Tail calls followed into their callee (the caller kept open:
    /// `tail_calls.rs`).
    pub tail_calls_followed: u64,
}

impl Stacks {
    /// State for `nfuncs` probed functions.
    pub fn new(nfuncs: usize) -> Self {
        Stacks {
            funcs: vec![FuncStats::default(); nfuncs],
            events: 0,
            invalid_events: 0,
            threads: Default::default(),
            exited: HashMap::new(),
            seen_dead: Default::default(),
            new_tids: Vec::new(),
            entry_only: Vec::new(),
            detached_from: Vec::new(),
            exits_after_detach: 0,
            gone: Vec::new(),
            tail_calls_followed: 0,
        }
    }

    /// Function `func` is being detached from `ts_ns` on: its entry probe
    /// goes before its exit probes, so exits with no entry are expected.
    pub fn detach_from(&mut self, func: u32, ts_ns: u64) {
        if self.detached_from.len() < self.funcs.len() {
            self.detached_from.resize(self.funcs.len(), u64::MAX);
        }
        if let Some(d) = self.detached_from.get_mut(func as usize) {
            *d = (*d).min(ts_ns);
        }
    }

    /// Every probe of `funcs` was gone at `ts_ns`, and every event before
    /// it has been applied: their frames still open close at `ts_ns`,
    /// detached; one under a traced call still open closes when that call
    /// does (or is proven gone). Returns how many frames it closed.
    pub fn detached(&mut self, funcs: &[u32], ts_ns: u64) -> u64 {
        self.gone.resize(self.funcs.len(), false);
        for &f in funcs {
            if let Some(g) = self.gone.get_mut(f as usize) {
                *g = true;
            }
        }
        let mut closed = 0;
        for t in self.threads.values_mut() {
            let before = t.detached_frames;
            t.close_detached(&mut self.funcs, &self.gone, ts_ns);
            closed += t.detached_frames - before;
        }
        closed
    }

    /// Sets what each function's probe hits cost (by index), to take out
    /// of the durations.
    pub fn set_costs(&mut self, costs: impl IntoIterator<Item = ProbeCost>) {
        for (f, c) in self.funcs.iter_mut().zip(costs) {
            f.cost = c;
        }
    }

    /// Marks the functions that have no exit probe (`true` at their index).
    pub fn set_entry_only(&mut self, entry_only: Vec<bool>) {
        self.entry_only = entry_only;
    }

    /// Functions were added to the session (probed after an exec).
    pub fn add_functions(&mut self, entry_only: &[bool]) {
        self.funcs
            .extend(std::iter::repeat_n(FuncStats::default(), entry_only.len()));
        self.entry_only
            .resize(self.funcs.len() - entry_only.len(), false);
        self.entry_only.extend_from_slice(entry_only);
    }

    /// True for a function with no exit probe.
    #[inline]
    pub fn is_entry_only(&self, func: u32) -> bool {
        self.entry_only.get(func as usize).copied().unwrap_or(false)
    }

    /// Records a thread's name as the kernel saw it on its first event.
    pub fn on_comm(&mut self, c: &CommEvent) {
        let len = c.comm.iter().position(|&b| b == 0).unwrap_or(c.comm.len());
        let name = String::from_utf8_lossy(&c.comm[..len]).into_owned();
        self.thread(c.event.tid).name = Some(name);
    }

    fn thread(&mut self, tid: u32) -> &mut ThreadState {
        let new_tids = &mut self.new_tids;
        self.threads.entry(tid).or_insert_with(|| {
            new_tids.push(tid);
            ThreadState {
                tid,
                ..Default::default()
            }
        })
    }

    /// Applies one event. Returns the call an exit completed, if any.
    #[inline]
    pub fn on_event(&mut self, ev: &Event) -> Option<Completed> {
        self.events += 1;
        let func = ev.func();
        if func as usize >= self.funcs.len() {
            self.invalid_events += 1;
            return None;
        }
        let funcs = &mut self.funcs;
        let gone = &self.gone;
        let det = Detaching {
            from: &self.detached_from,
            gone,
        };
        let new_tids = &mut self.new_tids;
        let t = self.threads.entry(ev.tid).or_insert_with(|| {
            new_tids.push(ev.tid);
            ThreadState {
                tid: ev.tid,
                ..Default::default()
            }
        });
        t.events += 1;
        match ev.kind() {
            KIND_ENTRY if self.entry_only.get(func as usize).copied().unwrap_or(false) => {
                let parent = t.stack.last().map_or(ROOT, |f| f.node);
                let node = t.tree.child(parent, func);
                t.tree.complete(node, 0, 0);
                funcs[func as usize].complete(0, 0, false);
                if let Some(caller) = t.stack.last_mut() {
                    caller.probe_ns += u64::from(funcs[func as usize].cost.entry_ns);
                }
            }
            KIND_ENTRY => {
                if ev.sp != 0 {
                    t.unwind_to(funcs, det, ev.sp, ev.ts_ns);
                }
                let parent = t.stack.last().map_or(ROOT, |f| f.node);
                let node = t.tree.child(parent, func);
                let outermost = !t.stack.iter().any(|f| f.func == func);
                t.stack.push(Frame {
                    func,
                    node,
                    entry_ns: ev.ts_ns,
                    sp: ev.sp,
                    child_ns: 0,
                    probe_ns: 0,
                    outermost,
                });
            }
            KIND_EXIT => {
                let Some(pos) = t
                    .stack
                    .iter()
                    .rposition(|f| f.func == func && same_frame(f.sp, ev.sp))
                else {
                    // The returning frame was never seen entering, yet
                    // frames at or below its level are gone.
                    if ev.sp != 0 {
                        t.unwind_to(funcs, det, ev.sp.wrapping_sub(8), ev.ts_ns);
                    }
                    match self.detached_from.get(func as usize) {
                        Some(&from) if ev.ts_ns >= from => self.exits_after_detach += 1,
                        _ => t.orphan_exits += 1,
                    }
                    return None;
                };
                while t.stack.len() > pos + 1 {
                    let how = det.how(t.stack[t.stack.len() - 1].func, ev.ts_ns);
                    t.close_one(funcs, ev.ts_ns, how);
                }
                let f = t.close_top(funcs, gone, ev.ts_ns, Closed::Returned);
                return Some(Completed {
                    func,
                    start_ns: f.entry_ns,
                    dur_ns: ev.ts_ns.saturating_sub(f.entry_ns + f.probe_ns),
                    measured_ns: ev.ts_ns.saturating_sub(f.entry_ns),
                });
            }
            _ => self.invalid_events += 1,
        }
        None
    }

    /// Names the threads first seen since the last call, with `lookup`.
    /// A name read now wins over the kernel's first sighting (threads often
    /// rename themselves right after they start).
    pub fn name_new_threads(
        &mut self,
        lookup: impl Fn(u32) -> Option<String>,
    ) -> Vec<(u32, String)> {
        let mut set = Vec::new();
        for tid in self.new_tids.drain(..) {
            if let (Some(t), Some(name)) = (self.threads.get_mut(&tid), lookup(tid)) {
                t.name = Some(name.clone());
                set.push((tid, name));
            }
        }
        set
    }

    /// Ends a time window at `cut_ns`: frames still open are completed at
    /// the cut, so their time *within the window* counts (for the startup
    /// window, exec to ready). Returns how many frames were cut.
    pub fn cut_window(&mut self, cut_ns: u64) -> u64 {
        let mut cut = 0;
        for t in self.threads.values_mut() {
            while !t.stack.is_empty() {
                t.close_one(&mut self.funcs, cut_ns, Closed::Returned);
                cut += 1;
            }
        }
        cut
    }

    /// The thread `tid`, if it had events.
    pub fn thread_state(&self, tid: u32) -> Option<&ThreadState> {
        self.threads.get(&tid)
    }

    /// Marks every frame still open as unfinished. Call once, at the end.
    pub fn finish(&mut self) {
        for t in self.threads.values_mut() {
            for f in t.stack.drain(..) {
                self.funcs[f.func as usize].unfinished += 1;
                t.unfinished_frames += 1;
            }
        }
    }

    /// Threads seen, by tid.
    pub fn threads(&self) -> impl Iterator<Item = &ThreadState> {
        self.threads.values().chain(self.exited.values())
    }

    /// Number of threads seen (exited ones included).
    pub fn thread_count(&self) -> usize {
        self.threads.len()
            + self
                .exited
                .values()
                .map(|t| t.exited_threads as usize)
                .sum::<usize>()
    }

    /// Exits that matched no open entry, over all threads.
    pub fn orphan_exits(&self) -> u64 {
        self.threads().map(|t| t.orphan_exits).sum()
    }

    /// Frames that never completed, over all threads.
    pub fn unfinished_frames(&self) -> u64 {
        self.threads().map(|t| t.unfinished_frames).sum()
    }

    /// Frames closed by stack pointer, over all threads.
    pub fn unwound_frames(&self) -> u64 {
        self.threads().map(|t| t.unwound_frames).sum()
    }

    /// Frames closed when their function was detached, over all threads.
    pub fn detached_frames(&self) -> u64 {
        self.threads().map(|t| t.detached_frames).sum()
    }

    /// Folds exited threads into one aggregate per thread name: their open
    /// frames become unfinished, their call paths are summed. A thread is
    /// folded once `alive` said no at the previous call too, so everything
    /// it sent before dying has been drained in between; with `now`, at
    /// once (after the final drain). Returns how many threads were reaped.
    pub fn reap(&mut self, alive: impl Fn(u32) -> bool, now: bool) -> Vec<u32> {
        // Goroutines are not threads: they are never reaped.
        let dead: std::collections::HashSet<u32> = self
            .threads
            .keys()
            .copied()
            .filter(|&tid| !super::goroutines::is_goroutine(tid) && !alive(tid))
            .collect();
        let gone: Vec<u32> = if now {
            dead.iter().copied().collect()
        } else {
            dead.intersection(&self.seen_dead).copied().collect()
        };
        self.seen_dead = dead;
        self.fold_exited(&gone);
        gone
    }

    /// Folds the threads `gone` (see [`Stacks::reap`]); replay applies the
    /// recorded decisions through this.
    pub fn fold_exited(&mut self, gone: &[u32]) {
        for tid in gone {
            let Some(mut t) = self.threads.remove(tid) else {
                continue;
            };
            for f in t.stack.drain(..) {
                self.funcs[f.func as usize].unfinished += 1;
                t.unfinished_frames += 1;
            }
            let name = t.name.clone().unwrap_or_else(|| format!("tid-{tid}"));
            match self.exited.get_mut(&name) {
                Some(agg) => {
                    agg.events += t.events;
                    agg.orphan_exits += t.orphan_exits;
                    agg.unfinished_frames += t.unfinished_frames;
                    agg.unwound_frames += t.unwound_frames;
                    agg.detached_frames += t.detached_frames;
                    agg.tree.absorb(&t.tree);
                    agg.exited_threads += 1;
                }
                None => {
                    t.name = Some(name.clone());
                    t.exited_threads = 1;
                    self.exited.insert(name, t);
                }
            }
        }
    }

    /// Sets a thread's name (replay of a name read from /proc).
    pub fn set_name(&mut self, tid: u32, name: String) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.name = Some(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, tid: u32, kind: u32, func: u32) -> Event {
        Event {
            ts_ns: ts,
            tid,
            word: Event::pack(kind, func),
            sp: 0,
        }
    }
    fn run(n: usize, evs: &[(u64, u32, u32, u32)]) -> Stacks {
        let mut s = Stacks::new(n);
        for &(ts, tid, kind, func) in evs {
            s.on_event(&ev(ts, tid, kind, func));
        }
        s
    }
    const E: u32 = KIND_ENTRY;
    const X: u32 = KIND_EXIT;

    #[test]
    fn nested_calls_give_total_and_self() {
        // a(0..100) { b(10..40) b(50..90) }
        let s = run(
            2,
            &[
                (0, 1, E, 0),
                (10, 1, E, 1),
                (40, 1, X, 1),
                (50, 1, E, 1),
                (90, 1, X, 1),
                (100, 1, X, 0),
            ],
        );
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[0].total_ns, 100);
        assert_eq!(s.funcs[0].self_ns, 30);
        assert_eq!(s.funcs[1].calls, 2);
        assert_eq!(s.funcs[1].total_ns, 70);
        assert_eq!(
            (s.funcs[1].min_ns, s.funcs[1].max_ns, s.funcs[1].avg_ns()),
            (30, 40, 35)
        );
        assert_eq!(s.orphan_exits() + s.unfinished_frames(), 0);
    }

    #[test]
    fn recursion_counts_outermost_total_once() {
        // r(0..100) { r(10..60) { r(20..30) } }
        let s = run(
            1,
            &[
                (0, 1, E, 0),
                (10, 1, E, 0),
                (20, 1, E, 0),
                (30, 1, X, 0),
                (60, 1, X, 0),
                (100, 1, X, 0),
            ],
        );
        assert_eq!(s.funcs[0].calls, 3);
        assert_eq!(s.funcs[0].total_ns, 100);
        assert_eq!(s.funcs[0].self_ns, 100);
        assert_eq!(s.funcs[0].max_ns, 100);
        assert_eq!(s.funcs[0].min_ns, 10);
    }

    #[test]
    fn orphan_exit_leaves_stack_intact() {
        // a opens, an exit of b arrives with no b open, then a closes.
        let s = run(
            2,
            &[
                (0, 1, E, 0),
                (5, 1, X, 1),
                (10, 1, E, 1),
                (20, 1, X, 1),
                (30, 1, X, 0),
            ],
        );
        assert_eq!(s.orphan_exits(), 1);
        assert_eq!(s.funcs[0].total_ns, 30);
        assert_eq!(s.funcs[0].self_ns, 20);
        assert_eq!(s.funcs[1].calls, 1);
    }

    #[test]
    fn lost_exit_closes_inner_frame_unwound() {
        // a { b (exit lost) } : a's duration is unchanged; b is closed at
        // a's return, marked unwound.
        let s = run(2, &[(0, 1, E, 0), (10, 1, E, 1), (50, 1, X, 0)]);
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[0].total_ns, 50);
        assert_eq!(s.funcs[0].self_ns, 10);
        assert_eq!((s.funcs[1].calls, s.funcs[1].unwound), (1, 1));
        assert_eq!(s.funcs[1].total_ns, 40);
        assert_eq!(s.unfinished_frames(), 0);
        assert_eq!(s.unwound_frames(), 1);
    }

    #[test]
    fn open_frames_at_end_are_unfinished_not_invented() {
        let mut s = run(1, &[(0, 1, E, 0), (10, 2, E, 0), (20, 2, X, 0)]);
        s.finish();
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[0].total_ns, 10);
        assert_eq!(s.funcs[0].unfinished, 1);
        assert_eq!(s.thread_count(), 2);
    }

    #[test]
    fn threads_are_independent() {
        let s = run(
            1,
            &[(0, 1, E, 0), (5, 2, E, 0), (10, 1, X, 0), (25, 2, X, 0)],
        );
        assert_eq!(s.funcs[0].calls, 2);
        assert_eq!(s.funcs[0].total_ns, 30);
    }

    #[test]
    fn skipped_returns_do_not_mis_pair_recursion() {
        // r nested 4 deep at sp 1000, 900, 800, 700; the kernel skipped the
        // two innermost returns. Returns at 808 and 908... are depth 2 and 1.
        let mut s = Stacks::new(1);
        let at = |ts, kind, sp| Event {
            ts_ns: ts,
            tid: 1,
            word: Event::pack(kind, 0),
            sp,
        };
        for (i, sp) in [1000u64, 900, 800, 700].iter().enumerate() {
            s.on_event(&at(i as u64 * 10, E, *sp));
        }
        s.on_event(&at(100, X, 908));
        s.on_event(&at(200, X, 1008));
        // The two frames without a return close at their caller's return.
        assert_eq!(s.funcs[0].calls, 4);
        assert_eq!(s.funcs[0].unwound, 2);
        assert_eq!(s.funcs[0].total_ns, 200);
        assert_eq!(s.funcs[0].max_ns, 200);
        assert_eq!(s.funcs[0].min_ns, 70);
        assert_eq!(s.funcs[0].unfinished, 0);
        // A return from a frame that never entered is an orphan.
        s.on_event(&at(300, X, 5008));
        assert_eq!(s.orphan_exits(), 1);
    }

    #[test]
    fn exited_threads_fold_by_name() {
        let mut s = Stacks::new(1);
        for tid in 10..20 {
            s.on_event(&ev(0, tid, E, 0));
            s.on_event(&ev(5, tid, X, 0));
            s.threads.get_mut(&tid).unwrap().name = Some("worker".into());
        }
        s.on_event(&ev(0, 99, E, 0)); // still open when its thread dies
        s.threads.get_mut(&99).unwrap().name = Some("worker".into());
        assert!(
            s.reap(|tid| tid == 1, false).is_empty(),
            "first sighting only marks them"
        );
        assert_eq!(s.reap(|tid| tid == 1, false).len(), 11);
        assert_eq!(s.threads().count(), 1);
        let agg = s.threads().next().unwrap();
        assert_eq!(agg.exited_threads, 11);
        assert_eq!(agg.unfinished_frames, 1);
        assert_eq!(agg.tree.nodes()[1].calls, 10);
        assert_eq!(s.thread_count(), 11);
        assert_eq!(s.funcs[0].calls, 10);
        assert_eq!(s.funcs[0].unfinished, 1);
    }

    fn at(ts: u64, kind: u32, func: u32, sp: u64) -> Event {
        Event {
            ts_ns: ts,
            tid: 1,
            word: Event::pack(kind, func),
            sp,
        }
    }

    #[test]
    fn exception_through_frames_closes_them_unwound() {
        // outer(sp 1000) { middle(900) { thrower(800) throws } } caught in
        // outer, which then calls middle again and returns.
        let mut s = Stacks::new(3);
        s.on_event(&at(0, E, 0, 1000));
        s.on_event(&at(10, E, 1, 900));
        s.on_event(&at(20, E, 2, 800));
        // Caught: the next call from outer is at middle's level.
        s.on_event(&at(50, E, 1, 900));
        assert_eq!(s.funcs[1].unwound, 1);
        assert_eq!(s.funcs[2].unwound, 1);
        assert_eq!((s.funcs[1].calls, s.funcs[1].total_ns), (1, 40));
        assert_eq!((s.funcs[2].calls, s.funcs[2].total_ns), (1, 30));
        s.on_event(&at(60, X, 1, 908));
        s.on_event(&at(100, X, 0, 1008));
        assert_eq!(s.funcs[1].calls, 2);
        assert_eq!(s.funcs[1].unwound, 1);
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[0].total_ns, 100);
        assert_eq!(s.funcs[0].self_ns, 100 - 40 - 10);
        assert_eq!(s.unwound_frames(), 2);
        assert_eq!(s.unfinished_frames() + s.orphan_exits(), 0);
        for f in &s.funcs {
            assert!(f.self_ns <= f.total_ns, "{f:?}");
        }
    }

    #[test]
    fn longjmp_closes_frames_at_the_return_of_the_setjmp_caller() {
        // jumper(1000) { via(900) { via(800) longjmp } } back in jumper,
        // which returns: both via frames close at that return.
        let mut s = Stacks::new(2);
        s.on_event(&at(0, E, 0, 1000));
        s.on_event(&at(10, E, 1, 900));
        s.on_event(&at(20, E, 1, 800));
        s.on_event(&at(70, X, 0, 1008));
        assert_eq!(s.funcs[1].calls, 2);
        assert_eq!(s.funcs[1].unwound, 2);
        assert_eq!(s.funcs[1].total_ns, 60);
        assert_eq!(s.funcs[1].self_ns, 60);
        assert_eq!(s.funcs[0].total_ns, 70);
        assert_eq!(s.funcs[0].self_ns, 10);
    }

    #[test]
    fn signal_handler_on_its_own_stack_nests() {
        // a(sp 0x7000_0000) interrupted by a handler on a sigaltstack far
        // above: the handler's call nests and does not close a.
        let mut s = Stacks::new(2);
        s.on_event(&at(0, E, 0, 0x7000_0000));
        s.on_event(&at(10, E, 1, 0x7fff_0000));
        s.on_event(&at(20, X, 1, 0x7fff_0008));
        s.on_event(&at(30, X, 0, 0x7000_0008));
        assert_eq!(s.unwound_frames(), 0);
        assert_eq!(s.funcs[0].total_ns, 30);
        assert_eq!(s.funcs[0].self_ns, 20);
    }

    #[test]
    fn orphan_exit_still_proves_deeper_frames_gone() {
        // b(800) open; a return from a frame at 900 never seen entering.
        let mut s = Stacks::new(2);
        s.on_event(&at(0, E, 1, 800));
        s.on_event(&at(10, X, 0, 908));
        assert_eq!(s.orphan_exits(), 1);
        assert_eq!(s.funcs[1].unwound, 1);
        assert_eq!(s.funcs[1].total_ns, 10);
    }

    #[test]
    fn exits_of_a_detached_function_without_entry_are_not_orphans() {
        let mut s = Stacks::new(1);
        s.on_event(&at(10, X, 0, 908));
        s.detach_from(0, 100);
        s.on_event(&at(50, E, 0, 900));
        s.on_event(&at(150, X, 0, 908));
        s.on_event(&at(160, X, 0, 908));
        assert_eq!(s.orphan_exits(), 1);
        assert_eq!(s.exits_after_detach, 1);
        assert_eq!(s.funcs[0].calls, 1);
    }

    #[test]
    fn a_frame_left_open_by_a_detached_exit_probe_is_closed_by_its_caller() {
        // caller(1000) { hot(900): its exit probe is gone mid-call }; the
        // caller's return closes hot as unwound, and caller's own time is
        // exact.
        let mut s = Stacks::new(2);
        s.on_event(&at(0, E, 0, 1000));
        s.on_event(&at(10, E, 1, 900));
        s.detach_from(1, 15);
        s.on_event(&at(40, E, 0, 800));
        s.on_event(&at(50, X, 0, 808));
        s.on_event(&at(100, X, 0, 1008));
        assert_eq!((s.funcs[0].calls, s.funcs[0].total_ns), (2, 100));
        assert_eq!((s.funcs[1].calls, s.funcs[1].detached), (1, 1));
        assert_eq!(s.funcs[1].total_ns, 90);
        assert_eq!(
            s.orphan_exits() + s.unfinished_frames() + s.unwound_frames(),
            0
        );
        for f in &s.funcs {
            assert!(f.self_ns <= f.total_ns, "{f:?}");
        }
    }

    #[test]
    fn frames_of_a_detached_function_close_at_the_detach_and_their_caller_normally() {
        // dispatch(sp 100000) { call(99000) { hash x150 (recursing, 98000
        // down) } }: hash is detached at 500, its returns never come; call
        // and dispatch then return normally.
        let mut s = Stacks::new(3);
        s.on_event(&at(0, E, 0, 100_000));
        s.on_event(&at(10, E, 1, 99_000));
        for i in 0..150u64 {
            s.on_event(&at(20 + i, E, 2, 98_000 - i * 64));
        }
        s.detach_from(2, 400);
        assert_eq!(s.detached(&[2], 500), 150);
        let t = s.thread_state(1).unwrap();
        assert_eq!(t.stack.len(), 2, "only the callers stay open");
        assert_eq!((s.funcs[2].calls, s.funcs[2].detached), (150, 150));
        assert_eq!(
            s.funcs[2].total_ns,
            500 - 20,
            "outermost hash: entry to detach"
        );
        s.on_event(&at(700, X, 1, 99_008));
        s.on_event(&at(800, X, 0, 100_008));
        assert_eq!((s.funcs[1].calls, s.funcs[1].total_ns), (1, 690));
        assert_eq!((s.funcs[0].calls, s.funcs[0].total_ns), (1, 800));
        assert_eq!(s.funcs[0].self_ns, 110);
        assert_eq!(s.funcs[1].self_ns, 690 - 480);
        assert_eq!(s.detached_frames(), 150);
        assert_eq!(
            s.unwound_frames() + s.orphan_exits() + s.unfinished_frames(),
            0
        );
        for f in &s.funcs {
            assert!(f.self_ns <= f.total_ns, "{f:?}");
        }
    }

    #[test]
    fn a_detached_frame_under_a_traced_call_closes_when_that_call_returns() {
        // hot(1000) { kept(900) still running at the detach (300) }: hot
        // closes at kept's return (400), not before it.
        let mut s = Stacks::new(2);
        s.on_event(&at(0, E, 0, 1000));
        s.on_event(&at(100, E, 1, 900));
        assert_eq!(s.detached(&[0], 300), 0);
        s.on_event(&at(400, X, 1, 908));
        assert_eq!((s.funcs[0].calls, s.funcs[0].detached), (1, 1));
        assert_eq!(s.funcs[0].total_ns, 400);
        assert_eq!(s.funcs[0].self_ns, 100);
        assert!(s.thread_state(1).unwrap().stack.is_empty());
        // Its later calls (none should come) are not affected by the mark
        // until they are left on top by a return.
        assert_eq!(s.detached_frames(), 1);
        assert_eq!(s.unwound_frames(), 0);
    }

    #[test]
    fn out_of_range_function_is_counted_invalid() {
        let s = run(1, &[(0, 1, E, 7)]);
        assert_eq!(s.invalid_events, 1);
    }
}
