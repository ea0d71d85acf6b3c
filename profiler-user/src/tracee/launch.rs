//! Runs a command under the profiler. [`Launched::spawn`] forks a child
//! that waits on a pipe before exec; probes are attached (scoped to its
//! PID, by binary path and file offset) and then [`Launched::release`] lets
//! it exec, so the probes are live before the program's first instruction.
//! A script or exec wrapper (`exec_chain.rs`) is instead let exec at once
//! and followed ([`Launched::follow`]) to the program it runs, which is
//! stopped at its exec until [`Launched::release`].
//!
//! At the end of a session that the command outlives, [`Launched::stop`]
//! ends it (SIGTERM, then SIGKILL after a grace period), unless it is to
//! keep running: then it was spawned without `PR_SET_PDEATHSIG`.
//!
//! The child, before exec: resets signal handlers and the signal mask,
//! drops to the invoking user under sudo (supplementary groups, gid, uid,
//! and `HOME`/`USER`/`LOGNAME` from their passwd entry), and asks to be
//! killed when the thread that spawned it exits (`PR_SET_PDEATHSIG`: spawn
//! from a thread that lives as long as the session, e.g. the main thread).
//! A failed exec is reported back through a close-on-exec pipe.
//!
//! Everything the child needs is prepared before `fork`; between `fork`
//! and `exec` it calls only async-signal-safe functions.
use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::Read,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::PermissionsExt, process::ExitStatusExt},
    },
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::{
        atomic::{AtomicI32, AtomicU64, Ordering},
        Mutex, Once, OnceLock,
    },
    time::{Duration, Instant},
};

use super::exec_chain::{self, Outcome};
use crate::{Error, Result};

/// How long a command is given to exit after the signal that ends it,
/// before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// glibc's `execvp` search path when `PATH` is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

fn cannot_run(program: &OsStr, reason: impl Into<String>) -> Error {
    Error::Launch {
        program: program.to_string_lossy().into_owned(),
        reason: reason.into(),
    }
}

/// `Some(true)` for an executable regular file, `Some(false)` for one
/// without execute permission, `None` when there is no such file.
fn executable(path: &Path) -> Option<bool> {
    let m = std::fs::metadata(path).ok()?;
    Some(m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `p` made absolute against the current directory, symlinks kept.
fn absolute(p: PathBuf) -> PathBuf {
    std::path::absolute(&p).unwrap_or(p)
}

/// Finds the program `argv0` names, as `execvp` would: a name with a `/` is
/// used as is; otherwise each `PATH` directory is tried in order. The
/// result is absolute (symlinks are not resolved), ready for attaching
/// probes by path.
pub fn resolve_program(argv0: &OsStr) -> Result<PathBuf> {
    if argv0.is_empty() {
        return Err(Error::Usage("no command given to run".into()));
    }
    let denied = || cannot_run(argv0, strerror(libc::EACCES));
    if argv0.as_bytes().contains(&b'/') {
        let p = PathBuf::from(argv0);
        return match executable(&p) {
            Some(true) => Ok(absolute(p)),
            Some(false) => Err(denied()),
            None => Err(cannot_run(argv0, strerror(libc::ENOENT))),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    let mut seen_denied = false;
    for dir in path.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() { b"." as &[u8] } else { dir };
        let cand = Path::new(OsStr::from_bytes(dir)).join(argv0);
        match executable(&cand) {
            Some(true) => return Ok(absolute(cand)),
            Some(false) => seen_denied = true,
            None => {}
        }
    }
    Err(if seen_denied {
        denied()
    } else {
        cannot_run(argv0, strerror(libc::ENOENT))
    })
}

/// The user to run as: `SUDO_UID`/`SUDO_GID` when running as root.
pub fn invoking_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    Some((uid, gid))
}

/// The user's name and home directory, from the passwd database.
fn passwd_entry(uid: u32) -> Option<(CString, OsString)> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: libc::passwd is plain data (integers and pointers);
        // all-zero is a valid value, filled in by getpwuid_r below.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `pw` and `out` are
        // locals and `buf` holds `buf.len()` writable bytes.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || out.is_null() {
            return None;
        }
        // SAFETY: getpwuid_r succeeded, so pw_name points to a
        // NUL-terminated string inside `buf`, which outlives the borrow.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_owned();
        // SAFETY: likewise for pw_dir.
        let home = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
        return Some((name, OsStr::from_bytes(home.to_bytes()).to_owned()));
    }
}

