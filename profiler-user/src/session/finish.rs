//! Writes a session's outputs from its finished pipeline. Shared by `record`
//! (live) and `report` (replaying `profile.data`), so both render the same
//! bytes from the same stream.
use std::collections::HashMap;

use crate::{
    analyze::cpu_profile::CpuProfile,
    analyze::dispatch::Dispatcher,
    analyze::stages::StageTracker,
    analyze::startup::StartupReport,
    output::html::Page,
    output::report::{Report, Session},
    output::writers,
    output::OutDir,
    session::datafile::{Header, Trailer},
    session::sinks::Sinks,
    text::{fmt_count, fmt_ns},
    tracee::select::{Binary, Func},
    Error, Result,
};

/// What the outputs need besides the pipeline itself.
pub struct Finish<'a> {
    /// Where to write.
    pub out: &'a OutDir,
    /// Probed functions and binaries.
    pub funcs: &'a [Func],
    /// Binaries searched.
    pub binaries: &'a [Binary],
    /// Session facts.
    pub session: Session,
    /// Final thread names.
    pub thread_names: HashMap<u32, String>,
    /// No dispatch function was known (startup is then never "ready" by
    /// dispatch).
    pub dispatch_fallback: bool,
    /// `--ready FUNC`.
    pub ready: Option<String>,
    /// `--startup-threshold`, in ns.
    pub startup_threshold_ns: Option<u64>,
    /// Launch mode: CLOCK_MONOTONIC at exec.
    pub exec_ns: u64,
    /// `--trace-events`.
    pub trace_events: u64,
    /// CPU profile and its rate (`--sample`).
    pub cpu: Option<(u64, CpuProfile)>,
    /// Off-CPU profile (`--off-cpu`).
    pub offcpu: Option<CpuProfile>,
    /// Scheduler/sample and thread-name events lost.
    pub lost_sched: u64,
    /// Thread-name events lost.
    pub lost_comm: u64,
}

impl<'a> Finish<'a> {
    /// What the outputs need of the session `h` (what was asked) and `t`
    /// (what happened) describe: the same for a live session and a replay.
    /// `damage` says what part of a damaged recording is missing.
    #[allow(clippy::too_many_arguments)]
    pub fn recorded(
        out: &'a OutDir,
        funcs: &'a [Func],
        binaries: &'a [Binary],
        h: &Header,
        t: Trailer,
        damage: Option<String>,
        thread_names: HashMap<u32, String>,
        trace_events: u64,
    ) -> Self {
        let session = Session {
            pid: h.pid,
            exe: h.exe.clone(),
            duration_ns: t.duration_ns,
            stop_reason: t.stop_reason,
            functions_probed: t.functions_probed,
            lost_events: t.lost_events,
            capped: t.capped,
            failed_probes: t.failed_probes,
            start_unix_ns: h.start_unix_ns,
            exit_rule: h.exit_rule.clone(),
            never_mapped: t.never_mapped,
            damage,
            untraced_children: t.untraced_children,
            follow: h.follow,
            governor: t.governor,
            cost_spread_pct: h.cost_spread_pct,
            cost_drift_pct: t.cost_drift_pct,
        };
        Finish {
            out,
            funcs,
            binaries,
            session,
            thread_names,
            dispatch_fallback: h.dispatch_fallback,
            ready: h.ready.clone(),
            startup_threshold_ns: h.startup_threshold_ns,
            exec_ns: h.exec_ns.unwrap_or(0),
            trace_events,
            cpu: t.cpu,
            offcpu: t.offcpu,
            lost_sched: t.lost_sched,
            lost_comm: t.lost_comm,
        }
    }
}

