//! Iterations of an event loop, bounded by its own wait syscall: which of
//! the watched thread's waits is the loop's (learnt), and how much of each
//! second the loop spent waiting (its idle time, as libuv's
//! `uv_metrics_idle_time` reports it).
//!
//! The loop's wait is the outermost one that recurs: every event loop
//! (libuv, asyncio's selector, GLib, Qt, redis's ae, a hand-written one,
//! and those that wait on a futex: Tcl's notifier, Java's
//! `EventQueue.getNextEvent`, a queue's consumer) waits at the same stack
//! depth each iteration, and a wait inside a handler (a blocking `poll()`,
//! `execSync`'s nested loop, a modal dialog's nested main loop) runs
//! deeper in the stack, at a lower stack pointer. A wait is told apart
//! by more than its depth: its family of syscalls (epoll, poll, select,
//! io_uring, futex) and what it waits on (the epoll descriptor, the futex
//! word), so that a `poll()` on another descriptor in a handler the
//! compiler inlined into the loop, or a lock taken in a handler, is inside
//! the iteration although it waits at the loop's own level. Of the
//! recurring sites within [`NEAR`] bytes of the outermost, the one waited
//! at most often is the loop's (each iteration waits there once; a
//! handler's wait only in some). The kernel judges each wait by what the
//! agent learnt (`WATCH_LOOP_SP`, `WATCH_LOOP_KEY`), and the event carries
//! its judgement, so a replay reads the same iterations.
use profiler_common::{wait, Event};

/// Seconds of a session whose idle time is kept per second (a week).
const MAX_IDLE_SECONDS: u64 = 7 * 86_400;

/// Distinct wait sites remembered while learning.
const MAX_SITES: usize = 64;
/// A site is the loop's once it has been waited at this often.
const RECURS: u64 = 3;
/// Count given to the wait the thread was in at attach (most likely the
/// loop's, idle): one more confirms it.
const AT_ATTACH: u64 = RECURS - 1;
/// Recurring sites this close to the outermost one are at the loop's own
/// level (the C library's wrappers of two calls from one function differ
/// by a few words of stack): of these, the most frequent is the loop's.
const NEAR: u64 = 128;
/// Objects told apart per site; waits on others are counted together.
const MAX_OBJECTS: usize = 4;
/// The loop's wait is matched by its object too once this share (in
/// percent) of its site's waits were on one object.
const ONE_OBJECT_PCT: u64 = 90;

/// One wait syscall of the watched thread, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// When.
    pub ts_ns: u64,
    /// Syscall number.
    pub nr: u32,
    /// What it waits on ([`wait::object`]): its first argument (the epoll
    /// or io_uring descriptor), clipped, or a futex word's folded address.
    pub fd: u32,
    /// The return (true) or the entry.
    pub exit: bool,
    /// The kernel judged it the loop's own wait.
    pub is_loop: bool,
    /// User stack pointer at the syscall.
    pub sp: u64,
}

impl Wait {
    /// Decodes a `KIND_WAIT` event.
    pub fn of(ev: &Event) -> Wait {
        // The word's bits below the link generation bit (the descriptor
        // reaches into the function field's tail-call bit).
        let w = ev.word & (profiler_common::FUNC_MASK | profiler_common::TAIL_CALL);
        Wait {
            ts_ns: ev.ts_ns,
            nr: w & wait::NR_MASK,
            fd: w >> wait::FD_SHIFT,
            exit: w & wait::EXIT != 0,
            is_loop: w & wait::LOOP != 0,
            sp: ev.sp,
        }
    }
}

/// The waits of one family of syscalls at one stack pointer.
#[derive(Debug, Clone)]
struct Site {
    sp: u64,
    /// The syscall last seen here.
    nr: u32,
    /// The objects waited on here, the first [`MAX_OBJECTS`] seen, with
    /// their counts.
    objects: Vec<(u32, u64)>,
    /// Waits here, plus a head start for the guess at attach.
    count: u64,
    /// Waits seen here (without the head start).
    seen: u64,
    /// Returns from waits here that the kernel judged the loop's (what
    /// the report describes: recorded in the events, so a replay says
    /// the same).
    judged_loop: u64,
}

