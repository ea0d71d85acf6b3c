//! The live status line on a TTY: elapsed time, event rate, losses,
//! threads. Redrawn at most once a second; silent when stderr is not a TTY.
use std::{
    io::{IsTerminal, Write},
    time::Duration,
};

use crate::{analyze::stacks::Stacks, attach::probes::CounterMap};

/// Live status line state.
pub struct Status {
    enabled: bool,
    last_draw: Duration,
    last_events: u64,
    drawn: bool,
}

impl Status {
    /// Enabled only when stderr is a terminal.
    pub fn new() -> Self {
        Status {
            enabled: std::io::stderr().is_terminal(),
            last_draw: Duration::ZERO,
            last_events: 0,
            drawn: false,
        }
    }

    /// Never drawn (`watch`, whose processes each have a collector).
    pub fn off() -> Self {
        Status {
            enabled: false,
            ..Self::new()
        }
    }

    /// Redraws the line if a second has passed.
    pub fn update(&mut self, elapsed: Duration, stacks: &Stacks, counters: &CounterMap) {
        if !self.enabled || elapsed < self.last_draw + Duration::from_secs(1) {
            return;
        }
        let dt = (elapsed - self.last_draw).as_secs_f64();
        let rate = (stacks.events - self.last_events) as f64 / dt;
        let lost = counters.read().lost;
        eprint!(
            "\r\x1b[K{:>6.1}s  {:>10} events/s  lost {}  threads {}",
            elapsed.as_secs_f64(),
            crate::text::fmt_count(rate as u64),
            lost,
            stacks.thread_count()
        );
        let _ = std::io::stderr().flush();
        self.last_draw = elapsed;
        self.last_events = stacks.events;
        self.drawn = true;
    }

    /// Ends the line so later output starts clean.
    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::new()
    }
}
