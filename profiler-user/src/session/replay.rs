//! A replay: `profile.data` fed through the pipeline built from its
//! header as `record` builds it ([`pipeline::Config::from_header`]), with
//! the journaled hang checks, thread exits, thread names and symbolized
//! addresses, and the outputs written from its header and trailer
//! ([`finish::Finish::recorded`]) as `record` writes them: with the
//! recorded settings, byte for byte the same.
use crate::{
    output::OutDir,
    session::{
        datafile::{self, replayed_binary, FuncInfo},
        finish,
        pipeline::{self, Overrides},
    },
    symbolize::Symbolizer,
    tracee::select::{Binary, Func},
    Result,
};

/// Replays `data` (read from `profile.data`; `damage` says what part of it
/// is missing) into `out`, with `o` changed from the recorded settings.
pub fn replay(
    mut data: datafile::Data,
    damage: Option<String>,
    out: &OutDir,
    o: &Overrides,
) -> Result<()> {
    let (h, t) = (&data.header, &data.trailer);
    let funcs: Vec<Func> = h.funcs.iter().map(FuncInfo::to_func).collect();
    let binaries: Vec<Binary> = h.binaries.iter().map(|p| replayed_binary(p)).collect();
    let stage_cfg = pipeline::stages_of(h)?;
    let mut sinks = pipeline::build(pipeline::Config::from_header(out, h, &funcs, &stage_cfg, o))?;
    if let Some(d) = &mut sinks.dispatch {
        d.set_symbolizer(Symbolizer::offline(h.pid, t.symbols.iter().cloned()));
    }
    sinks.processes = pipeline::processes_of(h, &funcs, o);
    if let Some(g) = &t.governor {
        // As recorded: the governor may have rebuilt links (session/record/collect.rs).
        sinks.dedup = Some(Default::default());
        for d in &g.detached {
            sinks.detach_from(d.func, d.decided_ns);
        }
    }
    if data.has_trailer && t.stop_ns > 0 {
        sinks.stop_at(t.stop_ns);
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
            out,
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
    Ok(())
}
