//! Keeps the kernel's unwind tables current for the table unwinder
//! (`profiler-ebpf/src/unwind.rs`): compiles each executable mapping's
//! binary once ([`crate::unwind::cfi::build`]), keyed by build-id (or
//! device, inode and mtime), writes its rows into one contiguous range of
//! the `UNWIND_ROWS` array (memory-mapped, so a table is one copy), and
//! writes each process's executable mappings into `UNWIND_PROCS`. A libc
//! mapped by 200 processes is one table. [`Tables::sync`] is called again
//! every second: it adds new processes (`--all`) and mappings (`dlopen`),
//! and keeps tables no process uses any more until their rows are needed
//! (then the oldest go first), so a binary mapped again soon is not compiled
//! again.
//!
//! The rows array has a budget ([`super::budget`]). Within it, tables go
//! first to the binaries samples land in ([`Tables::note_samples`]), then
//! to the others smallest first, so a big library nothing calls (libLLVM
//! mapped by Mesa) is the one left to frame pointers, and is not even
//! compiled when it cannot fit. When samples land in a binary the budget
//! left without a table, [`Tables::rebalance`] drops tables no sample has
//! touched to make room for it.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    os::fd::{AsFd, AsRawFd},
    time::Instant,
};

use aya::{
    maps::{HashMap as BpfHash, MapData},
    Ebpf,
};
use object::{Object, ObjectSegment};
use profiler_common::{
    ExecMapping, ProcMaps, UnwindRow, MAX_MAPPINGS, UNWIND_PROCS_MAP, UNWIND_ROWS_MAP,
};

use super::{
    cfi::{self, CacheKey},
    row_space::RowSpace,
};
use crate::{error::chain, tracee::process::parse_line, Error, Result};

mod what_runs;

/// Rows of evicted tables the agent keeps (32 MiB).
const SPARE_ROWS: usize = 2 << 20;

/// Processes on a CPU or waiting for one now (state `R`).
pub fn running_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('R'))
            })
        })
        .collect()
}

/// What was learnt from reading a binary.
#[derive(Debug, Clone)]
struct FileInfo {
    /// Its table's key.
    key: CacheKey,
    /// Loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
    /// Rows its table is expected to take, from the size of its CFI
    /// sections (`budget::estimate_rows`), before it is compiled.
    est_rows: u64,
}

/// One process's tables and mappings.
#[derive(Debug, Default)]
struct ProcEntry {
    /// Tables it uses (one use each).
    keys: Vec<CacheKey>,
    /// Its executable mappings' lines of `/proc/PID/maps`.
    exec: String,
    /// Its file mappings: (start, end, binary's key and path), by start.
    maps: Vec<(u64, u64, CacheKey, String)>,
}

/// One compiled table in the rows array.
#[derive(Debug)]
struct Loaded {
    start: u32,
    len: u32,
    /// The ELF virtual address its rows count from ([`cfi::Table::base`]).
    base: u64,
    /// Processes using it.
    refs: u32,
}

/// What the tables cost and cover, for the reports.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TablesStats {
    /// Binaries with a table in the kernel now.
    pub tables: usize,
    /// Rows in use, and the capacity.
    pub rows: u64,
    /// Capacity of the rows array.
    pub capacity: u64,
    /// Tables compiled (cache misses), and the time it took.
    pub built: u64,
    /// Tables evicted from the kernel and put back from the agent's copy
    /// instead of being compiled again.
    #[serde(default)]
    pub reloaded: u64,
    /// Milliseconds spent compiling tables.
    pub build_ms: u64,
    /// FDEs (functions described) in the tables compiled.
    #[serde(default)]
    pub fdes: u64,
    /// Rows whose CFI rule the unwinder cannot follow (walks stop there).
    #[serde(default)]
    pub unsupported_rows: u64,
    /// Processes with tables.
    pub processes: u64,
    /// Unwinding method per binary path: `tables`, or `frame pointers` and why.
    pub methods: std::collections::BTreeMap<String, String>,
    /// Rows each binary the budget left without a table would need
    /// (counted when compiled, else estimated), by path.
    #[serde(default)]
    pub starved_rows: std::collections::BTreeMap<String, u64>,
    /// Tables of binaries no sample touched, dropped to make room for
    /// binaries samples landed in, and how many times that was done.
    #[serde(default)]
    pub dropped: u64,
    #[serde(default)]
    pub rebalances: u64,
}

