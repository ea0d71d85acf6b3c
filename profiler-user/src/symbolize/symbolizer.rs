//! Turns addresses into names with blazesym: user addresses of a process
//! (ELF symbols, DWARF with inlined functions and file:line, debug files
//! under /usr/lib/debug; demangled), kernel addresses (kallsyms), and JIT
//! code from the process's perf map (`perfmap.rs`, checked before it is
//! read; blazesym's own perf map reading is off). Results are cached per
//! address; a frame that cannot be resolved is kept as `[unknown] 0x…`,
//! never dropped.
//!
//! Files the target's user controls must not block or mislead the agent,
//! which runs as root:
//! - blazesym 0.2.7, when it reads DWARF (`debug_syms`), opens files by
//!   name beside the binary, as named by the binary's *symbolic* path in
//!   our mount namespace: `<binary>.dwp` always, and for a
//!   `.gnu_debuglink` (also `.gnu_debugaltlink`, `.debug_sup`) the build-id
//!   and name under /usr/lib/debug and /lib/debug, then `<binary's
//!   directory>/<link name>`, after reading the binary again by that path
//!   for its build id (`dwarf/resolver.rs`: `try_find_dwp`,
//!   `find_debug_file`, `DebugFileIter`). Those opens are plain `open`s: a
//!   FIFO there blocks forever, a symlink is followed. None of this can be
//!   configured away except by turning DWARF off. So a binary is given to
//!   blazesym with DWARF by its path only when that path is root's alone
//!   (every directory on the way and the file owned by root, writable by
//!   nobody else: [`untrusted::root_controlled`]). Any other binary (a
//!   user's own build, /tmp, another mount namespace) is symbolized through
//!   `/proc/PID/map_files/…` (or an fd we opened without blocking), names
//!   under which nothing else exists, with DWARF only if it has no debug
//!   link sections; a split-debug binary in a user's directory gets its
//!   ELF symbols only.
//! - blazesym runs on its own thread. A request that gets no answer for
//!   [`STALL`] (a blocking read we did not foresee: a FUSE file, a hung
//!   NFS mount), or for more than a second after SIGINT/SIGTERM, is given
//!   up with one warning and the remaining frames are left unnamed: the
//!   session still ends and writes its outputs.
use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex, Once,
    },
    time::{Duration, Instant},
};

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Process, Source},
        Input, Sym, Symbolized, Symbolizer as Blaze,
    },
    Pid,
};

use super::{perfmap, python};
use crate::untrusted;

/// Largest cache before it is cleared, to keep memory flat.
const CACHE_CAP: usize = 200_000;

/// A blazesym request unanswered this long is given up.
pub const STALL: Duration = Duration::from_secs(30);

/// After SIGINT or SIGTERM while the session finishes (or a second one
/// before), a request still unanswered after this long is given up. The
/// signal that ends a recording is not one: a request it interrupts (the
/// name of a slow dispatch's frame, its binary's symbols being read) is let
/// finish, or the whole report would be left unnamed on a slow machine.
const INTERRUPT_GRACE: Duration = Duration::from_secs(1);

/// A process's mappings are read again, for an address outside every
/// remembered one, at most this often.
const MAPS_REFRESH: Duration = Duration::from_millis(250);

/// Frames of one address, outermost first: the function, then the
/// functions inlined into it at that address (suffixed `_[i]`).
pub type Frames = Vec<String>;

/// What an executable mapping holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// A file (the path starts with `/`).
    File,
    /// The vDSO.
    Vdso,
    /// Anonymous memory (JIT code, trampolines).
    Anon,
}

/// One executable mapping of a process: what it takes to symbolize its
/// addresses, also after the process is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExecMap {
    start: u64,
    end: u64,
    offset: u64,
    /// Device and inode of the file, as `/proc/PID/maps` gives them.
    dev: u64,
    inode: u64,
    path: PathBuf,
    kind: Kind,
}

impl ExecMap {
    fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end
    }

    /// Whether JIT code (named by the perf map) may live here: anonymous
    /// memory, or a memfd (double-mapped JIT code).
    fn may_be_jit(&self) -> bool {
        self.kind == Kind::Anon
            || (self.kind == Kind::File
                && self
                    .path
                    .as_os_str()
                    .as_encoded_bytes()
                    .starts_with(b"/memfd:"))
    }
}

/// The vDSO's name in `/proc/PID/maps`. Every process maps the same kernel
/// vDSO image, so its addresses are symbolized through our own mapping.
const VDSO: &str = "[vdso]";

/// `MAJOR:MINOR` (hex) of `/proc/PID/maps` as a `dev_t`.
fn parse_dev(s: &str) -> Option<u64> {
    let (major, minor) = s.split_once(':')?;
    Some(libc::makedev(
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    ))
}

/// Executable mappings from the text of `/proc/PID/maps`.
fn parse_exec_maps(text: &str) -> Vec<ExecMap> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (dev, inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            if !perms.contains('x') || path == "[vsyscall]" {
                return None;
            }
            let kind = if path.starts_with('/') {
                Kind::File
            } else if path == VDSO {
                Kind::Vdso
            } else {
                Kind::Anon
            };
            let (start, end) = range.split_once('-')?;
            Some(ExecMap {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                dev: parse_dev(dev)?,
                inode: inode.parse().ok()?,
                path: PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(&path)),
                kind,
            })
        })
        .collect()
}

/// A process's mappings read again (`new`), after `old`, of which the last
/// `earlier` are from images it exec'd from. When it has exec'd since (no
/// file mapping read last is still where it was), those read last become
/// earlier ones too. Returns `new`, then the earlier mappings that nothing
/// newer overlaps (so that samples from before an exec still find their
/// files), and how many those are.
fn reread(new: Vec<ExecMap>, old: &[ExecMap], earlier: usize) -> (Vec<ExecMap>, usize) {
    let same = |a: &ExecMap, b: &ExecMap| {
        a.kind == Kind::File && (a.start, a.dev, a.inode) == (b.start, b.dev, b.inode)
    };
    let split = old.len().saturating_sub(earlier);
    let exec = !old[..split].iter().any(|o| new.iter().any(|n| same(o, n)));
    let before = if exec { old } else { &old[split..] };
    let kept: Vec<ExecMap> = before
        .iter()
        .filter(|o| !new.iter().any(|n| n.start < o.end && o.start < n.end))
        .cloned()
        .collect();
    let (mut all, earlier) = (new, kept.len());
    all.extend(kept);
    (all, earlier)
}

