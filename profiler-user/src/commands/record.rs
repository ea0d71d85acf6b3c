//! `profiler record`: check inputs, attach (to a PID, or to a command it
//! launches, before its first instruction), collect until told to stop,
//! detach, then write every output. Anything that can be refused is refused
//! before a probe is attached.
use std::{collections::HashMap, time::Instant};

use crate::{
    analyze::cpu_profile,
    analyze::dispatch::{self},
    analyze::stages::StagesConfig,
    analyze::startup::StartupReport,
    attach::{
        probes::{self, Probes},
        samplers,
    },
    cli::RecordArgs,
    output::OutDir,
    output::{report::Session, writers},
    session::{
        collector::{self, StopReason},
        datafile, finish, pipeline,
        status::Status,
    },
    symbolize::Symbolizer,
    target::{
        caps,
        launch::{self, Launched},
        libwatch::LibWatch,
        process::{self, Target},
        select::{self, Required, Selection},
    },
    Error, Result,
};

/// The functions the session needs probed besides `--func`: stage triggers
/// (must exist), and in launch mode `main` (if present) and `--ready`.
pub fn required(stage_funcs: &[&str], launch: bool, ready: Option<&str>) -> Vec<Required> {
    let mut req: Vec<Required> = stage_funcs
        .iter()
        .map(|f| Required {
            name: f.to_string(),
            must: true,
            why: "--stage".into(),
        })
        .collect();
    if launch {
        req.push(Required {
            name: "main".into(),
            must: false,
            why: "startup timing".into(),
        });
        if let Some(r) = ready {
            req.push(Required {
                name: r.to_string(),
                must: true,
                why: "--ready".into(),
            });
        }
    }
    req
}

/// Checks option combinations that need launch mode or a running process.
fn check_mode(args: &RecordArgs) -> Result<()> {
    let launch = !args.command.is_empty();
    if !launch && (args.stages.ready.is_some() || args.stages.startup_threshold.is_some()) {
        return Err(Error::Usage(
            "--ready and --startup-threshold time a launch: use `profiler record [options] -- COMMAND`".into(),
        ));
    }
    Ok(())
}

/// One line for each `--lib` the target never mapped while recording (not
/// seen in its maps, checked every 0.1 s, and none of its probes fired).
fn never_mapped(
    libs: &LibWatch,
    sel: &Selection,
    stats: &[crate::analyze::stacks::FuncStats],
    pid: u32,
) -> Vec<String> {
    libs.libs
        .iter()
        .filter(|l| !l.seen)
        .filter_map(|l| {
            let mine: Vec<usize> = (0..sel.funcs.len())
                .filter(|&i| sel.funcs[i].binary == l.binary)
                .collect();
            let calls: u64 = mine.iter().map(|&i| stats[i].calls).sum();
            let probes: usize = mine.iter().map(|&i| sel.funcs[i].exit.probes()).sum();
            (calls == 0).then(|| {
                format!(
                    "{}: never seen mapped by PID {pid} (its maps read every 0.1 s and at the end); its {probes} probes saw nothing",
                    l.path.display()
                )
            })
        })
        .collect()
}

/// Runs `profiler record`. Returns the exit status to leave with: 0, or in
/// launch mode the command's. In launch mode with `--runs N` and no
/// `--stage`, the command is launched N times and the spread of its startup
/// times is reported.
pub fn run(args: &RecordArgs) -> Result<u8> {
    let launches = match (
        args.command.is_empty(),
        args.stages.stages.is_empty(),
        args.stages.runs,
    ) {
        (false, true, Some(n)) if n > 1 => n,
        _ => return record_once(args, None).map(|(code, _)| code),
    };
    let mut reports = Vec::new();
    let mut code = 0;
    for i in 0..launches {
        eprintln!("profiler: launch {} of {launches}", i + 1);
        let (c, report) = record_once(args, Some(i))?;
        code = c;
        reports.extend(report);
    }
    let summary = crate::analyze::startup::StartupSummary::of(&reports);
    let ready_what = args
        .stages
        .ready
        .as_ref()
        .map_or("first dispatch".to_string(), |f| format!("entry of {f}"));
    let text = summary.render_text(&ready_what);
    let out = OutDir::prepare(&args.out, writers::RECORD_FILES)?;
    out.write("startup.txt", text.as_bytes())?;
    out.write("startup.json", summary.render_json().as_bytes())?;
    print!("\nOver {launches} launches (startup.txt; the other outputs are the last launch's):\n{text}");
    Ok(code)
}

