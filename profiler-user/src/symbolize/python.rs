//! CPython frames: finds the processes that run CPython (a mapped binary
//! exporting `_PyRuntime`; `Py_Version`, or before 3.11 its file name,
//! gives the version), tells the kernel where their
//! frames are (`PY_PROCS`, with the field offsets of their version), and
//! names the frames the kernel walked (`py:qualname (file.py:line)`; before
//! 3.11, whose code objects have no qualified name, `py:name (file.py:line)`) from
//! their code objects, read through `/proc/PID/mem`.
//!
//! The offsets come from a table per minor version (`LAYOUTS`, in
//! `python/layouts.rs`), each entry checked against that version's own
//! headers by the test `layouts_match_each_installed_cpythons_headers`,
//! which compiles `offsetof` for every field with each CPython on the
//! machine; line numbers from `python/lines.rs`. A version not in the
//! table gets one line on stderr and native frames only.
//!
//! A code object is read when the kernel first stores a stack holding it
//! (a notice in `PY_NEWS`, read on the agent's ticks) and kept ([`CODES`]):
//! a process that execs or exits takes its memory along, and a
//! short-lived script under `sample --all` is gone by the time its
//! profile is named. What a code object holds names all its instructions.
//! One freed and another allocated at its address in the same process
//! would keep the first one's name; code objects are seldom freed (only
//! code made at run time, by `exec` or `compile`, is).
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::{collections::HashMap, fs::File};

use aya::{
    maps::{HashMap as BpfHash, MapData, RingBuf},
    Ebpf,
};
use object::{Object, ObjectSegment};
use profiler_common::python::{
    self as common, PyCodeNotice, PyProc, NONE, PY_NEWS_MAP, PY_PROCS_MAP,
};

use super::proc_mem::Mem;
use crate::tracee::process::FileKey;
use crate::{error::chain, Error, Result};
pub use layouts::{layout, proc_entry, Layout, SUPPORTED};
use layouts::{BYTES_DATA, OB_TYPE, STR_LENGTH, STR_STATE, VAR_SIZE};
pub use lines::Format;

mod layouts;
mod lines;

/// The native function that runs Python frames.
pub const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// Prefix of a Python frame's name.
pub const PREFIX: &str = "py:";

/// What a binary exports that marks it as CPython (virtual addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binary {
    runtime: u64,
    /// `Py_Version` (3.11 and later).
    version: Option<u64>,
    code_type: u64,
    /// Loadable segments: (file offset, file size, virtual address) of the
    /// one holding `_PyRuntime`'s mapping is found through these.
    segments: [(u64, u64, u64); 4],
}

/// Reads a binary's dynamic symbols for CPython's markers.
fn read_binary(open: &str) -> Option<Binary> {
    let file = File::open(open).ok()?;
    let data = object::ReadCache::new(file);
    let obj = object::File::parse(&data).ok()?;
    let syms = crate::tracee::symbols::dynamic_values(&obj, |name| {
        matches!(name, b"_PyRuntime" | b"Py_Version" | b"PyCode_Type")
    });
    let value = |name: &[u8]| syms.get(name).copied();
    let mut segments = [(0, 0, 0); 4];
    for (slot, s) in segments.iter_mut().zip(obj.segments()) {
        let (off, size) = s.file_range();
        *slot = (off, size, s.address());
    }
    Some(Binary {
        runtime: value(b"_PyRuntime")?,
        version: value(b"Py_Version"),
        code_type: value(b"PyCode_Type")?,
        segments,
    })
}

/// A process found running CPython.
#[derive(Debug, Clone, Copy)]
struct Proc {
    layout: &'static Layout,
    code_type: u64,
}

/// Processes running a CPython whose frames are walked, for naming.
static PROCS: Mutex<Option<HashMap<u32, Proc>>> = Mutex::new(None);

fn registered(pid: u32) -> Option<Proc> {
    PROCS.lock().ok()?.as_ref()?.get(&pid).copied()
}