/// The user's supplementary groups (always including `gid`).
fn group_list(name: &CString, gid: u32) -> Vec<libc::gid_t> {
    let mut groups = vec![0 as libc::gid_t; 64];
    for _ in 0..8 {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `name` is NUL-terminated, `groups` holds `n` writable entries.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
    vec![gid]
}

fn cstring(s: &[u8]) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Usage("the command line contains a NUL byte".into()))
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io(
            "creating a pipe",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Step codes the child reports with its errno.
const STEP_SETGROUPS: u8 = 1;
const STEP_SETGID: u8 = 2;
const STEP_SETUID: u8 = 3;
const STEP_EXEC: u8 = 4;

/// Everything the child touches, built before `fork`.
struct Plan {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    user: Option<(u32, u32, Vec<libc::gid_t>)>,
    parent: libc::pid_t,
    gate: libc::c_int,
    errors: libc::c_int,
    /// The parent's ends, to close (the gate's EOF must not be held open).
    parent_ends: [libc::c_int; 2],
    /// Ask to be killed with the profiler (not with `--keep-running`).
    pdeathsig: bool,
}

/// Closes every descriptor from 3 up except `keep` (sudo does the same),
/// so no other launch's pipe ends are held open; at least `also` is closed.
unsafe fn close_others(keep: [libc::c_int; 2], also: [libc::c_int; 2]) {
    let (lo, hi) = (keep[0].min(keep[1]), keep[0].max(keep[1]));
    let mut ok = true;
    for (a, b) in [(3, lo - 1), (lo + 1, hi - 1), (hi + 1, libc::c_int::MAX)] {
        let a = a.max(3);
        if a <= b {
            let (a, b) = (a as libc::c_long, b as libc::c_long);
            ok &= libc::syscall(libc::SYS_close_range, a, b, 0 as libc::c_long) == 0;
        }
    }
    if !ok {
        for fd in also {
            libc::close(fd);
        }
    }
}

/// The child between `fork` and `exec`: async-signal-safe calls only.
unsafe fn child(p: &Plan) -> ! {
    close_others([p.gate, p.errors], p.parent_ends);
    let fail = |step: u8| -> ! {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let e = errno.to_ne_bytes();
        let msg = [step, e[0], e[1], e[2], e[3]];
        libc::write(p.errors, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    };
    for sig in 1..libc::SIGRTMAX() {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction != libc::SIG_IGN
            && old.sa_sigaction != libc::SIG_DFL
        {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    if let Some((uid, gid, groups)) = &p.user {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            fail(STEP_SETGROUPS);
        }
        if libc::setgid(*gid) != 0 {
            fail(STEP_SETGID);
        }
        if libc::setuid(*uid) != 0 {
            fail(STEP_SETUID);
        }
    }
    // After the credential change, which would clear it.
    if p.pdeathsig {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    }
    if libc::getppid() != p.parent {
        libc::_exit(127);
    }
    let mut b = 0u8;
    loop {
        match libc::read(p.gate, (&mut b as *mut u8).cast(), 1) {
            1 => break,
            -1 if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => libc::_exit(127), // the parent gave up without releasing
        }
    }
    libc::execve(p.path.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
    fail(STEP_EXEC)
}

/// A child process waiting to exec, then running.
#[derive(Debug)]
pub struct Launched {
    /// The child's PID (also the program's, after exec).
    pub pid: u32,
    /// The resolved command path (a script or wrapper when `follows`).
    pub program: PathBuf,
    /// The command is a script or exec wrapper, followed through its
    /// execs to the program it runs ([`Launched::follow`]).
    pub follows: bool,
    /// The program to probe: `program`, or where following it ended.
    exe: Mutex<PathBuf>,
    /// The programs passed through on the way (followed only).
    passed: Mutex<Vec<PathBuf>>,
    /// Stopped at the program's exec, traced, until released.
    held: Mutex<bool>,
    /// The program's thread name, read at its exec (followed only).
    comm: Mutex<Option<String>>,
    argv0: OsString,
    user: Option<(u32, u32)>,
    gate: Mutex<Option<OwnedFd>>,
    errors: Mutex<Option<OwnedFd>>,
    pidfd: Option<OwnedFd>,
    exec_ns: OnceLock<u64>,
    status: Mutex<Option<ExitStatus>>,
}

/// What [`enable_perf_maps`] adds to `NODE_OPTIONS` (`--perf-basic-prof`
/// itself would also write a V8 log file into the command's directory).
pub const NODE_PERF_OPTIONS: &str =
    "--perf-basic-prof-only-functions --interpreted-frames-native-stack";

/// Asks JIT runtimes in the launched command to write `/tmp/perf-PID.map`,
/// so their JIT frames get names: CPython 3.12+ (`PYTHONPERFSUPPORT=1`) and
/// Node (`NODE_OPTIONS`). Settings the user made are kept.
fn enable_perf_maps(env: &mut Vec<(OsString, OsString)>) {
    if !env.iter().any(|(k, _)| k == "PYTHONPERFSUPPORT") {
        env.push(("PYTHONPERFSUPPORT".into(), "1".into()));
    }
    match env.iter_mut().find(|(k, _)| k == "NODE_OPTIONS") {
        Some((_, v)) if v.to_string_lossy().contains("perf-basic-prof") => {}
        Some((_, v)) => {
            v.push(" ");
            v.push(NODE_PERF_OPTIONS);
        }
        None => env.push(("NODE_OPTIONS".into(), NODE_PERF_OPTIONS.into())),
    }
}

impl Launched {
    /// Forks `argv` as a child that waits for [`Launched::release`] (or
    /// [`Launched::follow`]), running as the invoking user under sudo. It
    /// is killed when the profiler exits, unless it is to `outlive` it.
    pub fn spawn(argv: &[OsString], outlive: bool) -> Result<Launched> {
        Self::spawn_as(argv, invoking_user(), outlive)
    }

    /// Like [`Launched::spawn`], running as `user` (uid, gid) if given.
    pub fn spawn_as(
        argv: &[OsString],
        user: Option<(u32, u32)>,
        outlive: bool,
    ) -> Result<Launched> {
        let argv0 = argv.first().cloned().unwrap_or_default();
        let program = resolve_program(&argv0)?;
        let follows = exec_chain::is_launcher(&program);
        let args = argv
            .iter()
            .map(|a| cstring(a.as_bytes()))
            .collect::<Result<Vec<_>>>()?;
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        let mut plan_user = None;
        if let Some((uid, gid)) = user {
            let groups = match passwd_entry(uid) {
                Some((name, home)) => {
                    let name_os = OsStr::from_bytes(name.to_bytes()).to_owned();
                    env.retain(|(k, _)| !matches!(k.as_bytes(), b"HOME" | b"USER" | b"LOGNAME"));
                    env.push(("HOME".into(), home));
                    env.push(("USER".into(), name_os.clone()));
                    env.push(("LOGNAME".into(), name_os));
                    group_list(&name, gid)
                }
                None => vec![gid],
            };
            plan_user = Some((uid, gid, groups));
        }
        enable_perf_maps(&mut env);
        let env = env
            .iter()
            .map(|(k, v)| cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<Result<Vec<_>>>()?;
        let ptrs = |v: &[CString]| {
            let mut p: Vec<_> = v.iter().map(|c| c.as_ptr()).collect();
            p.push(std::ptr::null());
            p
        };
        let (gate_r, gate_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let plan = Plan {
            path: cstring(program.as_os_str().as_bytes())?,
            argv: ptrs(&args),
            envp: ptrs(&env),
            user: plan_user,
            // SAFETY: getpid has no preconditions and cannot fail.
            parent: unsafe { libc::getpid() },
            gate: gate_r.as_raw_fd(),
            errors: err_w.as_raw_fd(),
            parent_ends: [gate_w.as_raw_fd(), err_r.as_raw_fd()],
            pdeathsig: !outlive,
        };
        // Block signals across fork so no handler runs in the child before
        // it resets them.
        // SAFETY: fork in a process with threads: the child runs only
        // `child`, which calls async-signal-safe functions and execs or
        // exits; the signal masks are plain sigset_t values on our stack.
        let pid = unsafe {
            let (mut all, mut old): (libc::sigset_t, libc::sigset_t) = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::fork();
            if pid == 0 {
                child(&plan);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            pid
        };
        if pid < 0 {
            return Err(Error::io("fork", std::io::Error::last_os_error()));
        }
        drop((gate_r, err_w));
        let pidfd =
            // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
            unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
        let launched = Launched {
            pid: pid as u32,
            exe: Mutex::new(program.clone()),
            program,
            follows,
            passed: Mutex::new(Vec::new()),
            held: Mutex::new(false),
            comm: Mutex::new(None),
            argv0,
            user,
            gate: Mutex::new(Some(gate_w)),
            errors: Mutex::new(Some(err_r)),
            // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
            pidfd: (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as i32) }),
            exec_ns: OnceLock::new(),
            status: Mutex::new(None),
        };
        if follows {
            // Before the gate opens: its first exec already stops it.
            if let Err(e) = exec_chain::seize(launched.pid) {
                return Err(cannot_run(
                    &launched.argv0,
                    format!(
                        "it is a script or exec wrapper, followed through its execs with ptrace, which failed: {} \
                         (is the profiler itself being traced?)",
                        strerror(e.raw_os_error().unwrap_or(0))
                    ),
                ));
            }
        }
        Ok(launched)
    }

    /// The program to probe: the command, or (followed) the program it
    /// exec'd in the end.
    pub fn exe(&self) -> PathBuf {
        self.exe.lock().unwrap().clone()
    }

    /// The thread name the program runs under (the kernel's, from the
    /// file name it was exec'd by, as `/proc/PID/comm` shows after exec).
    pub fn comm(&self) -> String {
        self.comm
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| exec_chain::comm_of(&self.exe()))
    }

    /// `NAME (PID N)`, for messages.
    pub fn describe(&self) -> String {
        format!("{} (PID {})", self.comm(), self.pid)
    }

    /// The programs a followed command ran before the one probed.
    pub fn passed_through(&self) -> Vec<PathBuf> {
        self.passed.lock().unwrap().clone()
    }

    /// A script or exec wrapper ([`Launched::follows`]): lets it exec and
    /// follows it to the program it runs, which is left stopped before its
    /// first instruction until [`Launched::release`]. Gives up at
    /// `deadline` (`--duration` from now), then stops the command. Does
    /// nothing for a program launched directly.
    pub fn follow(&self, deadline: Option<Instant>) -> Result<()> {
        if !self.follows {
            return Ok(());
        }
        let Some(gate) = self.gate.lock().unwrap().take() else {
            return Ok(());
        };
        // SAFETY: `gate` is an open pipe end and the buffer holds the one byte written.
        unsafe { libc::write(gate.as_raw_fd(), b"g".as_ptr().cast(), 1) };
        drop(gate);
        let pid = self.pid;
        let outcome = exec_chain::follow(
            pid,
            deadline,
            |exe| self.passed.lock().unwrap().push(exe.to_path_buf()),
            |exe| {
                eprintln!(
                    "profiler: PID {pid} still runs {} {} s after its first exec; waiting for it to exec \
                     a program that is not a shell or exec wrapper (a script's own `exec` is followed, \
                     not the processes it starts)",
                    exe.display(),
                    exec_chain::HINT_AFTER.as_secs()
                )
            },
        );
        let chain = || {
            let passed = self.passed_through();
            match passed.is_empty() {
                true => String::new(),
                false => format!(
                    " (it ran {})",
                    passed
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", then ")
                ),
            }
        };
        match outcome {
            Outcome::Program { exe } => {
                *self.comm.lock().unwrap() =
                    std::fs::read_to_string(format!("/proc/{}/comm", self.pid))
                        .ok()
                        .map(|s| s.trim_end_matches('\n').to_string());
                *self.exe.lock().unwrap() = exe;
                *self.held.lock().unwrap() = true;
                Ok(())
            }
            Outcome::Exited(status) => {
                *self.status.lock().unwrap() = Some(status);
                if let Some(e) = self.exec_error() {
                    return Err(e);
                }
                let why = match status.code() {
                    // The shell's and env's codes for a program they could
                    // not find or run: they said which, above.
                    Some(126 | 127) => "it could not run the program it was given (see its message above)",
                    _ => "a script is followed through its own `exec` only: end it with `exec PROGRAM …`",
                };
                Err(cannot_run(
                    &self.argv0,
                    format!(
                        "it {} before it exec'd a program other than a shell or exec wrapper{}; {why}",
                        describe_status(status),
                        chain()
                    ),
                ))
            }
            Outcome::Waiting(exe) => {
                self.untrace();
                let _ = self.stop(Some(libc::SIGTERM), STOP_GRACE);
                Err(cannot_run(
                    &self.argv0,
                    format!(
                        "it still ran {} when --duration ended{}, and never exec'd a program other than \
                         a shell or exec wrapper: a script is followed through its own `exec` only: end it \
                         with `exec PROGRAM …`",
                        exe.display(),
                        chain()
                    ),
                ))
            }
        }
    }

    /// Ends tracing of a followed child that is running (not stopped):
    /// interrupts it, then detaches, passing on a signal it was stopped for.
    fn untrace(&self) {
        let pid = self.pid as libc::pid_t;
        // SAFETY: PTRACE_INTERRUPT of our own tracee, no address or data.
        unsafe {
            libc::ptrace(
                libc::PTRACE_INTERRUPT,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        loop {
            let mut st = 0;
            // SAFETY: waitpid on our own child, with a valid pointer to the status.
            let rc = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
            if rc < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                *self.status.lock().unwrap() = Some(ExitStatus::from_raw(st));
                return;
            }
            if libc::WIFSTOPPED(st) {
                let event = (st >> 16) & 0xff;
                let sig = match event {
                    0 => libc::WSTOPSIG(st),
                    _ => 0,
                };
                // SAFETY: PTRACE_DETACH of our stopped tracee; data is a signal number.
                unsafe {
                    libc::ptrace(
                        libc::PTRACE_DETACH,
                        pid,
                        std::ptr::null_mut::<libc::c_void>(),
                        sig as libc::c_long as *mut libc::c_void,
                    )
                };
                return;
            }
        }
    }

    /// The exec failure the child reported, if it did (read once it has
    /// exec'd or exited, so never blocks long).
    fn exec_error(&self) -> Option<Error> {
        let errors = self.errors.lock().unwrap().take()?;
        let mut msg = Vec::new();
        let _ = File::from(errors).read_to_end(&mut msg);
        if msg.len() < 5 {
            return None;
        }
        let errno = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
        let reason = match (msg[0], self.user) {
            (STEP_EXEC, _) => strerror(errno),
            (step, Some((uid, gid))) => {
                let call = ["setgroups", "setgid", "setuid"][(step as usize).clamp(1, 3) - 1];
                format!(
                    "dropping to uid {uid} gid {gid} failed at {call}: {}",
                    strerror(errno)
                )
            }
            (_, None) => strerror(errno),
        };
        Some(cannot_run(&self.argv0, reason))
    }

    /// Lets the child exec, and returns once it has (or failed to: then the
    /// child is reaped and the error says why). Calling it again does
    /// nothing.
    /// A followed command stopped at its program's exec is let go on
    /// (detached).
    pub fn release(&self) -> Result<()> {
        if self.follows && self.gate.lock().unwrap().is_some() {
            self.follow(None)?;
        }
        if std::mem::take(&mut *self.held.lock().unwrap()) {
            let _ = self.exec_ns.set(crate::clock::monotonic_ns());
            exec_chain::detach(self.pid);
            return Ok(());
        }
        let Some(gate) = self.gate.lock().unwrap().take() else {
            return Ok(());
        };
        let _ = self.exec_ns.set(crate::clock::monotonic_ns());
        // A child that already failed has closed its end: EPIPE, ignored.
        // SAFETY: `gate` is an open pipe end and the buffer holds the one byte written.
        unsafe { libc::write(gate.as_raw_fd(), b"g".as_ptr().cast(), 1) };
        drop(gate);
        match self.exec_error() {
            None => Ok(()),
            Some(e) => {
                let _ = self.wait();
                Err(e)
            }
        }
    }

    /// `CLOCK_MONOTONIC` ns taken at [`Launched::release`], just before the
    /// child was let go (the same clock as `bpf_ktime_get_ns`).
    pub fn exec_time_ns(&self) -> Option<u64> {
        self.exec_ns.get().copied()
    }

    /// Sends `sig` to the child. Safe after it exited and was reaped: a
    /// pidfd is used where the kernel has them, so a recycled PID is never
    /// signalled.
    pub fn forward_signal(&self, sig: i32) -> Result<()> {
        let rc = match &self.pidfd {
            // SAFETY: pidfd_send_signal on our own open pidfd, with no siginfo.
            Some(fd) => unsafe {
                let (fd, sig) = (fd.as_raw_fd() as libc::c_long, sig as libc::c_long);
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    sig,
                    0 as libc::c_long,
                    0 as libc::c_long,
                ) as i32
            },
            None if self.status.lock().unwrap().is_some() => return Ok(()),
            // SAFETY: kill(2) on our child, only while it has not been reaped.
            None => unsafe { libc::kill(self.pid as libc::pid_t, sig) },
        };
        let err = std::io::Error::last_os_error();
        if rc != 0 && err.raw_os_error() != Some(libc::ESRCH) {
            return Err(Error::io(format!("signalling PID {}", self.pid), err));
        }
        Ok(())
    }

    fn reap(&self, flags: libc::c_int) -> Result<Option<ExitStatus>> {
        if let Some(s) = *self.status.lock().unwrap() {
            return Ok(Some(s));
        }
        let mut st = 0;
        loop {
            // SAFETY: waitpid on our own child, with a valid pointer to the status.
            let rc = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut st, flags) };
            if rc == 0 {
                return Ok(None);
            }
            if rc > 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::io(format!("waiting for PID {}", self.pid), err));
            }
        }
        let s = ExitStatus::from_raw(st);
        *self.status.lock().unwrap() = Some(s);
        Ok(Some(s))
    }

    /// Blocks until the child exits; its status (cached: safe to call again).
    pub fn wait(&self) -> Result<ExitStatus> {
        self.reap(0)
            .map(|s| s.expect("blocking waitpid returns a status"))
    }

    /// The child's status if it has exited, without blocking.
    pub fn try_wait(&self) -> Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits up to `t` for the child to exit (its pidfd turning readable).
    fn wait_exit(&self, t: Duration) {
        match &self.pidfd {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = t.as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: poll on one pollfd of our open pidfd.
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
            None => std::thread::sleep(t.min(Duration::from_millis(10))),
        }
    }

    /// Ends the command at the end of a session it outlives: sends `first`
    /// (None: it got the terminal's SIGINT already, as the profiler did),
    /// then SIGKILL if it has not exited `grace` later, or at once on
    /// another SIGINT or SIGTERM to the profiler (once
    /// [`watch_stop_signals`] was called). Each step is one line on
    /// stderr. Returns its exit status.
    pub fn stop(&self, first: Option<i32>, grace: Duration) -> Result<ExitStatus> {
        if let Some(s) = self.try_wait()? {
            return Ok(s);
        }
        let who = self.describe();
        let secs = fmt_secs(grace);
        match first {
            Some(sig) => {
                eprintln!(
                    "profiler: stopping {who}: {}; SIGKILL in {secs} if it does not exit",
                    signal_name(sig)
                );
                self.forward_signal(sig)?;
            }
            None => eprintln!(
                "profiler: {who} got the terminal's SIGINT too; SIGKILL in {secs} if it does not exit"
            ),
        }
        let seen = STOP_SIGNALS.load(Ordering::Relaxed);
        let end = Instant::now() + grace;
        let status = loop {
            if let Some(s) = self.try_wait()? {
                break s;
            }
            let now = Instant::now();
            let again = STOP_SIGNALS.load(Ordering::Relaxed) != seen;
            if again || now >= end {
                match again {
                    true => eprintln!("profiler: signalled again: SIGKILL to {who} now"),
                    false => eprintln!("profiler: {who} did not exit within {secs}: SIGKILL"),
                }
                self.forward_signal(libc::SIGKILL)?;
                break self.wait()?;
            }
            self.wait_exit((end - now).min(Duration::from_millis(50)));
        };
        eprintln!("profiler: {who} {}", describe_status(status));
        Ok(status)
    }
}

