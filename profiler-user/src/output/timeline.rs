//! `trace.json`: the session as a Chrome Trace Event / Perfetto timeline.
//! One track per thread with every completed traced call (an "X" slice,
//! written when its exit pairs, so unfinished frames never get invented
//! ends), slow dispatches and hangs as marked slices, and dispatch samples
//! as instant events. Streamed to disk; calls past `--trace-events` are
//! counted, not written.
use std::{fs::File, io};

use crate::{
    analyze::dispatch::{Config, Dispatcher, Slow},
    analyze::stacks::Completed,
    output::export::trace::{json_name, TraceWriter},
};

/// Length of the slice marking a wake-up on the waker's track.
const WAKE_SLICE_NS: u64 = 1_000;

/// The streaming timeline of one session.
pub struct Timeline {
    w: TraceWriter,
    pid: u32,
    start_ns: u64,
    names: Vec<String>,
    limit: u64,
    calls: u64,
    /// Calls not written because of the limit.
    pub omitted: u64,
    error: Option<io::Error>,
    /// Threads of other processes than `pid` (several traced), by tid.
    other_pids: std::collections::HashMap<u32, u32>,
    /// Wakers whose track was named: (pid, tid).
    named_wakers: std::collections::HashSet<(u32, u32)>,
    /// The last flow arrow's id.
    flow_id: u64,
    /// Slow dispatches let go from detail, written at the end in the order
    /// they started ([`Timeline::let_go`]).
    let_go: Vec<Slow>,
}

/// Slow dispatches let go from detail held for the end, at most: past
/// them, each is written when let go.
const LET_GO_HELD: usize = 10_000;

impl Timeline {
    /// Starts `trace.json` in `file` for process `pid`; timestamps are
    /// relative to `start_ns` (CLOCK_MONOTONIC). `names` are the probed
    /// functions' names, escaped here once.
    pub fn create(
        file: File,
        pid: u32,
        exe: &str,
        start_ns: u64,
        names: Vec<String>,
        limit: u64,
    ) -> io::Result<Self> {
        let mut w = TraceWriter::create(file)?;
        w.process_name(pid, exe)?;
        Ok(Timeline {
            w,
            pid,
            start_ns,
            names: names.iter().map(|n| json_name(n)).collect(),
            limit,
            calls: 0,
            omitted: 0,
            error: None,
            other_pids: Default::default(),
            named_wakers: Default::default(),
            flow_id: 0,
            let_go: Vec::new(),
        })
    }

    /// Functions were added to the session (probed after an exec).
    pub fn add_functions(&mut self, names: &[String]) {
        self.names.extend(names.iter().map(|n| json_name(n)));
    }