/// What one code object tells: enough to name each of its instructions.
#[derive(Debug, Clone)]
struct Code {
    qualname: String,
    file: String,
    first: i32,
    /// `co_linetable` (`co_lnotab` before 3.10).
    table: Vec<u8>,
    format: Format,
}

impl Code {
    /// `py:qualname (file:line)` of instruction `index`.
    fn name(&self, index: u64) -> String {
        let line = match self.format.line(&self.table, self.first, index) {
            Some(line) => line.to_string(),
            None => "?".into(),
        };
        format!("{PREFIX}{} ({}:{line})", self.qualname, self.file)
    }
}

/// Code objects read, by process and address.
static CODES: Mutex<Option<HashMap<(u32, u64), Code>>> = Mutex::new(None);
/// Most code objects kept (about 300 bytes each); past it, code objects
/// are read when their frames are named.
const MAX_CODES: usize = 1 << 18;

/// The name of instruction `index` of code object `code` of `pid`, if it
/// was read.
fn cached_name(pid: u32, code: u64, index: u64) -> Option<String> {
    Some(CODES.lock().ok()?.as_ref()?.get(&(pid, code))?.name(index))
}

fn known(pid: u32, code: u64) -> bool {
    CODES
        .lock()
        .ok()
        .is_some_and(|g| g.as_ref().is_some_and(|c| c.contains_key(&(pid, code))))
}

fn keep(pid: u32, code: u64, read: Code) {
    if let Ok(mut g) = CODES.lock() {
        let codes = g.get_or_insert_with(HashMap::new);
        if codes.len() < MAX_CODES {
            codes.insert((pid, code), read);
        }
    }
}

/// Finds CPython in processes and keeps the kernel's `PY_PROCS` current.
pub struct Python {
    procs: BpfHash<MapData, u32, PyProc>,
    /// Code objects met for the first time ([`Python::learn`]), also read
    /// by a thread of their own.
    news: Arc<News>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Each binary read, by identity: its markers if it is CPython.
    files: HashMap<FileKey, Option<Binary>>,
    /// Versions already said to be unsupported.
    told: Vec<(u32, u32)>,
    /// `task_struct.thread.fsbase`, read from the kernel's BTF when a
    /// CPython before 3.11 is first met ([`NONE`]: not found).
    fsbase: Option<u32>,
}