/// Writes every output of the session; returns the startup report in
/// launch mode.
pub fn write(f: Finish, mut sinks: Sinks) -> Result<Option<StartupReport>> {
    sinks.flush_tail_calls();
    sinks.finish_dispatches();
    let Sinks {
        stacks,
        dispatch,
        timeline,
        stages,
        startup,
        mut processes,
        ..
    } = sinks;
    let stacks = writers::finished(stacks);
    if let Some(p) = &mut processes {
        p.finish();
    }
    let out = f.out;
    let report = Report {
        session: f.session.clone(),
        funcs: f.funcs,
        binaries: f.binaries,
        stacks: &stacks,
        thread_names: f.thread_names.clone(),
        processes: processes.as_ref(),
    };
    let mut page = summary_page(&f, &report, dispatch.as_ref());
    writers::spine(out, &report, &mut page)?;
    let duration_ns = f.session.duration_ns;
    if let Some(d) = &dispatch {
        writers::dispatches(out, d, duration_ns, f.session.damage.as_deref(), &mut page)?;
    }
    if !stages.is_empty() {
        let results: Vec<_> = stages.into_iter().map(StageTracker::finish).collect();
        let start = dispatch.as_ref().map_or(0, |d| d.session_start_ns());
        writers::stages(out, &results, start, &mut page)?;
    }
    let mut startup_report = None;
    if let Some((mut watch, mut window)) = startup {
        if let Some(first) = dispatch.as_ref().and_then(|d| d.first_start_ns) {
            if f.ready.is_none() && !f.dispatch_fallback {
                watch.mark_ready(first);
            }
        }
        if let Some(ready) = watch
            .report()
            .and_then(|r| r.exec_to_ready_ns.map(|d| d + f.exec_ns))
        {
            window.cut_window(ready);
        }
        let window = writers::finished(window);
        let window_report = Report {
            session: f.session.clone(),
            funcs: f.funcs,
            binaries: f.binaries,
            stacks: &window,
            thread_names: f.thread_names.clone(),
            processes: None,
        };
        let ready_what = match &f.ready {
            Some(func) => format!("entry of {func}"),
            None if f.dispatch_fallback => "never: give --ready FUNC or --dispatch".to_string(),
            None => "first dispatch".to_string(),
        };
        writers::startup(
            out,
            watch.report().as_ref(),
            &ready_what,
            f.startup_threshold_ns,
            &window_report,
        )?;
        startup_report = watch.report();
    }
    if let Some(tl) = timeline {
        let omitted = tl.omitted;
        let mut threads: Vec<(u32, String)> = f.thread_names.into_iter().collect();
        threads.sort();
        let procs: Vec<(u32, String)> = processes
            .iter()
            .flat_map(|p| p.iter().map(|p| (p.pid, p.exe.clone())))
            .collect();
        tl.finish(&procs, &threads, dispatch.as_ref())
            .map_err(|e| Error::Output {
                path: out.path().join("trace.json"),
                reason: e.to_string(),
            })?;
        if omitted > 0 {
            page.warn(format!(
                "trace.json holds the first {} calls; {omitted} more were left out (raise --trace-events)",
                f.trace_events
            ));
            eprintln!(
                "profiler: note: trace.json holds the first {} calls; {omitted} more were left out (raise --trace-events)",
                f.trace_events
            );
        }
    }
    let what = format!("PID {}", f.session.pid);
    if let Some(off) = &f.offcpu {
        print!("\n{}", writers::write_offcpu(out, off, &what, &mut page)?);
    }
    if let Some((hz, prof)) = &f.cpu {
        print!(
            "\n{}",
            writers::write_cpu(out, prof, &what, *hz, duration_ns, &mut page)?
        );
        let pprof = crate::output::export::cpu_pprof(
            &prof.folded,
            *hz,
            duration_ns,
            f.session.start_unix_ns,
        );
        out.write("cpu.pb.gz", &pprof)?;
    }
    page.write(out)?;
    if f.lost_sched + f.lost_comm > 0 {
        eprintln!(
            "profiler: warning: {} scheduler/sample events and {} thread-name events were lost (ring full): raise --ring-size",
            f.lost_sched, f.lost_comm
        );
    }
    Ok(startup_report)
}

/// The page's summary and warnings: the facts report.txt opens with.
fn summary_page(f: &Finish, report: &Report, dispatch: Option<&Dispatcher>) -> Page {
    let s = &f.session;
    let mut page = Page::new(
        &format!("profiler: PID {} ({})", s.pid, s.exe),
        s.duration_ns,
    );
    page.fact("target", format!("PID {} {}", s.pid, s.exe));
    page.fact("duration", fmt_ns(s.duration_ns));
    page.fact("stopped", &s.stop_reason);
    page.fact(
        "functions probed",
        format!(
            "{} ({} over --max-funcs, {} failed to attach)",
            s.functions_probed, s.capped, s.failed_probes
        ),
    );
    page.fact("returns seen by", &s.exit_rule);
    page.fact(
        "events",
        format!(
            "{} read; lost: {} call events, {} scheduler/sample, {} thread-name",
            fmt_count(report.stacks.events),
            s.lost_events,
            f.lost_sched,
            f.lost_comm
        ),
    );
    page.fact(
        "frames",
        format!(
            "{} exits without an entry, {} unfinished at the end, {} closed by unwinding",
            report.stacks.orphan_exits(),
            report.stacks.unfinished_frames(),
            report.stacks.unwound_frames()
        ),
    );
    if s.lost_events > 0 {
        page.warn(format!(
            "{} call events were lost (ring full): raise --ring-size or probe fewer functions",
            s.lost_events
        ));
    }
    if f.lost_sched + f.lost_comm > 0 {
        page.warn(format!(
            "{} scheduler/sample events and {} thread-name events were lost (ring full): raise --ring-size",
            f.lost_sched, f.lost_comm
        ));
    }
    if s.failed_probes > 0 {
        page.warn(format!("{} functions could not be probed", s.failed_probes));
    }
    if s.capped > 0 {
        page.warn(format!(
            "{} matching functions were not probed (--max-funcs)",
            s.capped
        ));
    }
    if let Some(d) = dispatch {
        if d.slow_dropped > 0 {
            page.warn(format!(
                "{} slow dispatches were counted in their groups but not detailed (kept: the {} longest of each group and the last {}, {} in all)",
                d.slow_dropped,
                crate::analyze::dispatch::retain::KEEP_WORST,
                crate::analyze::dispatch::retain::KEEP_RECENT,
                d.slow.len()
            ));
        }
        let truncated = d.slow.iter().filter(|s| s.truncated).count();
        if truncated > 0 {
            page.warn(format!(
                "{truncated} slow dispatches had more events than their buffer holds: their trees are truncated"
            ));
        }
    }
    page
}