/// The kernel's unwind tables and what is in them.
pub struct Tables {
    rows: *mut UnwindRow,
    capacity: u32,
    _rows_map: MapData,
    procs: BpfHash<MapData, u32, ProcMaps>,
    /// Free rows.
    space: RowSpace,
    loaded: HashMap<CacheKey, Loaded>,
    /// Tables no process uses any more, oldest first: kept (in the kernel
    /// and in `files`) until their rows are needed, so that a binary
    /// mapped again soon (a compiler run by a build, a short-lived helper
    /// under `--all`) is not compiled again.
    idle: VecDeque<CacheKey>,
    /// Tables evicted from the kernel, kept here (oldest first, up to
    /// [`SPARE_ROWS`] rows) so that a binary that comes back (a compiler
    /// a build runs again and again, once the rows array is full) costs a
    /// copy, not a new compile.
    spare: HashMap<CacheKey, (u64, Vec<UnwindRow>)>,
    spare_order: VecDeque<CacheKey>,
    spare_rows: usize,
    /// Each binary seen, by file identity, so it is read once.
    files: HashMap<cfi::FileKey, FileInfo>,
    /// Each process's tables and mappings.
    per_pid: HashMap<u32, ProcEntry>,
    /// Binaries samples landed in.
    hot: HashSet<CacheKey>,
    /// Binaries the budget left without a table: path, rows needed.
    starved: HashMap<CacheKey, (String, u64)>,
    /// Binaries no sample touched whose tables were dropped for ones
    /// samples landed in: not loaded again unless samples land in them.
    dropped: HashSet<CacheKey>,
    /// Binaries whose CFI could not be compiled (or is empty).
    no_cfi: HashSet<CacheKey>,
    /// Stacks (by the kernel's hash) already told of to
    /// [`Tables::note_samples`].
    stacks_seen: HashSet<u64>,
    /// CPython's frames in the processes that run it (None: the programs
    /// have no Python walker).
    python: Option<crate::symbolize::python::Python>,
    v8: Option<crate::symbolize::v8::V8>,
    hotspot: Option<crate::symbolize::hotspot::Hotspot>,
    /// Processes whose CPython could not be read yet (its version, read
    /// from its memory, just after an exec): tried again on each call.
    python_retry: HashSet<u32>,
    /// Statistics.
    pub stats: TablesStats,
}

impl Drop for Tables {
    fn drop(&mut self) {
        // SAFETY: `rows` was mapped by `take` with this length.
        unsafe {
            libc::munmap(self.rows.cast(), mapped_len(self.capacity));
        }
    }
}

fn mapped_len(capacity: u32) -> usize {
    let page = 4096usize;
    (capacity as usize * size_of::<UnwindRow>()).div_ceil(page) * page
}