impl Python {
    /// Takes `PY_PROCS` out of `ebpf`. `PROFILER_PYTHON_FRAMES=0` in the
    /// environment leaves it empty (native frames only: for comparing
    /// costs).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self> {
        if std::env::var_os("PROFILER_PYTHON_FRAMES").is_some_and(|v| v == "0") {
            return Err(Error::Load(
                "Python frames turned off by PROFILER_PYTHON_FRAMES=0".into(),
            ));
        }
        let map = ebpf
            .take_map(PY_PROCS_MAP)
            .ok_or_else(|| Error::Load(format!("no {PY_PROCS_MAP} map")))?;
        let news = ebpf
            .take_map(PY_NEWS_MAP)
            .ok_or_else(|| Error::Load(format!("no {PY_NEWS_MAP} map")))?;
        let news = Arc::new(News {
            ring: Mutex::new(RingBuf::try_from(news).map_err(|e| Error::Load(chain(&e)))?),
            told: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let reader = {
            let news = Arc::clone(&news);
            std::thread::Builder::new()
                .name("profiler-news".into())
                .spawn(move || {
                    while !news.stop.load(Ordering::Relaxed) {
                        news.read();
                        std::thread::sleep(News::EVERY);
                    }
                })
                .map_err(|e| Error::Load(format!("starting the notices' thread: {e}")))?
        };
        Ok(Python {
            procs: BpfHash::try_from(map).map_err(|e| Error::Load(chain(&e)))?,
            news,
            reader: Some(reader),
            files: HashMap::new(),
            told: Vec::new(),
            fsbase: None,
        })
    }

    /// Looks for CPython in `pid`'s executable mappings (`exec`, lines of
    /// `/proc/PID/maps`), and tells the kernel where its frames are.
    /// False when it runs one whose version could not be read yet (to be
    /// tried again).
    pub fn add_process(&mut self, pid: u32, exec: &str) -> bool {
        for m in exec.lines().filter_map(crate::tracee::process::parse_line) {
            let (start, end, offset) = (m.start, m.end, m.offset);
            let open = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
            let Ok(meta) = std::fs::metadata(&open) else {
                continue;
            };
            let key = FileKey::new(&meta);
            let bin = *self.files.entry(key).or_insert_with(|| read_binary(&open));
            let Some(bin) = bin else { continue };
            let Some(&(seg_off, _, vaddr)) = bin
                .segments
                .iter()
                .find(|&&(o, size, _)| size > 0 && offset >= o && offset < o + size)
            else {
                continue;
            };
            let bias = start.wrapping_sub(vaddr + (offset - seg_off));
            return self.register(pid, &m.path, bias, &bin);
        }
        // No CPython (any more: it exec'd another program).
        self.remove_process(pid);
        true
    }

    /// False when the version could not be read from `pid`'s memory.
    fn register(&mut self, pid: u32, path: &str, bias: u64, bin: &Binary) -> bool {
        // Before 3.11 there is no `Py_Version`: the file names the version.
        let (major, minor) = match bin.version {
            Some(v) => match Mem::open(pid).and_then(|m| m.u32(bias.wrapping_add(v))) {
                Some(hex) => (hex >> 24, (hex >> 16) & 0xff),
                None => return false,
            },
            None => version_in_name(path).unwrap_or((3, 0)),
        };
        let Some(layout) = layout(minor).filter(|_| major == 3) else {
            if !self.told.contains(&(major, minor)) {
                self.told.push((major, minor));
                let version = match minor {
                    0 => "a Python whose version its file name does not tell".to_string(),
                    _ => format!("Python {major}.{minor}"),
                };
                eprintln!(
                    "profiler: note: {path} (PID {pid}) is {version}, whose frames are not walked \
                     (supported: {SUPPORTED}); its stacks show the interpreter's native frames only"
                );
            }
            return true;
        };
        let fsbase = match layout.frame_objects() {
            true => *self
                .fsbase
                .get_or_insert_with(|| crate::attach::task_btf::fsbase_offset().unwrap_or(NONE)),
            false => NONE,
        };
        if layout.frame_objects() && fsbase == NONE {
            if !self.told.contains(&(major, minor)) {
                self.told.push((major, minor));
                eprintln!(
                    "profiler: note: {path} (PID {pid}) is Python 3.{minor}, whose threads are found                      by their fs base, and this kernel's BTF does not say where task_struct keeps it;                      its stacks show the interpreter's native frames only"
                );
            }
            return true;
        }
        let entry = proc_entry(layout, bias.wrapping_add(bin.runtime), fsbase);
        if self.procs.insert(pid, entry, 0).is_ok() {
            if let Ok(mut g) = PROCS.lock() {
                g.get_or_insert_with(HashMap::new).insert(
                    pid,
                    Proc {
                        layout,
                        code_type: bias.wrapping_add(bin.code_type),
                    },
                );
            }
        }
        true
    }

    /// Forgets `pid` in the kernel (its names stay, for its samples).
    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }

