//! `profiler report DIR`: renders a recording's outputs again from its
//! `profile.data`, offline and without root. The stream is fed through the
//! same pipeline as live, with the journaled hang checks, thread exits,
//! thread names and symbolized addresses, so with the recorded settings the
//! outputs come out byte for byte the same; dispatch thresholds can be
//! changed. A recording cut short or damaged is replayed up to its last
//! whole block, and every output says the figures cover only that part.
use crate::{
    cli::ReportArgs,
    output::writers,
    output::OutDir,
    session::{
        datafile::{self, replayed_binary, FuncInfo},
        finish, pipeline,
    },
    symbolize::Symbolizer,
    tracee::select::{Binary, Func},
    Result,
};

/// Runs `profiler report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let file = if args.recording.is_dir() {
        args.recording.join("profile.data")
    } else {
        args.recording.clone()
    };
    let mut data = datafile::read(&file)?;
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
    let ns = |d: Option<std::time::Duration>| d.map(|d| d.as_nanos() as u64);
    let o = pipeline::Overrides {
        threshold_ns: ns(args.threshold),
        hang_ns: ns(args.hang),
        frame_interval_ns: ns(args.frame_interval),
        full_tree: args.full_tree,
        trace_events: args.trace_events,
    };
    let stage_cfg = pipeline::stages_of(h)?;
    let mut sinks = pipeline::build(pipeline::Config::from_header(
        &out, h, &funcs, &stage_cfg, &o,
    ))?;
    if let Some(d) = &mut sinks.dispatch {
        d.set_symbolizer(Symbolizer::offline(h.pid, t.symbols.iter().cloned()));
    }
    sinks.processes = pipeline::processes_of(h, &funcs, &o);
    if let Some(g) = &t.governor {
        // As recorded: the governor may have rebuilt links (session/record.rs).
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
    let trailer = std::mem::take(&mut data.trailer);
    finish::write(
        finish::Finish::recorded(
            &out,
            &funcs,
            &binaries,
            h,
            trailer,
            damage,
            thread_names,
            o.trace_events(h),
        ),
        sinks,
    )?;
    eprintln!(
        "profiler: replayed {} into {}",
        file.display(),
        out.path().display()
    );
    Ok(())
}
