//! Prometheus metrics of `profiler watch` (`--metrics ADDR`, issue 43): a
//! small registry the session feeds as stalls happen, rendered in the text
//! exposition format 0.0.4 (`text.rs`) and served by a tiny HTTP/1.1
//! responder on a thread of its own (`http.rs`).
//!
//! The metrics, their names an interface:
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `profiler_watched_processes` | gauge | none |
//! | `profiler_stalls_total` | counter | process, `group` |
//! | `profiler_stall_seconds` | histogram ([`STALL_BUCKETS`]) | process, `group` |
//! | `profiler_hangs_total` | counter | process |
//! | `profiler_loop_busy_ratio` | gauge | process |
//! | `profiler_probe_overhead_ratio` | gauge | process |
//! | `profiler_lost_events_total` | counter | none |
//!
//! A process's labels are `pid`, `comm` and one of `exe`, `unit` or
//! `cgroup` ([`Origin`]). Every label value may come from the target
//! (its name, its path): it is read as UTF-8 with invalid bytes replaced by
//! U+FFFD, and backslash, double quote and line feed are escaped, so no
//! process name can break the exposition.
//!
//! **Bounded.** The `group` label takes at most `cap` distinct values
//! ([`DEFAULT_GROUP_CAP`]) in each metric, first come first served; the
//! stalls of any other group are counted under `group="other"`
//! ([`OTHER_GROUP`]). A slot is given back when no series holds its group
//! any more.
//!
//! **A process that goes away** ([`Metrics::remove_process`]): its gauges
//! go at once (they describe a present that no longer exists), and its
//! counters and histograms stay, with their final values, for
//! [`LINGER`] (five minutes), so that a scrape or two after the exit still
//! sees the stalls counted just before it; then they go too, and memory
//! stays flat however many processes come and go. A PID added again while
//! its old series linger replaces them at once (two series with one label
//! set would be a broken exposition).
//!
//! The registry is not synchronized itself: the session holds it in an
//! `Arc<Mutex<Metrics>>`, which [`serve`] shares with the HTTP thread.
mod http;
#[cfg(test)]
mod tests;
mod text;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

pub use http::{parse_addr, serve, Server};

/// Distinct `group` values each metric keeps by default.
pub const DEFAULT_GROUP_CAP: usize = 20;

/// The `group` value the stalls of groups past the cap are counted under.
pub const OTHER_GROUP: &str = "other";

/// Upper bounds (seconds) of `profiler_stall_seconds`' buckets, `+Inf`
/// beside them.
pub const STALL_BUCKETS: [f64; 8] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// How long a removed process's counters and histograms stay.
pub const LINGER: Duration = Duration::from_secs(300);