/// Address-to-name resolution, with a cache.
pub struct Symbolizer {
    pid: u32,
    cache: HashMap<(u32, u64), Frames>,
    maps: HashMap<u32, Arc<Vec<ExecMap>>>,
    /// How many of a process's `maps` (the last ones) are of the images
    /// it exec'd from.
    earlier: HashMap<u32, usize>,
    /// When each process's mappings were last read.
    refreshed: HashMap<u32, Instant>,
    /// Every address resolved, kept for `profile.data` (or, offline, the
    /// only source of names).
    journal: HashMap<(u32, u64), Frames>,
    offline: bool,
    /// The blazesym thread; None offline, or once given up.
    worker: Option<Worker>,
    /// Each file of the normalized space, by what identifies it, and its
    /// start there.
    normalized: HashMap<(PathBuf, u64, u64, Kind), u64>,
    /// Each Python frame name of the normalized space, and its index.
    python_names: HashMap<String, u64>,
    /// How long a caller that must not stall (the collector's thread)
    /// waits for an answer; None: until it comes ([`STALL`]).
    patience: Option<Duration>,
    /// A request that ran out of patience, whose answer is still to come.
    pending: Option<Pending>,
    /// An answer was not waited for since the last [`Self::take_missed`]:
    /// what was asked for was left unnamed, and is not remembered so.
    missed: bool,
}

/// A request the caller stopped waiting for.
struct Pending {
    /// The frames it asks for (pid, addresses), to keep when the answer
    /// comes; None: a location, dropped.
    frames: Option<(u32, Vec<u64>)>,
    since: Instant,
}

/// Pseudo-pid under which kernel addresses are cached.
const KERNEL: u32 = 0;

/// Pseudo-pid of normalized addresses ([`Symbolizer::normalize`]): no
/// process has it (PIDs stay under 2^22).
pub const NORMALIZED: u32 = u32::MAX - 1;

/// Where the first file of the normalized space starts: above every user
/// address (2^47), so a raw address left as it was never falls in a file.
const NORMALIZED_BASE: u64 = 1 << 48;
/// The room each file gets in the normalized space.
const NORMALIZED_SPAN: u64 = 1 << 40;

/// The one frame a normalized stack of a process whose mappings were never
/// read is left with: its addresses could not be named at any time, and
/// kept as they were, they would make every such process's stacks
/// distinct.
const UNNAMED: u64 = NORMALIZED_BASE - 4096;

/// What [`UNNAMED`] is called.
pub const UNNAMED_FRAME: &str = "[unknown: exited before its mappings were read]";

impl Symbolizer {
    /// A symbolizer whose default process is `pid`.
    pub fn new(pid: u32) -> Self {
        let mut s = Symbolizer {
            pid,
            cache: HashMap::new(),
            maps: HashMap::new(),
            earlier: HashMap::new(),
            refreshed: HashMap::new(),
            journal: HashMap::new(),
            offline: false,
            worker: Worker::start(),
            normalized: HashMap::new(),
            python_names: HashMap::new(),
            patience: None,
            pending: None,
            missed: false,
        };
        s.remember_maps(pid);
        s
    }

    /// Snapshots `pid`'s executable mappings, so its addresses can still be
    /// symbolized (from the files, by offset) after it exits. Call it again
    /// from time to time to catch `dlopen`.
    pub fn remember_maps(&mut self, pid: u32) {
        let _ = self.read_maps(pid, true);
    }

    /// [`Self::remember_maps`] for one of many processes seen in passing
    /// (`sample --all`): where its perf map is (which costs a read of
    /// `/proc/PID/status`, the dearest part) is looked up only when it has
    /// memory where JIT code may live.
    /// Returns the text of `/proc/PID/maps` (for the unwind tables), or
    /// None when it could not be read (the process has exited).
    pub fn remember_maps_in_passing(&mut self, pid: u32) -> Option<String> {
        self.read_maps(pid, false)
    }

    fn read_maps(&mut self, pid: u32, perf_map: bool) -> Option<String> {
        if pid == KERNEL || pid == NORMALIZED {
            return None;
        }
        self.refreshed.insert(pid, Instant::now());
        if perf_map {
            // Where its perf map is and whose it is, kept for after it exits.
            let _ = perfmap::Location::of(pid);
        }
        let text = crate::tracee::process::read_maps(pid).ok()?;
        let maps = parse_exec_maps(&text);
        hold(pid, &maps);
        if !perf_map && maps.iter().any(ExecMap::may_be_jit) {
            let _ = perfmap::Location::of(pid);
        }
        if !maps.is_empty() {
            let (maps, earlier) = match self.maps.get(&pid) {
                Some(old) => reread(maps, old, self.earlier.get(&pid).copied().unwrap_or(0)),
                None => (maps, 0),
            };
            self.maps.insert(pid, Arc::new(maps));
            self.earlier.insert(pid, earlier);
        }
        Some(text)
    }

    /// A symbolizer whose every answer takes `delay` (tests).
    #[cfg(test)]
    pub fn slowed(pid: u32, delay: Duration) -> Self {
        let mut s = Symbolizer::new(pid);
        s.worker = Worker::start_slowed(delay);
        s
    }

    /// A symbolizer that only answers from a journal (offline replay).
    pub fn offline(pid: u32, journal: impl IntoIterator<Item = (u32, u64, Frames)>) -> Self {
        let journal = journal.into_iter().map(|(p, a, f)| ((p, a), f)).collect();
        Symbolizer {
            pid,
            cache: HashMap::new(),
            maps: HashMap::new(),
            earlier: HashMap::new(),
            refreshed: HashMap::new(),
            journal,
            offline: true,
            worker: None,
            normalized: HashMap::new(),
            python_names: HashMap::new(),
            patience: None,
            pending: None,
            missed: false,
        }
    }

    /// Every address resolved so far, for `profile.data`.
    pub fn journal(&self) -> Vec<(u32, u64, Frames)> {
        let mut v: Vec<_> = self
            .journal
            .iter()
            .map(|(&(p, a), f)| (p, a, f.clone()))
            .collect();
        v.sort();
        v
    }

    /// `file:line` of the instruction at `addr` in process `pid`, from DWARF,
    /// when the binary has it (innermost, i.e. inside inlined code).
    pub fn location(&mut self, pid: u32, addr: u64) -> Option<String> {
        if self.offline || pid == KERNEL {
            return None;
        }
        if !self.settle(self.patience.is_none()) {
            self.missed = true;
            return None;
        }
        self.refresh_if_outside(pid, &[addr]);
        let maps = self.maps.get(&pid).cloned().unwrap_or_default();
        match self.ask(Req::Location { pid, addr, maps }, None)? {
            Resp::Location(loc) => loc,
            Resp::Frames(_) => None,
        }
    }

