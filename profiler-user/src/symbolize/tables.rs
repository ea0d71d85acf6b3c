//! Keeps the kernel's unwind tables current for the table unwinder
//! (`profiler-ebpf/src/unwind.rs`): compiles each executable mapping's
//! binary once ([`crate::unwind_table::build`]), keyed by build-id (or
//! device, inode and mtime), writes its rows into one contiguous range of
//! the `UNWIND_ROWS` array (memory-mapped, so a table is one copy), and
//! writes each process's executable mappings into `UNWIND_PROCS`. A libc
//! mapped by 200 processes is one table. [`Tables::sync`] is called again
//! every second: it adds new processes (`--all`) and mappings (`dlopen`),
//! and keeps tables no process uses any more until their rows are needed
//! (then the oldest go first), so a binary mapped again soon is not compiled
//! again.
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
    row_space::RowSpace,
    unwind_table::{self, CacheKey},
};
use crate::{error::chain, target::process::parse_line, Error, Result};

/// Capacity of `UNWIND_ROWS` (as the programs were loaded with it):
/// 2 Mi rows (32 MiB of kernel memory) for one process, 4 Mi (64 MiB)
/// system-wide.
pub fn capacity(all: bool) -> u32 {
    if all {
        profiler_common::UNWIND_ROWS_ALL
    } else {
        profiler_common::UNWIND_ROWS_ONE_PROCESS
    }
}

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
    /// Its table's key, if it has one.
    key: Option<CacheKey>,
    /// Loadable segments: (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

