//! Startup time of a launched program, Matrix-StartupTracer style but
//! exact: from exec (taken at [`crate::tracee::launch::Launched::release`]) to
//! *ready* (the entry of `--ready FUNC`, or the first dispatch), split at
//! the entry of `main` when it is probed. All times are `CLOCK_MONOTONIC`
//! ns, the clock of `bpf_ktime_get_ns`.
use std::fmt::Write;

use serde::Serialize;

use super::stages::Summary;
use crate::text::fmt_ns;

/// One launch's startup, split at `main`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StartupReport {
    /// Exec to ready; `None` if the program never became ready.
    pub exec_to_ready_ns: Option<u64>,
    /// Exec to the entry of `main` (loader, relocations, constructors);
    /// `None` if `main` was not probed or not seen.
    pub pre_main_ns: Option<u64>,
    /// Entry of `main` to ready.
    pub main_to_ready_ns: Option<u64>,
}

impl StartupReport {
    /// Computes the split. Times before exec (clock skew between CPUs)
    /// count as zero; a `main` seen after ready is ignored.
    pub fn compute(exec_ns: u64, main_ns: Option<u64>, ready_ns: Option<u64>) -> Self {
        let main_ns = main_ns.filter(|&m| ready_ns.is_none_or(|r| m <= r));
        StartupReport {
            exec_to_ready_ns: ready_ns.map(|r| r.saturating_sub(exec_ns)),
            pre_main_ns: main_ns.map(|m| m.saturating_sub(exec_ns)),
            main_to_ready_ns: main_ns.zip(ready_ns).map(|(m, r)| r.saturating_sub(m)),
        }
    }

    /// A short text block; `ready` describes the ready point, e.g. "entry of
    /// app_ready" or "first dispatch".
    pub fn render_text(&self, ready: &str) -> String {
        let mut out = String::new();
        match self.exec_to_ready_ns {
            Some(t) => {
                let _ = writeln!(out, "Startup: {} from exec to ready ({ready})", fmt_ns(t));
            }
            None => {
                let _ = writeln!(out, "Startup: never became ready ({ready} was not seen)");
            }
        }
        if let Some(t) = self.pre_main_ns {
            let _ = writeln!(out, "  exec to main:  {}", fmt_ns(t));
        }
        if let Some(t) = self.main_to_ready_ns {
            let _ = writeln!(out, "  main to ready: {}", fmt_ns(t));
        }
        out
    }
}

/// Collects the three times from the event stream of one launch.
#[derive(Debug, Clone, Default)]
pub struct StartupWatch {
    main_func: Option<u32>,
    ready_func: Option<u32>,
    exec_ns: Option<u64>,
    main_ns: Option<u64>,
    ready_ns: Option<u64>,
}

impl StartupWatch {
    /// Watches for the entry of `main_func` and `ready_func` (probe
    /// indices), either of which may be absent.
    pub fn new(main_func: Option<u32>, ready_func: Option<u32>) -> Self {
        StartupWatch {
            main_func,
            ready_func,
            ..Default::default()
        }
    }

    /// The exec time ([`crate::tracee::launch::Launched::exec_time_ns`]).
    pub fn set_exec(&mut self, ts_ns: u64) {
        self.exec_ns = Some(ts_ns);
    }

    /// A function entry: the first of `main` and of the ready function count.
    pub fn on_entry(&mut self, func: u32, ts_ns: u64) {
        if Some(func) == self.main_func && self.main_ns.is_none() {
            self.main_ns = Some(ts_ns);
        }
        if Some(func) == self.ready_func {
            self.mark_ready(ts_ns);
        }
    }

    /// Ready by other means (the first dispatch began); only the first counts.
    pub fn mark_ready(&mut self, ts_ns: u64) {
        self.ready_ns.get_or_insert(ts_ns);
    }

    /// True once ready was seen (the session may stop, or relaunch).
    pub fn is_ready(&self) -> bool {
        self.ready_ns.is_some()
    }

    /// The report; `None` without an exec time.
    pub fn report(&self) -> Option<StartupReport> {
        Some(StartupReport::compute(
            self.exec_ns?,
            self.main_ns,
            self.ready_ns,
        ))
    }
}

/// Startup over several launches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StartupSummary {
    /// Launches measured.
    pub launches: usize,
    /// Launches that never became ready.
    pub not_ready: usize,
    /// Exec to ready, over the launches that became ready.
    pub exec_to_ready_ns: Option<Summary>,
    /// Exec to `main`, where seen.
    pub pre_main_ns: Option<Summary>,
    /// Each launch, in order.
    pub per_launch: Vec<StartupReport>,
}

impl StartupSummary {
    /// Summarises `reports`.
    pub fn of(reports: &[StartupReport]) -> Self {
        let ready: Vec<u64> = reports.iter().filter_map(|r| r.exec_to_ready_ns).collect();
        let main: Vec<u64> = reports.iter().filter_map(|r| r.pre_main_ns).collect();
        StartupSummary {
            launches: reports.len(),
            not_ready: reports.len() - ready.len(),
            exec_to_ready_ns: Summary::of(&ready),
            pre_main_ns: Summary::of(&main),
            per_launch: reports.to_vec(),
        }
    }