    /// Addresses of process `pid` (a user stack, innermost first) made
    /// independent of where it mapped its files: each address in a
    /// remembered file mapping becomes that file's offset in a space of
    /// files shared by all processes, named later as addresses of
    /// [`NORMALIZED`]. So stacks of many processes running the same
    /// programs (each laid out by ASLR) become the same, and the process's
    /// own mappings can be forgotten. Addresses in no file stay as they
    /// are (they are left unnamed); a process whose mappings were never read
    /// gets one frame that says so ([`UNNAMED_FRAME`]).
    pub fn normalize(&mut self, pid: u32, addrs: &[u64]) -> Vec<u64> {
        let Some(maps) = self.maps.get(&pid).cloned() else {
            // Never read (it exited within a tick): one frame says so.
            return match addrs.is_empty() {
                true => Vec::new(),
                false => vec![UNNAMED],
            };
        };
        let mut changed = false;
        let out = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                if runtime_frame(a) {
                    // Named now, while the process's memory can be read;
                    // the same name is the same slot in every process.
                    return self.normalize_runtime(pid, a);
                }
                // A return address may end its mapping: its call is before.
                let look = if i == 0 { a } else { a.saturating_sub(1) };
                let Some(m) = maps
                    .iter()
                    .find(|m| m.contains(look) && m.kind != Kind::Anon)
                else {
                    return a;
                };
                let key = (m.path.clone(), m.dev, m.inode, m.kind);
                let next = NORMALIZED_BASE + self.normalized.len() as u64 * NORMALIZED_SPAN;
                let base = *self.normalized.entry(key).or_insert_with(|| {
                    changed = true;
                    next
                });
                base + (a - m.start + m.offset)
            })
            .collect();
        if changed {
            let files = self
                .normalized
                .iter()
                .map(|((path, dev, inode, kind), &start)| ExecMap {
                    start,
                    end: start + NORMALIZED_SPAN,
                    offset: 0,
                    dev: *dev,
                    inode: *inode,
                    path: path.clone(),
                    kind: *kind,
                })
                .collect();
            self.maps.insert(NORMALIZED, Arc::new(files));
        }
        out
    }

    /// Forgets everything about processes `pids` (exited, their samples
    /// named already): mappings, cached names, journal entries, and the
    /// symbolization thread's state for them.
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            self.maps.remove(pid);
            self.earlier.remove(pid);
            self.refreshed.remove(pid);
            perfmap::Location::forget(*pid);
        }
        self.cache.retain(|(p, _), _| !pids.contains(p));
        self.journal.retain(|(p, _), _| !pids.contains(p));
        if let Some(w) = &self.worker {
            // Answered with nothing; a failure shows at the next request.
            let _ = w.tx.send(Req::Forget(pids.iter().copied().collect()));
        }
    }

    /// Forgets the mappings of processes `pids` (their frames named so far
    /// stay, in the journal): for processes looked at once, such as those
    /// that woke a dispatch.
    pub fn forget_mappings(&mut self, pids: &[u32]) {
        for pid in pids {
            self.maps.remove(pid);
            self.earlier.remove(pid);
            self.refreshed.remove(pid);
            perfmap::Location::forget(*pid);
        }
    }

    /// True once `pid`'s mappings were remembered.
    pub fn knows(&self, pid: u32) -> bool {
        self.maps.contains_key(&pid)
    }

    /// Innermost names for a user stack of the default process (innermost
    /// first), without inlined frames: for matching against traced calls.
    pub fn user_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(self.pid, addrs)
            .into_iter()
            .map(|mut f| f.swap_remove(0))
            .collect()
    }

    /// Names for a kernel stack (innermost first), suffixed `_[k]`.
    pub fn kernel_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(KERNEL, addrs)
            .into_iter()
            .map(|mut f| format!("{}_[k]", f.swap_remove(0)))
            .collect()
    }

    /// Frames for every address of a stack (innermost first) of process
    /// `pid` (0: the kernel). Return addresses past the first are moved back
    /// one byte so they land inside the call instruction.
    pub fn frames(&mut self, pid: u32, addrs: &[u64]) -> Vec<Frames> {
        if pid == NORMALIZED && addrs == [UNNAMED] {
            return vec![vec![UNNAMED_FRAME.to_string()]];
        }
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| match i == 0 || runtime_frame(a) {
                true => a,
                false => a.saturating_sub(1),
            })
            .collect();
        if self.offline {
            let frames = lookup
                .iter()
                .map(|a| {
                    self.journal
                        .get(&(pid, *a))
                        .cloned()
                        .unwrap_or_else(|| unknown(*a))
                })
                .collect();
            return python::splice(addrs, frames, is_eval);
        }
        for &a in lookup.iter().filter(|&&a| runtime_frame(a)) {
            if self.named(pid, a).is_none() {
                self.journal.insert((pid, a), runtime_frames(pid, a));
            }
        }
        let settled = self.settle(self.patience.is_none());
        let mut missing: Vec<u64> = lookup
            .iter()
            .copied()
            .filter(|a| self.named(pid, *a).is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() && !settled {
            // An earlier answer is still to come: these wait for a later
            // call, unnamed now and not remembered so.
            self.missed = true;
        } else if !missing.is_empty() {
            if self.cache.len() + missing.len() > CACHE_CAP {
                self.cache.clear();
            }
            let req = if pid == KERNEL {
                Req::Kernel(missing.clone())
            } else {
                self.refresh_if_outside(pid, &missing);
                Req::Frames {
                    pid,
                    addrs: missing.clone(),
                    maps: self.maps.get(&pid).cloned().unwrap_or_default(),
                }
            };
            match self.ask(req, Some((pid, missing.clone()))) {
                Some(Resp::Frames(f)) => self.keep(pid, missing, f),
                // Not waited for: kept when the answer comes.
                None if self.pending.is_some() => {}
                _ => self.keep(pid, missing, Vec::new()),
            }
        }
        let frames = lookup
            .iter()
            .map(|a| self.named(pid, *a).cloned().unwrap_or_else(|| unknown(*a)))
            .collect();
        python::splice(addrs, frames, is_eval)
    }

    /// Remembers the frames `resolved` for the addresses `missing` of
    /// `pid` (each unknown where the answer does not fit).
    fn keep(&mut self, pid: u32, missing: Vec<u64>, resolved: Vec<Frames>) {
        let resolved = match resolved.len() == missing.len() {
            true => resolved,
            false => missing.iter().map(|a| unknown(*a)).collect(),
        };
        let resolved: Vec<Frames> = resolved
            .into_iter()
            .zip(&missing)
            .map(|(f, &a)| {
                if f[0].starts_with("[unknown]") {
                    self.unknown_in_binary(pid, a).unwrap_or(f)
                } else {
                    f
                }
            })
            .collect();
        // One copy each: in the journal while it has room (it is
        // also the cache), else in the cache.
        for (a, f) in missing.into_iter().zip(resolved) {
            if self.journal.len() < CACHE_CAP {
                self.journal.insert((pid, a), f);
            } else {
                self.cache.insert((pid, a), f);
            }
        }
    }

    /// Sets how long a request may take before the caller moves on
    /// (`None`: it waits, as the end of a session does). A request that
    /// runs out of patience is answered later: its frames are kept then,
    /// and until then frames asked for are left unnamed
    /// ([`Self::take_missed`] says so).
    pub fn set_patience(&mut self, patience: Option<Duration>) {
        self.patience = patience;
    }

    /// The patience set ([`Self::set_patience`]).
    pub fn patience(&self) -> Option<Duration> {
        self.patience
    }

    /// True when a request was not waited for since the last call: what
    /// was asked for was left unnamed (ask again later).
    pub fn take_missed(&mut self) -> bool {
        std::mem::take(&mut self.missed)
    }

    /// True while an answer not waited for is still to come (after
    /// taking it in, if it came), and the caller is not to wait for it
    /// (it has patience).
    pub fn is_busy(&mut self) -> bool {
        self.patience.is_some() && !self.settle(false)
    }

    /// Takes in the answer of the request not waited for, if it came;
    /// with `wait`, waits for it. False while it is still to come.
    fn settle(&mut self, wait: bool) -> bool {
        let Some(p) = self.pending.take() else {
            return true;
        };
        let Some(w) = self.worker.as_ref() else {
            return true;
        };
        let answer = match wait {
            false => match w.rx.try_recv() {
                Ok(resp) => Some(resp),
                Err(mpsc::TryRecvError::Empty) if p.since.elapsed() < STALL => {
                    self.pending = Some(p);
                    return false;
                }
                Err(mpsc::TryRecvError::Empty) => {
                    self.give_up_stalled();
                    None
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.give_up("it failed");
                    None
                }
            },
            true => self.wait(p.since),
        };
        if let (Some((pid, addrs)), Some(Resp::Frames(f))) = (p.frames, answer) {
            self.keep(pid, addrs, f);
        }
        true
    }

    /// The normalized slot of Python or JavaScript frame `slot` of `pid`:
    /// one per name (and evaluator-call boundary), named in the journal.
    fn normalize_runtime(&mut self, pid: u32, slot: u64) -> u64 {
        let name = match self.named(pid, slot) {
            Some(f) => f[0].clone(),
            None => runtime_name(pid, slot),
        };
        let next = self.python_names.len() as u64;
        let index = *self.python_names.entry(name.clone()).or_insert(next);
        let out = if profiler_common::v8::is_frame(slot) {
            profiler_common::v8::encode(index << 3)
        } else if profiler_common::hotspot::is_frame(slot) {
            profiler_common::hotspot::encode_interpreted(index << 3, 0)
        } else {
            let entry = profiler_common::python::decode(slot).2;
            profiler_common::python::encode(index << 3, 0, entry)
        };
        self.journal.insert((NORMALIZED, out), vec![name]);
        out
    }

    /// The frames already resolved for `addr` of `pid`.
    fn named(&self, pid: u32, addr: u64) -> Option<&Frames> {
        let key = (pid, addr);
        self.journal.get(&key).or_else(|| self.cache.get(&key))
    }
}