/// One compiled table in the rows array.
#[derive(Debug)]
struct Loaded {
    start: u32,
    len: u32,
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
    spare: HashMap<CacheKey, Vec<UnwindRow>>,
    spare_order: VecDeque<CacheKey>,
    spare_rows: usize,
    /// Each binary seen, by file identity, so it is read once.
    files: HashMap<unwind_table::FileKey, FileInfo>,
    /// Each process's tables, and its executable mappings' text.
    per_pid: HashMap<u32, (Vec<CacheKey>, String)>,
    /// CPython's frames in the processes that run it (None: the programs
    /// have no Python walker).
    python: Option<super::python::Python>,
    v8: Option<super::v8::V8>,
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
            python: super::python::Python::take(ebpf).ok(),
            v8: super::v8::V8::take(ebpf).ok(),
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
            self.keep_spare(key.clone(), rows.to_vec());
            self.space.free(l.start, l.len);
            self.stats.rows -= u64::from(l.len);
            self.files.retain(|_, f| f.key.as_ref() != Some(key));
        }
        self.stats.tables = self.loaded.len();
    }

    /// Keeps an evicted table's rows, dropping the oldest kept ones past
    /// [`SPARE_ROWS`].
    fn keep_spare(&mut self, key: CacheKey, rows: Vec<UnwindRow>) {
        if rows.len() > SPARE_ROWS {
            return;
        }
        self.spare_rows += rows.len();
        if let Some(old) = self.spare.insert(key.clone(), rows) {
            self.spare_rows -= old.len();
            self.spare_order.retain(|k| k != &key);
        }
        self.spare_order.push_back(key);
        while self.spare_rows > SPARE_ROWS {
            let Some(k) = self.spare_order.pop_front() else {
                break;
            };
            if let Some(old) = self.spare.remove(&k) {
                self.spare_rows -= old.len();
            }
        }
    }

    /// An evicted table's rows, if still kept.
    fn take_spare(&mut self, key: &CacheKey) -> Option<Vec<UnwindRow>> {
        let rows = self.spare.remove(key)?;
        self.spare_rows -= rows.len();
        self.spare_order.retain(|k| k != key);
        Some(rows)
    }

    /// The table of the binary at `path` (opened from here as `open`),
    /// compiled and uploaded if new, for a mapping at `start` of file
    /// offset `offset`. Returns its key, the mapping's bias and its range.
    fn table_for(
        &mut self,
        path: &str,
        open: &str,
        start: u64,
        offset: u64,
    ) -> Option<(CacheKey, u64, u32, u32)> {
        let meta = std::fs::metadata(open).ok()?;
        let fkey = unwind_table::FileKey::new(&meta);
        let info = match self.files.get(&fkey) {
            Some(info) => info.clone(),
            None => {
                let info = self.load(path, open, &meta)?;
                self.files.insert(fkey, info.clone());
                info
            }
        };
        let key = info.key?;
        let &(seg_off, _, vaddr) = info
            .segments
            .iter()
            .find(|&&(off, size, _)| offset >= off && offset < off + size.max(1))?;
        let bias = start.wrapping_sub(vaddr + (offset - seg_off));
        let l = self.loaded.get_mut(&key)?;
        if l.refs == 0 {
            // In use again: no longer a candidate for eviction.
            self.idle.retain(|k| k != &key);
        }
        l.refs += 1;
        Some((key, bias, l.start, l.len))
    }

    /// Reads one binary, and compiles and uploads its table if new. Only
    /// what is needed is read (`pread` through [`object::ReadCache`]): the
    /// headers and the build-id note, then the CFI sections if the table is
    /// not loaded yet. A 150 MB compiler library whose table is cached
    /// costs a few kilobytes, not a copy of the file.
    fn load(&mut self, path: &str, open: &str, meta: &std::fs::Metadata) -> Option<FileInfo> {
        let file = std::fs::File::open(open).ok()?;
        let data = object::ReadCache::new(file);
        let segments = object::File::parse(&data)
            .ok()?
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, size, s.address())
            })
            .collect();
        let key = self.upload(path, &data, meta);
        Some(FileInfo { key, segments })
    }

    /// Compiles and uploads the table of `data`, unless already there.
    fn upload(
        &mut self,
        path: &str,
        data: &object::ReadCache<std::fs::File>,
        meta: &std::fs::Metadata,
    ) -> Option<CacheKey> {
        let key = CacheKey::new(data, meta);
        if self.loaded.contains_key(&key) {
            return Some(key);
        }
        let rows = match self.take_spare(&key) {
            Some(rows) => {
                self.stats.reloaded += 1;
                rows
            }
            None => {
                let t0 = Instant::now();
                let table = match unwind_table::build(data) {
                    Ok(t) if !t.rows.is_empty() => t,
                    Ok(_) => {
                        self.method(path, "frame pointers (no CFI)");
                        return None;
                    }
                    Err(e) => {
                        self.method(path, &format!("frame pointers ({e})"));
                        return None;
                    }
                };
                self.stats.build_ms += t0.elapsed().as_millis() as u64;
                self.stats.built += 1;
                self.stats.fdes += table.stats.fdes() as u64;
                self.stats.unsupported_rows += table.stats.unsupported() as u64;
                table.rows
            }
        };
        let len = u32::try_from(rows.len()).ok()?;
        let Some(start) = self.alloc(len) else {
            self.method(path, "frame pointers (unwind table memory full)");
            return None;
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
        self.loaded.insert(
            key.clone(),
            Loaded {
                start,
                len,
                refs: 0,
            },
        );
        self.stats.tables = self.loaded.len();
        self.stats.rows += u64::from(len);
        Some(key)
    }

    fn method(&mut self, path: &str, how: &str) {
        self.stats.methods.insert(path.to_string(), how.to_string());
    }

    /// Gives `pid` tables for its executable mappings, or refreshes them if
    /// they changed (dlopen). Does nothing for a process that is gone.
    pub fn add_process(&mut self, pid: u32) {
        let Ok(text) = crate::target::process::read_maps(pid) else {
            // Gone: its tables may go too.
            self.remove_process(pid);
            return;
        };
        self.add_process_from(pid, &text);
    }

    /// [`Self::add_process`] with `/proc/PID/maps` read already (`text`).
    pub fn add_process_from(&mut self, pid: u32, text: &str) {
        let exec: String = text
            .lines()
            .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
            .collect::<Vec<_>>()
            .join("\n");
        if self.per_pid.get(&pid).is_some_and(|(_, t)| *t == exec) {
            return;
        }
        // The old entry stays in the kernel until the new one replaces it,
        // and its tables stay held until then: a changed mapping (dlopen,
        // the uprobes' `[uprobes]` page) neither rebuilds the tables still
        // in use nor leaves a moment where the process has none.
        let old = self.per_pid.remove(&pid);
        let py_exec = (self.python.is_some() || self.v8.is_some()).then(|| exec.clone());
        let mut mappings: Vec<ExecMapping> = Vec::new();
        let mut keys = Vec::new();
        for line in exec.lines() {
            let Some(m) = parse_line(line) else { continue };
            let open = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            let mut e = ExecMapping {
                start: m.start,
                end: m.end,
                ..Default::default()
            };
            if let Some((key, bias, start, len)) = self.table_for(&m.path, &open, m.start, m.offset)
            {
                e.bias = bias;
                e.table_start = start;
                e.table_len = len;
                keys.push(key);
            }
            mappings.push(e);
        }
        mappings.sort_by_key(|m| m.start);
        mappings.truncate(MAX_MAPPINGS);
        let mut value = ProcMaps {
            len: mappings.len() as u32,
            pad: 0,
            maps: [ExecMapping::default(); MAX_MAPPINGS],
        };
        value.maps[..mappings.len()].copy_from_slice(&mappings);
        if self.procs.insert(pid, value, 0).is_ok() {
            self.per_pid.insert(pid, (keys, exec));
        } else {
            self.release(&keys);
            let _ = self.procs.remove(&pid);
        }
        if let Some((old_keys, _)) = old {
            self.release(&old_keys);
        }
        self.stats.processes = self.per_pid.len() as u64;
        // After the tables: the native walk matters first.
        if let Some(exec) = py_exec {
            if let Some(py) = &mut self.python {
                py.add_process(pid, &exec);
            }
            if let Some(v8) = &mut self.v8 {
                v8.add_process(pid, &exec);
            }
        }
    }

    /// Reads the Python code objects the kernel told of since the last
    /// call, while their processes run ([`super::python::Python::learn`]).
    /// Returns how many notices there were.
    pub fn learn_python(&mut self) -> usize {
        self.python.as_mut().map_or(0, |p| p.learn())
    }

    /// Forgets `pid`: its entry in the kernel, and its uses of tables.
    pub fn remove_process(&mut self, pid: u32) {
        if let Some((keys, _)) = self.per_pid.remove(&pid) {
            let _ = self.procs.remove(&pid);
            if let Some(py) = &mut self.python {
                py.remove_process(pid);
            }
            if let Some(v8) = &mut self.v8 {
                v8.remove_process(pid);
            }
            self.release(&keys);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_executable_file_mappings() {
        let m = parse_line("7f00-7f80 r-xp 00002000 08:01 1234 /usr/lib/libc.so.6").unwrap();
        assert_eq!((m.start, m.end, m.offset), (0x7f00, 0x7f80, 0x2000));
        assert_eq!(m.path, "/usr/lib/libc.so.6");
        assert!(parse_line("7f00-7f80 r-xp 00000000 00:00 0 [vdso]").is_none());
        assert!(parse_line("garbage").is_none());
    }
}
