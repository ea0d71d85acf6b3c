//! `profiler report DIR`: renders a recording's outputs again from its
//! `profile.data`, offline and without root. The stream is fed through the
//! same pipeline as live, with the journaled hang checks, thread exits,
//! thread names and symbolized addresses, so with the recorded settings the
//! outputs come out byte for byte the same; dispatch thresholds can be
//! changed. A recording cut short or damaged is replayed up to its last
//! whole block, and every output says the figures cover only that part.
use crate::{
    analyze::dispatch::{self},
    analyze::stages::StagesConfig,
    cli::ReportArgs,
    output::OutDir,
    output::{report::Session, writers},
    session::{
        datafile::{self, replayed_binary, FuncInfo},
        finish, pipeline,
    },
    symbolize::Symbolizer,
    target::select::{Binary, Func},
    Result,
};

/// Runs `profiler report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let file = if args.recording.is_dir() {
        args.recording.join("profile.data")
    } else {
        args.recording.clone()
    };
    let data = datafile::read(&file)?;
    let damage = data.damage.as_ref().map(|d| d.message());
    if let Some(d) = &damage {
        eprintln!("profiler: warning: {}: {d}", file.display());
    }
    if let Some((at, n)) = data.trailing {
        eprintln!(
            "profiler: warning: {}: {n} bytes after the trailer, at byte {at}, were ignored",
            file.display()
        );
    }
    let dir = args
        .out
        .clone()
        .or_else(|| file.parent().map(|p| p.to_path_buf()))
        .unwrap_or_else(|| ".".into());
    let out = OutDir::prepare(&dir, writers::RECORD_FILES)?;
    let (h, t) = (&data.header, &data.trailer);
    let funcs: Vec<Func> = h.funcs.iter().map(FuncInfo::to_func).collect();
    let binaries: Vec<Binary> = h.binaries.iter().map(|p| replayed_binary(p)).collect();
    let ns = |d: Option<std::time::Duration>, dflt: u64| d.map_or(dflt, |d| d.as_nanos() as u64);
    let trace_events = args.trace_events.unwrap_or(h.trace_events);
    let stage_cfg = StagesConfig::parse(&h.stages, &h.scenarios, h.runs)?;
    let exec_ns = h.exec_ns.unwrap_or(0);
    let mut sinks = pipeline::build(pipeline::Config {
        out: &out,
        pid: h.pid,
        exe: &h.exe,
        funcs: &funcs,
        dispatch: dispatch::Config {
            tid: h.watch_tid,
            thread_name: h.watch_name.clone(),
            rule: h.dispatch_rule.clone(),
            threshold_ns: ns(args.threshold, h.threshold_ns),
            hang_ns: ns(args.hang, h.hang_ns),
            frame_interval_ns: ns(args.frame_interval, h.frame_interval_ns),
            full_tree: args.full_tree || h.full_tree,
            sample_period_ns: 1_000_000_000u64.checked_div(h.dispatch_hz).unwrap_or(0),
            wakers: !h.no_wakers,
            wait_loop: h.wait_loop,
        },
        session_start_ns: h.session_start_ns,
        trace_events,
        stages: &stage_cfg,
        startup: h.launch.then_some((exec_ns, h.ready.as_deref())),
        dispatch_fallback: h.dispatch_fallback,
    })?;
    if let Some(d) = &mut sinks.dispatch {
        d.set_symbolizer(Symbolizer::offline(h.pid, t.symbols.iter().cloned()));
    }
    if !h.processes.is_empty() {
        sinks.processes = Some(pipeline::processes(
            &funcs,
            crate::analyze::processes::DispatchRule {
                threshold_ns: ns(args.threshold, h.threshold_ns),
                frame_interval_ns: ns(args.frame_interval, h.frame_interval_ns),
            },
            h.processes
                .iter()
                .map(|p| (p.pid, p.ppid, p.exe.clone(), p.start_ns)),
        ));
    }
    if let Some(g) = &t.governor {
        // As recorded: the governor may have rebuilt links (record.rs).
        sinks.dedup = Some(Default::default());
        for d in &g.detached {
            sinks.detach_from(d.func, d.decided_ns);
        }
    }
    for entry in &data.entries {
        sinks.replay(entry);
    }
    // Without the trailer, the names are those the stream itself gave.
    let thread_names = if data.has_trailer {
        t.thread_names.iter().cloned().collect()
    } else {
        sinks
            .stacks
            .threads()
            .filter_map(|t| t.name.clone().map(|n| (t.tid, n)))
            .collect()
    };
    let mut funcs = funcs;
    funcs.extend(sinks.added.funcs());
    let mut binaries = binaries;
    binaries.extend(sinks.added.binaries());
    let session = Session {
        pid: h.pid,
        exe: h.exe.clone(),
        duration_ns: t.duration_ns,
        stop_reason: t.stop_reason.clone(),
        functions_probed: t.functions_probed,
        lost_events: t.lost_events,
        capped: t.capped,
        failed_probes: t.failed_probes,
        start_unix_ns: h.start_unix_ns,
        exit_rule: h.exit_rule.clone(),
        never_mapped: t.never_mapped.clone(),
        damage,
        untraced_children: t.untraced_children,
        follow: h.follow,
        governor: t.governor.clone(),
        cost_spread_pct: h.cost_spread_pct,
    };
    finish::write(
        finish::Finish {
            out: &out,
            funcs: &funcs,
            binaries: &binaries,
            session,
            thread_names,
            dispatch_fallback: h.dispatch_fallback,
            ready: h.ready.clone(),
            startup_threshold_ns: h.startup_threshold_ns,
            exec_ns,
            trace_events,
            cpu: t.cpu.clone(),
            offcpu: t.offcpu.clone(),
            lost_sched: t.lost_sched,
            lost_comm: t.lost_comm,
        },
        sinks,
    )?;
    eprintln!(
        "profiler: replayed {} into {}",
        file.display(),
        out.path().display()
    );
    Ok(())
}