/// One recording session (one launch in launch mode). Returns the exit
/// status and, in launch mode, the startup report.
fn record_once(args: &RecordArgs, launch_no: Option<usize>) -> Result<(u8, Option<StartupReport>)> {
    select::compile(&args.select)?;
    let stage_runs = if launch_no.is_some() {
        None
    } else {
        args.stages.runs
    };
    let stage_cfg = StagesConfig::parse(&args.stages.stages, &args.stages.scenarios, stage_runs)?;
    check_mode(args)?;
    caps::check()?;
    let launch = !args.command.is_empty();
    let out = OutDir::prepare(&args.out, writers::RECORD_FILES)?;
    let (target, child) = if launch {
        let child = Launched::spawn(&args.command)?;
        (
            Target::launched(child.pid, child.program.clone())?,
            Some(child),
        )
    } else {
        (
            Target::open(args.pid.expect("clap requires --pid or a command"))?,
            None,
        )
    };
    // A target that exits while we set up makes some step fail (no
    // mappings, perf_event_open: ESRCH...): say that it exited.
    let gone = |e: Error| match child.is_none() && !target.alive() {
        true => Error::TargetGone(target.pid),
        false => e,
    };
    let required = required(&stage_cfg.functions(), launch, args.stages.ready.as_deref());
    let sel = select::select(&target, &args.select, &required).map_err(gone)?;
    if sel.capped > 0 {
        eprintln!(
            "profiler: probing the first {} of {} matching functions; raise --max-funcs to probe more \
             (each probed call costs about 4 µs, or 0.3 µs where a function starts with a 5-byte nop), \
             or narrow the selection with --func/--exclude",
            sel.funcs.len(),
            sel.funcs.len() + sel.capped
        );
    }
    // Stage functions resolve now, so a bad --stage fails before attaching.
    for spec in &stage_cfg.stages {
        spec.resolve(|name| pipeline::index_of(&sel.funcs, name))?;
    }
    let (watch_tid, watch_name) = target.resolve_thread(&args.dispatch.thread).map_err(gone)?;
    probes::raise_fd_limit();
    let unwind = match args.unwind {
        crate::cli::UnwindMode::Copy => return Err(Error::Usage(
            "--unwind copy is for `profiler sample --pid`; record walks stacks with tables or fp"
                .into(),
        )),
        u => u,
    };
    let mut probes =
        Probes::load(target.pid, watch_tid, args.ring_size, false, unwind).map_err(gone)?;
    let mut tables = match unwind {
        crate::cli::UnwindMode::Tables => {
            let mut t = crate::symbolize::tables::Tables::take(
                probes.ebpf_mut(),
                crate::symbolize::tables::capacity(false),
            )?;
            t.add_process(target.pid);
            Some(t)
        }
        _ => None,
    };
    let mut ring = probes.take_ring()?;
    let counters = probes.take_counters()?;
    probes
        .attach_watch(watch_tid, args.dispatch.dispatch_hz)
        .map_err(gone)?;
    if let Some(hz) = args.sample {
        samplers::start(probes.ebpf_mut(), hz).map_err(gone)?;
    }
    if args.off_cpu {
        samplers::start_offcpu(probes.ebpf_mut()).map_err(gone)?;
    }
    let cpu_maps = match args.sample.is_some() || args.off_cpu {
        true => Some(samplers::CpuMaps::take(probes.ebpf_mut(), args.off_cpu)?),
        false => None,
    };
    let probed = probes.attach(&sel, target.pid).map_err(gone)?;
    if child.is_none() && !target.alive() {
        return Err(Error::TargetGone(target.pid));
    }
    for (func, reason) in probes.failed.iter().take(3) {
        eprintln!("profiler: warning: could not probe {func}: {reason}");
    }
    let what = match &child {
        Some(c) => format!("{} (PID {}, launched)", c.program.display(), c.pid),
        None => format!("PID {}", target.pid),
    };
    eprintln!(
        "profiler: attached {probed} functions ({} probes) to {what} in {} ms ({}); stop with Ctrl-C",
        sel.probe_count(),
        probes.attach_ms,
        probes.attach_kind()
    );

    let started = Instant::now();
    let session_start_ns = crate::clock::monotonic_ns();
    let mut exec_ns = 0;
    if let Some(c) = &child {
        c.release()?;
        exec_ns = c.exec_time_ns().unwrap_or(session_start_ns);
    }
    let d = &args.dispatch;
    let exe = target.exe.display().to_string();
    let mut sinks = pipeline::build(pipeline::Config {
        out: &out,
        pid: target.pid,
        exe: &exe,
        funcs: &sel.funcs,
        dispatch: dispatch::Config {
            tid: watch_tid,
            thread_name: watch_name,
            rule: sel.dispatch_rule.clone(),
            threshold_ns: d.threshold.as_nanos() as u64,
            hang_ns: d.hang.as_nanos() as u64,
            frame_interval_ns: d.frame_interval.as_nanos() as u64,
            full_tree: d.full_tree,
            sample_period_ns: 1_000_000_000u64.checked_div(d.dispatch_hz).unwrap_or(0),
        },
        session_start_ns,
        trace_events: args.trace_events,
        stages: &stage_cfg,
        startup: child
            .as_ref()
            .map(|_| (exec_ns, args.stages.ready.as_deref())),
        dispatch_fallback: sel.dispatch_fallback,
    })?;
    sinks.cpu = cpu_maps.map(|m| (m, Symbolizer::new(target.pid)));
    sinks.tables = tables.take();
    sinks.libs = LibWatch::new(
        target.pid,
        sel.binaries
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.unmapped.map(|id| (i as u32, b.path.clone(), id))),
    );
    for l in &sinks.libs.libs {
        eprintln!(
            "profiler: {} is not mapped by PID {} yet: its probes fire once it is",
            l.path.display(),
            target.pid
        );
    }
    sinks.stop_when_runs_done = !args.stages.keep_going;
    sinks.exe = std::fs::canonicalize(&target.exe)
        .ok()
        .or_else(|| Some(target.exe.clone()));
    let start_unix_ns = crate::output::export::unix_ns_ago(0);
    if args.data_limit > 0 {
        let header = datafile::Header {
            pid: target.pid,
            exe: target.exe.display().to_string(),
            binaries: sel
                .binaries
                .iter()
                .map(|b| b.path.display().to_string())
                .collect(),
            funcs: sel
                .funcs
                .iter()
                .map(|f| datafile::FuncInfo {
                    name: f.name.clone(),
                    binary: f.binary,
                    offset: f.offset,
                    dispatch: f.dispatch,
                    exit: f.exit.kind().into(),
                })
                .collect(),
            dispatch_rule: sel.dispatch_rule.clone(),
            dispatch_fallback: sel.dispatch_fallback,
            exit_rule: sel.exit_rule.clone(),
            watch_tid,
            watch_name: sinks
                .dispatch
                .as_ref()
                .map(|d| d.cfg.thread_name.clone())
                .unwrap_or_default(),
            session_start_ns,
            start_unix_ns,
            dispatch_hz: args.dispatch.dispatch_hz,
            exec_ns: child.as_ref().map(|_| exec_ns),
            launch: child.is_some(),
            stages: args.stages.stages.clone(),
            scenarios: args.stages.scenarios.clone(),
            runs: if launch_no.is_some() {
                None
            } else {
                args.stages.runs
            },
            ready: args.stages.ready.clone(),
            startup_threshold_ns: args.stages.startup_threshold.map(|d| d.as_nanos() as u64),
            threshold_ns: args.dispatch.threshold.as_nanos() as u64,
            hang_ns: args.dispatch.hang.as_nanos() as u64,
            frame_interval_ns: args.dispatch.frame_interval.as_nanos() as u64,
            full_tree: args.dispatch.full_tree,
            trace_events: args.trace_events,
        };
        let file = out.create("profile.data")?;
        sinks.data = Some(
            datafile::DataWriter::create(file, &header, args.data_limit).map_err(|e| {
                Error::Output {
                    path: out.path().join("profile.data"),
                    reason: e.to_string(),
                }
            })?,
        );
    }
    let mut status = Status::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let reason = rt.block_on(collector::collect(
        &mut ring,
        &mut sinks,
        &target.pidfd,
        args.duration,
        &counters,
        &mut status,
    ))?;
    let duration_ns = started.elapsed().as_nanos() as u64;
    // Detach first, so the target runs unprobed while we finish up; then
    // take what was still in flight.
    let failed_probes = probes.failed.len();
    if target.alive() {
        sinks.libs.poll();
    }
    drop(probes);
    sinks.drain(&mut ring);
    let never_mapped = never_mapped(&sinks.libs, &sel, &sinks.stacks.funcs, target.pid);
    for line in &never_mapped {
        eprintln!("profiler: {line}");
    }
    let counters_now = counters.read();
    status.finish();
    match reason {
        StopReason::TargetExited => eprintln!("profiler: PID {} exited; writing the outputs", target.pid),
        StopReason::RunsComplete => eprintln!("profiler: every scenario has its runs; probes detached"),
        StopReason::TargetExeced => eprintln!(
            "profiler: PID {} exec'd another program, which the probes do not cover; writing the outputs",
            target.pid
        ),
        _ => {}
    }
    if let (Some(c), StopReason::Signal(sig)) = (&child, reason) {
        // Ctrl-C on a terminal reaches the command directly (same process
        // group); anything else is passed on.
        if sig != libc::SIGINT {
            let _ = c.forward_signal(sig);
        }
    }
    // Everything is drained: fold the threads that have exited.
    sinks.reap(true);
    let thread_names: HashMap<u32, String> = sinks
        .stacks
        .threads()
        .filter_map(|t| {
            let live = (t.exited_threads == 0)
                .then(|| process::thread_name(target.pid, t.tid))
                .flatten();
            live.or_else(|| t.name.clone()).map(|n| (t.tid, n))
        })
        .collect();
    let (mut cpu, mut offcpu) = (None, None);
    if let Some((maps, sym)) = &mut sinks.cpu {
        offcpu = cpu_profile::collect_offcpu(maps, sym);
        cpu = args.sample.map(|hz| {
            let mut prof = cpu_profile::collect(maps, sym);
            prof.lost = (counters_now.cpu_stack_lost, counters_now.cpu_counts_full, 0);
            prof.unwinding = sinks.tables.as_ref().map(|t| t.stats.clone());
            (hz, prof)
        });
    }
    let session = Session {
        pid: target.pid,
        exe: target.exe.display().to_string(),
        duration_ns,
        stop_reason: reason.as_str().to_string(),
        functions_probed: probed,
        lost_events: counters_now.lost,
        capped: sel.capped,
        failed_probes,
        start_unix_ns,
        exit_rule: sel.exit_rule.clone(),
        never_mapped: never_mapped.clone(),
        damage: None,
    };
    let mut data_result = Ok(());
    if let Some(data) = sinks.data.take() {
        let mut names: Vec<(u32, String)> =
            thread_names.iter().map(|(t, n)| (*t, n.clone())).collect();
        names.sort();
        let trailer = datafile::Trailer {
            duration_ns,
            stop_reason: session.stop_reason.clone(),
            functions_probed: probed,
            lost_events: counters_now.lost,
            lost_sched: counters_now.lost_sched,
            lost_comm: counters_now.lost_comm,
            capped: sel.capped,
            failed_probes,
            thread_names: names,
            symbols: sinks
                .dispatch
                .as_ref()
                .map(|d| d.symbol_journal())
                .unwrap_or_default(),
            cpu: cpu.clone(),
            offcpu: offcpu.clone(),
            complete: true,
            never_mapped,
            totals: None,
        };
        // A failure (a full disk) is told after the other outputs, so the
        // summary of what was recorded is still printed.
        data_result = match data.finish(&trailer) {
            Ok(w) => {
                print_data_line(&w, duration_ns);
                Ok(())
            }
            Err(e) => Err(Error::Output {
                path: out.path().join("profile.data"),
                reason: e.to_string(),
            }),
        };
    }
    let written = finish::write(
        finish::Finish {
            out: &out,
            funcs: &sel.funcs,
            binaries: &sel.binaries,
            session,
            thread_names,
            dispatch_fallback: sel.dispatch_fallback,
            ready: args.stages.ready.clone(),
            startup_threshold_ns: args.stages.startup_threshold.map(|d| d.as_nanos() as u64),
            exec_ns,
            trace_events: args.trace_events,
            cpu,
            offcpu,
            lost_sched: counters_now.lost_sched,
            lost_comm: counters_now.lost_comm,
        },
        sinks,
    );
    data_result?;
    let startup_report = written?;
    if child.is_some() {
        // Launch mode asked JIT runtimes for perf maps (launch.rs): say
        // whether the command's runtime wrote one.
        let map = format!("/tmp/perf-{}.map", target.pid);
        let exe = target.exe.file_name().unwrap_or_default().to_string_lossy();
        if std::path::Path::new(&map).exists() {
            eprintln!("profiler: {exe} wrote a JIT perf map ({map}): its JIT frames are named");
        } else if exe.starts_with("python") || exe.starts_with("node") {
            eprintln!(
                "profiler: {exe} wrote no JIT perf map (CPython needs 3.12+ for PYTHONPERFSUPPORT); \
                 its JIT frames stay unnamed"
            );
        }
    }
    eprintln!("profiler: wrote the outputs to {}", out.path().display());
    match child {
        Some(c) => {
            if c.try_wait()?.is_none() {
                eprintln!("profiler: waiting for PID {} to exit", c.pid);
            }
            Ok((
                launch::exit_code(c.wait()?).clamp(0, 255) as u8,
                startup_report,
            ))
        }
        None => Ok((0, None)),
    }
}

/// One line on what `profile.data` took (the bench reads it).
fn print_data_line(w: &datafile::Written, duration_ns: u64) {
    let t = &w.totals;
    let per = |bytes: u64| bytes as f64 / t.records.max(1) as f64;
    eprintln!(
        "profiler: profile.data: {} bytes for {} records ({} entry/exit events) in {} blocks, \
         {:.2} bytes per record (format 2: {:.2}); its writing thread used {:.3} s of CPU in {:.3} s",
        w.bytes,
        t.records,
        t.events,
        t.blocks,
        per(w.bytes),
        per(t.format2_bytes),
        w.cpu_ns as f64 / 1e9,
        duration_ns as f64 / 1e9,
    );
}
