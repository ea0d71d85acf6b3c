//! Following a launched command through its execs to the program it runs.
//!
//! A command that is a script (`#!`, e.g. a pyenv shim), any other file
//! that is not ELF (a `binfmt_misc` format), or an exec wrapper (`env`,
//! `nice`, …) is not the program the user means: it execs that program,
//! often through more scripts and wrappers (a pyenv shim runs `env`, then
//! `bash`, which execs the `pyenv` script, whose `env` and `bash` exec
//! `pyenv-exec`, whose `env` and `bash` exec the real `python3`).
//!
//! Such a child is traced with `PTRACE_SEIZE` and `PTRACE_O_TRACEEXEC`:
//! each of its own execs stops it after the new program is loaded and
//! before its first instruction. The program it then runs
//! (`/proc/PID/exe`) is looked at: a shell or an exec wrapper is let go on
//! ([`passes_through`]); anything else is the program, left stopped while
//! the probes are attached, then let go with `PTRACE_DETACH`. Only the
//! launched process is traced, not its children (a shell's `$(…)`
//! subshells run untraced), so a script that runs its program as a child
//! instead of exec'ing it is never followed there: the caller is told after
//! [`HINT_AFTER`] and gives up at `--duration`.
//!
//! `PTRACE_O_EXITKILL` kills the child if the profiler dies while it is
//! traced. Every ptrace call is made from the thread that seized the
//! child (the session's main thread).
use std::{
    fs::File,
    io::Read,
    os::unix::{fs::OpenOptionsExt, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::ExitStatus,
    time::{Duration, Instant},
};

/// Exec wrappers: programs that exec the command they are given, in the
/// same process.
const WRAPPERS: &[&str] = &[
    "env", "nice", "nohup", "setsid", "stdbuf", "taskset", "chrt", "ionice",
];

/// Shells (and busybox, which is one where `/bin/sh` links to it): they run
/// a script, which may exec its program.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "ksh93", "mksh", "ash", "yash", "busybox",
];

/// When the child still runs a shell or wrapper this long after its first
/// exec, the caller says why it waits.
pub const HINT_AFTER: Duration = Duration::from_secs(5);

/// At most this many programs passed through are told (a script that
/// execs itself in a loop would grow the list for ever).
const MAX_PASSED: usize = 32;

fn named(path: &Path, list: &[&str]) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| list.contains(&n))
}

/// True when the file at `path` (the command as resolved, symlinks kept)
/// is not itself the program to profile: not an ELF file (a script), or an
/// exec wrapper such as `env`. A shell given as the command is profiled as
/// itself.
pub fn is_launcher(path: &Path) -> bool {
    let mut head = [0u8; 4];
    let elf = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .and_then(|mut f: File| f.read_exact(&mut head))
        .is_ok()
        && head == *b"\x7fELF";
    !elf || named(path, WRAPPERS) || std::fs::canonicalize(path).is_ok_and(|c| named(&c, WRAPPERS))
}

/// True for a program the child is let go on through: a shell running a
/// script, or an exec wrapper.
pub fn passes_through(exe: &Path) -> bool {
    named(exe, SHELLS) || named(exe, WRAPPERS)
}

