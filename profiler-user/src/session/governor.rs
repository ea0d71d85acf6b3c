//! The overhead governor at work: every [`EVERY`] it reads the CPU time of
//! each thread with hits (/proc/PID/task/TID/schedstat), asks the estimator
//! (`analyze/overhead.rs`) whether some thread spends more than
//! `--max-overhead` of its CPU time in probes, and detaches the functions it
//! names (`Probes::detach_funcs`), saying so on stderr and in the reports.
use std::time::{Duration, Instant};

use crate::{
    analyze::overhead::{Detached, Estimator, ExitKind, FuncCost, GovernorReport, ThreadSample},
    attach::{
        calibrate::{self, EntryKind, HitCost},
        probes::Probes,
    },
    clock::monotonic_ns,
    session::probed::DetachRecord,
    text::fmt_count,
    tracee::{exits::ExitProbe, process::thread_cpu_ns, select::Selection},
    Result,
};

/// How often the estimate is made (and the window it covers).
pub const EVERY: Duration = Duration::from_millis(250);

/// For the first [`EARLY_FOR`] after attach, when hot functions run at
/// full probe cost until the governor sees them, the estimate is made this
/// often instead: a function hot from the start is detached within about
/// this long. (An idle thread is still held against a 250-ms window's
/// floor: `analyze/overhead.rs`.)
pub const EARLY_EVERY: Duration = Duration::from_millis(50);

/// How long the windows stay short after attach.
pub const EARLY_FOR: Duration = Duration::from_secs(2);

/// The governor of one session.
pub struct Governor<'a> {
    probes: &'a mut Probes,
    sel: &'a Selection,
    pid: u32,
    est: Estimator,
    session_start_ns: u64,
    /// When it began governing.
    began: Instant,
    last: Instant,
    /// CLOCK_MONOTONIC when the last detach was done.
    done_ns: u64,
    /// What it did, for the reports.
    pub report: GovernorReport,
}

impl<'a> Governor<'a> {
    /// A governor keeping every thread of `pid` under `max_pct` % of probe
    /// time, given the calibrated `cost`; functions marked in `protected`
    /// are never detached.
    pub fn new(
        probes: &'a mut Probes,
        sel: &'a Selection,
        pid: u32,
        max_pct: f64,
        cost: HitCost,
        protected: &[bool],
        session_start_ns: u64,
    ) -> Self {
        let files: Vec<Option<std::fs::File>> = sel
            .binaries
            .iter()
            .map(|b| std::fs::File::open(&b.open_path).ok())
            .collect();
        let funcs: Vec<FuncCost> = sel
            .funcs
            .iter()
            .enumerate()
            .map(|(i, f)| FuncCost {
                entry: files[f.binary as usize]
                    .as_ref()
                    .map_or(EntryKind::Step, |file| {
                        calibrate::entry_kind(file, f.entry_offset())
                    }),
                exit: match f.exit {
                    ExitProbe::Sites(_) => ExitKind::Sites,
                    ExitProbe::Uretprobe => ExitKind::Uretprobe,
                    ExitProbe::EntryOnly(_) => ExitKind::None,
                },
                // Every function is a dispatch function in the fallback
                // rule; only named ones are needed.
                protected: (f.dispatch && !sel.dispatch_fallback)
                    || protected.get(i).copied().unwrap_or(false),
            })
            .collect();
        let mut est = Estimator::new(max_pct, cost, &funcs);
        est.evaluate(monotonic_ns(), &vec![0; funcs.len()], std::iter::empty());

        Governor {
            probes,
            sel,
            pid,
            est,
            session_start_ns,
            began: Instant::now(),
            last: Instant::now(),
            done_ns: 0,
            report: GovernorReport {
                max_overhead_pct: max_pct,
                cost,
                ..GovernorReport::default()
            },
        }
    }

    /// Called on every drain tick with each function's events so far and
    /// each live thread's: every [`EVERY`] ([`EARLY_EVERY`] at first),
    /// estimates and detaches. Returns
    /// the functions it detached.
    pub fn tick(
        &mut self,
        func_events: &[u64],
        threads: impl Iterator<Item = (u32, u64)>,
    ) -> Result<&[Detached]> {
        let every = match self.began.elapsed() < EARLY_FOR {
            true => EARLY_EVERY,
            false => EVERY,
        };
        if self.last.elapsed() < every {
            return Ok(&[]);
        }
        self.last = Instant::now();
        let pid = self.pid;
        let threads = threads.map(|(tid, events)| ThreadSample {
            tid,
            events,
            cpu_ns: thread_cpu_ns(pid, tid),
        });
        let decided_ns = monotonic_ns();
        let decision = self.est.evaluate(decided_ns, func_events, threads);
        self.report.peak_pct = self.est.peak_pct;
        self.report.settled_pct = self.est.settled_pct();
        self.report.protected_hot = self.est.protected_hot.clone();
        let Some(d) = decision else { return Ok(&[]) };
        let gone: Vec<usize> = d.funcs.iter().map(|f| f.0 as usize).collect();
        self.probes.detach_funcs(self.sel, &gone, self.pid)?;
        self.done_ns = monotonic_ns();
        let at_ns = self.done_ns.saturating_sub(self.session_start_ns);
        let name = |f: u32| self.sel.funcs[f as usize].name.as_str();
        let what: Vec<String> = d
            .funcs
            .iter()
            .take(5)
            .map(|&(f, cps, pct)| {
                format!(
                    "{} ({} calls/s, est. {pct:.1}%)",
                    name(f),
                    fmt_count(cps as u64)
                )
            })
            .collect();
        let more = match d.funcs.len() {
            n if n > 5 => format!(" and {} more (report.txt lists them)", n - 5),
            _ => String::new(),
        };
        eprintln!(
            "profiler: overhead governor: detached {} after {:.2} s, thread {} spending an estimated \
             {:.1}% of its CPU time in probes (--max-overhead {}%): {}{more}; their counts stop here",
            if d.funcs.len() == 1 {
                name(d.funcs[0].0).to_string()
            } else {
                format!("{} functions", d.funcs.len())
            },
            at_ns as f64 / 1e9,
            d.tid,
            d.thread_pct,
            self.report.max_overhead_pct,
            what.join(", "),
        );
        for &(func, calls_per_s, overhead_pct) in &d.funcs {
            self.report.detached.push(Detached {
                func,
                name: self.sel.funcs[func as usize].name.clone(),
                at_ns,
                decided_ns,
                calls_per_s,
                overhead_pct,
                tid: d.tid,
                thread_pct: d.thread_pct,
            });
        }
        let new = self.report.detached.len() - d.funcs.len();
        Ok(&self.report.detached[new..])
    }
}

impl crate::session::collector::Steer for Governor<'_> {
    fn on_tick(&mut self, sinks: &mut crate::session::sinks::Sinks) -> Result<()> {
        let live = sinks.stacks.threads().filter(|t| t.exited_threads == 0);
        let gone = self.tick(&sinks.hits, live.map(|t| (t.tid, t.events)))?;
        let gone: Vec<(u32, u64)> = gone.iter().map(|d| (d.func, d.decided_ns)).collect();
        let Some(&(_, decided_ns)) = gone.first() else {
            return Ok(());
        };
        let record = DetachRecord {
            ts_ns: self.done_ns,
            decided_ns,
            funcs: gone.iter().map(|&(f, _)| f).collect(),
        };
        // Returns from now on without an entry are not orphans; the frames
        // left open close once every event up to the detach is read.
        for (f, decided_ns) in gone {
            sinks.detach_from(f, decided_ns);
        }
        sinks.detach_later(record);
        Ok(())
    }
}
