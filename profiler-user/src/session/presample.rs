//! Where the watched thread runs, before anything is probed: a short
//! session of the CPU and off-CPU samplers on the target alone (its own
//! eBPF object, unwind tables, torn down before the real session loads),
//! whose stacks of the watched thread choose the default selection when
//! the program has more functions than `--max-funcs` (issue 21, item 5):
//! the functions the thread was running or waiting in, and their callers,
//! rather than the first N in symbol order.
use std::{collections::HashMap, time::Duration};

use crate::{
    analyze::cpu_profile::read_user,
    attach::{
        probes::{Probes, Samplers},
        rings::RingSpec,
        samplers::{self, CpuMaps},
    },
    cli::UnwindMode,
    unwind::tables::Tables,
    Result,
};

/// How long the thread is sampled.
pub const SPAN: Duration = Duration::from_millis(300);

/// Sampling rate: about 300 samples of a busy thread in [`SPAN`].
const HZ: u64 = 997;

/// What the sample saw of the watched thread.
#[derive(Debug, Default)]
pub struct Seen {
    /// Each address on the thread's stacks (return addresses moved back
    /// into their call) and its weight: a CPU sample counts one, a
    /// millisecond blocked counts one.
    pub addrs: HashMap<u64, u64>,
    /// Stacks seen (on and off the CPU).
    pub stacks: u64,
}

/// Samples thread `tid` of process `pid` for [`SPAN`], with `rows` rows of
/// unwind tables.
pub fn sample(pid: u32, tid: u32, rows: u32) -> Result<Seen> {
    let mut probes = Probes::load_in_cgroup(
        pid,
        Default::default(),
        RingSpec::shared(4096),
        Samplers::both(false),
        (UnwindMode::Tables, rows),
        None,
        Default::default(),
    )?;
    let mut tables = Tables::take(probes.ebpf_mut(), rows)?;
    tables.add_process(pid);
    samplers::start(probes.ebpf_mut(), HZ)?;
    samplers::start_offcpu(probes.ebpf_mut())?;
    let maps = CpuMaps::take(probes.ebpf_mut(), true)?;
    std::thread::sleep(SPAN);
    // Stop sampling before reading.
    drop(probes);
    let mut seen = Seen::default();
    let on_cpu = maps
        .counts
        .iter()
        .filter_map(|e| e.ok())
        .map(|(key, per_cpu)| {
            let n: u64 = per_cpu.iter().sum();
            (key, n)
        });
    let off_cpu = maps
        .offcpu
        .iter()
        .flat_map(|m| m.iter().filter_map(|e| e.ok()))
        .map(|(key, per_cpu)| {
            let ns: u64 = per_cpu.iter().sum();
            (key, (ns / 1_000_000).max(1))
        });
    let all: Vec<_> = on_cpu.chain(off_cpu).collect();
    for (key, weight) in all {
        if key.tid != tid {
            continue;
        }
        let (user, _) = read_user(&maps, &key);
        seen.stacks += 1;
        for (i, &a) in user.iter().enumerate() {
            if profiler_common::is_runtime_frame(a) {
                continue;
            }
            let at = if i == 0 { a } else { a.saturating_sub(1) };
            *seen.addrs.entry(at).or_default() += weight;
        }
    }
    Ok(seen)
}

/// The file offsets, in the binary mapped at `exe_maps` (lines of
/// `/proc/PID/maps` of one file), of the addresses `seen`, with their
/// weights.
pub fn file_offsets(seen: &Seen, maps: &str, path: &str) -> Vec<(u64, u64)> {
    let ranges: Vec<(u64, u64, u64)> = maps
        .lines()
        .filter_map(crate::tracee::process::parse_line)
        .filter(|m| m.path == path)
        .map(|m| (m.start, m.end, m.offset))
        .collect();
    let mut out: Vec<(u64, u64)> = seen
        .addrs
        .iter()
        .filter_map(|(&a, &w)| {
            let &(start, _, off) = ranges.iter().find(|&&(s, e, _)| a >= s && a < e)?;
            Some((a - start + off, w))
        })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_offsets_in_their_file_only() {
        let mut seen = Seen::default();
        seen.addrs.insert(0x1010, 3);
        seen.addrs.insert(0x7f00_0000_0010, 5);
        let maps = "00001000-00002000 r-xp 00004000 fe:00 7 /usr/bin/app\n\
                    7f0000000000-7f0000001000 r-xp 00000000 fe:00 9 /usr/lib/libc.so.6\n";
        assert_eq!(file_offsets(&seen, maps, "/usr/bin/app"), [(0x4010, 3)]);
    }
}