/// Traces `pid` (our child, not yet exec'd) so that each of its execs
/// stops it; it is not stopped now.
pub fn seize(pid: u32) -> std::io::Result<()> {
    let opts = libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL;
    // SAFETY: PTRACE_SEIZE of our own child, with an options word as data.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            opts as libc::c_long as *mut libc::c_void,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// ptrace's request argument: `c_uint` in glibc's prototype, `c_int` in
/// musl's (the static build, `cargo xtask dist`).
#[cfg(not(target_env = "musl"))]
type PtraceRequest = libc::c_uint;
#[cfg(target_env = "musl")]
type PtraceRequest = libc::c_int;

/// Resumes the traced `pid` from a stop, delivering `sig` (0: none).
fn cont(pid: u32, req: PtraceRequest, sig: i32) {
    // SAFETY: a ptrace request on our own tracee; `data` is a signal number.
    // A tracee that died meanwhile makes it fail with ESRCH, and waitpid
    // then reports the death.
    unsafe {
        libc::ptrace(
            req,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        );
    }
}

/// Stops tracing `pid`, which runs on from where it was stopped.
pub fn detach(pid: u32) {
    cont(pid, libc::PTRACE_DETACH, 0);
}

/// Where following the child ended.
#[derive(Debug)]
pub enum Outcome {
    /// It is stopped at the exec of `exe`, before its first instruction.
    Program { exe: PathBuf },
    /// It exited (reaped: its status) before exec'ing such a program.
    Exited(ExitStatus),
    /// `deadline` passed while it still ran `exe` (a shell or wrapper);
    /// it runs on, still traced.
    Waiting(PathBuf),
}

/// Waits for the traced child `pid` to exec a program that does not pass
/// through, letting it go on through shells and wrappers (each one's path
/// is given to `passed`), and passing on every other signal it gets. Gives
/// up at `deadline`; `hint` is called once, [`HINT_AFTER`] after the first
/// exec, with the program it runs then.
pub fn follow(
    pid: u32,
    deadline: Option<Instant>,
    mut passed: impl FnMut(&Path),
    mut hint: impl FnMut(&Path),
) -> Outcome {
    let started = Instant::now();
    let mut first_exec: Option<Instant> = None;
    let mut current = PathBuf::new();
    let mut hinted = false;
    let mut nap = Duration::from_micros(200);
    let mut passes = 0;
    loop {
        let mut st = 0;
        // SAFETY: waitpid on our own child, with a valid pointer to the status.
        let rc =
            unsafe { libc::waitpid(pid as libc::pid_t, &mut st, libc::WNOHANG | libc::__WALL) };
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // Not our child any more (cannot happen: we have not reaped it).
            return Outcome::Waiting(current);
        }
        if rc <= 0 {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Outcome::Waiting(current);
            }
            if !hinted && first_exec.is_some_and(|t| now - t >= HINT_AFTER) {
                hinted = true;
                hint(&current);
            }
            // Poll fast at first (a shim execs within milliseconds), then
            // every 10 ms.
            std::thread::sleep(nap);
            if now - started > Duration::from_millis(50) {
                nap = Duration::from_millis(10);
            }
            continue;
        }
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            return Outcome::Exited(ExitStatus::from_raw(st));
        }
        if !libc::WIFSTOPPED(st) {
            continue;
        }
        let event = (st >> 16) & 0xff;
        if libc::WSTOPSIG(st) == libc::SIGTRAP && event == libc::PTRACE_EVENT_EXEC {
            first_exec.get_or_insert_with(Instant::now);
            current = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if passes_through(&current) {
                if passes < MAX_PASSED {
                    passes += 1;
                    passed(&current);
                }
                cont(pid, libc::PTRACE_CONT, 0);
                continue;
            }
            return Outcome::Program { exe: current };
        }
        if event == libc::PTRACE_EVENT_STOP {
            // A group stop (SIGSTOP, SIGTSTP): it stays stopped until
            // continued, as it would untraced.
            cont(pid, libc::PTRACE_LISTEN, 0);
            continue;
        }
        // Any other signal is delivered as it would be untraced.
        cont(pid, libc::PTRACE_CONT, libc::WSTOPSIG(st));
    }
}

/// The thread name the kernel gives a program exec'd from `path`: its file
/// name, cut to 15 bytes (`TASK_COMM_LEN` - 1).
pub fn comm_of(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default();
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name);
    String::from_utf8_lossy(&bytes[..bytes.len().min(15)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_are_scripts_and_wrappers() {
        let dir = std::env::temp_dir().join(format!("profiler-chain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("run");
        std::fs::write(&script, "#!/bin/sh\nexec true\n").unwrap();
        assert!(is_launcher(&script));
        assert!(is_launcher(Path::new("/usr/bin/env")));
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        assert!(
            !is_launcher(&sh),
            "a shell given as the command is profiled"
        );
        assert!(!is_launcher(&std::env::current_exe().unwrap()));
        assert!(passes_through(&sh) && passes_through(Path::new("/usr/bin/env")));
        assert!(!passes_through(Path::new("/usr/bin/python3.11")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn comm_is_the_file_name_cut_to_15_bytes() {
        assert_eq!(comm_of(Path::new("/usr/bin/python3")), "python3");
        assert_eq!(
            comm_of(Path::new("/x/a-very-long-program-name")),
            "a-very-long-pro"
        );
    }
}
