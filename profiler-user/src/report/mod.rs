//! Everything the session produced, in one place, and the renderers that
//! turn it into files: `text` (report.txt), `json` (functions.json) and
//! `flame` (trace.folded, flamegraph.svg).
pub mod flame;
pub mod json;
pub mod text;

use std::collections::HashMap;

use crate::{
    select::{Binary, Func},
    stacks::{FuncStats, Stacks},
};

/// Facts about the session as a whole.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// Target PID.
    pub pid: u32,
    /// Target executable.
    pub exe: String,
    /// Wall time recorded.
    pub duration_ns: u64,
    /// Why recording stopped.
    pub stop_reason: String,
    /// Functions with live probes.
    pub functions_probed: usize,
    /// Events dropped in the kernel because the ring was full.
    pub lost_events: u64,
    /// Functions matched but not probed (`--max-funcs`).
    pub capped: usize,
    /// Functions whose probes could not be attached.
    pub failed_probes: usize,
    /// Unix time at the start (pprof's time_nanos).
    pub start_unix_ns: i64,
    /// How returns were observed, in words.
    pub exit_rule: String,
}

/// The finished recording, ready to render.
pub struct Report<'a> {
    /// Session facts.
    pub session: Session,
    /// Probed functions, by index.
    pub funcs: &'a [Func],
    /// Binaries, by index.
    pub binaries: &'a [Binary],
    /// Rebuilt stacks and aggregates.
    pub stacks: &'a Stacks,
    /// Thread names by tid.
    pub thread_names: HashMap<u32, String>,
}

impl Report<'_> {
    /// The name to show for a thread: an aggregate of exited threads keeps
    /// its own (its tid may have been reused since).
    pub fn name_of(&self, t: &crate::stacks::ThreadState) -> String {
        match (&t.name, t.exited_threads) {
            (Some(n), 1..) => n.clone(),
            _ => self.thread_name(t.tid),
        }
    }

    /// A thread's name, or `tid-N` when it exited before we could read it.
    pub fn thread_name(&self, tid: u32) -> String {
        self.thread_names
            .get(&tid)
            .cloned()
            .unwrap_or_else(|| format!("tid-{tid}"))
    }

    /// Function indices with at least one call or unfinished frame, with
    /// their stats.
    pub fn active_funcs(&self) -> Vec<(usize, &FuncStats)> {
        self.stacks
            .funcs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.calls > 0 || s.unfinished > 0)
            .collect()
    }
}

/// Formats nanoseconds for people: `812 ns`, `12.4 µs`, `3.21 ms`, `1.52 s`.
pub fn fmt_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// Formats a count with a K/M suffix.
pub fn fmt_count(n: u64) -> String {
    if n < 10_000 {
        n.to_string()
    } else if n < 10_000_000 {
        format!("{:.1}K", n as f64 / 1e3)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_and_counts() {
        assert_eq!(fmt_ns(812), "812 ns");
        assert_eq!(fmt_ns(12_400), "12.4 µs");
        assert_eq!(fmt_ns(3_210_000), "3.21 ms");
        assert_eq!(fmt_ns(1_520_000_000), "1.52 s");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(123_456), "123.5K");
        assert_eq!(fmt_count(12_345_678), "12.3M");
    }
}