impl Symbolizer {
    /// Reads `pid`'s mappings again if one of `addrs` lies outside all the
    /// remembered ones (a `dlopen`, new JIT memory), at most every
    /// [`MAPS_REFRESH`].
    fn refresh_if_outside(&mut self, pid: u32, addrs: &[u64]) {
        let outside = match self.maps.get(&pid) {
            Some(maps) => addrs.iter().any(|&a| !maps.iter().any(|m| m.contains(a))),
            None => true,
        };
        if outside
            && self
                .refreshed
                .get(&pid)
                .is_none_or(|t| t.elapsed() >= MAPS_REFRESH)
        {
            self.remember_maps(pid);
        }
    }

    /// `[unknown] binary+0xoffset` for an address no symbol covers, when a
    /// remembered file mapping (or the vDSO) does.
    fn unknown_in_binary(&mut self, pid: u32, addr: u64) -> Option<Frames> {
        if pid == KERNEL {
            return None;
        }
        if !self.maps.contains_key(&pid) {
            self.remember_maps(pid);
        }
        let m = self
            .maps
            .get(&pid)?
            .iter()
            .find(|m| m.contains(addr) && m.kind != Kind::Anon)?;
        let name = m
            .path
            .file_name()
            .map_or_else(|| m.path.to_string_lossy(), |n| n.to_string_lossy());
        Some(vec![format!(
            "[unknown] {}+{:#x}",
            perfmap::clean_name(name.as_bytes()),
            addr - m.start + m.offset
        )])
    }

    /// Sends `req` to the blazesym thread and waits for the answer, giving
    /// up (for good, with one warning) after [`STALL`], or after
    /// [`INTERRUPT_GRACE`] once SIGINT/SIGTERM arrived during the wait and
    /// it was not the one that ended the collection ([`collection_ended`]:
    /// the session had ended already, or it is the second signal).
    /// With patience ([`Self::set_patience`]), a request unanswered then
    /// is left pending (`frames`: what it asks for, kept when it comes)
    /// and None returned.
    fn ask(&mut self, req: Req, frames: Option<(u32, Vec<u64>)>) -> Option<Resp> {
        let w = self.worker.as_ref()?;
        count_signals();
        if w.tx.send(req).is_err() {
            self.give_up("its thread is gone");
            return None;
        }
        let started = Instant::now();
        if let Some(patience) = self.patience {
            match w.rx.recv_timeout(patience) {
                Ok(resp) => return Some(resp),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.give_up("it failed");
                    return None;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.pending = Some(Pending {
                        frames,
                        since: started,
                    });
                    self.missed = true;
                    return None;
                }
            }
        }
        self.wait(started)
    }

    /// Waits for the answer to the request sent at `started`.
    fn wait(&mut self, started: Instant) -> Option<Resp> {
        let w = self.worker.as_ref()?;
        let signals = SIGNALS.load(Ordering::Relaxed);
        loop {
            match w.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(resp) => return Some(resp),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.give_up("it failed");
                    return None;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let waited = started.elapsed();
                    let now = SIGNALS.load(Ordering::Relaxed);
                    let second = now >= BASE.load(Ordering::Relaxed) + 2;
                    let hurry = now != signals && (ENDED.load(Ordering::Relaxed) || second);
                    if hurry && waited >= INTERRUPT_GRACE {
                        self.give_up("interrupted by a signal");
                        return None;
                    }
                    if waited >= STALL {
                        self.give_up_stalled();
                        return None;
                    }
                }
            }
        }
    }

    fn give_up_stalled(&mut self) {
        self.give_up(&format!(
            "no answer for {} s: a file the target maps may block reads",
            STALL.as_secs()
        ));
    }

    fn give_up(&mut self, why: &str) {
        // The thread may stay blocked; it is abandoned, not joined.
        self.worker = None;
        eprintln!(
            "profiler: warning: symbolization stopped ({why}); the remaining frames are left unnamed"
        );
    }
}