    /// Text: one launch as [`StartupReport::render_text`]; several as a
    /// summary line and one line per launch.
    pub fn render_text(&self, ready: &str) -> String {
        if let [one] = self.per_launch.as_slice() {
            return one.render_text(ready);
        }
        let mut out = String::new();
        let _ = write!(
            out,
            "Startup over {} launches, exec to ready ({ready}): ",
            self.launches
        );
        match &self.exec_to_ready_ns {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "avg = {}, min = {}, max = {}, p50 = {}, p95 = {}",
                    fmt_ns(s.avg),
                    fmt_ns(s.min),
                    fmt_ns(s.max),
                    fmt_ns(s.p50),
                    fmt_ns(s.p95)
                );
            }
            None => out.push_str("never ready\n"),
        }
        for (i, r) in self.per_launch.iter().enumerate() {
            let t = r.exec_to_ready_ns.map_or("not ready".into(), fmt_ns);
            let _ = write!(out, "  launch {}: {t}", i + 1);
            if let Some(m) = r.pre_main_ns {
                let _ = write!(out, " (exec to main {})", fmt_ns(m));
            }
            out.push('\n');
        }
        out
    }

    /// `startup.json`.
    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("startup JSON serializes") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn splits_at_main() {
        let r = StartupReport::compute(100 * MS, Some(112 * MS), Some(223 * MS));
        assert_eq!(r.exec_to_ready_ns, Some(123 * MS));
        assert_eq!(r.pre_main_ns, Some(12 * MS));
        assert_eq!(r.main_to_ready_ns, Some(111 * MS));
        assert_eq!(
            r.render_text("entry of app_ready"),
            "Startup: 123.00 ms from exec to ready (entry of app_ready)\n\
             \x20 exec to main:  12.00 ms\n\
             \x20 main to ready: 111.00 ms\n"
        );
    }

    #[test]
    fn missing_and_skewed_times() {
        let r = StartupReport::compute(100, None, Some(90));
        assert_eq!(
            (r.exec_to_ready_ns, r.pre_main_ns, r.main_to_ready_ns),
            (Some(0), None, None)
        );
        let r = StartupReport::compute(100, Some(150), None);
        assert_eq!((r.exec_to_ready_ns, r.pre_main_ns), (None, Some(50)));
        assert!(r
            .render_text("first dispatch")
            .contains("never became ready"));
        let r = StartupReport::compute(100, Some(300), Some(200));
        assert_eq!((r.pre_main_ns, r.main_to_ready_ns), (None, None));
    }

    #[test]
    fn watch_takes_first_events() {
        let mut w = StartupWatch::new(Some(0), Some(5));
        assert_eq!(w.report(), None);
        w.set_exec(1_000);
        w.on_entry(0, 1_200);
        w.on_entry(0, 1_300);
        assert!(!w.is_ready());
        w.on_entry(5, 2_000);
        w.mark_ready(2_500);
        w.on_entry(5, 3_000);
        let r = w.report().unwrap();
        assert_eq!(
            (r.exec_to_ready_ns, r.pre_main_ns),
            (Some(1_000), Some(200))
        );
        assert!(w.is_ready());
    }

    #[test]
    fn summarises_launches() {
        let reports: Vec<_> = [120, 100, 140, 110]
            .iter()
            .map(|&t| StartupReport::compute(0, Some(10 * MS), Some(t * MS)))
            .chain([StartupReport::compute(0, None, None)])
            .collect();
        let s = StartupSummary::of(&reports);
        assert_eq!((s.launches, s.not_ready), (5, 1));
        let e = s.exec_to_ready_ns.unwrap();
        assert_eq!(
            (e.avg, e.min, e.max, e.p50, e.p95),
            (117_500_000, 100 * MS, 140 * MS, 110 * MS, 140 * MS)
        );
        let text = s.render_text("first dispatch");
        assert!(text.starts_with(
            "Startup over 5 launches, exec to ready (first dispatch): avg = 117.50 ms, min = 100.00 ms"
        ), "{text}");
        assert!(
            text.contains("  launch 1: 120.00 ms (exec to main 10.00 ms)\n"),
            "{text}"
        );
        assert!(text.contains("  launch 5: not ready\n"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&s.render_json()).unwrap();
        assert_eq!(v["exec_to_ready_ns"]["p95"], 140 * MS);
        assert_eq!(
            v["per_launch"][4]["exec_to_ready_ns"],
            serde_json::Value::Null
        );
        assert_eq!(
            s.render_text("x"),
            StartupSummary::of(&reports).render_text("x")
        );
        let one = StartupSummary::of(&reports[..1]);
        assert!(one.render_text("x").starts_with("Startup: 120.00 ms"));
    }
}
