//! Tail calls as written: a function that leaves by jumping to another
//! (`jmp callee`, its frame already torn down) is still running, as far as
//! its source is concerned, until that callee returns. redis's
//! `evalCommand` ends in `jmp evalGenericCommand`; a slow EVAL must read
//! `evalCommand → evalGenericCommand`, not `evalGenericCommand` alone.
//!
//! With return sites, the jump is one of the caller's exits. Where the
//! callee is probed too, that site's probe carries
//! [`profiler_common::TAIL_CALL`], and this rewriter, which every function
//! event passes before the shadow stacks, the dispatcher and the timeline
//! see it, turns the stream into the calls as written:
//! - the tail-call exit is held until the thread's next event. When that
//!   is the entry of one of the caller's tail callees at the caller's own
//!   level, the caller's exit is dropped and the caller stays open (the
//!   callee's entry keeps the bit: the trees mark it `tail call`);
//!   anything else, and the held exit goes on as it was (the callee's
//!   entry was not seen: the frame closes at the jump, as before);
//! - a callee entered that way shares its caller's stack level (the same
//!   return address). So that pairing and "proven gone by the stack
//!   pointer" (`stacks.rs`) keep telling them apart, its events are moved
//!   down by one byte per frame kept open at that level: a real frame's
//!   stack pointer is 8-byte aligned, so nothing else lands there;
//! - when the innermost frame at that level returns, the callers kept open
//!   there return at the same instant, innermost first.
//!
//! With return uprobes there is no event at the jump: the callee returns
//! through the replaced address, and both exits fire then, the callee's
//! first. But the callee enters at its caller's level, which proves the
//! caller gone to the consumers. So the rewriter also follows the open
//! calls of functions that have tail callees and return uprobes: a callee
//! entered at the level of one is moved down in the same way, and the
//! caller's own exit, when it comes, is passed on as it is.
//!
//! Frames proven gone while kept open (an exception, `longjmp`) are left
//! to the consumers, which close them by stack pointer as they would any
//! frame. When the overhead governor detaches a function in a chain, the
//! frames it kept open close at the detach ([`TailCalls::detached`]).
use profiler_common::{Event, KIND_ENTRY, KIND_EXIT, TAIL_CALL};

/// A caller kept open by its tail call.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// The caller.
    func: u32,
    /// The real stack pointer its exit (and its callee's) reports.
    exit_sp: u64,
    /// The callee it jumped to.
    callee: u32,
    /// Its own exit will come (a return uprobe): none is made up for it.
    returns: bool,
}

/// One thread's tail calls in flight.
#[derive(Debug, Default)]
struct Thread {
    /// A tail-call exit waiting for the next event: as it will be passed on
    /// (bit cleared, stack pointer moved), and the real stack pointer.
    held: Option<(Event, u64)>,
    /// Callers kept open, outermost first.
    open: Vec<Open>,
    /// Open calls of functions with tail callees and return uprobes:
    /// (function, stack pointer at entry), innermost last.
    entered: Vec<(u32, u64)>,
}

impl Thread {
    /// How many callers are kept open at the level whose exits report
    /// `exit_sp`.
    fn depth_at(&self, exit_sp: u64) -> u64 {
        self.open
            .iter()
            .rev()
            .take_while(|o| o.exit_sp == exit_sp)
            .count() as u64
    }

    fn is_idle(&self) -> bool {
        self.held.is_none() && self.open.is_empty() && self.entered.is_empty()
    }
}

/// The rewriter (see the module docs).
#[derive(Debug, Default)]
pub struct TailCalls {
    /// Per function index, the probed functions its tail calls reach,
    /// sorted.
    callees: Vec<Vec<u32>>,
    /// Per function index, true for one with tail callees and a return
    /// uprobe (its open calls are followed).
    uret: Vec<bool>,
    /// Threads with a tail call in flight only.
    threads: foldhash::HashMap<u32, Thread>,
    /// Tail calls followed into their callee.
    pub followed: u64,
}

