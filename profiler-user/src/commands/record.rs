//! `profiler record`: check inputs, attach (to a PID, or to a command it
//! launches, before its first instruction), collect until told to stop,
//! detach, then write every output. Anything that can be refused is refused
//! before a probe is attached.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::{
    analyze::cpu_fold,
    analyze::dispatch::{self},
    analyze::stages::StagesConfig,
    analyze::startup::StartupReport,
    attach::{
        calibrate::{self, HitCost},
        probes::{self, Probes, Tracking},
        rings::RingSpec,
        samplers, task_btf,
    },
    cli::RecordArgs,
    output::OutDir,
    output::{report::Session, writers},
    session::{
        collector::{self, StopReason},
        collector::{NoSteer, Steer},
        datafile, finish,
        follow::ExecProber,
        governor::Governor,
        pipeline,
        rings::Rings,
        status::Status,
    },
    symbolize::Symbolizer,
    target::{
        caps, find,
        launch::{self, Launched},
        libwatch::LibWatch,
        merge::Probed,
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

/// The hit cost the governor assumes when calibration fails: this kernel's
/// int3 cost as measured by `cargo xtask bench` (BENCHMARKS.md, part a).
const FALLBACK_COST: HitCost = HitCost {
    entry_ns: 5000.0,
    entry_push_ns: 1500.0,
    entry_nop_ns: 500.0,
    ret_site_ns: 5000.0,
    uretprobe_ns: 3000.0,
    // Durations are not corrected with guesses.
    inside_ns: [0.0; 6],
    inside_spread_pct: 0.0,
};

/// Checks option combinations that need launch mode or a running process.
fn check_mode(args: &RecordArgs) -> Result<()> {
    let launch = !args.command.is_empty();
    if launch && (!args.pid.is_empty() || !args.pid_of.is_empty()) {
        return Err(Error::Usage(
            "--pid and --pid-of attach to running processes, a command after -- is launched: give one or the other".into(),
        ));
    }
    if args.keep_running && args.stages.stages.is_empty() && args.stages.runs.is_some_and(|n| n > 1)
    {
        return Err(Error::Usage(
            "--keep-running leaves the command running, and --runs N launches it N times: give one or the other".into(),
        ));
    }
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

/// The processes named by `--pid` and `--pid-of`, first given first, each once.
fn target_pids(args: &RecordArgs) -> Result<Vec<u32>> {
    let mut pids = args.pid.clone();
    for name in &args.pid_of {
        let found = find::pids_named(name);
        if found.is_empty() {
            return Err(Error::Usage(if args.follow {
                format!(
                    "--follow --pid-of {name:?}: no running process is named {name:?}, so there is no tree to follow: start it first, or launch it with `profiler record --follow -- COMMAND`"
                )
            } else {
                format!(
                    "--pid-of {name:?}: no running process has that name (its comm or its executable's file name): check with `pgrep -l {name}`"
                )
            }));
        }
        pids.extend(found);
    }
    let mut seen = std::collections::HashSet::new();
    pids.retain(|p| seen.insert(*p));
    Ok(pids)
}

/// Runs `profiler record`. Returns the exit status to leave with: 0, or in
/// launch mode the command's. In launch mode with `--runs N` and no
/// `--stage`, the command is launched N times and the spread of its startup
/// times is reported.
pub fn run(args: &RecordArgs) -> Result<u8> {
    crate::heap::tune();
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
/// The default selection chosen from a short sample of the watched thread
/// ([`crate::session::presample`]), and how many stacks it saw; None when
/// the sample saw none of the main executable's functions.
fn presample_selection(
    target: &Target,
    args: &RecordArgs,
    required: &[select::Required],
) -> Result<Option<(select::Selection, u64)>> {
    let (tid, _) = target.resolve_thread(&args.dispatch.thread)?;
    let rows = crate::symbolize::budget::rows(args.unwind_memory, false, Some(target.pid));
    let seen = crate::session::presample::sample(target.pid, tid, rows)?;
    let maps = crate::target::process::read_maps(target.pid)
        .map_err(|e| Error::io("reading the target's mappings", e))?;
    let offsets =
        crate::session::presample::file_offsets(&seen, &maps, &target.exe.to_string_lossy());
    if offsets.is_empty() {
        return Ok(None);
    }
    let sel = select::select_among(target, &args.select, required, Some(&offsets))?;
    Ok(Some((sel, seen.stacks)).filter(|(s, _)| s.presampled.unwrap_or(0) > 0))
}

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
    let pids = if launch {
        Vec::new()
    } else {
        target_pids(args)?
    };
    // Several processes (or a tree): probes on every process mapping the
    // binaries, the kernel's map of traced processes deciding.
    let tracking = Tracking {
        mode: if args.follow {
            profiler_common::track::FOLLOW
        } else if pids.len() > 1 {
            profiler_common::track::MAP
        } else {
            profiler_common::track::ONE
        },
        offsets: match task_btf::task_offsets() {
            Ok(o) => Some(o),
            Err(e) if args.follow || pids.len() > 1 => return Err(e),
            // One target: only the count of its untraced children is lost.
            Err(_) => None,
        },
    };
    let (target, child) = if launch {
        let child = Launched::spawn(&args.command, args.keep_running)?;
        if child.follows {
            // A script or wrapper: the program it execs, stopped at its
            // first instruction, is what gets probed.
            child.follow(args.duration.map(|d| Instant::now() + d))?;
            let passed: Vec<String> = child
                .passed_through()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            eprintln!(
                "profiler: followed {} (PID {}) through its execs to {}{}",
                child.program.display(),
                child.pid,
                child.exe().display(),
                match passed.is_empty() {
                    true => String::new(),
                    false => format!(" (passing {})", passed.join(", ")),
                }
            );
        }
        (Target::launched(child.pid, child.exe())?, Some(child))
    } else {
        (Target::open(pids[0])?, None)
    };
    // A target that exits while we set up makes some step fail (no
    // mappings, perf_event_open: ESRCH...): say that it exited.
    let gone = |e: Error| match child.is_none() && !target.alive() {
        true => Error::TargetGone(target.pid),
        false => e,
    };
    let others = pids
        .iter()
        .skip(1)
        .map(|&pid| Target::open(pid))
        .collect::<Result<Vec<_>>>()?;
    let required = required(&stage_cfg.functions(), launch, args.stages.ready.as_deref());
    let mut sel = select::select(&target, &args.select, &required).map_err(gone)?;
    let mut probed_set = Probed::of(&sel);
    for other in &others {
        let more = select::select(other, &args.select, &[])?;
        probed_set.merge(&mut sel, more, args.select.max_funcs);
    }
    // Too many functions for --max-funcs, none named: by PID, probe those
    // the watched thread runs and waits in, seen in a short sample.
    if sel.capped > 0 && !launch && others.is_empty() && args.select.funcs.is_empty() {
        match presample_selection(&target, args, &required) {
            Ok(Some((chosen, stacks))) => {
                let of = chosen.funcs.len() + chosen.capped;
                let callers = match chosen.tail_callers {
                    0 => String::new(),
                    n => format!(", and {n} that tail-call them"),
                };
                eprintln!(
                    "profiler: probing the {} functions of {} on the watched thread's stacks{callers} \
                     ({stacks} stacks in a {} ms sample; {of} match the default selection); \
                     --func names others, --max-funcs {} caps them",
                    chosen.presampled.unwrap_or(0) - chosen.tail_callers,
                    target.exe.display(),
                    crate::session::presample::SPAN.as_millis(),
                    args.select.max_funcs
                );
                sel = chosen;
                probed_set = Probed::of(&sel);
            }
            Ok(None) => {}
            Err(e) => eprintln!(
                "profiler: warning: sampling the watched thread to choose functions failed ({}); \
                 probing the first {} in symbol order",
                crate::error::chain(&e),
                sel.funcs.len()
            ),
        }
    }
    if sel.capped > 0 && sel.presampled.is_none() {
        eprintln!(
            "profiler: probing the first {} of {} matching functions; raise --max-funcs to probe more \
             (each probed call costs the target about 4 µs, or 0.3 µs where a function starts with a \
             5-byte nop, and --max-overhead detaches the functions that cost too much; attaching or \
             detaching 1,000 functions takes about 30 ms), or narrow the selection with --func/--exclude",
            sel.funcs.len(),
            sel.funcs.len() + sel.capped
        );
    }
    // Stage functions resolve now, so a bad --stage fails before attaching.
    for spec in &stage_cfg.stages {
        spec.resolve(|name| pipeline::index_of(&sel.funcs, name))?;
    }
    let (watch_tid, mut watch_name) = target.resolve_thread(&args.dispatch.thread).map_err(gone)?;
    if let Some(c) = child.as_ref().filter(|c| c.pid == watch_tid) {
        // Not exec'd yet: named after the program, as the kernel will.
        watch_name = c.comm();
    }
    // No dispatch function: the watched thread's event-loop iterations,
    // bounded by its wait syscalls (one process; several keep, per
    // process, every outermost call).
    let wait_loop = sel.dispatch_fallback && !tracking.by_map();
    if sel.dispatch_fallback && tracking.by_map() {
        sel.dispatch_rule = select::FALLBACK_RULE_PER_PROCESS.to_string();
    }
    probes::raise_fd_limit();
    let unwind = match args.unwind {
        crate::cli::UnwindMode::Copy => return Err(Error::Usage(
            "--unwind copy is for `profiler sample --pid`; record walks stacks with tables or fp"
                .into(),
        )),
        u => u,
    };
    // A launched command has not exec'd its program yet: the machine's
    // ceiling; a running process: what its binaries need.
    let table_rows =
        crate::symbolize::budget::rows(args.unwind_memory, false, (!launch).then_some(target.pid));
    let mut probes = Probes::load(
        target.pid,
        probes::Watch {
            tid: watch_tid,
            wakers: !args.dispatch.no_wakers,
            wait_loop,
        },
        RingSpec {
            mode: args.rings,
            size: args.ring_size,
        },
        false,
        (unwind, table_rows),
        tracking,
    )
    .map_err(gone)?;
    let all_pids: Vec<u32> = std::iter::once(target.pid)
        .chain(others.iter().map(|t| t.pid))
        .collect();
    if tracking.by_map() {
        probes.trace(&all_pids)?;
    }
    probes.attach_process_events(tracking)?;
    let mut tables = match unwind {
        crate::cli::UnwindMode::Tables => {
            let mut t = crate::symbolize::tables::Tables::take(probes.ebpf_mut(), table_rows)?;
            t.add_process(target.pid);
            Some(t)
        }
        _ => None,
    };
    // The overhead governor (default 10% with --pid, off in launch mode)
    // needs the cost of one probe hit here, measured before the target is
    // probed.
    // Probing exec'd programs and detaching hot functions both change the
    // probes while the session runs; with several processes only the first
    // is done for now.
    if tracking.by_map() && args.max_overhead.is_some_and(|p| p > 0.0) {
        return Err(Error::Usage(
            "--max-overhead does not work with --follow or several targets yet: drop it (the governor is off for them)".into(),
        ));
    }
    let max_overhead = match tracking.by_map() {
        true => 0.0,
        false => args.max_overhead.unwrap_or(if launch { 0.0 } else { 10.0 }),
    };
    // The cost of one probe hit here, measured before the target is
    // probed: for the governor, and to take the probes' own cost out of
    // the durations.
    let calibrated = match max_overhead > 0.0 || !args.raw_durations {
        true => Some(calibrate::calibrate()),
        false => None,
    };
    let hit_cost = (max_overhead > 0.0).then(|| match &calibrated {
        Some(Ok(c)) => *c,
        Some(Err(e)) => {
            eprintln!(
                "profiler: warning: {}; the overhead governor assumes {} µs per probe hit, and durations keep the probes' cost",
                crate::error::chain(e),
                FALLBACK_COST.entry_ns / 1000.0
            );
            FALLBACK_COST
        }
        None => FALLBACK_COST,
    });
    let cost_spread_pct = match &calibrated {
        Some(Ok(c)) if !args.raw_durations => Some(c.inside_spread_pct),
        _ => None,
    };
    match &calibrated {
        Some(Ok(c)) if !args.raw_durations => calibrate::set_costs(&mut sel, c),
        Some(Err(e)) if max_overhead <= 0.0 => eprintln!(
            "profiler: warning: {}; durations keep the probes' own cost",
            crate::error::chain(e)
        ),
        _ => {}
    }
    // The kernel may take most of a second to load the in-dispatch
    // samplers and the programs that watch the loop's waits: loaded now,
    // so that they and the functions' probes go on together below.
    probes
        .prepare_watch(args.dispatch.dispatch_hz)
        .map_err(gone)?;
    // The session starts before the first probe that reports events goes
    // on: every time in the outputs counts from here, so none is earlier.
    let started = Instant::now();
    let session_start_ns = crate::clock::monotonic_ns();
    let mut rings = Rings::new(probes.take_rings())?;
    let counters = probes.take_counters()?;
    probes
        .attach_watch(args.dispatch.dispatch_hz)
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
    let scope = if tracking.by_map() { 0 } else { target.pid };
    let probed = probes.attach(&sel, scope).map_err(gone)?;
    if child.is_none() && !target.alive() {
        return Err(Error::TargetGone(target.pid));
    }
    for line in probes.refused_summary() {
        eprintln!("{line}");
    }
    let mut what = match &child {
        Some(c) if c.follows => format!(
            "{} (PID {}, launched as {})",
            c.exe().display(),
            c.pid,
            c.program.display()
        ),
        Some(c) => format!("{} (PID {}, launched)", c.program.display(), c.pid),
        None if others.is_empty() => format!("PID {}", target.pid),
        None => format!(
            "PIDs {}",
            all_pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if args.follow {
        what.push_str(" and the processes they make (--follow)");
    }
    // Printed by the collector once it handles SIGINT and SIGTERM, so a
    // Ctrl-C right after it always ends the session cleanly.
    let attached = format!(
        "profiler: attached {probed} functions ({} probes) to {what} in {} ms ({}); stop with Ctrl-C",
        sel.probe_count(),
        probes.attach_ms,
        probes.attach_kind()
    );

    if let Some(c) = &hit_cost {
        eprintln!(
            "profiler: overhead governor: a probe hit costs {:.1} µs here ({:.1} µs on a push, \
             {:.2} µs on a 5-byte nop, {:.1} µs at a return site, {:.1} µs a return uprobe); functions are detached when a thread spends over {max_overhead}% \
             of its CPU time in probes (--max-overhead; 0 turns this off)",
            c.entry_ns / 1000.0,
            c.entry_push_ns / 1000.0,
            c.entry_nop_ns / 1000.0,
            c.ret_site_ns / 1000.0,
            c.uretprobe_ns / 1000.0,
        );
    }
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
            wakers: !d.no_wakers,
            wait_loop,
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
    if wait_loop {
        sinks.loop_sp = Some(probes.loop_sp()?);
        // Blocked in a wait now: most likely idle in its loop, the first
        // guess of which wait is the loop's.
        let blocked = process::thread_syscall(target.pid, watch_tid);
        if let (Some((nr, args, sp)), Some(d)) = (blocked, &mut sinks.dispatch) {
            let getevents = args[3] & profiler_common::wait::IORING_ENTER_GETEVENTS != 0;
            let io_uring = nr as u32 == profiler_common::wait::NR_IO_URING_ENTER;
            if profiler_common::wait::is_wait(nr) && (!io_uring || getevents) {
                d.loop_wait.at_attach(
                    nr as u32,
                    args[0].min(profiler_common::wait::FD_MAX) as u32,
                    sp,
                );
            }
        }
    }
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
    let targets: Vec<datafile::TargetInfo> = match tracking.by_map() {
        false => Vec::new(),
        true => std::iter::once(&target)
            .chain(others.iter())
            .map(|t| datafile::TargetInfo {
                pid: t.pid,
                ppid: match &child {
                    Some(_) => std::process::id(),
                    None => find::parent_of(t.pid),
                },
                exe: t.exe.display().to_string(),
                start_ns: session_start_ns,
            })
            .collect(),
    };
    if tracking.by_map() {
        sinks.processes = Some(pipeline::processes(
            &sel.funcs,
            crate::analyze::processes::DispatchRule {
                threshold_ns: d.threshold.as_nanos() as u64,
                frame_interval_ns: d.frame_interval.as_nanos() as u64,
            },
            targets
                .iter()
                .map(|t| (t.pid, t.ppid, t.exe.clone(), t.start_ns)),
        ));
    } else {
        // One target: its exec ends the session (the probes are its
        // program's); with several, each exec is followed.
        sinks.exe = std::fs::canonicalize(&target.exe)
            .ok()
            .or_else(|| Some(target.exe.clone()));
    }
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
            funcs: sel.funcs.iter().map(datafile::FuncInfo::of).collect(),
            dispatch_rule: sel.dispatch_rule.clone(),
            dispatch_fallback: sel.dispatch_fallback,
            wait_loop,
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
            no_wakers: args.dispatch.no_wakers,
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
            processes: targets.clone(),
            follow: args.follow,
            cost_spread_pct,
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
    let protected: Vec<bool> = sel
        .funcs
        .iter()
        .map(|f| required.iter().any(|r| r.name == f.name))
        .collect();
    if hit_cost.is_some() {
        sinks.hits = vec![0; sel.funcs.len()];
        sinks.dedup = Some(Default::default());
    }
    let failed_probes = probes.failed.len();
    let mut status = Status::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let mut steer = match hit_cost {
        Some(cost) => Steering::Govern(Box::new(Governor::new(
            &mut probes,
            &sel,
            target.pid,
            max_overhead,
            cost,
            &protected,
            session_start_ns,
        ))),
        None if tracking.by_map() => Steering::Follow(ExecProber {
            probes: &mut probes,
            sel: &mut sel,
            probed: probed_set,
            args: crate::cli::SelectArgs {
                libs: Vec::new(),
                dispatch: Vec::new(),
                ..args.select.clone()
            },
        }),
        None => Steering::Neither(NoSteer),
    };
    if child.is_some() {
        launch::watch_stop_signals();
    }
    let collected = rt.block_on(collector::collect(
        &mut rings,
        &mut sinks,
        &target.pidfd,
        args.duration,
        collector::Live {
            counters: &counters,
            status: &mut status,
            attached: &attached,
        },
        steer.as_mut(),
    ));
    // A failure from here on (the target exiting while the governor
    // rebuilds its probes, a ring that cannot be polled) ends the session,
    // never the recording: every output is still written.
    let (reason, failure) = match collected {
        Ok(reason) => (reason, None),
        Err(e) if matches!(e, Error::TargetGone(_)) || target.exits_within(LATE_EXIT_WAIT) => {
            status.finish();
            eprintln!(
                "profiler: PID {} exited while the session was changing its probes ({})",
                target.pid,
                crate::error::chain(&e)
            );
            (StopReason::TargetExited, None)
        }
        Err(e) => {
            status.finish();
            eprintln!(
                "profiler: the session stopped early: {}; writing the outputs",
                crate::error::chain(&e)
            );
            (StopReason::Failed, Some(e))
        }
    };
    let governed = steer.governed();
    let duration_ns = started.elapsed().as_nanos() as u64;
    // Detach first, so the target runs unprobed while we finish up; then
    // take what was still in flight.
    if target.alive() {
        sinks.libs.poll();
    }
    drop(probes);
    sinks.flush(&mut rings);
    if rings.late() > 0 {
        eprintln!(
            "profiler: warning: {} events reached the agent more than {} ms after they happened; the order of their threads' events may be off",
            rings.late(),
            crate::session::merge::SLACK_NS / 1_000_000
        );
    }
    let never_mapped = never_mapped(&sinks.libs, &sel, &sinks.stacks.funcs, target.pid);
    for line in &never_mapped {
        eprintln!("profiler: {line}");
    }
    if args.sample.is_none() {
        // Without --sample, cpu.txt is not there to say it (with it, the
        // warning comes with the CPU profile, with shares).
        if let Some(line) = sinks.tables.as_ref().and_then(|t| t.starved_note()) {
            eprintln!("profiler: warning: {line}");
        }
    }
    let counters_now = counters.read();
    status.finish();
    match reason {
        StopReason::TargetExited => eprintln!("profiler: PID {} exited; writing the outputs", target.pid),
        StopReason::RunsComplete => eprintln!("profiler: every scenario has its runs; probes detached"),
        StopReason::AllExited => eprintln!("profiler: every traced process exited; writing the outputs"),
        StopReason::TargetExeced => eprintln!(
            "profiler: PID {} exec'd another program, which the probes do not cover; writing the outputs",
            target.pid
        ),
        _ => {}
    }
    // The session ended before the command did: it is stopped (its probes
    // are gone already), or with --keep-running left running.
    let mut kept = false;
    let mut stopped_at_duration = false;
    if let Some(c) = &child {
        let terminal = reason == StopReason::Signal(libc::SIGINT) && launch::sigint_from_terminal();
        let ends = matches!(reason, StopReason::Duration | StopReason::Signal(_));
        if ends && c.try_wait()?.is_none() {
            if args.keep_running {
                eprintln!(
                    "profiler: left {} running, every probe removed (--keep-running){}",
                    c.describe(),
                    match terminal {
                        true => "; it got the terminal's SIGINT too",
                        false => "",
                    }
                );
                kept = true;
            } else {
                let first = match reason {
                    // Ctrl-C on a terminal reached the command directly
                    // (same process group).
                    StopReason::Signal(libc::SIGINT) if terminal => None,
                    StopReason::Signal(sig) => Some(sig),
                    _ => Some(libc::SIGTERM),
                };
                c.stop(first, launch::STOP_GRACE)?;
                stopped_at_duration = reason == StopReason::Duration;
            }
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
        offcpu = cpu_fold::collect_offcpu(maps, sym);
        cpu = args.sample.map(|hz| {
            let placement = sinks.tables.as_ref().map(|t| t.placement());
            let mut prof = cpu_fold::collect(maps, sym, placement);
            prof.unwinding = sinks.tables.as_ref().map(|t| t.stats.clone());
            for note in crate::output::writers::unwind_notes(&prof).warnings {
                eprintln!("profiler: warning: {note}");
            }
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
        untraced_children: counters_now.untraced_children,
        follow: args.follow,
        governor: governed.clone(),
        cost_spread_pct,
    };
    if counters_now.traced_full + counters_now.lost_proc > 0 {
        eprintln!(
            "profiler: warning: {} child processes were not followed (the map of traced processes was full) and {} process events were lost (ring full)",
            counters_now.traced_full, counters_now.lost_proc
        );
    }
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
            untraced_children: counters_now.untraced_children,
            governor: governed,
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
    if let Some(e) = failure {
        return Err(e);
    }
    match child {
        // Still running on purpose, or stopped because the recording was
        // as long as asked: the session succeeded.
        Some(_) if kept || stopped_at_duration => Ok((0, startup_report)),
        Some(c) => {
            if c.try_wait()?.is_none() {
                eprintln!("profiler: waiting for {} to exit", c.describe());
            }
            Ok((
                launch::exit_code(c.wait()?).clamp(0, 255) as u8,
                startup_report,
            ))
        }
        None => Ok((0, None)),
    }
}

/// How long a late failure waits for the target's exit to complete before
/// calling the failure an error: an exiting process loses its memory
/// (and `/proc/PID/exe`) before its last thread is gone.
const LATE_EXIT_WAIT: Duration = Duration::from_millis(500);

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

/// What the session does to its probes while it runs (one of them: both
/// change the probes).
enum Steering<'a> {
    /// The overhead governor detaches hot functions.
    Govern(Box<Governor<'a>>),
    /// New programs of traced processes are probed after an exec.
    Follow(ExecProber<'a>),
    Neither(NoSteer),
}

impl Steering<'_> {
    fn as_mut(&mut self) -> &mut dyn Steer {
        match self {
            Steering::Govern(g) => g.as_mut(),
            Steering::Follow(p) => p,
            Steering::Neither(n) => n,
        }
    }

    /// What the governor did, if it ran.
    fn governed(self) -> Option<crate::analyze::overhead::GovernorReport> {
        match self {
            Steering::Govern(g) => Some(g.report),
            _ => None,
        }
    }
}
