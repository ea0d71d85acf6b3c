//! Event-loop iterations as dispatches ([`Config::wait_loop`]): the
//! watched thread's wait syscalls bound them ([`loop_wait`] learns which
//! wait is the loop's).
use super::*;

impl Dispatcher {
    /// A wait syscall of the watched thread (`KIND_WAIT`): the return of
    /// the loop's own wait opens an iteration, its next entry ends it.
    ///
    /// Until the thread first waits in its loop, outermost traced calls
    /// are its dispatches (a loop that waits some other way, e.g. on a
    /// condition variable, has no wait to bound it); the first loop wait
    /// ends the one open then.
    pub fn on_wait(&mut self, ev: &Event) {
        let w = loop_wait::Wait::of(ev);
        if !self.loop_wait.observe(&w) || !self.cfg.wait_loop {
            return;
        }
        if !self.waits_seen {
            self.waits_seen = true;
            self.end(w.ts_ns);
        }
        if !w.exit {
            self.end(w.ts_ns);
        } else if self.open.is_none() && w.ts_ns >= self.session_start_ns {
            // (The waits are watched from just before the session starts:
            // an iteration that began earlier is not the session's.)
            self.begin(w.ts_ns);
        }
    }

    /// True when iterations are bounded by the loop's waits (rather than
    /// by dispatch functions or outermost calls).
    pub fn by_waits(&self) -> bool {
        self.cfg.wait_loop && self.waits_seen
    }

    /// How dispatches were recognised, in words, with what was learnt.
    pub fn rule(&self) -> String {
        match (self.cfg.wait_loop, self.waits_seen) {
            (true, true) => format!("{}; {}", self.cfg.rule, self.loop_wait.describe()),
            (true, false) => "every outermost traced call on the watched thread: it never waited \
                 in epoll, poll, select, io_uring or a futex, so no event loop was seen (--dispatch names a \
                 dispatch function)"
                .to_string(),
            _ => self.cfg.rule.clone(),
        }
    }
}
