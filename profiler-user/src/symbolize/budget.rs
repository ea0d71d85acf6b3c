//! How much kernel memory the unwind tables may take (the `UNWIND_ROWS`
//! array, allocated whole when the programs load), and, at the end, which
//! binary each sampled address was in and whether it had a table
//! ([`Placement`]), so the reports can say which binaries the budget left
//! to frame pointers and how many samples that cost.
//!
//! The default is sized to the machine: 1/64 of `MemAvailable` (else of
//! `MemTotal`) for one process, between 32 MiB and 256 MiB; 1/32 of it
//! system-wide (`sample --all`), between 64 MiB and 512 MiB.
//! `--unwind-memory` overrides it.
use std::collections::HashMap;

use profiler_common::UnwindRow;

/// Bytes per row of the tables.
pub const ROW_BYTES: u64 = size_of::<UnwindRow>() as u64;

pub use crate::cli::{UNWIND_MEMORY_MAX as MAX_BYTES, UNWIND_MEMORY_MIN as MIN_BYTES};
pub use crate::fmt::fmt_bytes;

/// The default budget for a machine whose `/proc/meminfo` reads `meminfo`:
/// a fraction of the memory available, clamped (see the module's doc).
pub fn default_bytes(all: bool, meminfo: &str) -> u64 {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kb << 10)
        })
    };
    let (div, lo, hi) = match all {
        false => (64, 32 << 20, 256 << 20),
        true => (32, 64 << 20, 512 << 20),
    };
    match field("MemAvailable").or_else(|| field("MemTotal")) {
        Some(mem) => (mem / div).clamp(lo, hi),
        None => lo,
    }
}

/// Rows of `UNWIND_ROWS` for `--unwind-memory` (`option`), else the
/// machine's default.
pub fn rows(option: Option<u64>, all: bool) -> u32 {
    let bytes = option.unwrap_or_else(|| {
        default_bytes(
            all,
            &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        )
    });
    (bytes.clamp(MIN_BYTES, MAX_BYTES) / ROW_BYTES) as u32
}

/// A budget that would hold `rows`, with a quarter to spare, rounded up
/// to a power of two megabytes.
pub fn suggest(rows: u64) -> u64 {
    let want = rows * ROW_BYTES * 5 / 4;
    want.max(1 << 20).next_power_of_two().min(MAX_BYTES)
}

/// What a binary's frames were walked with, at the end of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its table.
    Table,
    /// Frame pointers: its table did not fit in the budget.
    Starved,
    /// Frame pointers for another reason (no CFI, unreadable).
    Other,
}

/// Each process's executable file mappings, with their binary's status.
#[derive(Debug, Default, Clone)]
pub struct Placement {
    /// By process: (start, end, index into `bins`), sorted by start.
    pub(super) procs: HashMap<u32, Vec<(u64, u64, usize)>>,
    /// Binary paths and their status.
    pub(super) bins: Vec<(String, Status)>,
}

impl Placement {
    /// The binary of process `pid` holding `pc`, and its status.
    pub fn binary(&self, pid: u32, pc: u64) -> Option<(&str, Status)> {
        let maps = self.procs.get(&pid)?;
        let i = maps.partition_point(|&(start, _, _)| start <= pc);
        let &(_, end, bin) = maps.get(i.checked_sub(1)?)?;
        (pc < end).then(|| {
            let (path, status) = &self.bins[bin];
            (path.as_str(), *status)
        })
    }
}

/// The status a method string of the reports (`TablesStats::methods`)
/// stands for.
pub fn status_of(method: &str) -> Status {
    if method == "tables" {
        Status::Table
    } else if method.starts_with(MEMORY_FULL) {
        Status::Starved
    } else {
        Status::Other
    }
}

/// How the reports name a binary the budget left without a table.
pub const MEMORY_FULL: &str = "frame pointers (unwind table memory full";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_a_clamped_fraction_of_available_memory() {
        let info = |kb: u64| format!("MemTotal: 99999999 kB\nMemAvailable: {kb} kB\n");
        // 24 GiB available: the upper bounds.
        assert_eq!(default_bytes(false, &info(24 << 20)), 256 << 20);
        assert_eq!(default_bytes(true, &info(24 << 20)), 512 << 20);
        // 4 GiB: 64 MiB for one process, 128 MiB system-wide.
        assert_eq!(default_bytes(false, &info(4 << 20)), 64 << 20);
        assert_eq!(default_bytes(true, &info(4 << 20)), 128 << 20);
        // 1 GiB: the lower bounds.
        assert_eq!(default_bytes(false, &info(1 << 20)), 32 << 20);
        assert_eq!(default_bytes(true, &info(1 << 20)), 64 << 20);
        // No MemAvailable: MemTotal; nothing readable: the lower bound.
        assert_eq!(default_bytes(false, "MemTotal: 8388608 kB\n"), 128 << 20);
        assert_eq!(default_bytes(false, ""), 32 << 20);
    }

    #[test]
    fn sizes_print_and_suggestions_round_up() {
        assert_eq!(fmt_bytes(32 << 20), "32M");
        assert_eq!(fmt_bytes(1 << 30), "1G");
        assert_eq!(fmt_bytes(256 << 10), "256K");
        // 1 Mi rows (16 MiB) and a quarter: 32M.
        assert_eq!(suggest(1 << 20), 32 << 20);
        assert_eq!(suggest(10), 1 << 20);
        assert_eq!(rows(Some(32 << 20), false), 2 << 20);
        assert_eq!(rows(Some(1), false), (MIN_BYTES / ROW_BYTES) as u32);
    }

    #[test]
    fn placement_finds_the_binary_of_an_address() {
        let p = Placement {
            procs: HashMap::from([(7, vec![(0x1000, 0x2000, 0), (0x5000, 0x6000, 1)])]),
            bins: vec![
                ("/bin/app".into(), Status::Table),
                ("/lib/big.so".into(), Status::Starved),
            ],
        };
        assert_eq!(p.binary(7, 0x1000), Some(("/bin/app", Status::Table)));
        assert_eq!(p.binary(7, 0x5fff), Some(("/lib/big.so", Status::Starved)));
        assert_eq!(p.binary(7, 0x2000), None);
        assert_eq!(p.binary(7, 0x10), None);
        assert_eq!(p.binary(8, 0x1000), None);
    }
}
