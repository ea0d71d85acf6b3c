//! `profiler record`: check inputs, attach, collect until told to stop,
//! detach, then write every output. Anything that can be refused is refused
//! before a probe is attached.
use std::{collections::HashMap, time::Instant};

use crate::{
    caps,
    cli::{ListArgs, RecordArgs},
    collector, cpuprof,
    dispatch::{self, Dispatcher},
    output::OutDir,
    probes::{self, Probes},
    report::{self, Report, Session},
    select,
    stacks::Stacks,
    status::Status,
    symbolize::Symbolizer,
    target::{self, Target},
    timeline::Timeline,
    Error, Result,
};

/// Files `record` writes.
pub const OUTPUT_FILES: &[&str] = &[
    "report.txt",
    "functions.json",
    "trace.folded",
    "flamegraph.svg",
];

/// Runs `profiler record`.
pub fn record(args: &RecordArgs) -> Result<()> {
    select::compile(&args.select)?;
    caps::check()?;
    let target = Target::open(args.target.pid)?;
    let out = OutDir::prepare(&args.out, OUTPUT_FILES)?;
    let sel = select::select(&target, &args.select)?;
    if sel.capped > 0 {
        eprintln!(
            "profiler: probing the first {} of {} matching functions; raise --max-funcs to probe more \
             (each probed call costs about 4 µs, or 0.3 µs where a function starts with a 5-byte nop), \
             or narrow the selection with --func/--exclude",
            sel.funcs.len(),
            sel.funcs.len() + sel.capped
        );
    }
    let (watch_tid, watch_name) = target.resolve_thread(&args.dispatch.thread)?;
    probes::raise_fd_limit();
    let mut probes = Probes::load(target.pid, watch_tid, args.ring_size, false)?;
    let mut ring = probes.take_ring()?;
    let counters = probes.take_counters()?;
    probes.attach_watch(watch_tid, args.dispatch.dispatch_hz)?;
    let cpu_maps = match args.sample {
        Some(hz) => {
            cpuprof::start(probes.ebpf_mut(), hz)?;
            Some(cpuprof::CpuMaps::take(probes.ebpf_mut())?)
        }
        None => None,
    };
    let probed = probes.attach(&sel, target.pid)?;
    if !target.alive() {
        return Err(Error::TargetGone(target.pid));
    }
    for (func, reason) in probes.failed.iter().take(3) {
        eprintln!("profiler: warning: could not probe {func}: {reason}");
    }
    eprintln!(
        "profiler: attached {probed} functions ({} probes) to PID {} in {} ms; stop with Ctrl-C",
        probed * 2,
        target.pid,
        probes.attach_ms
    );

    let started = Instant::now();
    let session_start_ns = collector::monotonic_ns();
    let d = &args.dispatch;
    let dispatcher = Dispatcher::new(
        dispatch::Config {
            tid: watch_tid,
            thread_name: watch_name,
            rule: sel.dispatch_rule.clone(),
            threshold_ns: d.threshold.as_nanos() as u64,
            hang_ns: d.hang.as_nanos() as u64,
            frame_interval_ns: d.frame_interval.as_nanos() as u64,
            full_tree: d.full_tree,
            sample_period_ns: 1_000_000_000u64.checked_div(d.dispatch_hz).unwrap_or(0),
            hang_log: Some(out.path().join("hangs.log")),
        },
        target.pid,
        sel.funcs.iter().map(|f| f.name.clone()).collect(),
        sel.funcs.iter().map(|f| f.dispatch).collect(),
        session_start_ns,
    );
    let timeline = match args.trace_events {
        0 => None,
        limit => Some(
            Timeline::create(
                out.create("trace.json")?,
                target.pid,
                &target.exe.display().to_string(),
                session_start_ns,
                sel.funcs.iter().map(|f| f.name.clone()).collect(),
                limit,
            )
            .map_err(|e| Error::Output {
                path: out.path().join("trace.json"),
                reason: e.to_string(),
            })?,
        ),
    };
    let mut sinks = collector::Sinks::new(
        target.pid,
        Stacks::new(sel.funcs.len()),
        Some(dispatcher),
        timeline,
    );
    sinks.cpu = cpu_maps.map(|m| (m, Symbolizer::new(target.pid)));
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
    drop(probes);
    sinks.drain(&mut ring);
    let collector::Sinks {
        mut stacks,
        dispatch,
        timeline,
        cpu,
        ..
    } = sinks;
    let counters_now = counters.read();
    let lost_events = counters_now.lost;
    status.finish();
    stacks.finish();
    if reason == collector::StopReason::TargetExited {
        eprintln!("profiler: PID {} exited; writing the outputs", target.pid);
    }

    // Names set after a thread's first event (pthread_setname_np) win.
    stacks.name_new_threads(|_| None);
    let thread_names: HashMap<u32, String> = stacks
        .threads()
        .filter_map(|t| {
            target::thread_name(target.pid, t.tid)
                .or_else(|| t.name.clone())
                .map(|n| (t.tid, n))
        })
        .collect();
    let report = Report {
        session: Session {
            pid: target.pid,
            exe: target.exe.display().to_string(),
            duration_ns,
            stop_reason: reason.as_str().to_string(),
            functions_probed: probed,
            lost_events,
            capped: sel.capped,
            failed_probes,
        },
        funcs: &sel.funcs,
        binaries: &sel.binaries,
        stacks: &stacks,
        thread_names,
    };
    write_outputs(&out, &report)?;
    if let Some(d) = &dispatch {
        write_dispatches(&out, d, duration_ns)?;
    }
    if let Some(tl) = timeline {
        let omitted = tl.omitted;
        let mut threads: Vec<(u32, String)> = report
            .thread_names
            .iter()
            .map(|(t, n)| (*t, n.clone()))
            .collect();
        threads.sort();
        tl.finish(&threads, dispatch.as_ref())
            .map_err(|e| Error::Output {
                path: out.path().join("trace.json"),
                reason: e.to_string(),
            })?;
        if omitted > 0 {
            eprintln!(
                "profiler: note: trace.json holds the first {} calls; {omitted} more were left out (raise --trace-events)",
                args.trace_events
            );
        }
    }
    if let (Some((maps, mut sym)), Some(hz)) = (cpu, args.sample) {
        let prof = cpuprof::collect(&maps, &mut sym);
        let what = format!("PID {}", target.pid);
        print!(
            "\n{}",
            crate::sample::write_cpu(&out, &prof, &what, hz, duration_ns)?
        );
        out.write(
            "cpu.pb.gz",
            &crate::export::cpu_pprof(&prof.folded, hz, duration_ns),
        )?;
    }
    if counters_now.lost_sched + counters_now.lost_comm > 0 {
        eprintln!(
            "profiler: warning: {} scheduler/sample events and {} thread-name events were lost (ring full): raise --ring-size",
            counters_now.lost_sched, counters_now.lost_comm
        );
    }
    Ok(())
}