/// SIGINTs and SIGTERMs the profiler got since [`watch_stop_signals`].
static STOP_SIGNALS: AtomicU64 = AtomicU64::new(0);
/// `si_code` of the last SIGINT (`SI_KERNEL`: sent by a terminal, to its
/// whole foreground process group, the command included).
static LAST_SIGINT_CODE: AtomicI32 = AtomicI32::new(0);
/// `si_code` of a signal the kernel sent, as a terminal's Ctrl-C is.
const SI_KERNEL: i32 = 0x80;

/// Counts SIGINT and SIGTERM alongside tokio's handling of them (which
/// ends the session, then swallows them), and notes where each SIGINT came
/// from. Call before the session waits for them: until then they kill the
/// profiler (and with it the command).
pub fn watch_stop_signals() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the action only stores to atomics, which is
            // async-signal-safe.
            let _ = unsafe {
                signal_hook_registry::register_sigaction(sig, move |info: &libc::siginfo_t| {
                    if sig == libc::SIGINT {
                        LAST_SIGINT_CODE.store(info.si_code, Ordering::Relaxed);
                    }
                    STOP_SIGNALS.fetch_add(1, Ordering::Relaxed);
                })
            };
        }
    });
}

/// True when the last SIGINT came from a terminal (Ctrl-C): the command,
/// in the profiler's process group, got it too.
pub fn sigint_from_terminal() -> bool {
    LAST_SIGINT_CODE.load(Ordering::Relaxed) == SI_KERNEL
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}