impl Site {
    fn new(w: &Wait, count: u64) -> Site {
        Site {
            sp: w.sp,
            nr: w.nr,
            objects: vec![(w.fd, count)],
            count,
            seen: count,
            judged_loop: 0,
        }
    }

    fn family(&self) -> u32 {
        wait::family(self.nr)
    }

    /// The object nearly all waits here were on, when there is one.
    fn one_object(&self) -> Option<u32> {
        let &(obj, n) = self.objects.iter().max_by_key(|(_, n)| *n)?;
        (self.seen > 0 && n * 100 >= self.seen * ONE_OBJECT_PCT).then_some(obj)
    }

    /// The kernel's key for waits of this site ([`wait::key`]).
    fn key(&self) -> u64 {
        match self.one_object() {
            Some(obj) => wait::key(self.nr, obj, true),
            None => wait::key(self.nr, 0, false),
        }
    }

    fn note(&mut self, w: &Wait) {
        self.count += 1;
        self.seen += 1;
        self.nr = w.nr;
        if let Some((_, n)) = self.objects.iter_mut().find(|(o, _)| *o == w.fd) {
            *n += 1;
        } else if self.objects.len() < MAX_OBJECTS {
            self.objects.push((w.fd, 1));
        }
    }
}

/// What the kernel is told of the loop's wait: its stack pointer and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Learnt {
    /// `WATCH_LOOP_SP`.
    pub sp: u64,
    /// `WATCH_LOOP_KEY` ([`wait::key`]).
    pub key: u64,
    /// Its family ([`wait::family`]).
    family: u32,
}

/// Learns the loop's wait and keeps its idle time.
#[derive(Debug, Default)]
pub struct LoopWait {
    sites: Vec<Site>,
    /// The loop's wait as the kernel was last told it (sp 0: not learnt).
    learnt: Learnt,
    /// A new rule the kernel has not been told yet.
    untold: Option<Learnt>,
    /// When the current loop wait began (None: not in one).
    idle_since: Option<u64>,
    /// Idle nanoseconds per second of the session.
    idle_per_s: Vec<u64>,
    session_start_ns: u64,
    /// When the session stopped: idle time after it is not the session's
    /// (the waits are still seen while the probes detach).
    stop_ns: Option<u64>,
    /// Loop waits seen (returns).
    pub loop_waits: u64,
    /// Other waits seen (returns): inside iterations.
    pub inner_waits: u64,
}

impl LoopWait {
    /// A learner for a session that began at `session_start_ns`.
    pub fn new(session_start_ns: u64) -> Self {
        LoopWait {
            session_start_ns,
            ..LoopWait::default()
        }
    }

    /// Returns from waits the kernel judged the loop's at `w`'s site (its
    /// stack pointer and family), as the events say (not the guess at
    /// attach, which a replay does not make).
    pub fn judged_loop_at(&self, w: &Wait) -> u64 {
        let family = wait::family(w.nr);
        self.sites
            .iter()
            .find(|s| s.sp == w.sp && s.family() == family)
            .map_or(0, |s| s.judged_loop)
    }

    /// The session stopped at `ts_ns`: idle time is counted up to it.
    pub fn stop_at(&mut self, ts_ns: u64) {
        self.stop_ns = Some(ts_ns);
    }

    /// The thread was in wait syscall `nr` at stack pointer `sp` when the
    /// session began (`/proc/PID/task/TID/syscall`): most likely idle in
    /// its loop, so that is the first guess.
    /// `fd` is its first argument, as [`wait::object`] takes it.
    pub fn at_attach(&mut self, nr: u32, arg0: u64, sp: u64) {
        let w = Wait {
            ts_ns: 0,
            nr,
            fd: wait::object(u64::from(nr), arg0) as u32,
            exit: true,
            is_loop: true,
            sp,
        };
        let mut site = Site::new(&w, AT_ATTACH);
        // One wait is no evidence that it always waits on this object.
        site.objects = vec![(w.fd, 0)];
        site.seen = 0;
        self.sites.push(site);
        self.relearn();
    }