/// `ev` as an exit of `func`, without the tail-call bit, at `sp`.
fn exit_at(ev: &Event, func: u32, sp: u64) -> Event {
    Event {
        word: Event::pack(KIND_EXIT, func),
        sp,
        ..*ev
    }
}

impl TailCalls {
    /// For functions whose tail callees are `callees` (by index), `uret`
    /// true for those whose returns are seen by return uprobes.
    pub fn new(mut callees: Vec<Vec<u32>>, uret: Vec<bool>) -> Self {
        for c in &mut callees {
            c.sort_unstable();
            c.dedup();
        }
        let uret = callees
            .iter()
            .zip(uret.iter().chain(std::iter::repeat(&false)))
            .map(|(c, &u)| u && !c.is_empty())
            .collect();
        TailCalls {
            callees,
            uret,
            ..Default::default()
        }
    }

    /// Functions were added to the session (with no tail calls followed).
    pub fn add_functions(&mut self, n: usize) {
        self.callees.resize(self.callees.len() + n, Vec::new());
        self.uret.resize(self.callees.len(), false);
    }

    fn is_uret_caller(&self, func: u32) -> bool {
        self.uret.get(func as usize).copied().unwrap_or(false)
    }

    /// True when `ev` would pass unchanged and leave no state: no tail
    /// call in flight on any thread, and nothing to follow in `ev`.
    #[inline]
    pub fn passes(&self, ev: &Event) -> bool {
        self.threads.is_empty() && !ev.tail_call() && !self.is_uret_caller(ev.func())
    }