    fn rel(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.start_ns)
    }

    fn keep(&mut self, r: io::Result<()>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }

    /// A completed traced call on thread `tid`.
    #[inline]
    pub fn call(&mut self, tid: u32, c: &Completed) {
        self.call_in(self.pid, tid, c);
    }

    /// A completed traced call on thread `tid` of process `pid` (several
    /// processes traced: each is its own group of tracks).
    #[inline]
    pub fn call_in(&mut self, pid: u32, tid: u32, c: &Completed) {
        if pid != self.pid {
            self.other_pids.insert(tid, pid);
        }
        if self.calls >= self.limit || self.error.is_some() {
            self.omitted += 1;
            return;
        }
        self.calls += 1;
        let start = self.rel(c.start_ns);
        let r = self
            .w
            .call(pid, tid, &self.names[c.func as usize], start, c.measured_ns);
        self.keep(r);
    }

    /// A cpu-clock sample of the watched thread during a dispatch.
    pub fn sample(&mut self, tid: u32, ts_ns: u64, frames: usize) {
        let ts = self.rel(ts_ns);
        let r = self.w.instant(
            self.pid,
            tid,
            "cpu sample",
            ts,
            &[("frames", frames.to_string())],
        );
        self.keep(r);
    }

    /// A slow dispatch: for each of its wake-ups by a thread or a process,
    /// a short slice on the waker's track and a flow arrow from it to the
    /// woken dispatch (wakers outside the target, not in `threads`, get
    /// their track named once); then its own slice. Written when the
    /// dispatcher lets it go from detail, or at the end for those it kept.
    pub fn slow_dispatch(&mut self, cfg: &Config, s: &Slow, threads: &[(u32, String)]) {
        use crate::analyze::dispatch::wakers::WakerKind;
        let main = &cfg.thread_name;
        for w in &s.wakers {
            if !matches!(w.kind, WakerKind::Thread | WakerKind::Process) {
                continue;
            }
            let known = w.pid == self.pid && threads.iter().any(|(t, _)| *t == w.tid);
            if !known && self.named_wakers.insert((w.pid, w.tid)) {
                if w.pid != self.pid {
                    let r = self.w.process_name(w.pid, &w.comm);
                    self.keep(r);
                }
                let r = self.w.thread_name(w.pid, w.tid, &w.comm);
                self.keep(r);
            }
            for &ts in &w.wakes_ns {
                self.flow_id += 1;
                let id = self.flow_id;
                let args = [
                    ("woke", format!("{main} ({})", cfg.tid)),
                    ("in", w.function.clone()),
                    ("dispatch", s.index.to_string()),
                ];
                let name = format!("wakes {main}");
                let start = ts.saturating_sub(WAKE_SLICE_NS);
                let r = self
                    .w
                    .complete(w.pid, w.tid, &name, "waker", start, WAKE_SLICE_NS, &args);
                self.keep(r);
                let r = self
                    .w
                    .flow(true, id, w.pid, w.tid, "wakeup", "waker", start);
                self.keep(r);
                let r = self
                    .w
                    .flow(false, id, self.pid, cfg.tid, "wakeup", "waker", ts);
                self.keep(r);
            }
        }
        let args = [
            ("key", s.key.clone()),
            ("verdict", s.verdict.clone()),
            ("index", s.index.to_string()),
        ];
        let name = format!("slow dispatch: {}", s.key);
        let r = self.w.complete(
            self.pid,
            cfg.tid,
            &name,
            "dispatch",
            s.start_ns,
            s.duration_ns,
            &args,
        );
        self.keep(r);
    }

    /// Slow dispatch `s`, let go from detail: held and written at the end
    /// with the others let go, in the order they started, so that a
    /// recording and its replay write the same file (a dispatch explained
    /// late, when its frames' names came, is let go later while recording
    /// than in the replay). Past [`LET_GO_HELD`], written now.
    pub fn let_go(&mut self, cfg: &Config, s: Slow) {
        if self.let_go.len() < LET_GO_HELD {
            self.let_go.push(s);
        } else {
            self.slow_dispatch(cfg, &s, &[]);
        }
    }

    /// Closes the file: process names (`processes`: pid and program, when
    /// several were traced), thread names, then slow dispatches and hangs.
    /// Returns the first write error, if any happened.
    pub fn finish(
        mut self,
        processes: &[(u32, String)],
        threads: &[(u32, String)],
        dispatch: Option<&Dispatcher>,
    ) -> io::Result<()> {
        let main = self.pid;
        for (pid, exe) in processes.iter().filter(|(pid, _)| *pid != main) {
            let r = self.w.process_name(*pid, exe);
            self.keep(r);
        }
        for (tid, name) in threads {
            let pid = self.other_pids.get(tid).copied().unwrap_or(self.pid);
            let r = self.w.thread_name(pid, *tid, name);
            self.keep(r);
        }
        if let Some(d) = dispatch.filter(|d| d.by_waits()) {
            // The loop's idle share of each second (libuv's idle time).
            let name = format!("{} loop idle %", d.cfg.thread_name);
            for (sec, idle) in d.loop_wait.idle_per_second(None).iter().enumerate() {
                let ts = sec as u64 * 1_000_000_000;
                let r = self
                    .w
                    .counter(self.pid, &name, "idle", ts, *idle as f64 / 1e7);
                self.keep(r);
            }
        }
        if let Some(d) = dispatch {
            let mut let_go = std::mem::take(&mut self.let_go);
            let_go.sort_by_key(|s| s.index);
            for s in &let_go {
                self.slow_dispatch(&d.cfg, s, &[]);
            }
            for s in &d.slow {
                self.slow_dispatch(&d.cfg, s, threads);
            }
            for h in &d.hangs {
                let dur = h.duration_ns.unwrap_or(h.reported_after_ns);
                let args = [
                    ("stack", h.stack.join(" <- ")),
                    ("index", h.index.to_string()),
                ];
                let r = self
                    .w
                    .complete(self.pid, d.cfg.tid, "HANG", "hang", h.start_ns, dur, &args);
                self.keep(r);
            }
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.w.finish()
    }
}