impl Tables {
    /// Takes the unwinder's maps out of `ebpf` and maps the rows array.
    pub fn take(ebpf: &mut Ebpf, capacity: u32) -> Result<Self> {
        let rows_map = match ebpf.take_map(UNWIND_ROWS_MAP) {
            Some(aya::maps::Map::Array(m)) => m,
            _ => return Err(Error::Load(format!("no {UNWIND_ROWS_MAP} array"))),
        };
        let procs = ebpf
            .take_map(UNWIND_PROCS_MAP)
            .ok_or_else(|| Error::Load(format!("no {UNWIND_PROCS_MAP} map")))?;
        let procs = BpfHash::try_from(procs).map_err(|e| Error::Load(chain(&e)))?;
        // SAFETY: mapping the array map's fd, which the kernel allows for
        // BPF_F_MMAPABLE arrays, for its whole size.
        let rows = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len(capacity),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                rows_map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if rows == libc::MAP_FAILED {
            return Err(Error::io(
                "mapping the unwind rows",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Tables {
            rows: rows.cast(),
            capacity,
            _rows_map: rows_map,
            procs,
            space: RowSpace::new(capacity),
            loaded: HashMap::new(),
            idle: VecDeque::new(),
            spare: HashMap::new(),
            spare_order: VecDeque::new(),
            spare_rows: 0,
            files: HashMap::new(),
            per_pid: HashMap::new(),
            hot: HashSet::new(),
            starved: HashMap::new(),
            dropped: HashSet::new(),
            no_cfi: HashSet::new(),
            stacks_seen: HashSet::new(),
            python: crate::symbolize::python::Python::take(ebpf).ok(),
            v8: crate::symbolize::v8::V8::take(ebpf).ok(),
            hotspot: crate::symbolize::hotspot::Hotspot::take(ebpf).ok(),
            python_retry: HashSet::new(),
            stats: TablesStats {
                capacity: u64::from(capacity),
                ..Default::default()
            },
        })
    }

    /// A range of `len` free rows; idle tables are evicted, oldest first,
    /// until it fits.
    fn alloc(&mut self, len: u32) -> Option<u32> {
        loop {
            if let Some(start) = self.space.alloc(len) {
                return Some(start);
            }
            let key = self.idle.pop_front()?;
            self.evict(&key);
        }
    }

    /// Frees an idle table's rows (kept in `spare`) and forgets its files.
    fn evict(&mut self, key: &CacheKey) {
        if let Some(l) = self.loaded.remove(key) {
            // SAFETY: [start, start + len) is inside the mapping and ours.
            let rows = unsafe {
                std::slice::from_raw_parts(self.rows.add(l.start as usize), l.len as usize)
            };
            self.keep_spare(key.clone(), l.base, rows.to_vec());
            self.space.free(l.start, l.len);
            self.stats.rows -= u64::from(l.len);
        }
        self.stats.tables = self.loaded.len();
    }

    /// Keeps an evicted table's rows, dropping the oldest kept ones past
    /// [`SPARE_ROWS`].
    fn keep_spare(&mut self, key: CacheKey, base: u64, rows: Vec<UnwindRow>) {
        if rows.len() > SPARE_ROWS {
            return;
        }
        self.spare_rows += rows.len();
        if let Some((_, old)) = self.spare.insert(key.clone(), (base, rows)) {
            self.spare_rows -= old.len();
            self.spare_order.retain(|k| k != &key);
        }
        self.spare_order.push_back(key);
        while self.spare_rows > SPARE_ROWS {
            let Some(k) = self.spare_order.pop_front() else {
                break;
            };
            if let Some((_, old)) = self.spare.remove(&k) {
                self.spare_rows -= old.len();
            }
        }
    }

    /// An evicted table's rows, if still kept.
    fn take_spare(&mut self, key: &CacheKey) -> Option<(u64, Vec<UnwindRow>)> {
        let (base, rows) = self.spare.remove(key)?;
        self.spare_rows -= rows.len();
        self.spare_order.retain(|k| k != key);
        Some((base, rows))
    }

    /// What is known of the binary opened from here as `open`: read once
    /// per file (its headers, build-id note and section sizes only).
    fn file_info(&mut self, open: &str) -> Option<FileInfo> {
        let meta = std::fs::metadata(open).ok()?;
        let fkey = cfi::FileKey::new(&meta);
        if let Some(info) = self.files.get(&fkey) {
            return Some(info.clone());
        }
        let file = std::fs::File::open(open).ok()?;
        let data = object::ReadCache::new(file);
        let elf = object::File::parse(&data).ok()?;
        let segments = elf
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, size, s.address())
            })
            .collect();
        let est_rows = super::budget::estimate_rows(&elf);
        let key = CacheKey::new(&data, &meta);
        let info = FileInfo {
            key,
            segments,
            est_rows,
        };
        self.files.insert(fkey, info.clone());
        Some(info)
    }

    /// Rows that could be had now: free ones, and those of idle tables.
    fn obtainable(&self) -> u64 {
        let idle: u64 = self
            .idle
            .iter()
            .filter_map(|k| self.loaded.get(k))
            .map(|l| u64::from(l.len))
            .sum();
        self.space.free_rows() + idle
    }

    /// Compiles and uploads the table of the binary `path` (opened from
    /// here as `open`, key `key`, about `est` rows), unless it is loaded
    /// already, has no CFI, was dropped, or cannot fit (then it is left to
    /// frame pointers, and not even compiled when its estimate is well
    /// past what could be freed).
    fn ensure(&mut self, key: &CacheKey, path: &str, open: &str, est: u64) {
        if self.dropped.contains(key) || self.no_cfi.contains(key) {
            return;
        }
        if self.loaded.contains_key(key) {
            self.method(path, "tables");
            return;
        }
        let (base, rows) = match self.take_spare(key) {
            Some(spare) => {
                self.stats.reloaded += 1;
                spare
            }
            None => {
                // Estimates are within a fifth of the real size: beyond
                // that, it cannot fit, and compiling it would be wasted.
                if est * 4 / 5 > self.obtainable() {
                    self.starve(key, path, est, "; not compiled");
                    return;
                }
                let t0 = Instant::now();
                let built = std::fs::File::open(open)
                    .map_err(|e| e.to_string())
                    .and_then(|f| cfi::build(&object::ReadCache::new(f)));
                let table = match built {
                    Ok(t) if !t.rows.is_empty() => t,
                    Ok(_) => {
                        self.no_cfi.insert(key.clone());
                        self.method(path, "frame pointers (no CFI)");
                        return;
                    }
                    Err(e) => {
                        self.no_cfi.insert(key.clone());
                        self.method(path, &format!("frame pointers ({e})"));
                        return;
                    }
                };
                self.stats.build_ms += t0.elapsed().as_millis() as u64;
                self.stats.built += 1;
                self.stats.fdes += table.stats.fdes() as u64;
                self.stats.unsupported_rows += table.stats.unsupported() as u64;
                (table.base, table.rows)
            }
        };
        let Some(len) = u32::try_from(rows.len()).ok() else {
            return;
        };
        let Some(start) = self.alloc(len) else {
            // Kept, so that making room later costs a copy.
            self.starve(key, path, u64::from(len), "");
            self.keep_spare(key.clone(), base, rows);
            return;
        };
        // SAFETY: [start, start + len) is inside the mapping and ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rows.as_ptr(),
                self.rows.add(start as usize),
                len as usize,
            );
        }
        self.method(path, "tables");
        self.starved.remove(key);
        self.stats.starved_rows.remove(path);
        self.loaded.insert(
            key.clone(),
            Loaded {
                start,
                len,
                base,
                refs: 0,
            },
        );
        self.stats.tables = self.loaded.len();
        self.stats.rows += u64::from(len);
    }

    /// Notes that the budget left `key` (at `path`, `rows` rows) without a
    /// table.
    fn starve(&mut self, key: &CacheKey, path: &str, rows: u64, how: &str) {
        self.starved.insert(key.clone(), (path.to_string(), rows));
        self.stats.starved_rows.insert(path.to_string(), rows);
        self.method(path, &format!("{}{how})", super::budget::MEMORY_FULL));
    }

    fn method(&mut self, path: &str, how: &str) {
        self.stats.methods.insert(path.to_string(), how.to_string());
    }

    /// Gives `pid` tables for its executable mappings, or refreshes them if
    /// they changed (dlopen). Does nothing for a process that is gone.
    pub fn add_process(&mut self, pid: u32) {
        // A launched command not yet exec'd is still the agent's own fork:
        // its tables would be the agent's (seconds to build on a slow
        // machine, before the program's own are).
        if is_own_fork(pid) {
            return;
        }
        let Ok(text) = crate::tracee::process::read_maps(pid) else {
            // Gone: its tables may go too.
            self.remove_process(pid);
            return;
        };
        self.add_process_from(pid, &text);
    }

    /// Tells the kernel of `pid`'s interpreters (CPython, V8), without
    /// building its tables, when its executable mappings differ from
    /// `seen`. Returns those mappings when it looked (None while `pid` is
    /// still the agent's fork, gone, or unchanged).
    pub fn add_interpreters(&mut self, pid: u32, seen: Option<&str>) -> Option<String> {
        if is_own_fork(pid) {
            return None;
        }
        let exec = executable_lines(&crate::tracee::process::read_maps(pid).ok()?);
        if seen == Some(exec.as_str()) {
            return None;
        }
        self.add_runtimes(pid, &exec);
        Some(exec)
    }

    /// Tells the kernel how `pid`'s interpreters' frames look (CPython,
    /// V8, HotSpot), from its executable mappings `exec`.
    fn add_runtimes(&mut self, pid: u32, exec: &str) {
        self.add_python(pid, exec);
        if let Some(v8) = &mut self.v8 {
            v8.add_process(pid, exec);
        }
        if let Some(hs) = &mut self.hotspot {
            hs.add_process(pid, exec);
        }
    }

    /// [`Self::add_process`] with `/proc/PID/maps` read already (`text`).
    pub fn add_process_from(&mut self, pid: u32, text: &str) {
        let exec = executable_lines(text);
        if self.per_pid.get(&pid).is_some_and(|e| e.exec == exec) {
            if self.python_retry.contains(&pid) {
                self.add_python(pid, &exec);
            }
            // A JVM whose code heaps were not set up yet.
            if let Some(hs) = &mut self.hotspot {
                if hs.pending(pid) {
                    hs.add_process(pid, &exec);
                }
            }
            return;
        }
        // Before the tables: telling the kernel how an interpreter's
        // frames look takes a symbol lookup, while building a large
        // binary's tables (node's) can take seconds under load, and a
        // short script can be over by then. JIT-compiled and
        // interpreted frames are walked by their frame pointers, so
        // they are named before the native tables are in.
        self.add_runtimes(pid, &exec);
        self.apply(pid, exec, &HashSet::new());
    }

    /// Tells the kernel of `pid`'s CPython, if it runs one; to be tried
    /// again when it could not be read yet.
    fn add_python(&mut self, pid: u32, exec: &str) {
        let Some(py) = &mut self.python else { return };
        match py.add_process(pid, exec) {
            true => self.python_retry.remove(&pid),
            false => self.python_retry.insert(pid),
        };
    }

    /// Writes `pid`'s entry for its executable mappings `exec`, uploading
    /// the tables it lacks (those of binaries samples landed in first,
    /// then the smallest first), except those in `defer`.
    fn apply(&mut self, pid: u32, exec: String, defer: &HashSet<CacheKey>) {
        // The old entry stays in the kernel until the new one replaces it,
        // and its tables stay held until then: a changed mapping (dlopen,
        // the uprobes' `[uprobes]` page) neither rebuilds the tables still
        // in use nor leaves a moment where the process has none.
        let old = self.per_pid.remove(&pid);
        let mut found = Vec::new();
        for line in exec.lines() {
            let Some(m) = parse_line(line) else { continue };
            let open = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            let info = self.file_info(&open);
            found.push((m, open, info));
        }
        // Each binary once, in the order its table is wanted.
        let mut order: Vec<(bool, u64, CacheKey, String, String)> = Vec::new();
        for (m, open, info) in &found {
            let Some(info) = info else { continue };
            if defer.contains(&info.key) || order.iter().any(|o| o.2 == info.key) {
                continue;
            }
            let cold = !self.hot.contains(&info.key);
            order.push((
                cold,
                info.est_rows,
                info.key.clone(),
                m.path.clone(),
                open.clone(),
            ));
        }
        order.sort_by_key(|a| (a.0, a.1));
        for (_, est, key, path, open) in &order {
            self.ensure(key, path, open, *est);
        }
        let mut mappings: Vec<ExecMapping> = Vec::new();
        let mut keys = Vec::new();
        let mut maps = Vec::new();
        for (m, _, info) in found {
            let mut e = ExecMapping {
                start: m.start,
                end: m.end,
                ..Default::default()
            };
            if let Some(info) = info {
                if let Some((bias, start, len)) = self.use_table(&info, m.start, m.offset) {
                    e.bias = bias;
                    e.table_start = start;
                    e.table_len = len;
                    keys.push(info.key.clone());
                }
                maps.push((m.start, m.end, info.key, m.path));
            }
            mappings.push(e);
        }
        mappings.sort_by_key(|m| m.start);
        mappings.truncate(MAX_MAPPINGS);
        maps.sort_by_key(|m| m.0);
        let mut value = ProcMaps {
            len: mappings.len() as u32,
            pad: 0,
            maps: [ExecMapping::default(); MAX_MAPPINGS],
        };
        value.maps[..mappings.len()].copy_from_slice(&mappings);
        if self.procs.insert(pid, value, 0).is_ok() {
            self.per_pid.insert(pid, ProcEntry { keys, exec, maps });
        } else {
            self.release(&keys);
            let _ = self.procs.remove(&pid);
        }
        if let Some(old) = old {
            self.release(&old.keys);
        }
        self.stats.processes = self.per_pid.len() as u64;
    }

    /// One more use of the loaded table of `info`, for a mapping at `start`
    /// of file offset `offset`: the mapping's bias (to the table's keys: the
    /// ELF virtual address less the table's base) and the table's range.
    fn use_table(&mut self, info: &FileInfo, start: u64, offset: u64) -> Option<(u64, u32, u32)> {
        let &(seg_off, _, vaddr) = info
            .segments
            .iter()
            .find(|&&(off, size, _)| offset >= off && offset < off + size.max(1))?;
        let bias = start.wrapping_sub(vaddr + (offset - seg_off));
        if self.dropped.contains(&info.key) {
            return None;
        }
        let l = self.loaded.get_mut(&info.key)?;
        if l.refs == 0 {
            // In use again: no longer a candidate for eviction.
            self.idle.retain(|k| k != &info.key);
        }
        l.refs += 1;
        Some((bias.wrapping_add(l.base), l.start, l.len))
    }

    /// Reads the Python code objects the kernel told of since the last
    /// call, while their processes run ([`crate::symbolize::python::Python::learn`]).
    /// Returns how many notices there were.
    pub fn learn_python(&mut self) -> usize {
        self.python.as_mut().map_or(0, |p| p.learn())
    }

    /// Forgets `pid`: its entry in the kernel, and its uses of tables.
    pub fn remove_process(&mut self, pid: u32) {
        if let Some(e) = self.per_pid.remove(&pid) {
            let _ = self.procs.remove(&pid);
            if let Some(py) = &mut self.python {
                py.remove_process(pid);
            }
            if let Some(v8) = &mut self.v8 {
                v8.remove_process(pid);
            }
            if let Some(hs) = &mut self.hotspot {
                hs.remove_process(pid);
            }
            self.release(&e.keys);
            self.stats.processes = self.per_pid.len() as u64;
        }
    }

    /// Drops one use of each table; a table nobody uses becomes idle, and
    /// is freed when its rows are needed.
    fn release(&mut self, keys: &[CacheKey]) {
        for key in keys {
            let Some(l) = self.loaded.get_mut(key) else {
                continue;
            };
            l.refs = l.refs.saturating_sub(1);
            if l.refs == 0 {
                self.idle.push_back(key.clone());
            }
        }
    }

    /// Forgets every process that exited, and those `drop` names: a
    /// long session whose target forks short-lived children (each given
    /// tables for a while) keeps neither their entries nor their uses.
    pub fn forget(&mut self, drop: impl Fn(u32) -> bool) {
        let gone: Vec<u32> = self
            .per_pid
            .keys()
            .copied()
            .filter(|&p| drop(p) || !std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        for pid in gone {
            self.remove_process(pid);
        }
    }

    /// Adds or refreshes the tables of the processes `pids`, in that order,
    /// until `budget` is spent (the rest wait for the next call); with
    /// `exact`, also drops those of every other process. Processes that
    /// exited lose theirs either way. Returns the processes not reached.
    pub fn sync(&mut self, pids: &[u32], exact: bool, budget: std::time::Duration) -> Vec<u32> {
        let want: HashSet<u32> = pids.iter().copied().collect();
        self.forget(|p| exact && !want.contains(&p));
        self.add(pids, budget)
    }

    /// Adds or refreshes the tables of the processes `pids`, in that order,
    /// until `budget` is spent, without looking for exited processes (as
    /// [`Tables::sync`] does). Returns the processes not reached.
    pub fn add(&mut self, pids: &[u32], budget: std::time::Duration) -> Vec<u32> {
        let start = Instant::now();
        let mut done = HashSet::new();
        let mut left = Vec::new();
        for &pid in pids {
            if !done.insert(pid) {
                continue;
            }
            if start.elapsed() > budget {
                left.push(pid);
            } else {
                self.add_process(pid);
            }
        }
        left
    }

    /// [`Tables::add`] for processes whose `/proc/PID/maps` was just read
    /// (`read`, first), then `then`, within one `budget`. Returns the
    /// processes not reached.
    pub fn add_read(
        &mut self,
        read: Vec<(u32, String)>,
        then: &[u32],
        budget: std::time::Duration,
    ) -> Vec<u32> {
        let start = Instant::now();
        let mut left = Vec::new();
        for (pid, text) in read {
            match start.elapsed() > budget {
                true => left.push(pid),
                false => self.add_process_from(pid, &text),
            }
        }
        left.extend(self.add(then, budget.saturating_sub(start.elapsed())));
        left
    }
}

