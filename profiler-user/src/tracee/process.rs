//! The traced process: liveness (through a pidfd, so a reused PID is never
//! mistaken for it), its executable, its mapped files and thread names.
use std::{
    fs,
    os::fd::{FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use super::ldso::Loader;
use crate::{Error, Result};

/// A file-backed mapping of the target, as listed in `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Start address of the first mapping of this file.
    pub start: u64,
    /// End address of that mapping.
    pub end: u64,
    /// Path as the target sees it (inside its mount namespace).
    pub path: PathBuf,
}

impl Mapping {
    /// A path to the same file that works from our mount namespace, even if
    /// the file was deleted: the `/proc/PID/map_files` magic link.
    pub fn open_path(&self, pid: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            self.start, self.end
        ))
    }
}

/// Nanoseconds thread `tid` of `pid` has run on a CPU (the first field of
/// /proc/PID/task/TID/schedstat: the scheduler's own accounting, probe
/// handling included); `None` if it is gone or the kernel has no schedstat.
pub fn thread_cpu_ns(pid: u32, tid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The name of `pid` if it is a kernel thread (`PF_KTHREAD` in the flags
/// of /proc/PID/stat), else `None`.
fn kernel_thread_name(pid: u32) -> Option<String> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1;
    // After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let flags: u64 = rest.split_whitespace().nth(6)?.parse().ok()?;
    (flags & PF_KTHREAD != 0).then(|| name.to_string())
}

/// A live process we are tracing.
#[derive(Debug)]
pub struct Target {
    /// Its PID (tgid).
    pub pid: u32,
    /// Its executable's path as the target sees it.
    pub exe: PathBuf,
    /// Path that opens the executable from here (`/proc/PID/exe` for a
    /// running process; the program's path for one launched but not yet
    /// exec'd).
    pub exe_open: PathBuf,
    /// Held open for the whole session: it becomes readable when the
    /// process exits, and it keeps naming this process even if the PID is
    /// reused.
    pub pidfd: OwnedFd,
    /// Launched by us and not yet exec'd: nothing of the program is mapped.
    pub launched: bool,
}

/// A file's identity: device and inode (what a uprobe belongs to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity of the file at `path` (followed).
    pub fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// A file's version: its identity and modification time (the cache key
/// of a binary without a build-id: its unwind table, its runtime's layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// Device holding the file.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileKey {
    /// The key of a file, from its metadata (`std::fs::metadata`, or of
    /// `/proc/PID/map_files/…`, which follows to the mapped file).
    pub fn new(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// A library `--lib` names.
#[derive(Debug, Clone)]
pub struct Library {
    /// Its path as the target sees it.
    pub path: PathBuf,
    /// A path that opens it from here.
    pub open_path: PathBuf,
    /// Set when the target had not mapped it yet: the file's identity, to
    /// notice when it does.
    pub unmapped: Option<FileId>,
}

impl Target {
    /// Opens the process. Fails with [`Error::NoSuchProcess`] if it is gone.
    pub fn open(pid: u32) -> Result<Self> {
        // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ESRCH) | Some(libc::EINVAL) => Error::NoSuchProcess(pid),
                _ => Error::io(format!("pidfd_open({pid})"), err),
            });
        }
        // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let exe = fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| match e.kind() {
            // No executable: a kernel thread, or a process that is exiting
            // (its memory already released) or a zombie.
            std::io::ErrorKind::NotFound => match kernel_thread_name(pid) {
                Some(name) => Error::KernelThread { pid, name },
                None if fs::metadata(format!("/proc/{pid}")).is_ok() => Error::TargetGone(pid),
                None => Error::NoSuchProcess(pid),
            },
            _ => Error::io(
                format!("reading /proc/{pid}/exe (is it a kernel thread?)"),
                e,
            ),
        })?;
        let exe_open = PathBuf::from(format!("/proc/{pid}/exe"));
        Ok(Target {
            pid,
            exe,
            exe_open,
            pidfd,
            launched: false,
        })
    }

    /// A child forked by `profiler record -- CMD` that will exec `program`.
    pub fn launched(pid: u32, program: PathBuf) -> Result<Self> {
        // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            return Err(Error::io(
                format!("pidfd_open({pid})"),
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Target {
            pid,
            exe: program.clone(),
            exe_open: program,
            pidfd,
            launched: true,
        })
    }

    /// A path to the executable that works from our namespace, even if it
    /// was deleted or lives in another mount namespace.
    pub fn exe_open_path(&self) -> PathBuf {
        self.exe_open.clone()
    }

    /// True while the process has not exited.
    pub fn alive(&self) -> bool {
        !self.exits_within(std::time::Duration::ZERO)
    }

    /// True once the process has exited, waiting up to `wait` for it: a
    /// process tearing itself down (its memory, so `/proc/PID/exe`, already
    /// gone) is not counted as exited until its last thread is.
    pub fn exits_within(&self, wait: std::time::Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on one pollfd of our open pidfd.
        unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
    }

    /// The file-backed mappings, one per distinct file, in address order.
    pub fn mappings(&self) -> Result<Vec<Mapping>> {
        let text = fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map_err(|e| Error::io(format!("reading /proc/{}/maps", self.pid), e))?;
        Ok(parse_maps(&text))
    }

    /// Finds the mapped library that `--lib NAME_OR_PATH` names: an exact
    /// path, a file name, or a prefix of the file name (`libc` finds
    /// `libc.so.6`).
    pub fn find_library(&self, name: &str) -> Result<Mapping> {
        let maps = self.mappings()?;
        let file_name = |m: &Mapping| m.path.file_name().map(|f| f.to_string_lossy().into_owned());
        let exact = maps
            .iter()
            .find(|m| m.path == Path::new(name) || file_name(m).as_deref() == Some(name));
        let prefix = || {
            maps.iter().find(|m| {
                file_name(m).is_some_and(|f| {
                    f.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
                })
            })
        };
        exact
            .or_else(prefix)
            .cloned()
            .ok_or_else(|| Error::NoSuchLibrary(name.to_string(), self.pid))
    }

    /// Finds the library `--lib NAME_OR_PATH` names: among the mapped files
    /// first (a running process), else as the target's dynamic loader
    /// would find it (`ldso.rs`), mapped or not: its probes then fire once
    /// it is mapped, by the loader or by `dlopen`.
    pub fn library(&self, name: &str) -> Result<Library> {
        if !self.launched {
            if let Ok(m) = self.find_library(name) {
                return Ok(Library {
                    open_path: m.open_path(self.pid),
                    path: m.path,
                    unmapped: None,
                });
            }
        }
        let loader = if self.launched {
            Loader::of_launch(&self.exe_open)
        } else {
            Loader::of_process(self.pid, &self.exe)
        };
        let found = loader.find(name).map_err(|looked| Error::LibraryNotFound {
            name: name.to_string(),
            whom: if self.launched {
                self.exe.display().to_string()
            } else {
                format!("PID {}", self.pid)
            },
            looked: looked.join(", "),
        })?;
        let id = FileId::of(&found.open_path);
        let mapped = !self.launched && id.is_some_and(|id| maps_file(self.pid, id, &found.path));
        Ok(Library {
            path: found.path,
            open_path: found.open_path,
            unmapped: if mapped { None } else { id },
        })
    }
}