    /// Notes a wait; returns true when it bounds an iteration (the loop's
    /// own wait, as the kernel judged it).
    pub fn observe(&mut self, w: &Wait) -> bool {
        if w.exit {
            if w.is_loop {
                self.loop_waits += 1;
            } else {
                self.inner_waits += 1;
            }
            let family = wait::family(w.nr);
            if let Some(s) = self
                .sites
                .iter_mut()
                .find(|s| s.sp == w.sp && s.family() == family)
            {
                s.note(w);
                s.judged_loop += u64::from(w.is_loop);
            } else if self.sites.len() < MAX_SITES {
                let mut site = Site::new(w, 1);
                site.judged_loop = u64::from(w.is_loop);
                self.sites.push(site);
            }
            self.relearn();
        }
        if w.is_loop {
            if w.exit {
                if let Some(since) = self.idle_since.take() {
                    self.add_idle(since, w.ts_ns);
                }
            } else {
                self.idle_since = Some(w.ts_ns);
            }
        }
        w.is_loop
    }

    fn relearn(&mut self) {
        let learnt = self.learnt;
        let is_current =
            |s: &Site| learnt.sp == 0 || (s.sp == learnt.sp && s.family() == learnt.family);
        let candidates: Vec<&Site> = self
            .sites
            .iter()
            .filter(|s| s.count >= RECURS || (s.count >= AT_ATTACH && is_current(s)))
            .collect();
        let Some(outer) = candidates.iter().map(|s| s.sp).max() else {
            return;
        };
        // At the loop's own level, the most frequent (then the outermost).
        let Some(best) = candidates
            .iter()
            .filter(|s| s.sp + NEAR >= outer)
            .max_by_key(|s| (s.count, s.sp))
        else {
            return;
        };
        let new = Learnt {
            sp: best.sp,
            key: best.key(),
            family: best.family(),
        };
        if new != self.learnt {
            self.learnt = new;
            self.untold = Some(new);
        }
    }

    /// The loop's wait for the kernel's `WATCH_LOOP_SP` and
    /// `WATCH_LOOP_KEY`, when it changed.
    pub fn take_untold(&mut self) -> Option<Learnt> {
        self.untold.take()
    }

    fn add_idle(&mut self, from: u64, to: u64) {
        // Per second for the first week of a session (4.8 MB at most):
        // a damaged or hostile recording's timestamps must not make this
        // loop over billions of seconds.
        let horizon = self
            .session_start_ns
            .saturating_add(MAX_IDLE_SECONDS * 1_000_000_000);
        let to = to.min(horizon).min(self.stop_ns.unwrap_or(u64::MAX));
        let mut t = from.max(self.session_start_ns);
        while t < to {
            let sec = ((t - self.session_start_ns) / 1_000_000_000) as usize;
            let sec_end = self.session_start_ns + (sec as u64 + 1) * 1_000_000_000;
            let until = to.min(sec_end);
            if self.idle_per_s.len() <= sec {
                // A session of a day has 86,400 seconds: 700 kB at most.
                self.idle_per_s.resize(sec + 1, 0);
            }
            self.idle_per_s[sec] += until - t;
            t = until;
        }
    }

    /// The share of the last `secs` complete seconds before `now_ns` that
    /// the loop spent idle in its wait (a wait in progress counted); None
    /// before the first complete second. Reads only those seconds.
    pub fn recent_idle_share(&self, now_ns: u64, secs: u64) -> Option<f64> {
        let full = now_ns.saturating_sub(self.session_start_ns) / 1_000_000_000;
        let from = full.saturating_sub(secs);
        if full == from {
            return None;
        }
        let (lo, hi) = (from as usize, (full as usize).min(self.idle_per_s.len()));
        let mut idle: u64 = self.idle_per_s.get(lo..hi).map_or(0, |s| s.iter().sum());
        if let Some(since) = self.idle_since {
            let start = self.session_start_ns + from * 1_000_000_000;
            let end = self.session_start_ns + full * 1_000_000_000;
            idle += end.min(now_ns).saturating_sub(since.max(start));
        }
        Some((idle as f64 / ((full - from) as f64 * 1e9)).clamp(0.0, 1.0))
    }