/// The executable mappings' lines of `/proc/PID/maps` text `maps`.
fn executable_lines(maps: &str) -> String {
    maps.lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .collect::<Vec<_>>()
        .join("\n")
}

/// True when `pid` runs the agent's own executable: a child forked to
/// launch a command, before its exec.
fn is_own_fork(pid: u32) -> bool {
    if pid == std::process::id() {
        return false;
    }
    fn id(path: &str) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    // Read once: this runs for every process on every pass.
    static OWN: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let own = *OWN.get_or_init(|| id("/proc/self/exe"));
    own.is_some() && id(&format!("/proc/{pid}/exe")) == own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_of_the_agent_is_told_apart() {
        assert!(!is_own_fork(std::process::id()), "the agent itself");
        // A fork, before it would exec.
        // SAFETY: the child only sleeps and exits (async-signal-safe).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above.
            unsafe {
                libc::sleep(5);
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork failed");
        let same = is_own_fork(child as u32);
        // SAFETY: our own child, reaped here.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        let mut other = std::process::Command::new("sleep")
            .arg("1")
            .spawn()
            .unwrap();
        let differs = is_own_fork(other.id());
        let _ = other.kill();
        let _ = other.wait();
        assert!(same && !differs, "same executable {same}, sleep {differs}");
    }

    #[test]
    fn parses_executable_file_mappings() {
        let m = parse_line("7f00-7f80 r-xp 00002000 08:01 1234 /usr/lib/libc.so.6").unwrap();
        assert_eq!((m.start, m.end, m.offset), (0x7f00, 0x7f80, 0x2000));
        assert_eq!(m.path, "/usr/lib/libc.so.6");
        assert!(parse_line("7f00-7f80 r-xp 00000000 00:00 0 [vdso]").is_none());
        assert!(parse_line("garbage").is_none());
    }
}