fn write_dispatches(out: &OutDir, d: &Dispatcher, duration_ns: u64) -> Result<()> {
    let text = dispatch::report::text(d, duration_ns);
    out.write("dispatches.txt", text.as_bytes())?;
    out.write(
        "dispatches.json",
        dispatch::report::json(d, duration_ns).as_bytes(),
    )?;
    for (name, svg) in dispatch::report::svgs(d) {
        out.write(&name, &svg)?;
    }
    print!("\n{text}");
    Ok(())
}

fn write_outputs(out: &OutDir, report: &Report) -> Result<()> {
    let text = report::text::render(report);
    out.write("report.txt", text.as_bytes())?;
    out.write("functions.json", report::json::render(report).as_bytes())?;
    let folded = report::flame::folded(report);
    let mut folded_text = folded.join("\n");
    folded_text.push('\n');
    out.write("trace.folded", folded_text.as_bytes())?;
    out.write(
        "profile.pb.gz",
        &crate::export::wall_pprof(&folded, report.session.duration_ns),
    )?;
    let title = format!(
        "profiler: PID {} wall-clock by call path",
        report.session.pid
    );
    let svg = report::flame::svg(&folded, &title).map_err(|reason| Error::Output {
        path: out.path().join("flamegraph.svg"),
        reason,
    })?;
    out.write("flamegraph.svg", &svg)?;
    print!("{text}");
    eprintln!(
        "profiler: wrote {}/{{{}}}",
        out.path().display(),
        OUTPUT_FILES.join(",")
    );
    Ok(())
}

/// Runs `profiler list`.
pub fn list(args: &ListArgs) -> Result<()> {
    select::compile(&args.select)?;
    let target = Target::open(args.target.pid)?;
    let mut select_args = args.select.clone();
    select_args.max_funcs = usize::MAX;
    let sel = select::select(&target, &select_args)?;
    let mut out = String::new();
    for f in &sel.funcs {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "{}\t{}\t{:#x}",
            f.name,
            sel.binaries[f.binary as usize].path.display(),
            f.offset
        );
    }
    print!("{out}");
    Ok(())
}