    /// Idle nanoseconds in each second of the session so far (the last
    /// counts a wait still in progress up to `now_ns`, when given).
    pub fn idle_per_second(&self, now_ns: Option<u64>) -> Vec<u64> {
        let mut me = LoopWait {
            idle_per_s: self.idle_per_s.clone(),
            session_start_ns: self.session_start_ns,
            stop_ns: self.stop_ns,
            ..LoopWait::default()
        };
        if let (Some(since), Some(now)) = (self.idle_since, now_ns) {
            me.add_idle(since, now);
        }
        me.idle_per_s
    }

    /// The rule learnt, in words, for the reports.
    pub fn describe(&self) -> String {
        // The site most of the kernel's loop judgements fell on.
        let Some(site) = self
            .sites
            .iter()
            .filter(|s| s.judged_loop > 0)
            .max_by_key(|s| (s.judged_loop, s.sp))
        else {
            return "no wait seen yet: every wait bounds an iteration".to_string();
        };
        let one = site.one_object();
        let what = match (site.nr, one) {
            (
                wait::NR_EPOLL_WAIT
                | wait::NR_EPOLL_PWAIT
                | wait::NR_EPOLL_PWAIT2
                | wait::NR_IO_URING_ENTER,
                Some(fd),
            ) => format!("{} on fd {fd}", wait::name(site.nr)),
            (wait::NR_FUTEX, Some(_)) => "futex on one futex word (a condition variable's or a \
                 queue's: the thread that wakes it starts each iteration)"
                .to_string(),
            (nr, _) => wait::name(nr).to_string(),
        };
        format!(
            "the loop's wait is {what} at stack pointer {:#x} ({} of the thread's waits there); \
             {} other waits (deeper, or on something else) counted as blocked time inside \
             iterations",
            site.sp, site.judged_loop, self.inner_waits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_time_of_absurd_timestamps_stays_bounded() {
        let mut l = LoopWait {
            session_start_ns: 1_000,
            ..LoopWait::default()
        };
        let t0 = std::time::Instant::now();
        l.add_idle(1_000, u64::MAX);
        assert_eq!(l.idle_per_s.len() as u64, MAX_IDLE_SECONDS);
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    }

    fn w(ts_ns: u64, exit: bool, is_loop: bool, sp: u64) -> Wait {
        Wait {
            ts_ns,
            nr: wait::NR_EPOLL_WAIT,
            fd: 3,
            exit,
            is_loop,
            sp,
        }
    }

    #[test]
    fn the_outermost_recurring_wait_is_the_loops() {
        let mut l = LoopWait::new(0);
        // A handler's poll, deeper (lower sp), recurs first.
        for i in 0..3 {
            l.observe(&w(i, true, true, 0x1000));
        }
        assert_eq!(l.take_untold().map(|l| l.sp), Some(0x1000));
        for i in 0..2 {
            l.observe(&w(10 + i, true, true, 0x2000));
        }
        assert_eq!(l.take_untold(), None, "two waits are not yet a loop");
        l.observe(&w(20, true, true, 0x2000));
        assert_eq!(l.take_untold().map(|l| l.sp), Some(0x2000));
        // A once-only shallower wait does not move it.
        l.observe(&w(30, true, true, 0x3000));
        assert_eq!(l.take_untold(), None);
        assert!(l
            .describe()
            .contains("epoll_wait on fd 3 at stack pointer 0x2000"));
    }

    #[test]
    fn the_wait_at_attach_is_the_first_guess() {
        let mut l = LoopWait::new(0);
        l.at_attach(wait::NR_POLL, 0, 0x5000);
        let first = l.take_untold().expect("a guess");
        assert_eq!(first.sp, 0x5000);
        assert!(wait::key_matches(first.key, wait::NR_PPOLL, 7));
        assert!(!wait::key_matches(first.key, wait::NR_EPOLL_WAIT, 0));
        for i in 0..3 {
            l.observe(&w(i, true, false, 0x4000));
        }
        assert_eq!(
            l.take_untold(),
            None,
            "deeper recurring waits do not displace it"
        );
    }

    fn on(nr: u32, fd: u32, sp: u64) -> Wait {
        Wait {
            ts_ns: 0,
            nr,
            fd,
            exit: true,
            is_loop: true,
            sp,
        }
    }

    #[test]
    fn a_poll_at_the_loops_own_level_is_inside_an_iteration() {
        // A handler inlined into the loop polls another descriptor: its
        // libc wrapper leaves it a few words shallower than epoll_wait.
        let mut l = LoopWait::new(0);
        l.at_attach(wait::NR_EPOLL_WAIT, 8, 0x2000);
        for i in 0..12 {
            l.observe(&on(wait::NR_EPOLL_WAIT, 8, 0x2000));
            if i % 4 == 0 {
                l.observe(&on(wait::NR_POLL, wait::FD_MAX as u32, 0x2010));
            }
        }
        let mut last = None;
        while let Some(t) = l.take_untold() {
            last = Some(t);
        }
        let learnt = last.expect("learnt");
        assert_eq!(learnt.sp, 0x2000);
        assert!(wait::key_matches(learnt.key, wait::NR_EPOLL_PWAIT, 8));
        assert!(!wait::key_matches(learnt.key, wait::NR_POLL, 8));
        assert!(
            !wait::key_matches(learnt.key, wait::NR_EPOLL_WAIT, 9),
            "another epoll descriptor is another wait"
        );
        assert!(
            l.describe().contains("epoll_wait on fd 8"),
            "{}",
            l.describe()
        );
    }

    #[test]
    fn a_futex_loop_is_learnt_by_its_futex_word() {
        let cv = 0x7f00_1234_5028u64;
        let obj = |a: u64| wait::object(u64::from(wait::NR_FUTEX), a) as u32;
        // A condition variable's two group futexes are one object.
        assert_eq!(obj(cv), obj(cv + 4));
        assert_ne!(obj(cv), obj(cv + 64));
        let mut l = LoopWait::new(0);
        l.at_attach(wait::NR_FUTEX, cv, 0x3000);
        assert!(
            wait::key_matches(l.take_untold().expect("guess").key, wait::NR_FUTEX, 1),
            "one wait at attach is not yet evidence of one futex word"
        );
        for i in 0..10 {
            l.observe(&on(wait::NR_FUTEX, obj(cv + 4 * (i % 2)), 0x3000));
            // A lock inside a handler, at about the same level.
            if i % 3 == 0 {
                l.observe(&on(wait::NR_FUTEX, obj(0x7f00_2000_0000), 0x3020));
            }
        }
        let learnt = l.take_untold().expect("learnt");
        assert_eq!(learnt.sp, 0x3000);
        assert!(wait::key_matches(
            learnt.key,
            wait::NR_FUTEX,
            u64::from(obj(cv))
        ));
        assert!(!wait::key_matches(
            learnt.key,
            wait::NR_FUTEX,
            u64::from(obj(0x7f00_2000_0000))
        ));
        assert!(
            l.describe().contains("futex on one futex word"),
            "{}",
            l.describe()
        );
        // A consumer whose futex word changes every time (a new lock per
        // wait) is matched by its family alone.
        let mut q = LoopWait::new(0);
        for i in 0..10u64 {
            q.observe(&on(
                wait::NR_FUTEX,
                obj(0x7f00_0000_0000 + i * 4096),
                0x3000,
            ));
        }
        let learnt = q.take_untold().expect("learnt");
        assert!(wait::key_matches(learnt.key, wait::NR_FUTEX, 12345));
        assert!(!wait::key_matches(learnt.key, wait::NR_POLL, 12345));
    }

    #[test]
    fn idle_time_is_split_by_second() {
        let mut l = LoopWait::new(1_000);
        l.observe(&w(1_000 + 500_000_000, false, true, 1));
        l.observe(&w(1_000 + 1_250_000_000, true, true, 1));
        // A wait inside an iteration is not idle time.
        l.observe(&w(1_000 + 1_300_000_000, false, false, 0));
        l.observe(&w(1_000 + 1_400_000_000, true, false, 0));
        assert_eq!(l.idle_per_second(None), [500_000_000, 250_000_000]);
        l.observe(&w(1_000 + 2_900_000_000, false, true, 1));
        assert_eq!(
            l.idle_per_second(Some(1_000 + 3_100_000_000)),
            [500_000_000, 250_000_000, 100_000_000, 100_000_000]
        );
        assert_eq!((l.loop_waits, l.inner_waits), (1, 1));
    }
}
