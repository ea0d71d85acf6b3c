//! Iterations of an event loop, bounded by its own wait syscall: which of
//! the watched thread's waits is the loop's (learnt), and how much of each
//! second the loop spent waiting (its idle time, as libuv's
//! `uv_metrics_idle_time` reports it).
//!
//! The loop's wait is the outermost one that recurs: every event loop
//! (libuv, asyncio's selector, GLib, Qt, redis's ae, a hand-written one)
//! waits at the same stack depth each iteration, and a wait inside a
//! handler (a blocking `poll()`, `execSync`'s nested loop, a modal
//! dialog's nested main loop) runs deeper in the stack, at a lower stack
//! pointer. The kernel judges each wait by the stack pointer the agent
//! learnt (`WATCH_LOOP_SP`), and the event carries its judgement, so a
//! replay reads the same iterations.
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

/// One wait syscall of the watched thread, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// When.
    pub ts_ns: u64,
    /// Syscall number.
    pub nr: u32,
    /// Its first argument (the epoll or io_uring descriptor), clipped.
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

#[derive(Debug, Clone)]
struct Site {
    sp: u64,
    nr: u32,
    fd: u32,
    /// Waits here, plus a head start for the guess at attach.
    count: u64,
    /// Returns from waits here that the kernel judged the loop's (what
    /// the report describes: recorded in the events, so a replay says
    /// the same).
    judged_loop: u64,
}

/// Learns the loop's wait and keeps its idle time.
#[derive(Debug, Default)]
pub struct LoopWait {
    sites: Vec<Site>,
    /// The loop's wait's stack pointer (0: not learnt).
    loop_sp: u64,
    /// A new `loop_sp` the kernel has not been told yet.
    untold: Option<u64>,
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

    /// The session stopped at `ts_ns`: idle time is counted up to it.
    pub fn stop_at(&mut self, ts_ns: u64) {
        self.stop_ns = Some(ts_ns);
    }

    /// The thread was in wait syscall `nr` at stack pointer `sp` when the
    /// session began (`/proc/PID/task/TID/syscall`): most likely idle in
    /// its loop, so that is the first guess.
    pub fn at_attach(&mut self, nr: u32, fd: u32, sp: u64) {
        self.sites.push(Site {
            sp,
            nr,
            fd,
            count: AT_ATTACH,
            judged_loop: 0,
        });
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
            if let Some(s) = self.sites.iter_mut().find(|s| s.sp == w.sp) {
                s.count += 1;
                s.judged_loop += u64::from(w.is_loop);
            } else if self.sites.len() < MAX_SITES {
                self.sites.push(Site {
                    sp: w.sp,
                    nr: w.nr,
                    fd: w.fd,
                    count: 1,
                    judged_loop: u64::from(w.is_loop),
                });
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
        let best = self
            .sites
            .iter()
            .filter(|s| {
                s.count >= RECURS
                    || (s.count >= AT_ATTACH && (self.loop_sp == 0 || s.sp == self.loop_sp))
            })
            .map(|s| s.sp)
            .max();
        if let Some(sp) = best {
            if sp != self.loop_sp {
                self.loop_sp = sp;
                self.untold = Some(sp);
            }
        }
    }

    /// A stack pointer for the kernel's `WATCH_LOOP_SP`, when it changed.
    pub fn take_untold(&mut self) -> Option<u64> {
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
        let what = match site.nr {
            wait::NR_EPOLL_WAIT
            | wait::NR_EPOLL_PWAIT
            | wait::NR_EPOLL_PWAIT2
            | wait::NR_IO_URING_ENTER => format!("{} on fd {}", wait::name(site.nr), site.fd),
            nr => wait::name(nr).to_string(),
        };
        format!(
            "the loop's wait is {what} at stack pointer {:#x} ({} of the thread's waits there); \
             {} deeper waits counted as blocked time inside iterations",
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
        assert_eq!(l.take_untold(), Some(0x1000));
        for i in 0..2 {
            l.observe(&w(10 + i, true, true, 0x2000));
        }
        assert_eq!(l.take_untold(), None, "two waits are not yet a loop");
        l.observe(&w(20, true, true, 0x2000));
        assert_eq!(l.take_untold(), Some(0x2000));
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
        assert_eq!(l.take_untold(), Some(0x5000));
        for i in 0..3 {
            l.observe(&w(i, true, false, 0x4000));
        }
        assert_eq!(
            l.take_untold(),
            None,
            "deeper recurring waits do not displace it"
        );
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