/// SIGINT and SIGTERM received, counted alongside tokio's own handling of
/// them (which ends a recording, and later swallows them).
static SIGNALS: AtomicU64 = AtomicU64::new(0);

/// The session stopped collecting: a signal from now on asks it to hurry.
static ENDED: AtomicBool = AtomicBool::new(false);

/// [`SIGNALS`] when the session began collecting (a launch mode's later
/// sessions begin after earlier signals).
static BASE: AtomicU64 = AtomicU64::new(0);

/// Called when a session begins collecting: the next signal is the one
/// that may end it ([`collection_ended`]).
pub fn collection_started() {
    count_signals();
    BASE.store(SIGNALS.load(Ordering::Relaxed), Ordering::Relaxed);
    ENDED.store(false, Ordering::Relaxed);
}

/// Called when the session stops collecting (its duration, its target's
/// exit, or the signal that ends it): a SIGINT or SIGTERM after this gives
/// up a symbolization that blocks.
pub fn collection_ended() {
    ENDED.store(true, Ordering::Relaxed);
}

fn count_signals() {
    static ONCE: Once = Once::new();
    if cfg!(test) {
        return;
    }
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the action only increments an atomic, which is
            // async-signal-safe.
            let _ = unsafe {
                signal_hook_registry::register(sig, || {
                    SIGNALS.fetch_add(1, Ordering::Relaxed);
                })
            };
        }
    });
}

/// A request to the blazesym thread.
enum Req {
    /// Frames for user addresses of `pid`, with its remembered mappings.
    Frames {
        pid: u32,
        addrs: Vec<u64>,
        maps: Arc<Vec<ExecMap>>,
    },
    /// Frames for kernel addresses.
    Kernel(Vec<u64>),
    /// Drop what is kept per process for these (no answer).
    Forget(Vec<u32>),
    /// `file:line` of one user address.
    Location {
        pid: u32,
        addr: u64,
        maps: Arc<Vec<ExecMap>>,
    },
}

enum Resp {
    Frames(Vec<Frames>),
    Location(Option<String>),
}

/// The blazesym thread's handle.
struct Worker {
    tx: mpsc::Sender<Req>,
    rx: mpsc::Receiver<Resp>,
}

impl Worker {
    fn start() -> Option<Worker> {
        Self::start_slowed(Duration::ZERO)
    }

    /// A worker that takes `delay` before each answer (tests: a binary
    /// whose symbols take long to read).
    fn start_slowed(delay: Duration) -> Option<Worker> {
        let (tx, requests) = mpsc::channel::<Req>();
        let (answers, rx) = mpsc::channel::<Resp>();
        std::thread::Builder::new()
            .name("symbolizer".into())
            .spawn(move || {
                let mut core = Core::new();
                for req in requests {
                    std::thread::sleep(delay);
                    let resp = match req {
                        Req::Frames { pid, addrs, maps } => {
                            Resp::Frames(core.frames(pid, &addrs, &maps))
                        }
                        Req::Kernel(addrs) => Resp::Frames(core.kernel(&addrs)),
                        Req::Location { pid, addr, maps } => {
                            Resp::Location(core.location(pid, addr, &maps))
                        }
                        Req::Forget(pids) => {
                            for pid in pids {
                                core.perf.remove(&pid);
                            }
                            continue;
                        }
                    };
                    if answers.send(resp).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker { tx, rx })
    }
}

/// How far a mapped file may be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// Its path is root's alone: blazesym may read it by name, with DWARF
    /// and whatever debug files it finds.
    Root,
    /// Anyone else's: read through a name nothing else exists under, with
    /// DWARF only if it has no debug link sections (`links`).
    User { links: bool },
    /// Not readable as a regular file now.
    Unreadable,
}

/// The blazesym side, on its own thread.
struct Core {
    blaze: Blaze,
    trust: HashMap<(PathBuf, u64, u64), Trust>,
    perf: HashMap<u32, perfmap::Tracked>,
    own_vdso: Option<u64>,
}

/// The files of mappings whose path is not root's alone, opened through
/// `/proc/PID/map_files` when the mappings are read (while mapped) and
/// held (at most [`HELD_MAX`]), so that their symbols are read after the
/// process exits: by path, an overlay (a container's root; /tmp in the
/// kernels' VMs) gives another device than the mapping's, so the file
/// could not be told to be the same. Keyed by the mapping's device and
/// inode (a file's identity, whatever path named it). None: root's alone,
/// or not opened.
#[derive(Default)]
struct Held {
    files: HashMap<(u64, u64), Option<File>>,
    /// Of `files`, those open.
    open: usize,
}
static HELD: Mutex<Option<Held>> = Mutex::new(None);
/// Files held open at most ([`HELD`]).
const HELD_MAX: usize = 1024;

/// Holds the files of `pid`'s file mappings `maps` not held yet
/// ([`HELD`]).
fn hold(pid: u32, maps: &[ExecMap]) {
    let Ok(mut g) = HELD.lock() else { return };
    let held = g.get_or_insert_with(Held::default);
    for m in maps.iter().filter(|m| m.kind == Kind::File) {
        let key = (m.dev, m.inode);
        if held.files.contains_key(&key) {
            continue;
        }
        let file = match untrusted::root_controlled(&m.path) {
            true => None,
            false if held.open >= HELD_MAX => continue,
            false => {
                let mf = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
                untrusted::open_regular(std::path::Path::new(&mf), true)
                    .ok()
                    .map(|(f, _)| f)
            }
        };
        held.open += usize::from(file.is_some());
        held.files.insert(key, file);
    }
}

/// A copy of the held file of mapping `m` ([`HELD`]).
fn held(m: &ExecMap) -> Option<File> {
    let g = HELD.lock().ok()?;
    g.as_ref()?
        .files
        .get(&(m.dev, m.inode))?
        .as_ref()?
        .try_clone()
        .ok()
}

/// Opens the file of mapping `m` of `pid` without blocking: through
/// `/proc/PID/map_files` while it is mapped, else the file held since its
/// mappings were read ([`HELD`]), else by its path if that is still the
/// same regular file (device and inode). Returns the file and a path
/// blazesym can open it by, under which no other file can exist.
fn open_mapping(pid: u32, m: &ExecMap) -> Option<(File, PathBuf)> {
    let mf = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    if let Ok((f, _)) = untrusted::open_regular(&mf, true) {
        return Some((f, mf));
    }
    if let Some(f) = held(m) {
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        return Some((f, by_fd));
    }
    let (f, md) = untrusted::open_regular(&m.path, false).ok()?;
    if (md.dev(), md.ino()) != (m.dev, m.inode) {
        return None;
    }
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
    Some((f, by_fd))
}

/// `file:line` of a symbol (innermost inlined function first).
fn code_location(sym: &Sym<'_>) -> Option<String> {
    let ci = sym
        .inlined
        .last()
        .and_then(|i| i.code_info.as_ref())
        .or(sym.code_info.as_deref())?;
    let file = std::path::Path::new(&ci.file)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    Some(match ci.line {
        Some(line) => format!("{file}:{line}"),
        None => file,
    })
}

impl Core {
    fn new() -> Self {
        Core {
            blaze: Blaze::new(),
            trust: HashMap::new(),
            perf: HashMap::new(),
            own_vdso: None,
        }
    }