/// True when process `pid` maps the file `id` (whose path, as the process
/// sees it, is `path`): same inode, and same device or same path (an
/// overlay shows another device than its files' own).
pub fn maps_file(pid: u32, id: FileId, path: &Path) -> bool {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    text.lines().any(|line| {
        let mut f = line.split_ascii_whitespace();
        let (Some(_), Some(_), Some(_), Some(dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        if ino.parse::<u64>().ok() != Some(id.ino) {
            return false;
        }
        let dev = dev.split_once(':').and_then(|(ma, mi)| {
            Some(libc::makedev(
                u32::from_str_radix(ma, 16).ok()?,
                u32::from_str_radix(mi, 16).ok()?,
            ))
        });
        dev == Some(id.dev) || f.next().is_some_and(|p| Path::new(p) == path)
    })
}

/// The characters of a thread's name Linux keeps (`TASK_COMM_LEN` less
/// its NUL): `AWT-EventQueue-0` is seen as `AWT-EventQueue-`.
pub const COMM_LEN: usize = 15;

/// AWT's event-dispatch thread, `AWT-EventQueue-0`, as Linux keeps it.
pub const AWT_EDT: &str = "AWT-EventQueue-";
/// JavaFX's `JavaFX Application Thread`, as Linux keeps it.
pub const JAVAFX_APP: &str = "JavaFX Applicat";

/// Thread `tid` of `pid` is in a `futex` system call now (parked), from
/// `/proc/PID/task/TID/syscall`.
fn in_futex(pid: u32, tid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
        .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_futex.to_string()))
}