    /// True when no tail call is in flight on any thread.
    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.threads.is_empty()
    }

    fn is_callee(&self, caller: u32, callee: u32) -> bool {
        self.callees
            .get(caller as usize)
            .is_some_and(|c| c.binary_search(&callee).is_ok())
    }

    /// Passes `ev` on, rewritten, into `out` (in order).
    #[inline]
    pub fn feed(&mut self, ev: &Event, out: &mut Vec<Event>) {
        if self.passes(ev) {
            out.push(*ev);
            return;
        }
        let mut t = match self.threads.remove(&ev.tid) {
            Some(t) => t,
            // Another thread's tail call is in flight; nothing in this one.
            None if !ev.tail_call() && !self.is_uret_caller(ev.func()) => {
                out.push(*ev);
                return;
            }
            None => Thread::default(),
        };
        self.step(&mut t, ev, out);
        if !t.is_idle() {
            self.threads.insert(ev.tid, t);
        }
    }

    fn step(&mut self, t: &mut Thread, ev: &Event, out: &mut Vec<Event>) {
        if let Some((held, real_sp)) = t.held.take() {
            let caller = held.func();
            if ev.kind() == KIND_ENTRY
                && ev.sp.wrapping_add(8) == real_sp
                && self.is_callee(caller, ev.func())
            {
                t.open.push(Open {
                    func: caller,
                    exit_sp: real_sp,
                    callee: ev.func(),
                    returns: false,
                });
                self.followed += 1;
                // Marked as entered by a tail call (for the trees); every
                // consumer reads the function without the bit.
                let depth = t.depth_at(real_sp);
                out.push(Event {
                    sp: ev.sp.wrapping_sub(depth),
                    word: ev.word | TAIL_CALL,
                    ..*ev
                });
                return;
            }
            out.push(held);
        }
        let exit = ev.kind() == KIND_EXIT;
        if !exit && ev.sp != 0 {
            // A callee entering at the level of a caller with a return
            // uprobe, through its tail call.
            if let Some(&(caller, sp)) = t.entered.last() {
                if sp == ev.sp && self.is_callee(caller, ev.func()) {
                    t.entered.pop();
                    t.open.push(Open {
                        func: caller,
                        exit_sp: sp.wrapping_add(8),
                        callee: ev.func(),
                        returns: true,
                    });
                    self.followed += 1;
                    let depth = t.depth_at(sp.wrapping_add(8));
                    if self.is_uret_caller(ev.func()) {
                        t.entered.push((ev.func(), ev.sp));
                    }
                    out.push(Event {
                        sp: ev.sp.wrapping_sub(depth),
                        word: ev.word | TAIL_CALL,
                        ..*ev
                    });
                    return;
                }
            }
            while t
                .entered
                .last()
                .is_some_and(|&(_, sp)| crate::analyze::stacks::is_dead(sp, ev.sp))
            {
                t.entered.pop();
            }
            if self.is_uret_caller(ev.func()) {
                t.entered.push((ev.func(), ev.sp));
            }
        }
        if exit && ev.sp != 0 {
            if let Some(&(f, sp)) = t.entered.last() {
                if f == ev.func() && sp.wrapping_add(8) == ev.sp {
                    t.entered.pop();
                }
            }
            while t
                .entered
                .last()
                .is_some_and(|&(_, sp)| crate::analyze::stacks::is_dead(sp, ev.sp.wrapping_sub(8)))
            {
                t.entered.pop();
            }
        }
        if exit && ev.sp != 0 {
            let depth = t.depth_at(ev.sp);
            if depth > 0 {
                // The innermost frame at a level callers are kept open at.
                let moved = exit_at(ev, ev.func(), ev.sp.wrapping_sub(depth));
                if ev.tail_call() {
                    t.held = Some((moved, ev.sp));
                    return;
                }
                out.push(moved);
                // The callers kept open there return now, innermost first:
                // made up for those whose exit is a tail call's jump; one
                // with a return uprobe returns by itself, next.
                while t.open.last().is_some_and(|o| o.exit_sp == ev.sp) {
                    let o = t.open.pop().expect("a caller kept open");
                    if o.returns {
                        break;
                    }
                    out.push(exit_at(ev, o.func, ev.sp.wrapping_sub(t.depth_at(ev.sp))));
                }
                return;
            }
        }
        // Callers kept open at a level this event proves gone are closed
        // by the consumers; forget them.
        if ev.sp != 0 {
            let level = if exit { ev.sp.wrapping_sub(8) } else { ev.sp };
            while t
                .open
                .last()
                .is_some_and(|o| crate::analyze::stacks::is_dead(o.exit_sp.wrapping_sub(8), level))
            {
                t.open.pop();
            }
        }
        if exit && ev.tail_call() {
            t.held = Some((exit_at(ev, ev.func(), ev.sp), ev.sp));
            return;
        }
        out.push(Event {
            word: ev.word & !TAIL_CALL,
            ..*ev
        });
    }

    /// Passes on every held exit (the end of the session).
    pub fn flush(&mut self, out: &mut Vec<Event>) {
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            if let Some(t) = self.threads.get_mut(&tid) {
                if let Some((held, _)) = t.held.take() {
                    out.push(held);
                }
                if t.is_idle() {
                    self.threads.remove(&tid);
                }
            }
        }
    }

    /// Functions `funcs` were detached at `ts_ns`: a caller kept open for
    /// one of them (or kept open as one of them) can no longer see its
    /// end. It returns now, with every caller kept open inside it, so the
    /// consumers close the detached frames under it as detached.
    pub fn detached(&mut self, funcs: &[u32], ts_ns: u64, out: &mut Vec<Event>) {
        self.flush(out);
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let Some(mut t) = self.threads.remove(&tid) else {
                continue;
            };
            if let Some(first) = t
                .open
                .iter()
                .position(|o| funcs.contains(&o.callee) || funcs.contains(&o.func))
            {
                while t.open.len() > first {
                    let o = t.open.pop().expect("a caller kept open");
                    if o.returns && !funcs.contains(&o.func) {
                        // Its return uprobe still fires, at its own level.
                        continue;
                    }
                    let sp = o.exit_sp.wrapping_sub(t.depth_at(o.exit_sp));
                    let at = Event {
                        ts_ns,
                        tid,
                        word: 0,
                        sp: 0,
                    };
                    out.push(exit_at(&at, o.func, sp));
                }
            }
            if !t.is_idle() {
                self.threads.insert(tid, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::stacks::Stacks;

    const E: u32 = KIND_ENTRY;
    const X: u32 = KIND_EXIT;

    fn ev(ts: u64, kind: u32, func: u32, sp: u64) -> Event {
        Event {
            ts_ns: ts,
            tid: 1,
            word: Event::pack(kind, func),
            sp,
        }
    }

    fn tail(func: u32) -> u32 {
        func | TAIL_CALL
    }

    /// The call paths of thread 1, as function lists.
    fn paths(s: &Stacks) -> Vec<Vec<u32>> {
        let t = s.threads().next().expect("a thread");
        (1..t.tree.nodes().len())
            .map(|n| t.tree.path(n as crate::analyze::calltree::NodeId))
            .collect()
    }

    /// Runs `evs` through a rewriter (function 0 tail-calls 1, 1 tail-calls
    /// 2) and shadow stacks of `n` functions.
    fn run(n: usize, evs: &[Event]) -> (Vec<Event>, Stacks, u64) {
        let mut tails = TailCalls::new(vec![vec![1], vec![2], vec![]], Vec::new());
        let mut out = Vec::new();
        for e in evs {
            tails.feed(e, &mut out);
        }
        tails.flush(&mut out);
        let mut stacks = Stacks::new(n);
        for e in &out {
            stacks.on_event(e);
        }
        (out, stacks, tails.followed)
    }

    #[test]
    fn a_tail_caller_stays_open_until_its_callee_returns() {
        // main (3) calls 0 at sp 1000; 0 jumps to 1, which returns at 80.
        let (out, s, followed) = run(
            4,
            &[
                ev(0, E, 3, 2000),
                ev(10, E, 0, 1000),
                ev(20, X, tail(0), 1008),
                ev(21, E, 1, 1000),
                ev(30, E, 3, 900),
                ev(40, X, 3, 908),
                ev(80, X, 1, 1008),
                ev(90, X, 3, 2008),
            ],
        );
        assert_eq!(followed, 1);
        // Only the callee's entry carries the bit now: entered by a tail call.
        let marked: Vec<(u32, u32)> = out
            .iter()
            .filter(|e| e.tail_call())
            .map(|e| (e.kind(), e.func()))
            .collect();
        assert_eq!(marked, [(E, 1)]);
        // 0 closes at 80, with 1 inside it: 70 ns, 1 is 59.
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[0].total_ns, 70);
        assert_eq!(s.funcs[0].unwound, 0);
        assert_eq!(s.funcs[1].calls, 1);
        assert_eq!(s.funcs[1].total_ns, 59);
        assert_eq!(s.funcs[0].self_ns, 11);
        assert_eq!((s.orphan_exits(), s.unfinished_frames()), (0, 0));
        // The tree: 3 → 0 → 1 → 3.
        assert!(paths(&s).contains(&vec![3, 0, 1, 3]), "{:?}", paths(&s));
    }

    #[test]
    fn a_tail_call_between_return_uprobes_keeps_the_caller_open() {
        // No event at the jump: 1 enters at 0's level; both return
        // uprobes fire at 80, the callee's first.
        let mut tails = TailCalls::new(vec![vec![1], vec![], vec![]], vec![true, true, false]);
        let mut out = Vec::new();
        for e in [
            ev(0, E, 3, 2000),
            ev(10, E, 0, 1000),
            ev(21, E, 1, 1000),
            ev(30, E, 2, 900),
            ev(40, X, 2, 908),
            ev(80, X, 1, 1008),
            ev(80, X, 0, 1008),
            ev(85, E, 0, 1000),
            ev(86, X, 0, 1008),
            ev(90, X, 3, 2008),
        ] {
            tails.feed(&e, &mut out);
        }
        tails.flush(&mut out);
        assert!(tails.is_idle());
        assert_eq!(tails.followed, 1);
        let mut s = Stacks::new(4);
        for e in &out {
            s.on_event(e);
        }
        assert_eq!((s.funcs[0].calls, s.funcs[0].total_ns), (2, 71));
        assert_eq!((s.funcs[1].calls, s.funcs[1].total_ns), (1, 59));
        assert_eq!(
            s.unwound_frames() + s.orphan_exits() + s.unfinished_frames(),
            0
        );
        assert!(paths(&s).contains(&vec![3, 0, 1, 2]), "{:?}", paths(&s));
    }

    #[test]
    fn a_chain_of_tail_calls_closes_together() {
        let (_, s, followed) = run(
            3,
            &[
                ev(10, E, 0, 1000),
                ev(20, X, tail(0), 1008),
                ev(21, E, 1, 1000),
                ev(30, X, tail(1), 1008),
                ev(31, E, 2, 1000),
                ev(50, X, 2, 1008),
            ],
        );
        assert_eq!(followed, 2);
        assert_eq!(
            (
                s.funcs[0].total_ns,
                s.funcs[1].total_ns,
                s.funcs[2].total_ns
            ),
            (40, 29, 19)
        );
        assert_eq!(s.unwound_frames() + s.unfinished_frames(), 0);
    }

    #[test]
    fn a_tail_call_whose_callee_entry_is_not_seen_closes_at_the_jump() {
        // 0 jumps, but the next event is another call at a deeper level.
        let (_, s, followed) = run(
            4,
            &[
                ev(10, E, 0, 1000),
                ev(20, X, tail(0), 1008),
                ev(30, E, 3, 900),
                ev(40, X, 3, 908),
            ],
        );
        assert_eq!(followed, 0);
        assert_eq!((s.funcs[0].calls, s.funcs[0].total_ns), (1, 10));
        assert_eq!(s.unwound_frames(), 0);
    }

    #[test]
    fn a_held_tail_exit_is_passed_on_at_the_end() {
        let (_, s, _) = run(2, &[ev(10, E, 0, 1000), ev(20, X, tail(0), 1008)]);
        assert_eq!((s.funcs[0].calls, s.funcs[0].total_ns), (1, 10));
    }

    #[test]
    fn frames_kept_open_are_unwound_by_a_later_event_above_them() {
        // 1 never returns (longjmp to main's level): the entry at 1000 of
        // another call proves both gone.
        let (_, s, _) = run(
            4,
            &[
                ev(10, E, 0, 1000),
                ev(20, X, tail(0), 1008),
                ev(21, E, 1, 1000),
                ev(60, E, 3, 1000),
                ev(70, X, 3, 1008),
            ],
        );
        assert_eq!(s.funcs[0].calls, 1);
        assert_eq!(s.funcs[1].calls, 1);
        assert_eq!(s.unwound_frames(), 2);
        assert_eq!(s.funcs[3].calls, 1);
    }

    #[test]
    fn a_detached_callee_closes_its_caller_at_the_detach() {
        let mut tails = TailCalls::new(vec![vec![1], vec![], vec![]], Vec::new());
        let mut out = Vec::new();
        for e in [
            ev(10, E, 0, 1000),
            ev(20, X, tail(0), 1008),
            ev(21, E, 1, 1000),
        ] {
            tails.feed(&e, &mut out);
        }
        let mut stacks = Stacks::new(2);
        for e in &out {
            stacks.on_event(e);
        }
        stacks.detach_from(1, 50);
        out.clear();
        tails.detached(&[1], 60, &mut out);
        for e in &out {
            stacks.on_event(e);
        }
        stacks.detached(&[1], 60);
        assert_eq!(stacks.funcs[1].detached, 1);
        assert_eq!((stacks.funcs[0].calls, stacks.funcs[0].total_ns), (1, 50));
        assert_eq!(stacks.unfinished_frames(), 0);
        assert!(tails.threads.is_empty());
    }
}