    /// How far the file of mapping `m` may be trusted (cached per file).
    fn trust(&mut self, pid: u32, m: &ExecMap) -> Trust {
        let key = (m.path.clone(), m.dev, m.inode);
        if let Some(t) = self.trust.get(&key) {
            return *t;
        }
        let t = if untrusted::root_controlled(&m.path) {
            Trust::Root
        } else if let Some((f, _)) = open_mapping(pid, m) {
            Trust::User {
                links: untrusted::has_debug_links(&f),
            }
        } else {
            // Not cached: the file may be readable later.
            return Trust::Unreadable;
        };
        self.trust.insert(key, t);
        t
    }

    /// A process source with blazesym's perf map reading off (ours is
    /// checked first), with or without DWARF.
    fn process(pid: Pid, debug: bool) -> Source<'static> {
        let mut p = Process::new(pid);
        p.perf_map = false;
        p.debug_syms = debug;
        Source::Process(p)
    }

    /// Symbolizes `addrs[i]` for each `i` in `idx` through `src` (absolute
    /// addresses or file offsets), filling what resolves into `out`.
    fn fill(
        &self,
        src: &Source,
        input: &[u64],
        idx: &[usize],
        offsets: bool,
        out: &mut [Option<Frames>],
    ) {
        if idx.is_empty() {
            return;
        }
        let syms = match offsets {
            true => self.blaze.symbolize(src, Input::FileOffset(input)),
            false => self.blaze.symbolize(src, Input::AbsAddr(input)),
        };
        for (&i, f) in idx.iter().zip(to_frames(syms.ok(), input)) {
            if !f[0].starts_with("[unknown]") {
                out[i] = Some(f);
            }
        }
    }

    /// Frames for user addresses of `pid`; see the module comment for who
    /// reads what.
    fn frames(&mut self, pid: u32, addrs: &[u64], maps: &[ExecMap]) -> Vec<Frames> {
        // A refused perf map is reported at first sight of the process,
        // whether or not it has JIT code.
        self.perf.entry(pid).or_insert_with(|| {
            let map = perfmap::Tracked::new(pid);
            map.check();
            map
        });
        let at: Vec<Option<&ExecMap>> = addrs
            .iter()
            .map(|&a| maps.iter().find(|m| m.contains(a)))
            .collect();
        let mut out: Vec<Option<Frames>> = vec![None; addrs.len()];
        let (mut rooted, mut plain) = (Vec::new(), Vec::new());
        let mut users: Vec<(&ExecMap, bool, Vec<usize>)> = Vec::new();
        for (i, m) in at.iter().enumerate() {
            match m {
                None => plain.push(i),
                Some(m) if m.kind == Kind::Vdso => plain.push(i),
                Some(m) if m.kind == Kind::Anon => {}
                Some(m) => match self.trust(pid, m) {
                    Trust::Root => rooted.push(i),
                    Trust::User { links } => {
                        match users.iter_mut().find(|(u, _, _)| std::ptr::eq(*u, *m)) {
                            Some((_, _, v)) => v.push(i),
                            None => users.push((m, links, vec![i])),
                        }
                    }
                    Trust::Unreadable => {}
                },
            }
        }
        for (idx, debug) in [(&rooted, true), (&plain, false)] {
            let input: Vec<u64> = idx.iter().map(|&i| addrs[i]).collect();
            self.fill(
                &Self::process(Pid::from(pid), debug),
                &input,
                idx,
                false,
                &mut out,
            );
        }
        for (m, links, idx) in &users {
            self.in_user_file(pid, m, *links, addrs, idx, &mut out);
        }
        // A process that exited (or a zombie with empty maps): its root-owned
        // files and the vDSO, by file offset.
        let rest: Vec<usize> = (0..addrs.len())
            .filter(|&i| out[i].is_none())
            .filter(|&i| {
                at[i].is_some_and(|m| {
                    m.kind == Kind::Vdso
                        || (m.kind == Kind::File
                            && self.trust.get(&(m.path.clone(), m.dev, m.inode))
                                == Some(&Trust::Root))
                })
            })
            .collect();
        self.in_remembered_files(&at, addrs, &rest, &mut out);
        // JIT code: the perf map, once checked.
        let jit: Vec<usize> = (0..addrs.len())
            .filter(|&i| out[i].is_none() && at[i].is_some_and(ExecMap::may_be_jit))
            .collect();
        if !jit.is_empty() {
            let map = self
                .perf
                .entry(pid)
                .or_insert_with(|| perfmap::Tracked::new(pid));
            map.refresh();
            let mut missed = Vec::new();
            for i in jit {
                match map.lookup(addrs[i]) {
                    Some(name) => out[i] = Some(vec![name.to_string()]),
                    None => missed.push(i),
                }
            }
            // Code compiled since the last read (a name is cached for good
            // once asked for, so it is worth a second look now).
            if !missed.is_empty() && map.refresh_within(perfmap::RELOAD_ON_MISS) {
                for i in missed {
                    if let Some(name) = map.lookup(addrs[i]) {
                        out[i] = Some(vec![name.to_string()]);
                    }
                }
            }
        }
        out.into_iter()
            .zip(addrs)
            .map(|(f, &a)| f.unwrap_or_else(|| unknown(a)))
            .collect()
    }