/// Whether the truncation note was said (once a run: `--thread` is
/// resolved more than once).
static TOLD_TRUNCATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How `--thread NAME` matched a process's threads.
#[derive(Debug, PartialEq, Eq)]
pub enum ByName {
    /// A thread has that name (the first one, by TID).
    Exact(u32, String),
    /// None has it, the name is longer than [`COMM_LEN`], and one thread's
    /// name is its first [`COMM_LEN`] bytes.
    Truncated(u32, String),
    /// As [`ByName::Truncated`], but several threads have that name.
    Ambiguous(Vec<u32>, String),
    None,
}

/// `name` as Linux keeps it: its first [`COMM_LEN`] bytes (read back
/// lossily where that splits a character).
fn truncated(name: &str) -> String {
    let bytes = name.as_bytes();
    String::from_utf8_lossy(&bytes[..bytes.len().min(COMM_LEN)]).into_owned()
}

/// Matches `spec` against `threads` (TID and name, by TID).
pub fn by_name(spec: &str, threads: &[(u32, String)]) -> ByName {
    if let Some((tid, name)) = threads.iter().find(|(_, n)| n == spec) {
        return ByName::Exact(*tid, name.clone());
    }
    if spec.len() <= COMM_LEN {
        return ByName::None;
    }
    let cut = truncated(spec);
    let tids: Vec<u32> = threads
        .iter()
        .filter(|(_, n)| *n == cut)
        .map(|(t, _)| *t)
        .collect();
    match tids[..] {
        [] => ByName::None,
        [tid] => ByName::Truncated(tid, cut),
        _ => ByName::Ambiguous(tids, cut),
    }
}

