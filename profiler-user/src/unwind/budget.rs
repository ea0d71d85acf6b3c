//! How much kernel memory the unwind tables may take (the `UNWIND_ROWS`
//! array, allocated whole when the programs load), and, at the end, which
//! binary each sampled address was in and whether it had a table
//! ([`Placement`]), so the reports can say which binaries the budget left
//! to frame pointers and how many samples that cost.
//!
//! The default is sized to the machine and to what is traced: for one
//! running process, what its binaries' tables are expected to take (from
//! the size of their CFI sections) and a quarter more, plus 16 MiB for
//! libraries it loads later, between 32 MiB and a ceiling of 1/64 of
//! `MemAvailable` (else of `MemTotal`) clamped to [32 MiB, 256 MiB]; the
//! ceiling itself for a command not started yet. System-wide (`sample
//! --all`): the same for every running process's binaries (each once) and
//! a quarter, plus 64 MiB for programs started later, between 64 MiB and a
//! ceiling of 1/64 of the memory clamped to [64 MiB, 256 MiB]. The array's
//! pages are all allocated when the programs load, so the default is only
//! as large as the target needs. `--unwind-memory` overrides it.
use std::collections::HashMap;

use profiler_common::UnwindRow;

/// Bytes per row of the tables.
pub const ROW_BYTES: u64 = size_of::<UnwindRow>() as u64;

pub use crate::cli::{UNWIND_MEMORY_MAX as MAX_BYTES, UNWIND_MEMORY_MIN as MIN_BYTES};
pub use crate::text::fmt_bytes;

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
        true => (64, 64 << 20, 256 << 20),
    };
    match field("MemAvailable").or_else(|| field("MemTotal")) {
        Some(mem) => (mem / div).clamp(lo, hi),
        None => lo,
    }
}

/// Rows of `UNWIND_ROWS` for `--unwind-memory` (`option`), else the
/// default for the machine and, when one running process is traced,
/// `pid`'s binaries (see the module's doc).
pub fn rows(option: Option<u64>, all: bool, pid: Option<u32>) -> u32 {
    let bytes = option.unwrap_or_else(|| {
        let ceiling = default_bytes(
            all,
            &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        );
        match (all, pid) {
            (true, _) => need_rows(all_pids()).map_or(ceiling, |n| sized_all(n, ceiling)),
            (false, Some(pid)) => need_rows([pid]).map_or(ceiling, |n| sized_to(n, ceiling)),
            (false, None) => ceiling,
        }
    });
    (bytes.clamp(MIN_BYTES, MAX_BYTES) / ROW_BYTES) as u32
}

/// The default budget for a process whose tables are expected to take
/// `need` rows, under `ceiling` bytes.
pub fn sized_to(need: u64, ceiling: u64) -> u64 {
    (need * ROW_BYTES * 5 / 4 + (16 << 20)).clamp(32 << 20, ceiling.max(32 << 20))
}

/// The default budget system-wide, when the running processes' tables
/// are expected to take `need` rows: those and a quarter, plus 64 MiB for
/// programs started later (a build's compilers), between 64 MiB and
/// `ceiling`.
pub fn sized_all(need: u64, ceiling: u64) -> u64 {
    (need * ROW_BYTES * 5 / 4 + (64 << 20)).clamp(64 << 20, ceiling.max(64 << 20))
}

/// Every process's PID (`/proc`).
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Bytes of CFI sections per row of a compiled table, for estimates
/// (libLLVM-15: 6.2, libz3: 6.4, libgtk-3: 5.1, libc: 6.6, python3.11:
/// 6.9, libclang-cpp: 5.6; node: 10.0).
const CFI_BYTES_PER_ROW: u64 = 6;

/// Rows the table of `elf` is expected to take, from the size of its CFI
/// sections, before it is compiled.
pub fn estimate_rows<'a, R: object::ReadRef<'a>>(elf: &object::File<'a, R>) -> u64 {
    use object::{Object, ObjectSection};
    let cfi: u64 = [".eh_frame", ".debug_frame"]
        .iter()
        .filter_map(|n| elf.section_by_name(n).map(|s| s.size()))
        .sum();
    cfi.div_ceil(CFI_BYTES_PER_ROW).max(1)
}

/// Rows the tables of the binaries `pids` map are expected to take, each
/// binary once (headers read only); None when no process's mappings could
/// be read.
fn need_rows(pids: impl IntoIterator<Item = u32>) -> Option<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut rows = 0;
    let mut read = false;
    for pid in pids {
        // Kernel threads and processes gone meanwhile have none.
        let Ok(text) = crate::tracee::process::read_maps(pid) else {
            continue;
        };
        read = true;
        rows += need_rows_in(pid, &text, &mut seen);
    }
    read.then_some(rows)
}

/// [`need_rows`] for one process's maps (`text`), skipping the binaries in
/// `seen`.
fn need_rows_in(
    pid: u32,
    text: &str,
    seen: &mut std::collections::HashSet<crate::tracee::process::FileKey>,
) -> u64 {
    let mut rows = 0;
    for line in text.lines() {
        if !line
            .split_whitespace()
            .nth(1)
            .is_some_and(|p| p.contains('x'))
        {
            continue;
        }
        let Some(m) = crate::tracee::process::parse_line(line) else {
            continue;
        };
        let open = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let Ok(meta) = std::fs::metadata(&open) else {
            continue;
        };
        if !seen.insert(crate::tracee::process::FileKey::new(&meta)) {
            continue;
        }
        let Ok(file) = std::fs::File::open(&open) else {
            continue;
        };
        let data = object::ReadCache::new(file);
        if let Ok(elf) = object::File::parse(&data) {
            rows += estimate_rows(&elf);
        }
    }
    rows
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
        assert_eq!(default_bytes(true, &info(24 << 20)), 256 << 20);
        // 4 GiB: 64 MiB, for one process or system-wide.
        assert_eq!(default_bytes(false, &info(4 << 20)), 64 << 20);
        assert_eq!(default_bytes(true, &info(4 << 20)), 64 << 20);
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
        // 2 Mi rows (16 MiB) and a quarter: 32M.
        assert_eq!(suggest(2 << 20), 32 << 20);
        assert_eq!(suggest(10), 1 << 20);
        assert_eq!(rows(Some(32 << 20), false, None), 4 << 20);
        assert_eq!(rows(Some(1), false, None), (MIN_BYTES / ROW_BYTES) as u32);
    }

    #[test]
    fn a_process_default_follows_its_binaries() {
        let ceiling = 256 << 20;
        // A small program: the floor.
        assert_eq!(sized_to(50_000, ceiling), 32 << 20);
        // 60 MiB of expected rows: 75 MiB and 16 to spare.
        assert_eq!(sized_to(60 << 17, ceiling), 91 << 20);
        // More than the machine allows: the ceiling.
        assert_eq!(sized_to(1 << 26, ceiling), ceiling);
        // This process's own binaries are readable and have CFI.
        let own = need_rows([std::process::id()]).unwrap();
        assert!(own > 1000, "{own}");
        // Each binary once: twice the same process is the same.
        assert_eq!(need_rows([std::process::id(); 2]), Some(own));
        assert_eq!(need_rows([]), None);
        // System-wide: the running processes' rows, a quarter, 64 MiB.
        assert_eq!(sized_all(0, 256 << 20), 64 << 20);
        assert_eq!(sized_all(4 << 20, 256 << 20), 104 << 20);
        assert_eq!(sized_all(1 << 26, 256 << 20), 256 << 20);
        assert!(need_rows(all_pids()).is_some_and(|r| r >= own));
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