/// What names a watched process beside its PID and `comm`: the label
/// `exe`, `unit` or `cgroup`. Bytes, since paths need not be UTF-8.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// `exe="…"`: the executable's path (`--exe`, `--pid`).
    Exe(&'a [u8]),
    /// `unit="…"`: the systemd unit it runs in (`--unit`).
    Unit(&'a [u8]),
    /// `cgroup="…"`: the cgroup it runs in (`--cgroup`).
    Cgroup(&'a [u8]),
}

impl Origin<'_> {
    fn label(self) -> (&'static str, Vec<u8>) {
        match self {
            Origin::Exe(v) => ("exe", v.to_vec()),
            Origin::Unit(v) => ("unit", v.to_vec()),
            Origin::Cgroup(v) => ("cgroup", v.to_vec()),
        }
    }
}

/// Per-bucket counts (not cumulative: `render` sums them), then `+Inf`.
#[derive(Clone, Debug, Default)]
struct Histogram {
    counts: [u64; STALL_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        let i = STALL_BUCKETS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(STALL_BUCKETS.len());
        self.counts[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

/// One process's series.
#[derive(Debug)]
struct Process {
    /// `pid="…",comm="…",exe="…"`, escaped once.
    labels: String,
    /// By `group` label value (a group past the cap under `other`).
    stalls: BTreeMap<String, u64>,
    seconds: BTreeMap<String, Histogram>,
    hangs: u64,
    busy_ratio: Option<f64>,
    overhead_ratio: Option<f64>,
    /// When [`Metrics::remove_process`] was called.
    gone: Option<Instant>,
}

impl Process {
    fn new(pid: u32, comm: &[u8], origin: Option<Origin<'_>>) -> Process {
        let mut labels = String::new();
        let mut pairs: Vec<(&str, Vec<u8>)> = vec![
            ("pid", pid.to_string().into_bytes()),
            ("comm", comm.to_vec()),
        ];
        if let Some(o) = origin {
            pairs.push(o.label());
        }
        for (i, (name, value)) in pairs.iter().enumerate() {
            if i > 0 {
                labels.push(',');
            }
            text::label(&mut labels, name, value);
        }
        Process {
            labels,
            stalls: BTreeMap::new(),
            seconds: BTreeMap::new(),
            hangs: 0,
            busy_ratio: None,
            overhead_ratio: None,
            gone: None,
        }
    }
}

/// The registry: every series `profiler watch` exports.
#[derive(Debug)]
pub struct Metrics {
    cap: usize,
    linger: Duration,
    /// The `group` values that have a series of their own.
    admitted: BTreeSet<String>,
    processes: BTreeMap<u32, Process>,
    lost: u64,
}

impl Metrics {
    /// An empty registry whose `group` label takes at most `cap` values
    /// per metric beside `other` ([`DEFAULT_GROUP_CAP`] is the default;
    /// 0 counts every stall under `other`).
    pub fn new(cap: usize) -> Metrics {
        Metrics {
            cap,
            linger: LINGER,
            admitted: BTreeSet::new(),
            processes: BTreeMap::new(),
            lost: 0,
        }
    }

    /// How long a removed process's counters stay ([`LINGER`] unless set).
    pub fn set_linger(&mut self, linger: Duration) {
        self.linger = linger;
    }

    /// Starts the series of a newly watched process. A process of that PID
    /// already known (alive, or gone and lingering) is replaced.
    pub fn add_process(&mut self, pid: u32, comm: &[u8], origin: Option<Origin<'_>>) {
        self.prune();
        self.processes.insert(pid, Process::new(pid, comm, origin));
        self.readmit();
    }

    /// The process is no longer watched: its gauges go now, its counters
    /// and histograms after the linger (see the module's doc).
    pub fn remove_process(&mut self, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            if p.gone.is_none() {
                p.gone = Some(Instant::now());
                p.busy_ratio = None;
                p.overhead_ratio = None;
            }
        }
        self.prune();
    }

    /// One stall of `pid`'s watched thread, of group `group`, that lasted
    /// `duration`: `profiler_stalls_total` and `profiler_stall_seconds`.
    /// A PID never added (or already removed) is counted all the same,
    /// under its `pid` label alone: a stall is never dropped.
    pub fn stall(&mut self, pid: u32, group: &str, duration: Duration) {
        self.prune();
        let group = self.admit(group);
        let p = self.process(pid);
        *p.stalls.entry(group.clone()).or_default() += 1;
        p.seconds
            .entry(group)
            .or_default()
            .observe(duration.as_secs_f64());
    }

    /// A hang of `pid`'s watched thread, counted when first reported
    /// (`profiler_hangs_total`); its stall is counted by [`Metrics::stall`]
    /// when it ends.
    pub fn hang(&mut self, pid: u32) {
        self.prune();
        self.process(pid).hangs += 1;
    }

    /// The loop's iterations' share of wall time over the last window,
    /// 0 to 1 (`profiler_loop_busy_ratio`). Ignored for a PID not watched
    /// now (a gauge of a process that is gone would describe nothing).
    pub fn set_busy_ratio(&mut self, pid: u32, ratio: f64) {
        if let Some(p) = self.live(pid) {
            p.busy_ratio = Some(ratio);
        }
    }

    /// The probes' estimated share of the watched thread's time
    /// (`profiler_probe_overhead_ratio`). Ignored for a PID not watched now.
    pub fn set_probe_overhead(&mut self, pid: u32, ratio: f64) {
        if let Some(p) = self.live(pid) {
            p.overhead_ratio = Some(ratio);
        }
    }

    /// Events the kernel could not hand over since the watch began
    /// (`profiler_lost_events_total`). A counter never goes down: a lower
    /// total than the last one is ignored.
    pub fn set_lost(&mut self, total: u64) {
        self.lost = self.lost.max(total);
    }

    /// Processes watched now (`profiler_watched_processes`).
    pub fn watched(&self) -> usize {
        self.processes.values().filter(|p| p.gone.is_none()).count()
    }

    /// Every series in the text exposition format 0.0.4, one family after
    /// another, each with its `# HELP` and `# TYPE` lines.
    pub fn render(&mut self) -> String {
        self.prune();
        let mut out = String::with_capacity(256 + 1024 * self.processes.len());
        text::family(
            &mut out,
            "profiler_watched_processes",
            "gauge",
            "Processes profiler watch is watching now.",
        );
        text::sample(
            &mut out,
            "profiler_watched_processes",
            "",
            &[],
            self.watched() as f64,
        );

        text::family(
            &mut out,
            "profiler_stalls_total",
            "counter",
            "Stalls of the watched thread (iterations or dispatches over the threshold), by group.",
        );
        for p in self.processes.values() {
            for (group, n) in &p.stalls {
                text::sample(
                    &mut out,
                    "profiler_stalls_total",
                    &p.labels,
                    &[("group", group)],
                    *n as f64,
                );
            }
        }

        text::family(
            &mut out,
            "profiler_stall_seconds",
            "histogram",
            "Durations of the watched thread's stalls, by group.",
        );
        for p in self.processes.values() {
            for (group, h) in &p.seconds {
                let mut cumulative = 0;
                for (i, n) in h.counts.iter().enumerate() {
                    cumulative += n;
                    let le = STALL_BUCKETS
                        .get(i)
                        .map_or_else(|| "+Inf".to_owned(), |&b| text::number(b));
                    text::sample(
                        &mut out,
                        "profiler_stall_seconds_bucket",
                        &p.labels,
                        &[("group", group), ("le", &le)],
                        cumulative as f64,
                    );
                }
                let group = [("group", group.as_str())];
                text::sample(
                    &mut out,
                    "profiler_stall_seconds_sum",
                    &p.labels,
                    &group,
                    h.sum,
                );
                text::sample(
                    &mut out,
                    "profiler_stall_seconds_count",
                    &p.labels,
                    &group,
                    h.count as f64,
                );
            }
        }

        text::family(
            &mut out,
            "profiler_hangs_total",
            "counter",
            "Hangs of the watched thread, counted when first reported while still stuck.",
        );
        for p in self.processes.values() {
            text::sample(
                &mut out,
                "profiler_hangs_total",
                &p.labels,
                &[],
                p.hangs as f64,
            );
        }

        text::family(
            &mut out,
            "profiler_loop_busy_ratio",
            "gauge",
            "Share of wall time the watched thread spent in loop iterations, not waiting (0 to 1).",
        );
        for p in self.processes.values() {
            if let Some(r) = p.busy_ratio {
                text::sample(&mut out, "profiler_loop_busy_ratio", &p.labels, &[], r);
            }
        }

        text::family(
            &mut out,
            "profiler_probe_overhead_ratio",
            "gauge",
            "Estimated share of the watched thread's time spent in the profiler's probes.",
        );
        for p in self.processes.values() {
            if let Some(r) = p.overhead_ratio {
                text::sample(&mut out, "profiler_probe_overhead_ratio", &p.labels, &[], r);
            }
        }

        text::family(
            &mut out,
            "profiler_lost_events_total",
            "counter",
            "Events the kernel could not hand to the profiler (full rings).",
        );
        text::sample(
            &mut out,
            "profiler_lost_events_total",
            "",
            &[],
            self.lost as f64,
        );
        out
    }

    /// The group's own label value if it has (or gets) a slot, else
    /// [`OTHER_GROUP`].
    fn admit(&mut self, group: &str) -> String {
        if self.admitted.contains(group) {
            return group.to_owned();
        }
        if group != OTHER_GROUP && self.admitted.len() < self.cap {
            self.admitted.insert(group.to_owned());
            return group.to_owned();
        }
        OTHER_GROUP.to_owned()
    }

    /// `pid`'s series, made with no `comm` or origin for a PID never added
    /// (or removed and gone).
    fn process(&mut self, pid: u32) -> &mut Process {
        self.processes
            .entry(pid)
            .or_insert_with(|| Process::new(pid, b"", None))
    }

    /// `pid`'s series if it is watched now.
    fn live(&mut self, pid: u32) -> Option<&mut Process> {
        self.processes.get_mut(&pid).filter(|p| p.gone.is_none())
    }

    /// Drops removed processes whose linger is over, and gives their groups'
    /// slots back.
    fn prune(&mut self) {
        let linger = self.linger;
        let before = self.processes.len();
        self.processes
            .retain(|_, p| p.gone.is_none_or(|at| at.elapsed() < linger));
        if self.processes.len() != before {
            self.readmit();
        }
    }

    /// The admitted groups, recomputed from the series that exist.
    fn readmit(&mut self) {
        let held: BTreeSet<&String> = self
            .processes
            .values()
            .flat_map(|p| p.stalls.keys())
            .collect();
        self.admitted.retain(|g| held.contains(g));
    }
}