/// Whether the JVM thread note was said (once a run: the thread is
/// resolved more than once).
static TOLD_JVM_THREAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Target {
    /// Resolves `--thread`: `main` (tid == pid), a TID of this process, or
    /// a thread name: a runtime's own name of a thread first (`full_names`:
    /// a JVM's `Thread.getName()` by TID, which Linux cuts to
    /// [`COMM_LEN`]), else the kernel's (one longer than Linux keeps
    /// matches its truncation, [`by_name`]); without it, the main thread,
    /// or a JVM's ([`Target::jvm_thread`]). Returns the tid and its name.
    pub fn resolve_thread(
        &self,
        spec: Option<&str>,
        full_names: &dyn Fn(u32) -> std::result::Result<Vec<(u32, String)>, String>,
    ) -> Result<(u32, String)> {
        let pid = self.pid;
        let name_of = |tid: u32| thread_name(pid, tid);
        let Some(spec) = spec else {
            if let Some((tid, name)) = self.jvm_thread() {
                // Its whole name, where the JVM gives it.
                let whole = full_names(pid)
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|(t, n)| (t == tid).then_some(n));
                return Ok((tid, whole.unwrap_or(name)));
            }
            return Ok((pid, name_of(pid).unwrap_or_default()));
        };
        if spec == "main" {
            return Ok((pid, name_of(pid).unwrap_or_default()));
        }
        if let Ok(tid) = spec.parse::<u32>() {
            return name_of(tid).map(|n| (tid, n)).ok_or_else(|| {
                Error::Usage(format!(
                    "PID {pid} has no thread {tid}: see /proc/{pid}/task for its threads"
                ))
            });
        }
        let tasks = fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| Error::io(format!("listing /proc/{pid}/task"), e))?;
        let mut threads: Vec<(u32, String)> = tasks
            .flatten()
            .filter_map(|entry| {
                let tid = entry.file_name().to_str()?.parse::<u32>().ok()?;
                Some((tid, name_of(tid)?))
            })
            .collect();
        threads.sort();
        // A JVM's threads by their whole names, when it can be read:
        // Linux's may be cut, and two cut alike. Linux's names still match
        // as given; by their truncation, only the other threads' do.
        let mut whole = full_names(pid).unwrap_or_default();
        whole.retain(|(tid, _)| threads.iter().any(|(t, _)| t == tid));
        if let Some((tid, name)) = whole.iter().find(|(_, n)| n == spec) {
            return Ok((*tid, name.clone()));
        }
        let exact = by_name(spec, &threads);
        threads.retain(|(tid, _)| !whole.iter().any(|(t, _)| t == tid));
        let found = match exact {
            ByName::Exact(..) => exact,
            _ => by_name(spec, &threads),
        };
        match found {
            ByName::Exact(tid, name) => Ok((tid, name)),
            ByName::Truncated(tid, name) => {
                if !TOLD_TRUNCATED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "profiler: note: PID {pid} has no thread named {spec:?}, and Linux keeps a \
                         thread's first {COMM_LEN} characters: watching thread {tid}, named {name:?}"
                    );
                }
                Ok((tid, name))
            }
            ByName::Ambiguous(tids, name) => Err(Error::Usage(format!(
                "--thread {spec:?}: Linux keeps a thread's first {COMM_LEN} characters, and PID {pid} has {} \
                 threads named {name:?} (TIDs {}); use --thread TID",
                tids.len(),
                tids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ))),
            ByName::None => {
                let mut names: Vec<String> = threads.into_iter().chain(whole).map(|(_, n)| n).collect();
                names.sort();
                names.dedup();
                Err(Error::Usage(format!(
                    "PID {pid} has no thread named {spec:?}; its threads are: {}; use --thread main, a TID or one of these names",
                    names.join(", ")
                )))
            }
        }
    }

    /// The thread a JVM's dispatches are watched on, when the target is
    /// one (it maps `libjvm.so`): the `java` launcher's main thread only
    /// waits in `pthread_join` for the VM. While the Java main thread
    /// (the first thread after it with its name) is parked in a futex, or
    /// gone (`DestroyJavaVM` waits the same way), the event-dispatch
    /// thread (`AWT-EventQueue-0`, seen as [`AWT_EDT`]; or JavaFX's,
    /// [`JAVAFX_APP`]) when one exists; else the Java main thread. Says
    /// which on stderr. None for any other process.
    pub fn jvm_thread(&self) -> Option<(u32, String)> {
        let pid = self.pid;
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        if !maps.lines().any(|l| l.ends_with("/libjvm.so")) {
            return None;
        }
        let mut threads: Vec<(u32, String)> = fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
            .filter_map(|e| {
                let tid = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((tid, thread_name(pid, tid)?))
            })
            .collect();
        threads.sort();
        let launcher = threads.iter().find(|(t, _)| *t == pid)?.1.clone();
        let java_main = threads
            .iter()
            .find(|(t, n)| *t > pid && *n == launcher)
            .cloned();
        let parked = java_main
            .as_ref()
            .is_none_or(|(tid, _)| in_futex(pid, *tid));
        let edt = [AWT_EDT, JAVAFX_APP].iter().find_map(|want| {
            let mut named = threads.iter().filter(|(_, n)| n == want);
            match (named.next(), named.next()) {
                (Some(t), None) => Some(t.clone()),
                _ => None,
            }
        });
        let (tid, name, why) = match (edt, java_main) {
            (Some(e), _) if parked => (e.0, e.1, "its Java main thread is parked"),
            (_, Some(m)) => (
                m.0,
                m.1,
                "its launcher's main thread only waits for the VM; this is the Java main thread",
            ),
            (Some(e), None) => (e.0, e.1, "its Java main thread is gone"),
            (None, None) => return None,
        };
        if !TOLD_JVM_THREAD.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "profiler: note: PID {pid} is a JVM and {why}: watching thread {tid} ({name}); \
                 --thread main|TID|NAME watches another"
            );
        }
        Some((tid, name))
    }
}