    /// Reads the code objects the kernel told of since the last call,
    /// while their processes run. Returns how many notices there were
    /// since then (the notices' thread's included).
    pub fn learn(&mut self) -> usize {
        self.news.read();
        self.news.told.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        self.news.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// The kernel's notices of code objects (and JavaScript functions) met
/// for the first time. The agent's ticks read them, and so does a thread
/// of their own every [`News::EVERY`]: a tick can spend seconds on a big
/// binary's unwind tables (node's, under emulation), and a process that
/// exits meanwhile takes the names with it. The kernel tells of each one
/// once.
struct News {
    ring: Mutex<RingBuf<MapData>>,
    /// Notices read since [`Python::learn`] last returned.
    told: AtomicUsize,
    stop: AtomicBool,
}

impl News {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(10);

    /// Reads what the ring holds, and the objects it names. The ring stays
    /// locked until they are read: a tick's [`Python::learn`] returns with
    /// the thread's reads done too.
    fn read(&self) {
        let mut told: Vec<PyCodeNotice> = Vec::new();
        let Ok(mut ring) = self.ring.lock() else {
            return;
        };
        while let Some(item) = ring.next() {
            if let Some(n) = profiler_common::read::<PyCodeNotice>(&item) {
                told.push(n);
            }
        }
        if told.is_empty() {
            return;
        }
        self.told.fetch_add(told.len(), Ordering::Relaxed);
        told.sort_unstable_by_key(|n| (n.pid, n.code));
        told.dedup();
        // JavaScript functions share the ring (`v8.rs`).
        let (js, told): (Vec<PyCodeNotice>, Vec<PyCodeNotice>) = told
            .into_iter()
            .partition(|n| profiler_common::v8::is_frame(n.code));
        for group in js.chunk_by(|a, b| a.pid == b.pid) {
            let slots: Vec<u64> = group.iter().map(|n| n.code).collect();
            super::v8::learn(group[0].pid, &slots);
        }
        // And Java methods (`hotspot.rs`).
        let (java, told): (Vec<PyCodeNotice>, Vec<PyCodeNotice>) = told
            .into_iter()
            .partition(|n| profiler_common::hotspot::is_frame(n.code));
        for group in java.chunk_by(|a, b| a.pid == b.pid) {
            let slots: Vec<u64> = group.iter().map(|n| n.code).collect();
            super::hotspot::learn(group[0].pid, &slots);
        }
        let mut open: Option<(u32, Option<Mem>)> = None;
        for n in &told {
            let Some(proc) = registered(n.pid) else {
                continue;
            };
            if known(n.pid, n.code) {
                continue;
            }
            if open.as_ref().is_none_or(|(p, _)| *p != n.pid) {
                open = Some((n.pid, Mem::open(n.pid)));
            }
            if let Some((_, Some(mem))) = &open {
                if let Some(Read::Code(code)) = read_code(mem, &proc, n.code) {
                    keep(n.pid, n.code, code);
                }
            }
        }
        drop(ring);
    }
}

/// `(3, 10)` from `…/libpython3.10.so.1.0` or `…/python3.10`.
fn version_in_name(path: &str) -> Option<(u32, u32)> {
    let name = path.rsplit('/').next()?;
    let at = name.find("python")? + "python".len();
    let (major, rest) = name[at..].split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// A `str` object's text (compact strings; others read as `?`).
fn string(mem: &Mem, layout: &Layout, obj: u64) -> Option<String> {
    let len = mem.u64(obj + STR_LENGTH)?.min(4096) as usize;
    let state = mem.u32(obj + STR_STATE)?;
    let (kind, compact, ascii) = (
        (state >> 2) & 7,
        state & (1 << 5) != 0,
        state & (1 << 6) != 0,
    );
    if !compact {
        return Some("?".into());
    }
    if ascii {
        let b = mem.bytes(obj + u64::from(layout.ascii_size), len)?;
        return Some(String::from_utf8_lossy(&b).into_owned());
    }
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return None,
    };
    let b = mem.bytes(obj + u64::from(layout.compact_size), len * width)?;
    Some(
        b.chunks(width)
            .map(|c| {
                let mut v = [0u8; 4];
                v[..width].copy_from_slice(c);
                char::from_u32(u32::from_le_bytes(v)).unwrap_or('?')
            })
            .collect(),
    )
}

/// The name of Python frame `slot` (from the kernel) of process `pid`:
/// `py:qualname (file:line)`. None when `pid` is not known to run CPython.
pub fn name(pid: u32, slot: u64) -> Option<String> {
    let proc = registered(pid)?;
    let (code, index, _) = common::decode(slot);
    if let Some(name) = cached_name(pid, code, index) {
        return Some(name);
    }
    let Some(mem) = Mem::open(pid) else {
        return Some(format!("{PREFIX}[exited before its code was read]"));
    };
    Some(match read_code(&mem, &proc, code) {
        Some(Read::Code(read)) => {
            let name = read.name(index);
            keep(pid, code, read);
            name
        }
        // Freed (and its memory reused) between the sample and this read.
        Some(Read::Freed) => format!("{PREFIX}[freed code object]"),
        None => format!("{PREFIX}[unreadable code object {code:#x}]"),
    })
}

/// A code object read, or the sign that it is gone.
enum Read {
    Code(Code),
    /// Its memory holds something else now.
    Freed,
}

fn read_code(mem: &Mem, proc: &Proc, code: u64) -> Option<Read> {
    let l = proc.layout;
    if mem.u64(code + OB_TYPE)? != proc.code_type {
        return Some(Read::Freed);
    }
    let qualname = string(mem, l, mem.u64(code + u64::from(l.code_qualname))?)?;
    let file = string(mem, l, mem.u64(code + u64::from(l.code_filename))?)?;
    let first = mem.u32(code + u64::from(l.code_firstlineno))? as i32;
    let table = mem.u64(code + u64::from(l.code_linetable))?;
    let size = mem.u64(table + VAR_SIZE)?.min(1 << 20) as usize;
    let table = mem.bytes(table + BYTES_DATA, size)?;
    Some(Read::Code(Code {
        qualname,
        file,
        first,
        table,
        format: Format::of(l.minor),
    }))
}

/// Puts the Python frames of a stack (the kernel appends them after the
/// native frames, innermost first, each outermost-of-its-call frame
/// flagged) under the native frames that run them: segment `k` goes just
/// inside the `k`-th [`EVAL_FRAME`] from the leaf. Segments left over (the
/// native walk stopped early) go outermost. `frames` holds one entry per
/// slot of `addrs`.
pub fn splice<T>(addrs: &[u64], frames: Vec<T>, is_eval: impl Fn(&T) -> bool) -> Vec<T> {
    if !addrs.iter().any(|&a| common::is_frame(a)) {
        return frames;
    }
    let mut native = Vec::new();
    let mut segments: Vec<Vec<T>> = vec![Vec::new()];
    for (&a, f) in addrs.iter().zip(frames) {
        if common::is_frame(a) {
            segments.last_mut().expect("one segment at least").push(f);
            if common::decode(a).2 {
                segments.push(Vec::new());
            }
        } else {
            native.push(f);
        }
    }
    if segments.last().is_some_and(Vec::is_empty) {
        segments.pop();
    }
    let mut segments = segments.into_iter();
    let mut out = Vec::new();
    for f in native {
        if is_eval(&f) {
            if let Some(seg) = segments.next() {
                out.extend(seg);
            }
        }
        out.push(f);
    }
    out.extend(segments.flatten());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(
            version_in_name("/usr/lib/libpython3.10.so.1.0"),
            Some((3, 10))
        );
        assert_eq!(
            version_in_name("/root/.pyenv/versions/3.9.18/bin/python3.9"),
            Some((3, 9))
        );
        assert_eq!(version_in_name("/usr/bin/python3"), None);
    }

    #[test]
    fn python_frames_go_under_the_evaluator_frames_that_run_them() {
        let py = |code: u64, entry: bool| common::encode(code << 3, 0, entry);
        // Native: leaf, eval#0, call, eval#1, main. Python: a (entry of
        // eval#0), b, c (entry of eval#1).
        let addrs = [1, 2, 3, 4, 5, py(1, true), py(2, false), py(3, true)];
        let names: Vec<String> = ["leaf", "E", "call", "E", "main", "a", "b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = splice(&addrs, names, |f| f == "E");
        assert_eq!(out, ["leaf", "a", "E", "call", "b", "c", "E", "main"]);
        // The native walk stopped before the second evaluator frame.
        let names: Vec<String> = ["leaf", "E", "a", "b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = splice(
            &[1, 2, py(1, true), py(2, false), py(3, true)],
            names,
            |f| f == "E",
        );
        assert_eq!(out, ["leaf", "a", "E", "b", "c"]);
    }
}
