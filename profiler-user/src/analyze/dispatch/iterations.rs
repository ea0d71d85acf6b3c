//! Event-loop iterations as dispatches ([`Config::wait_loop`]): the
//! watched thread's wait syscalls bound them ([`loop_wait`] learns which
//! wait is the loop's).
//!
//! A preset's dispatch functions ([`Config::preset`]: chosen because the
//! process maps their library, as AWT maps GLib) count only if the watched
//! thread calls them: its waits are watched beside them, and when it has
//! returned from [`TRIAL_WAITS`] loop waits at one site (stack level and
//! family) without calling one (each loop that runs a preset's functions
//! calls them after each of its waits, always the same), its dispatches
//! are its loop's iterations from there, the
//! iteration that wait's return begins included, and a [`Notice::Note`]
//! says so. The decision is made on the events alone, so a replay makes
//! it at the same one.
use super::*;

/// Loop waits returned from at one site without a preset function called,
/// after which the preset is given up. At one site: a program's startup
/// waits before its loop runs, each at a site of its own (node's four
/// futex waits for its platform's threads, before libuv's first
/// `epoll_pwait`), are not its loop's.
pub const TRIAL_WAITS: u64 = 5;

/// How a preset's trial is going.
#[derive(Debug, Default)]
pub struct PresetTrial {
    /// The watched thread entered a preset function.
    called: bool,
    /// Loop waits returned from meanwhile, at the site waited at most.
    waits: u64,
    /// The preset was given up: iterations are bounded by waits.
    pub failed: bool,
}

impl PresetTrial {
    /// A traced entry on the watched thread; `dispatch` when its function
    /// is a dispatch function.
    pub fn called(&mut self, dispatch: bool) {
        self.called |= dispatch;
    }
}

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
        let is_loop = self.loop_wait.observe(&w);
        if self.on_trial() {
            self.try_preset(&w, is_loop);
            if !self.preset.failed {
                return;
            }
        }
        if !is_loop || !self.iterating() {
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
        self.iterating() && self.waits_seen
    }

    /// Iterations are bounded by the loop's waits once it waits: no
    /// dispatch function, or a preset given up.
    fn iterating(&self) -> bool {
        self.cfg.wait_loop && (!self.cfg.preset || self.preset.failed)
    }

    /// A preset's functions are on trial: not called yet, not given up.
    fn on_trial(&self) -> bool {
        self.cfg.wait_loop && self.cfg.preset && !self.preset.called && !self.preset.failed
    }

    /// Counts a loop wait of a preset's trial; gives the preset up when the
    /// thread keeps waiting without calling it.
    fn try_preset(&mut self, w: &loop_wait::Wait, is_loop: bool) {
        if !(is_loop && w.exit) {
            return;
        }
        // (`observe` has counted this one.)
        self.preset.waits = self.preset.waits.max(self.loop_wait.judged_loop_at(w));
        if self.preset.waits < TRIAL_WAITS || self.open.is_some() {
            return;
        }
        self.preset.failed = true;
        self.notices.push(Notice::Note(format!(
            "profiler: note: the watched thread returned from {} waits at one stack level in \
             {} without calling any of its dispatch functions ({}): its dispatches are its \
             event loop's iterations from here, bounded by its waits",
            self.preset.waits,
            crate::text::fmt_ns(w.ts_ns.saturating_sub(self.session_start_ns)),
            self.cfg.rule
        )));
    }

    /// How dispatches were recognised, in words, with what was learnt.
    pub fn rule(&self) -> String {
        if self.cfg.preset {
            return match self.preset.failed {
                true => format!(
                    "{} (the dispatch functions of the {} were never called on the watched \
                     thread: given up after {} of its waits at one stack level); {}",
                    crate::tracee::select::FALLBACK_RULE,
                    self.cfg.rule,
                    self.preset.waits,
                    self.loop_wait.describe()
                ),
                false => self.cfg.rule.clone(),
            };
        }
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
