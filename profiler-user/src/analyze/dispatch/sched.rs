//! Splits a window of the watched thread's wall time into on-CPU, blocked
//! and runnable (waiting for a CPU) time, from its scheduler transitions:
//! switched out while runnable (preempted) or blocked, woken, switched in.

/// The watched thread's scheduling state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Running on a CPU.
    OnCpu,
    /// Sleeping: I/O, a lock, a timer.
    Blocked,
    /// Ready to run, waiting for a CPU.
    Runnable,
}

/// Time in each state over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    /// Time on a CPU.
    pub on_cpu_ns: u64,
    /// Time blocked.
    pub blocked_ns: u64,
    /// Time waiting to run.
    pub runnable_ns: u64,
}

/// Tracks the thread's state and, while a window is open, the time spent
/// in each state.
#[derive(Debug, Clone)]
pub struct SchedTracker {
    state: State,
    since_ns: u64,
    window: Option<(u64, Split)>,
}

impl Default for SchedTracker {
    fn default() -> Self {
        SchedTracker {
            state: State::OnCpu,
            since_ns: 0,
            window: None,
        }
    }
}

impl SchedTracker {
    fn account(&mut self, until_ns: u64) {
        if let Some((start, split)) = &mut self.window {
            let from = self.since_ns.max(*start);
            let d = until_ns.saturating_sub(from);
            match self.state {
                State::OnCpu => split.on_cpu_ns = split.on_cpu_ns.saturating_add(d),
                State::Blocked => split.blocked_ns = split.blocked_ns.saturating_add(d),
                State::Runnable => split.runnable_ns = split.runnable_ns.saturating_add(d),
            }
        }
    }

    fn transition(&mut self, ts_ns: u64, to: State) {
        self.account(ts_ns);
        self.state = to;
        self.since_ns = ts_ns;
    }

    /// The thread left the CPU, blocked or still runnable.
    pub fn switched_out(&mut self, ts_ns: u64, blocked: bool) {
        self.transition(
            ts_ns,
            if blocked {
                State::Blocked
            } else {
                State::Runnable
            },
        );
    }

    /// The thread was woken.
    pub fn woken(&mut self, ts_ns: u64) {
        if self.state == State::Blocked {
            self.transition(ts_ns, State::Runnable);
        }
    }

    /// The thread got a CPU.
    pub fn switched_in(&mut self, ts_ns: u64) {
        self.transition(ts_ns, State::OnCpu);
    }

    /// Opens a window at `ts_ns`. The thread is running then: it just hit
    /// a probe.
    pub fn open(&mut self, ts_ns: u64) {
        self.state = State::OnCpu;
        self.since_ns = ts_ns;
        self.window = Some((ts_ns, Split::default()));
    }

    /// The open window's split as it stands at `ts_ns` (not before the
    /// last transition), without closing it.
    pub fn split_at(&self, ts_ns: u64) -> Split {
        let mut t = self.clone();
        t.account(ts_ns);
        t.window.map(|(_, s)| s).unwrap_or_default()
    }

    /// Closes the window at `ts_ns` and returns its split.
    pub fn close(&mut self, ts_ns: u64) -> Split {
        self.account(ts_ns);
        self.since_ns = ts_ns;
        self.window.take().map(|(_, s)| s).unwrap_or_default()
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_a_window() {
        let mut t = SchedTracker::default();
        t.open(100);
        t.switched_out(130, true); // 30 on CPU
        t.woken(180); // 50 blocked
        t.switched_in(190); // 10 runnable
        t.switched_out(200, false); // 10 on CPU
        t.switched_in(205); // 5 runnable
        let s = t.close(215); // 10 on CPU
        assert_eq!(
            s,
            Split {
                on_cpu_ns: 50,
                blocked_ns: 50,
                runnable_ns: 15
            }
        );
        assert_eq!(s.on_cpu_ns + s.blocked_ns + s.runnable_ns, 115);
    }

    #[test]
    fn transitions_outside_a_window_are_not_counted() {
        let mut t = SchedTracker::default();
        t.switched_out(10, true);
        t.switched_in(50);
        t.open(60);
        assert_eq!(
            t.close(70),
            Split {
                on_cpu_ns: 10,
                blocked_ns: 0,
                runnable_ns: 0
            }
        );
    }
}