fn fmt_secs(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{} s", d.as_secs()),
        _ => format!("{:.1} s", d.as_secs_f64()),
    }
}

/// `exited with status N` or `was killed by SIGTERM`.
pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_name(s)),
        _ => format!("ended ({status})"),
    }
}

impl Drop for Launched {
    /// A child never released is let go to `_exit` (its gate reads EOF)
    /// and reaped, one held at its program's exec is killed and reaped; a
    /// running one is left alone (it dies with us anyway, unless it is to
    /// outlive us).
    fn drop(&mut self) {
        if std::mem::take(self.held.get_mut().unwrap()) {
            let _ = self.forward_signal(libc::SIGKILL);
            let _ = self.wait();
        } else if self.gate.get_mut().unwrap().take().is_some() {
            let _ = self.wait();
        } else {
            let _ = self.try_wait();
        }
    }
}

/// The shell's convention: the exit code, or 128 + the killing signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("profiler-launch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn exit_code_is_passed_through() {
        let l = Launched::spawn_as(&argv(&["/bin/sh", "-c", "exit 7"]), None, false).unwrap();
        l.release().unwrap();
        assert!(l.exec_time_ns().is_some());
        assert_eq!(exit_code(l.wait().unwrap()), 7);
        assert_eq!(exit_code(l.wait().unwrap()), 7, "cached");
    }

    #[test]
    fn perf_maps_are_asked_for_without_overriding_the_user() {
        let mut env = vec![("NODE_OPTIONS".into(), "--max-old-space-size=100".into())];
        enable_perf_maps(&mut env);
        assert!(env.contains(&("PYTHONPERFSUPPORT".into(), "1".into())));
        assert!(env.contains(&(
            "NODE_OPTIONS".into(),
            format!("--max-old-space-size=100 {NODE_PERF_OPTIONS}").into()
        )));
        let mut env = vec![("PYTHONPERFSUPPORT".into(), "0".into())];
        enable_perf_maps(&mut env);
        assert!(env.contains(&("PYTHONPERFSUPPORT".into(), "0".into())));
    }

    #[test]
    fn resolves_like_execvp() {
        let sh = resolve_program(OsStr::new("sh")).unwrap();
        let up = std::env::current_dir().unwrap().components().count() - 1;
        let rel = format!("{}bin/sh", "../".repeat(up));
        let dot = resolve_program(OsStr::new(&rel)).unwrap();
        assert!(dot.is_absolute() && dot.ends_with("bin/sh"), "{dot:?}");
        assert!(sh.ends_with("sh") && sh.is_absolute(), "{sh:?}");
        let e = resolve_program(OsStr::new("no-such-command-xyz")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot run no-such-command-xyz: No such file or directory"
        );
        let e = Launched::spawn_as(&argv(&["./no/such/prog"]), None, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot run ./no/such/prog: No such file or directory"
        );
        assert!(resolve_program(OsStr::new("")).is_err());
    }

    #[test]
    fn exec_failure_is_reported_by_the_child() {
        let bad = tmp("not-a-program");
        std::fs::write(&bad, b"\x01\x02 garbage, no shebang").unwrap();
        std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
        let l = Launched::spawn_as(&[bad.clone().into()], None, false).unwrap();
        let e = l.release().unwrap_err().to_string();
        assert_eq!(
            e,
            format!("cannot run {}: Exec format error", bad.display())
        );
        assert_eq!(exit_code(l.try_wait().unwrap().unwrap()), 127);
        std::fs::remove_file(&bad).unwrap();
    }

    #[test]
    fn child_waits_for_release() {
        let here = resolve_program(OsStr::new("./Cargo.toml"));
        assert!(here.is_err(), "not executable");
        let f = tmp("ran");
        let cmd = format!("echo ran > {}", f.display());
        let l = Launched::spawn_as(&argv(&["sh", "-c", &cmd]), None, false).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!f.exists(), "the child ran before release");
        assert!(l.try_wait().unwrap().is_none());
        l.release().unwrap();
        assert!(l.wait().unwrap().success());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "ran\n");
        std::fs::remove_file(&f).unwrap();
    }

    #[test]
    fn dropping_unreleased_child_reaps_it() {
        let l = Launched::spawn_as(&argv(&["/bin/sh", "-c", "exit 0"]), None, false).unwrap();
        let pid = l.pid as libc::pid_t;
        drop(l);
        // SAFETY: kill with signal 0 only checks whether the process exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "child still exists");
    }

    #[test]
    fn signals_are_forwarded() {
        let l = Launched::spawn_as(&argv(&["/bin/sleep", "10"]), None, false).unwrap();
        l.release().unwrap();
        l.forward_signal(libc::SIGTERM).unwrap();
        assert_eq!(exit_code(l.wait().unwrap()), 128 + libc::SIGTERM);
        l.forward_signal(libc::SIGTERM).unwrap(); // reaped: harmless
    }

    fn script(name: &str, text: &str) -> PathBuf {
        let p = tmp(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn a_script_is_followed_to_the_program_it_execs() {
        // env, then sh (the script), then env again, then sleep: the
        // program is sleep, stopped at its exec until released.
        let inner = script("inner", "#!/bin/sh\nexec /usr/bin/env sleep 0.3\n");
        let outer = script(
            "outer",
            &format!("#!/usr/bin/env sh\nexec {}\n", inner.display()),
        );
        let l = Launched::spawn_as(&[outer.clone().into()], None, false).unwrap();
        assert!(l.follows);
        l.follow(None).unwrap();
        assert!(l.exe().ends_with("sleep"), "{:?}", l.exe());
        assert_eq!(l.comm(), "sleep");
        let passed: Vec<String> = l
            .passed_through()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(passed.len(), 4, "env, sh, sh, env: {passed:?}");
        assert_eq!((passed[0].as_str(), passed[3].as_str()), ("env", "env"));
        // Held: still stopped a while later.
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert!(l.try_wait().unwrap().is_none(), "ran before release");
        l.release().unwrap();
        assert_eq!(exit_code(l.wait().unwrap()), 0);
        for p in [inner, outer] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_script_that_exits_without_exec_is_an_error() {
        let s = script("exits", "#!/bin/sh\nexit 4\n");
        let l = Launched::spawn_as(&[s.clone().into()], None, false).unwrap();
        let e = l.follow(None).unwrap_err().to_string();
        assert!(e.contains("exited with status 4 before it exec'd"), "{e}");
        assert_eq!(exit_code(l.try_wait().unwrap().unwrap()), 4);
        let bad = script("bad-interp", "#!/no/such/interpreter\n");
        let l = Launched::spawn_as(&[bad.clone().into()], None, false).unwrap();
        let e = l.follow(None).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("cannot run {}: No such file or directory", bad.display())
        );
        for p in [s, bad] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_script_that_never_execs_is_given_up_at_the_deadline() {
        let s = script("loops", "#!/bin/sh\nsleep 30\n");
        let l = Launched::spawn_as(&[s.clone().into()], None, false).unwrap();
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(300);
        let e = l.follow(Some(deadline)).unwrap_err().to_string();
        assert!(e.contains("when --duration ended"), "{e}");
        // Stopped with SIGTERM (sh dies of it at once), untraced.
        assert_eq!(
            exit_code(l.try_wait().unwrap().unwrap()),
            128 + libc::SIGTERM
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        std::fs::remove_file(s).unwrap();
    }

    #[test]
    fn stop_sends_sigterm_then_sigkill_after_the_grace() {
        let l = Launched::spawn_as(&argv(&["/bin/sleep", "10"]), None, false).unwrap();
        l.release().unwrap();
        let st = l.stop(Some(libc::SIGTERM), Duration::from_secs(3)).unwrap();
        assert_eq!(exit_code(st), 128 + libc::SIGTERM);
        // SIGTERM ignored (and the ignoring kept across exec): SIGKILL.
        let cmd = "trap '' TERM; exec /bin/sleep 10";
        let l = Launched::spawn_as(&argv(&["/bin/sh", "-c", cmd]), None, false).unwrap();
        l.release().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let st = l
            .stop(Some(libc::SIGTERM), Duration::from_millis(500))
            .unwrap();
        let took = t0.elapsed();
        assert_eq!(exit_code(st), 128 + libc::SIGKILL);
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
            "{took:?}"
        );
    }

    #[test]
    fn drops_to_the_given_user() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 || passwd_entry(65534).is_none() {
            return; // needs root and a `nobody` user
        }
        let check = r#"test "$(id -u)" = 65534 && test "$(id -g)" = 65534 && test "$(id -un)" = "$USER" && test "$(id -G)" = "$(id -G "$USER")""#;
        let l = Launched::spawn_as(
            &argv(&["/bin/sh", "-c", check]),
            Some((65534, 65534)),
            false,
        )
        .unwrap();
        l.release().unwrap();
        assert_eq!(exit_code(l.wait().unwrap()), 0);
    }
}