    /// Addresses in a file that is not root's: through a name nothing else
    /// exists under, with DWARF only if it has no debug link sections.
    fn in_user_file(
        &mut self,
        pid: u32,
        m: &ExecMap,
        links: bool,
        addrs: &[u64],
        idx: &[usize],
        out: &mut [Option<Frames>],
    ) {
        let Some((file, path)) = open_mapping(pid, m) else {
            return;
        };
        let mut elf = Elf::new(path);
        elf.debug_syms = !links;
        let offsets: Vec<u64> = idx.iter().map(|&i| addrs[i] - m.start + m.offset).collect();
        self.fill(&Source::Elf(elf), &offsets, idx, true, out);
        drop(file);
    }

    /// Start of this process's own vDSO mapping.
    fn own_vdso_start(&mut self) -> u64 {
        *self.own_vdso.get_or_insert_with(|| {
            let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            parse_exec_maps(&text)
                .into_iter()
                .find(|m| m.kind == Kind::Vdso)
                .map_or(0, |m| m.start)
        })
    }

    /// Symbolizes addresses of an exited process from its remembered
    /// mappings (`at[i]` holds `addrs[i]`): each becomes a file offset in a
    /// root-owned binary, or an address in our own vDSO.
    fn in_remembered_files(
        &mut self,
        at: &[Option<&ExecMap>],
        addrs: &[u64],
        idx: &[usize],
        out: &mut [Option<Frames>],
    ) {
        // Per file: the addresses' indices and their file offsets (each by
        // its own mapping: a file may have several executable ones).
        let mut by_file: Vec<(&ExecMap, Vec<usize>, Vec<u64>)> = Vec::new();
        for &i in idx {
            let Some(m) = at[i] else { continue };
            let offset = addrs[i] - m.start + m.offset;
            match by_file.iter_mut().find(|(f, _, _)| f.path == m.path) {
                Some((_, v, o)) => {
                    v.push(i);
                    o.push(offset);
                }
                None => by_file.push((m, vec![i], vec![offset])),
            }
        }
        for (m, items, offsets) in by_file {
            if m.kind == Kind::Vdso {
                let own = self.own_vdso_start();
                let mine: Vec<u64> = offsets.iter().map(|o| o + own).collect();
                let src = Self::process(Pid::Slf, false);
                self.fill(&src, &mine, &items, false, out);
            } else {
                let src = Source::Elf(Elf::new(m.path.clone()));
                self.fill(&src, &offsets, &items, true, out);
            }
        }
    }

    /// Frames for kernel addresses.
    fn kernel(&self, addrs: &[u64]) -> Vec<Frames> {
        let src = Source::Kernel(Kernel {
            debug_syms: false,
            ..Kernel::default()
        });
        to_frames(
            self.blaze.symbolize(&src, Input::AbsAddr(addrs)).ok(),
            addrs,
        )
    }

    /// `file:line` of `addr` in `pid`, from DWARF, under the same rules as
    /// [`Core::frames`].
    fn location(&mut self, pid: u32, addr: u64, maps: &[ExecMap]) -> Option<String> {
        let m = maps
            .iter()
            .find(|m| m.contains(addr) && m.kind == Kind::File)?;
        let sym = |blaze: &Blaze, src: &Source, input: Input<&[u64]>| -> Option<String> {
            let syms = blaze.symbolize(src, input).ok()?;
            match syms.first()? {
                Symbolized::Sym(sym) => code_location(sym),
                Symbolized::Unknown(_) => None,
            }
        };
        match self.trust(pid, m) {
            Trust::Root => sym(
                &self.blaze,
                &Self::process(Pid::from(pid), true),
                Input::AbsAddr(&[addr]),
            ),
            Trust::User { links: true } => None,
            Trust::User { links: false } => {
                let (file, path) = open_mapping(pid, m)?;
                let loc = sym(
                    &self.blaze,
                    &Source::Elf(Elf::new(path)),
                    Input::FileOffset(&[addr - m.start + m.offset]),
                );
                drop(file);
                loc
            }
            Trust::Unreadable => None,
        }
    }
}

/// True for a Python or JavaScript frame's slot (see `python.rs`, `v8.rs`).
fn runtime_frame(a: u64) -> bool {
    profiler_common::is_runtime_frame(a)
}

/// The name of a Python or JavaScript frame's slot of `pid`.
fn runtime_name(pid: u32, slot: u64) -> String {
    if profiler_common::v8::is_frame(slot) {
        return super::v8::name(pid, slot)
            .unwrap_or_else(|| format!("{}[unknown {slot:#x}]", super::v8::PREFIX));
    }
    if profiler_common::hotspot::is_frame(slot) {
        return runtime_frames(pid, slot).swap_remove(0);
    }
    python::name(pid, slot).unwrap_or_else(|| format!("{}[unknown]", python::PREFIX))
}

/// The frames of a runtime's slot of `pid`: one name, or a compiled
/// Java method's with the methods inlined into it.
fn runtime_frames(pid: u32, slot: u64) -> Frames {
    if profiler_common::hotspot::is_frame(slot) {
        return super::hotspot::name(pid, slot)
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| vec![format!("{}[unknown {slot:#x}]", super::hotspot::PREFIX)]);
    }
    vec![runtime_name(pid, slot)]
}

/// True for the native frame that runs Python frames.
fn is_eval(f: &Frames) -> bool {
    f.first().is_some_and(|n| n == python::EVAL_FRAME)
}

fn unknown(a: u64) -> Frames {
    vec![format!("[unknown] {a:#x}")]
}

