//! The errors a user can meet. Each message says what went wrong and what to
//! do about it, on one line.
use std::path::PathBuf;

/// Everything `profiler` can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The PID names no live process.
    #[error("no process with PID {0}: check the PID with `pgrep` or `ps`")]
    NoSuchProcess(u32),
    /// The PID names a kernel thread, which runs no user code.
    #[error("PID {pid} is a kernel thread ({name}): it runs no user-space code to probe; give the PID of a user process")]
    KernelThread {
        /// The PID.
        pid: u32,
        /// Its name.
        name: String,
    },
    /// The target exited or was replaced while we were setting up.
    #[error("PID {0} exited while attaching; start it again and retry")]
    TargetGone(u32),
    /// The agent lacks a capability it needs.
    #[error(
        "missing capability {missing}: tracing needs CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN \
         (uprobe perf events need CAP_SYS_ADMIN on this kernel); run it as root, e.g. with sudo"
    )]
    MissingCapability {
        /// Names of the missing capabilities, comma-separated.
        missing: String,
    },
    /// A `--func`/`--exclude` glob does not parse.
    #[error(
        "bad pattern {pattern:?}: {reason}; use shell-style globs such as 'parse_*' or 'ns::*'"
    )]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// Why it did not parse.
        reason: String,
    },
    /// No function matched the selection.
    #[error("no function matches {what} in {where_}; run `profiler list --pid {pid}` to see the candidates")]
    NoMatch {
        /// The selection, as the user gave it.
        what: String,
        /// The binaries searched.
        where_: String,
        /// The target PID.
        pid: u32,
    },
    /// `--lib` names nothing mapped by the target.
    #[error("library {0:?} is not mapped by PID {1}; see /proc/{1}/maps for what it has loaded")]
    NoSuchLibrary(String, u32),
    /// `--lib` names no library the target's loader would find.
    #[error("no library {name:?} for {whom}: looked in {looked}; give its path (--lib /path/to/lib.so) or a name from `ldconfig -p`")]
    LibraryNotFound {
        /// As given.
        name: String,
        /// "PID N" or "the command".
        whom: String,
        /// Where it looked, in the loader's order.
        looked: String,
    },
    /// A binary could not be read or parsed as ELF.
    #[error("cannot read ELF symbols from {path}: {reason}")]
    BadElf {
        /// The binary.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// An output file or directory could not be created or written.
    #[error("cannot write {path}: {reason}; choose another --out directory")]
    Output {
        /// The path.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The output path, or a file inside it, is a symlink: refused for safety.
    #[error("refusing to write through symlink {0}: remove it or choose another --out directory")]
    Symlink(PathBuf),
    /// The eBPF object could not be loaded (the verifier log is included).
    #[error("loading the eBPF programs failed: {0}")]
    Load(String),
    /// The running kernel lacks what the programs need, or refused one
    /// of them: one line that says which and what to do
    /// (`attach::kernel`).
    #[error("{0}")]
    Kernel(String),
    /// An eBPF program or map could not be loaded, taken or attached; the
    /// library's error is kept as the source (rendered by [`chain`]).
    #[error("loading the eBPF programs failed{}", context.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
    Ebpf {
        /// What was being done, when more than loading.
        context: Option<String>,
        /// The library's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A probe could not be attached.
    #[error("attaching a probe to {func} in {binary} at {offset:#x} failed: {reason}")]
    Attach {
        /// Function name.
        func: String,
        /// Binary path.
        binary: PathBuf,
        /// File offset.
        offset: u64,
        /// The kernel's answer.
        reason: String,
    },
    /// Invalid combination or value of options.
    #[error("{0}")]
    Usage(String),
    /// Any other I/O failure, with context.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The command to profile could not be started.
    #[error("cannot run {program}: {reason}")]
    Launch {
        /// The command as given.
        program: String,
        /// Why it could not run (the OS's words).
        reason: String,
    },
}

/// Shorthand for results carrying [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps an eBPF library error ([`Error::Ebpf`]).
    pub fn ebpf(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Ebpf {
            context: None,
            source: Box::new(source),
        }
    }

    /// Wraps an eBPF library error with what we were doing ([`Error::Ebpf`]).
    pub fn ebpf_in(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Ebpf {
            context: Some(context.into()),
            source: Box::new(source),
        }
    }
}

/// Renders an error and its sources as one line, `error: source: source…`,
/// leaving out a source whose text the line already holds.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let next = e.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_renders_sources_on_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = Error::ebpf_in("attaching sched_switch", io);
        assert_eq!(
            chain(&e),
            "loading the eBPF programs failed: attaching sched_switch: denied"
        );
        let io = std::io::Error::other("no such map");
        assert_eq!(
            chain(&Error::ebpf(io)),
            "loading the eBPF programs failed: no such map"
        );
        let e = Error::io("reading /proc/1/maps", std::io::Error::other("gone"));
        assert_eq!(chain(&e), "reading /proc/1/maps: gone");
    }
}