/// A file mapping from a `/proc/PID/maps` line.
pub struct MapLine {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// The file mapping a `/proc/PID/maps` line describes (None for anonymous
/// memory, the vDSO and other pseudo-files, or a malformed line).
pub fn parse_line(line: &str) -> Option<MapLine> {
    let mut f = line.split_whitespace();
    let (range, _perms, off) = (f.next()?, f.next()?, f.next()?);
    let path = f.skip(2).collect::<Vec<_>>().join(" ");
    if !path.starts_with('/') {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    Some(MapLine {
        start: u64::from_str_radix(a, 16).ok()?,
        end: u64::from_str_radix(b, 16).ok()?,
        offset: u64::from_str_radix(off, 16).ok()?,
        path,
    })
}

/// The text of `/proc/PID/maps` (`pid`'s mappings). Read into one large
/// buffer: the kernel regenerates the file's lines at every `read`, taking
/// the process's memory-map lock each time, and `read_to_string` starts
/// with a 32-byte probe and then grows its buffer a read at a time.
pub fn read_maps(pid: u32) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = fs::File::open(format!("/proc/{pid}/maps"))?;
    let mut buf = Vec::with_capacity(64 << 10);
    file.read_to_end(&mut buf)?;
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Parses the text of `/proc/PID/maps` into one [`Mapping`] per file.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(_perms), Some(_off), Some(_dev), Some(inode), Some(rest)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let path = rest.trim_start();
        if inode == "0" || !path.starts_with('/') {
            continue;
        }
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        if out.iter().any(|m| m.path == Path::new(path)) {
            continue;
        }
        out.push(Mapping {
            start,
            end,
            path: PathBuf::from(path),
        });
    }
    out
}

/// The name (`comm`) of thread `tid` of process `pid`, if it still exists.
pub fn thread_name(pid: u32, tid: u32) -> Option<String> {
    // Read lossily: the kernel cuts a long name's bytes, and may cut a
    // character in two.
    fs::read(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\n')
                .to_string()
        })
}

/// The child processes of `pid`'s main thread (`/proc/PID/task/PID/children`),
/// empty when unknown. Cross-process waits are often on a child (a helper
/// fed through a pipe): its stacks are walked with tables too.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether thread `tid` of process `pid` still exists.
/// The syscall thread `tid` of `pid` is blocked in, from
/// `/proc/PID/task/TID/syscall`: its number, its six arguments and the user
/// stack pointer. None when it runs, or the file cannot be read.
pub fn thread_syscall(pid: u32, tid: u32) -> Option<(u64, [u64; 6], u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    parse_syscall(&text)
}

/// The wait syscall thread `tid` of `pid` is blocked in (an event loop's:
/// epoll, poll, select, `io_uring_enter` getting events, or a private futex
/// wait), as [`thread_syscall`] reads it; None when it is in none.
pub fn thread_wait(pid: u32, tid: u32) -> Option<(u64, [u64; 6], u64)> {
    use profiler_common::wait;
    let (nr, args, sp) = thread_syscall(pid, tid)?;
    wait::waits(nr, [args[0], args[1], args[2], args[3]]).then_some((nr, args, sp))
}

/// Parses `/proc/PID/task/TID/syscall`: `NR ARG1 … ARG6 SP PC` (numbers
/// in hex after the first); `running` or `-1 SP PC` (not in a syscall)
/// give None.
fn parse_syscall(text: &str) -> Option<(u64, [u64; 6], u64)> {
    let mut it = text.split_whitespace();
    let nr: u64 = it.next()?.parse().ok()?;
    let mut hex = it.map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16));
    let mut args = [0u64; 6];
    for a in &mut args {
        *a = hex.next()?.ok()?;
    }
    let sp = hex.next()?.ok()?;
    Some((nr, args, sp))
}