fn to_frames(syms: Option<Vec<Symbolized<'_>>>, addrs: &[u64]) -> Vec<Frames> {
    match syms {
        Some(syms) => syms
            .iter()
            .zip(addrs)
            .map(|(s, a)| match s {
                Symbolized::Sym(sym) => {
                    let mut f = vec![sym.name.to_string()];
                    f.extend(sym.inlined.iter().map(|i| format!("{}_[i]", i.name)));
                    f
                }
                Symbolized::Unknown(_) => unknown(*a),
            })
            .collect(),
        None => addrs.iter().map(|a| unknown(*a)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_of_the_images_before_an_exec_are_kept_where_free() {
        let sh = parse_exec_maps(
            "1000-2000 r-xp 0 fe:01 10 /usr/bin/dash\n\
             8000-9000 r-xp 0 fe:01 20 /usr/lib/libc.so.6\n",
        );
        // dlopen, dlclose: the mappings read last are still in place; the
        // new read wins.
        let more = parse_exec_maps(
            "1000-2000 r-xp 0 fe:01 10 /usr/bin/dash\n\
             8000-9000 r-xp 0 fe:01 20 /usr/lib/libc.so.6\n\
             a000-b000 r-xp 0 fe:01 30 /usr/lib/libplugin.so\n",
        );
        assert_eq!(reread(more.clone(), &sh, 0), (more.clone(), 0));
        assert_eq!(reread(sh.clone(), &more, 0), (sh.clone(), 0));
        // exec: a new image; the shell's libc, which nothing overlaps, is
        // kept after it, its main program (overlapped) is not.
        let burner = parse_exec_maps(
            "1800-2800 r-xp 0 fe:01 40 /usr/bin/burner\n\
             5000-6000 r-xp 0 fe:01 20 /usr/lib/libc.so.6\n",
        );
        let (merged, earlier) = reread(burner[..1].to_vec(), &sh, 0);
        assert_eq!(
            (&merged[..1], &merged[1..], earlier),
            (&burner[..1], &sh[1..], 1)
        );
        // Read again, once the new image has mapped its libc: no exec
        // since, and the shell's libc stays.
        let (merged, earlier) = reread(burner.clone(), &merged, earlier);
        assert_eq!(
            (&merged[..2], &merged[2..], earlier),
            (&burner[..], &sh[1..], 1)
        );
    }

    #[inline(never)]
    fn marker_function_for_symbolizer() -> u64 {
        marker_function_for_symbolizer as *const () as u64
    }

    #[test]
    fn normalized_addresses_name_what_the_process_own_did() {
        let me = std::process::id();
        let mut s = Symbolizer::new(me);
        let addr = normalized_addresses_name_what_the_process_own_did as *const () as usize as u64;
        let direct = s.frames(me, &[addr]);
        assert!(!direct[0][0].starts_with("[unknown]"), "{direct:?}");
        let norm = s.normalize(me, &[addr, 0x10]);
        assert!(norm[0] >= NORMALIZED_BASE, "{:#x}", norm[0]);
        assert_eq!(norm[1], 0x10, "an address in no file stays as it was");
        assert_eq!(s.normalize(me, &[addr])[0], norm[0]);
        // The process forgotten: its normalized address still names the
        // same function.
        s.forget(&std::collections::HashSet::from([me]));
        assert!(!s.knows(me));
        assert_eq!(s.frames(NORMALIZED, &norm[..1]), direct);
        // A process never read: one frame that says so.
        let unread = s.normalize(u32::MAX - 7, &[0x1000, 0x2000]);
        assert_eq!(unread.len(), 1);
        assert_eq!(
            s.frames(NORMALIZED, &unread),
            vec![vec![UNNAMED_FRAME.to_string()]]
        );
    }

    #[test]
    fn resolves_own_function_and_keeps_unknowns() {
        let mut s = Symbolizer::new(std::process::id());
        let names = s.user_stack(&[marker_function_for_symbolizer(), 0x10]);
        assert!(
            names[0].ends_with("marker_function_for_symbolizer"),
            "{names:?}"
        );
        assert!(names[1].starts_with("[unknown]"), "{names:?}");
    }

    /// Our pid, executable mappings, the marker function's address and the
    /// index of its mapping.
    fn own_marker() -> (u32, Vec<ExecMap>, u64, usize) {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let maps = parse_exec_maps(&text);
        let addr = marker_function_for_symbolizer();
        let i = maps.iter().position(|m| m.contains(addr)).unwrap();
        (std::process::id(), maps, addr, i)
    }

    #[test]
    fn symbolizes_from_remembered_maps_by_file_offset() {
        let (me, maps, addr, i) = own_marker();
        let m = &maps[i];
        let mut core = Core::new();
        let mut out = vec![None];
        if core.trust(me, m) == Trust::Root {
            core.in_remembered_files(&[Some(m)], &[addr], &[0], &mut out);
        } else {
            core.in_user_file(me, m, false, &[addr], &[0], &mut out);
        }
        let frames = out[0].clone().unwrap();
        assert!(
            frames[0].ends_with("marker_function_for_symbolizer"),
            "{frames:?}"
        );
        let maps = parse_exec_maps(
            "55d4c0a01000-55d4c0a02000 r-xp 00001000 fe:01 123 /usr/bin/my app\n\
             7f-80 rw-p 0 0:0 0 [heap]\n\
             7f00-7f10 rwxp 0 00:00 0 \n\
             7f20-7f30 r-xp 0 00:01 77 /memfd:jit (deleted)\n",
        );
        assert_eq!(
            maps[0],
            ExecMap {
                start: 0x55d4c0a01000,
                end: 0x55d4c0a02000,
                offset: 0x1000,
                dev: libc::makedev(0xfe, 1),
                inode: 123,
                path: "/usr/bin/my app".into(),
                kind: Kind::File,
            }
        );
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[1].kind, Kind::Anon);
        assert!(maps[1].may_be_jit());
        assert_eq!(maps[2].path, PathBuf::from("/memfd:jit"));
        assert!(maps[2].may_be_jit() && !maps[0].may_be_jit());
    }

    #[test]
    fn user_binary_is_symbolized_through_map_files_with_dwarf() {
        // Our own test binary, seen as if a user owned it: through
        // /proc/self/map_files, never by its path.
        let (me, maps, addr, i) = own_marker();
        let m = &maps[i];
        let mut core = Core::new();
        let mut out = vec![None];
        core.in_user_file(me, m, false, &[addr], &[0], &mut out);
        let frames = out[0].clone().unwrap();
        assert!(
            frames[0].ends_with("marker_function_for_symbolizer"),
            "{frames:?}"
        );
        core.trust.insert(
            (m.path.clone(), m.dev, m.inode),
            Trust::User { links: false },
        );
        let loc = core
            .location(me, addr, &maps)
            .expect("file:line from DWARF");
        assert!(loc.starts_with("symbolizer.rs:"), "{loc}");
    }

    #[test]
    fn jit_addresses_are_named_from_a_checked_perf_map() {
        // An anonymous executable mapping of our own, and a perf map for it.
        let len = 4096;
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        let start = page as u64;
        let me = std::process::id();
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let maps = parse_exec_maps(&text);
        assert!(maps
            .iter()
            .any(|m| m.contains(start) && m.kind == Kind::Anon));
        let dir = std::env::temp_dir().join(format!("profiler-symjit-{me}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf.map");
        std::fs::write(
            &path,
            format!("{start:x} 40 JIT:hot;fn\n{:x} 10 other\n", start + 0x100),
        )
        .unwrap();
        let mut core = Core::new();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        core.perf.insert(
            me,
            perfmap::Tracked::at(Some(perfmap::Location {
                path: path.clone(),
                shown: path.display().to_string(),
                owners: vec![0, uid],
            })),
        );
        let frames = core.frames(me, &[start + 8, start + 0x104, start + 0x200], &maps);
        assert_eq!(frames[0], vec!["JIT:hot;fn".to_string()]);
        assert_eq!(frames[1], vec!["other".to_string()]);
        assert!(frames[2][0].starts_with("[unknown]"), "{frames:?}");
        // SAFETY: our mapping.
        unsafe { libc::munmap(page, len) };
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
