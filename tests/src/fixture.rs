//! Guards for a fixture process and for a temporary directory.
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// A running fixture, stopped at its `ready` handshake. Killed on drop.
pub struct Fixture {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// The fixture's PID, as it printed it.
    pub pid: u32,
    /// Absolute path of the fixture's executable.
    pub exe: PathBuf,
}

impl Fixture {
    /// Spawns `exe args…` and waits for its `ready <pid>` line.
    pub fn spawn(exe: &Path, args: &[&str]) -> Fixture {
        Fixture::spawn_env(exe, args, &[])
    }

    /// [`Fixture::spawn`] with `env` added to its environment.
    pub fn spawn_env(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Fixture {
        let mut cmd = Command::new(exe);
        cmd.args(args).envs(env.iter().copied());
        let fx = Fixture::spawn_cmd(cmd, exe);
        assert_eq!(fx.pid, fx.child.id(), "fixture handshake");
        fx
    }

    /// Runs `cmd`, which ends up running the fixture `exe` (itself, or
    /// through a wrapper such as `unshare --pid --fork`), and waits for its
    /// `ready <pid>` line. The PID printed may be in another PID namespace:
    /// [`Fixture::pid`] is then the host PID of the descendant of `cmd`
    /// whose innermost PID it is.
    pub fn spawn_cmd(mut cmd: Command, exe: &Path) -> Fixture {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut fx = Fixture {
            pid: child.id(),
            child,
            stdin,
            lines,
            exe: exe.to_path_buf(),
        };
        // Under emulation a runtime's first start reads its files through
        // the guest's shared folders and translates its code: Debian's
        // python3 importing asyncio took over 10 s there.
        let ready = fx.line(Duration::from_secs(if crate::emulated() { 90 } else { 10 }));
        let printed: u32 = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("fixture handshake: {ready:?}"));
        if printed != fx.pid {
            fx.pid = host_pid(fx.pid, printed).unwrap_or_else(|| {
                panic!(
                    "no descendant of {} is PID {printed} in its namespace",
                    fx.pid
                )
            });
        }
        fx
    }

    pub fn line(&mut self, timeout: Duration) -> String {
        self.lines.recv_timeout(timeout).unwrap_or_else(|e| {
            let status = self.child.try_wait().ok().flatten();
            panic!(
                "no line from fixture {} within {timeout:?} ({e}); status {status:?}",
                self.pid
            )
        })
    }

    fn send(&mut self, what: &str) {
        let stdin = self.stdin.as_mut().expect("fixture stdin open");
        // One write: `writeln!` on the unbuffered pipe writes the line and
        // its newline apart, and a fixture that reads between them sees two
        // lines (an event loop then counts one more iteration).
        stdin
            .write_all(format!("{what}\n").as_bytes())
            .expect("write to fixture stdin");
        stdin.flush().expect("flush fixture stdin");
    }

    /// Tells the fixture to run its workload.
    pub fn go(&mut self) {
        self.send("go");
    }

    /// Waits for the workload to finish and returns its ground truth.
    pub fn truth(&mut self) -> Value {
        let line = self.line(Duration::from_secs(120));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad truth line {line:?}: {e}"))
    }

    /// Runs the workload and returns its ground truth.
    pub fn run(&mut self) -> Value {
        self.go();
        self.truth()
    }

    /// Lets the fixture exit and asserts it exited 0, as it does unprofiled.
    pub fn release(&mut self) -> ExitStatus {
        self.send("exit");
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait fixture") {
                assert!(status.success(), "fixture exited with {status}");
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fixture {} did not exit",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the second line (`exit`) and waits (at most 30 s) for the
    /// process to exit, returning its exit status and every line it printed
    /// after the ones already read, without judging them: for fixtures whose
    /// exit (an exec, a status other than 0) is what a test compares.
    pub fn finish(&mut self) -> (ExitStatus, Vec<String>) {
        if let Some(stdin) = self.stdin.as_mut() {
            // It may have exited on its own already (a pipe without a
            // reader): its status says how.
            let _ = stdin.write_all(b"exit\n");
        }
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait fixture") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "fixture {} did not exit",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends at EOF, which may come after the exit.
        let mut rest = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            rest.push(line);
        }
        (status, rest)
    }

    /// Waits (at most 30 s) for a fixture that exits by itself, without
    /// writing to it; returns its exit status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait fixture") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fixture {} did not exit",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The host PID of the descendant of `root` whose PID in its own (innermost)
/// namespace is `inner`.
fn host_pid(root: u32, inner: u32) -> Option<u32> {
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
        let ids: Vec<u32> = nspid
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if ids.len() > 1 && ids.last() == Some(&inner) {
            return Some(p);
        }
        let children =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        todo.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    None
}

/// A fresh directory under the system temp dir, removed on drop unless the
/// test is failing (then its path is printed to inspect the outputs).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/profiler-tests-<pid>-<n>-<tag>`.
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("profiler-tests-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// `dir/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