pub fn thread_alive(pid: u32, tid: u32) -> bool {
    Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

#[cfg(test)]
mod tests {

    #[test]
    fn blocked_syscall_from_proc() {
        let text = "232 0x4 0x7ffc1000 0x400 0xffffffff 0x0 0x0 0x7ffc0ff8 0x7f00123\n";
        assert_eq!(
            parse_syscall(text),
            Some((232, [4, 0x7ffc1000, 0x400, 0xffff_ffff, 0, 0], 0x7ffc0ff8))
        );
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffc0ff8 0x7f00123\n"), None);
    }

    use super::*;

    #[test]
    fn kernel_threads_are_told_from_processes() {
        // PID 2 is kthreadd on Linux; this test process is a user process.
        assert_eq!(kernel_thread_name(2).as_deref(), Some("kthreadd"));
        assert_eq!(kernel_thread_name(std::process::id()), None);
    }

    #[test]
    fn a_thread_name_longer_than_linux_keeps_matches_its_truncation() {
        let t = |v: &[(u32, &str)]| -> Vec<(u32, String)> {
            v.iter().map(|(t, n)| (*t, n.to_string())).collect()
        };
        let threads = t(&[(10, "java"), (11, "AWT-EventQueue-"), (12, "AWT-Shutdown")]);
        // Its own name first, exactly.
        assert_eq!(by_name("java", &threads), ByName::Exact(10, "java".into()));
        assert_eq!(
            by_name("AWT-EventQueue-", &threads),
            ByName::Exact(11, "AWT-EventQueue-".into())
        );
        // 16 characters: its first 15.
        assert_eq!(
            by_name("AWT-EventQueue-0", &threads),
            ByName::Truncated(11, "AWT-EventQueue-".into())
        );
        // 15 characters or fewer must match exactly.
        assert_eq!(by_name("AWT-EventQueue", &threads), ByName::None);
        assert_eq!(by_name("AWT-Shutdown-hook", &threads), ByName::None);
        // A name that truncates to another thread's name but is not it.
        assert_eq!(by_name("AWT-EventQueuX-0", &threads), ByName::None);
        // Two threads with that truncation: refused, with both TIDs.
        let two = t(&[(11, "AWT-EventQueue-"), (13, "AWT-EventQueue-")]);
        assert_eq!(
            by_name("AWT-EventQueue-1", &two),
            ByName::Ambiguous(vec![11, 13], "AWT-EventQueue-".into())
        );
        // A cut inside a character reads back lossily, as /proc shows it.
        let cut = String::from_utf8_lossy(&"abcdefghijklmné-x".as_bytes()[..15]).into_owned();
        assert_eq!(
            by_name("abcdefghijklmné-x", &t(&[(20, &cut)])),
            ByName::Truncated(20, cut.clone())
        );
    }

    #[test]
    fn thread_alive_sees_this_thread_only() {
        let pid = std::process::id();
        assert!(thread_alive(pid, pid));
        assert!(!thread_alive(pid, u32::MAX));
    }

    #[test]
    fn parses_file_mappings_once_each() {
        let text = "\
55d4c0a00000-55d4c0a01000 r--p 00000000 fe:01 123 /usr/bin/app
55d4c0a01000-55d4c0a02000 r-xp 00001000 fe:01 123 /usr/bin/app
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 [heap]
7f1000000000-7f1000100000 r-xp 00000000 fe:01 456 /usr/lib/libc.so.6
7f2000000000-7f2000001000 r-xp 00000000 fe:01 789 /tmp/gone (deleted)
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, Path::new("/usr/bin/app"));
        assert_eq!(maps[0].start, 0x55d4c0a00000);
        assert_eq!(maps[1].path, Path::new("/usr/lib/libc.so.6"));
        assert_eq!(maps[2].path, Path::new("/tmp/gone"));
        assert_eq!(
            maps[2].open_path(7),
            Path::new("/proc/7/map_files/7f2000000000-7f2000001000")
        );
    }
}
