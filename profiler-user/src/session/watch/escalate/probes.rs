//! The probes of an escalation, taken off, and the file offsets of a
//! stall's samples they are chosen from.
use crate::{
    analyze::flight::FlightRecorder,
    attach::probes::Probes,
    clock::monotonic_ns,
    session::{
        presample::{self, Seen},
        probed::DetachRecord,
        sinks::Sinks,
    },
    tracee::{process, select},
};

/// Unprobes functions `gone` of `sel` (decided at `decided_ns`), and tells
/// the pipeline: their frames still open close once every record up to
/// the detach is read, as the governor's do.
pub(super) fn detach(
    probes: &mut Probes,
    sinks: &mut Sinks,
    sel: &select::Selection,
    pid: u32,
    gone: &[usize],
    decided_ns: u64,
) -> crate::Result<()> {
    if gone.is_empty() {
        return Ok(());
    }
    let done = probes.detach_funcs(sel, gone, pid);
    let record = DetachRecord {
        ts_ns: monotonic_ns(),
        decided_ns,
        funcs: gone.iter().map(|&f| f as u32).collect(),
    };
    for &f in &record.funcs {
        sinks.detach_from(f, decided_ns);
    }
    sinks.detach_later(record);
    done
}

/// The file offsets in the main executable `exe` (as `/proc/PID/maps`
/// names it) of the addresses on the flight recorder's samples of
/// `[start_ns, end_ns)`, with their weights (samples), sorted.
pub(super) fn stall_offsets(
    f: &FlightRecorder,
    pid: u32,
    exe: &str,
    start_ns: u64,
    end_ns: u64,
) -> Vec<(u64, u64)> {
    let mut seen = Seen::default();
    for (_, user) in f.between(start_ns, end_ns) {
        seen.stacks += 1;
        for (i, &a) in user.iter().enumerate() {
            if profiler_common::is_runtime_frame(a) {
                continue;
            }
            // A return address, moved back into its call.
            let at = if i == 0 { a } else { a.saturating_sub(1) };
            *seen.addrs.entry(at).or_default() += 1;
        }
    }
    let Ok(maps) = process::read_maps(pid) else {
        return Vec::new();
    };
    presample::file_offsets(&seen, &maps, exe)
}
