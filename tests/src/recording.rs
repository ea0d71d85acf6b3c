//! Running the profiler: a guard for a live recording, and one-shot runs.
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the profiler may take to attach or to finish: 30 s, or 5
/// minutes under software emulation (`crate::emulated`), where attaching
/// a few hundred functions one perf event each (kernels before 6.10) takes
/// minutes.
pub fn timeout() -> Duration {
    if crate::emulated() {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(30)
    }
}

/// `--max-overhead 0` under software emulation, for a recording that
/// neither sets the governor nor follows children: a probe hit costs
/// 30-40 µs there instead of about 1 µs, so the governor would detach the
/// functions whose exact counts the test asserts. The governor's own tests
/// set `--max-overhead`, and keep it.
pub fn governor_off_under_emulation(extra: &[&str]) -> &'static [&'static str] {
    let sets = extra
        .iter()
        .any(|a| a.starts_with("--max-overhead") || *a == "--follow");
    if !sets
        && crate::relaxed(
            "the overhead governor is off (--max-overhead 0): probe hits cost 30-40 µs",
        )
    {
        &["--max-overhead", "0"]
    } else {
        &[]
    }
}

/// The profiler binary: `$PROFILER_BIN`, else `<workspace>/target/release/profiler`.
pub fn profiler_bin() -> PathBuf {
    let bin = std::env::var_os("PROFILER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join("target/release/profiler"));
    assert!(
        bin.exists(),
        "{} not found: run `cargo build --release -p profiler-user` or set PROFILER_BIN",
        bin.display()
    );
    bin
}

/// A finished profiler run.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything printed on stdout (the text report).
    pub stdout: String,
    /// stderr, line by line.
    pub stderr: Vec<String>,
}

impl Finished {
    /// The first stderr line starting with `prefix`; panics, showing
    /// stderr, when there is none.
    pub fn stderr_line(&self, prefix: &str) -> &str {
        self.stderr
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no stderr line starting {prefix:?}: {:?}", self.stderr))
    }
}

/// A profiler process whose stdout and stderr are drained by threads.
struct Running {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_rx: Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        let mut out = child.stdout.take().expect("piped stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, stderr_rx) = channel();
        let lines = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[profiler] {line}");
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            stderr,
            stderr_rx,
            stdout: Some(stdout),
            stderr_thread: Some(stderr_thread),
        }
    }

    fn wait(&mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait profiler") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "profiler did not exit within {timeout:?}; stderr: {:?}",
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default();
        if let Some(h) = self.stderr_thread.take() {
            h.join().unwrap();
        }
        let stderr = self.stderr.lock().unwrap().clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the profiler with `args` to completion (at most [`timeout`]).
pub fn profiler(args: &[&str]) -> Finished {
    profiler_within(args, timeout())
}

/// [`profiler`] with a limit of its own.
pub fn profiler_within(args: &[&str], limit: Duration) -> Finished {
    let mut cmd = Command::new(profiler_bin());
    cmd.args(args);
    Running::spawn(cmd).wait(limit)
}

/// `profiler report DIR --out AGAIN` (offline replay of DIR's
/// `profile.data`) into a new temporary directory tagged `tag`; asserts
/// it succeeded and returns the directory.
pub fn replay(dir: &std::path::Path, tag: &str) -> crate::TempDir {
    let again = crate::TempDir::new(tag);
    let rep = profiler(&[
        "report",
        dir.to_str().expect("UTF-8 path"),
        "--out",
        again.path().to_str().expect("UTF-8 path"),
    ]);
    assert!(
        rep.status.success(),
        "replay of {} failed: {rep:?}",
        dir.display()
    );
    again
}
/// Runs `wrapper… profiler args…` (e.g. setpriv) to completion.
pub fn profiler_wrapped(wrapper: &[&str], args: &[&str]) -> Finished {
    let mut cmd = Command::new(wrapper[0]);
    cmd.args(&wrapper[1..]).arg(profiler_bin()).args(args);
    Running::spawn(cmd).wait(timeout())
}

/// A live `profiler record`, returned once its probes are attached.
/// Killed on drop.
pub struct Recording {
    run: Running,
}

impl Recording {
    /// `profiler record --pid PID --out OUT --raw-durations extra…`, to
    /// adjust before [`Recording::spawn`]. The durations are as measured:
    /// the fixtures time themselves on their own clock, which runs with the
    /// probes (`costs.rs` tests the default, corrected durations, with
    /// [`Recording::corrected`]).
    pub fn command(pid: u32, out: &std::path::Path, extra: &[&str]) -> Command {
        let mut cmd = Recording::corrected(pid, out, extra);
        if !extra.contains(&"--raw-durations") {
            cmd.arg("--raw-durations");
        }
        cmd.args(governor_off_under_emulation(extra));
        cmd
    }

    /// `profiler record --pid PID --out OUT extra…`, with the default,
    /// corrected durations.
    pub fn corrected(pid: u32, out: &std::path::Path, extra: &[&str]) -> Command {
        let mut cmd = Command::new(profiler_bin());
        cmd.args(["record", "--pid", &pid.to_string(), "--out"])
            .arg(out)
            .args(extra);
        cmd
    }

    /// Starts `profiler record --pid PID --out OUT extra…` and waits for the
    /// `attached` line on stderr.
    pub fn start(pid: u32, out: &std::path::Path, extra: &[&str]) -> Recording {
        Recording::spawn(Recording::command(pid, out, extra))
    }

    /// Runs `cmd` and waits (at most [`timeout`]) for `attached` on stderr.
    pub fn spawn(cmd: Command) -> Recording {
        let mut run = Running::spawn(cmd);
        let deadline = Instant::now() + timeout();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match run.stderr_rx.recv_timeout(left) {
                Ok(line) if line.contains("attached") => return Recording { run },
                Ok(_) => {}
                Err(_) => {
                    let fin = run.wait(Duration::from_secs(1));
                    panic!("profiler never printed `attached`: {fin:?}");
                }
            }
        }
    }

    /// Runs `cmd` and waits (at most [`timeout`]) for a stderr line
    /// containing `needle`.
    pub fn spawn_until(cmd: Command, needle: &str) -> Recording {
        let mut rec = Recording {
            run: Running::spawn(cmd),
        };
        rec.wait_for_line(needle, timeout());
        rec
    }

    /// Waits (at most `limit`) for a new stderr line containing `needle`,
    /// and returns it; panics, showing stderr, when none comes.
    pub fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.run.stderr_rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no stderr line containing {needle:?} within {limit:?}: {:?}",
                    self.run.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// stderr so far, line by line.
    pub fn stderr_so_far(&self) -> Vec<String> {
        self.run.stderr.lock().unwrap().clone()
    }

    /// The profiler's PID.
    pub fn pid(&self) -> u32 {
        self.run.child.id()
    }

    /// Sends `signal` to the profiler (e.g. `SIGSTOP` to pause its consumer).
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child, which has not been reaped.
        let rc = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// Sends `signal` (e.g. `libc::SIGINT`) and waits for the profiler to exit.
    pub fn stop(mut self, signal: i32) -> Finished {
        self.signal(signal);
        self.run.wait(timeout())
    }

    /// Waits for the profiler to stop by itself (target exit, `--duration`).
    pub fn wait(mut self) -> Finished {
        self.run.wait(timeout())
    }
}

/// Asserts a failed run: exit status 1 and one stderr line
/// `profiler: error: …` containing `needle`. With `only_line`, that line must be
/// all of stderr (errors found before attaching print nothing else).
pub fn assert_error(fin: &Finished, needle: &str, only_line: bool) {
    assert_eq!(
        fin.status.code(),
        Some(1),
        "exit status; stderr: {:?}",
        fin.stderr
    );
    let errors: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.starts_with("profiler: error: "))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "exactly one `profiler: error:` line in {:?}",
        fin.stderr
    );
    assert!(
        errors[0].contains(needle),
        "{:?} should contain {needle:?}",
        errors[0]
    );
    if only_line {
        assert_eq!(
            fin.stderr.len(),
            1,
            "stderr should be one line: {:?}",
            fin.stderr
        );
    }
}

/// Starts fixture `exe fx_args…`, records it by PID with `extra` options,
/// runs its workload and stops the profiler with SIGINT; then checks the
/// teardown (nothing attached, the fixture's text equal to its ELF) and
/// that the fixture exits 0. Returns the fixture's truth and the outputs.
pub fn record_fixture(
    exe: &std::path::Path,
    fx_args: &[&str],
    extra: &[&str],
) -> (serde_json::Value, crate::Outputs) {
    let out = crate::TempDir::new("record");
    let mut fx = crate::Fixture::spawn(exe, fx_args);
    let rec = Recording::start(fx.pid, out.path(), extra);
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    crate::assert_nothing_attached();
    crate::assert_text_unchanged(fx.pid, &fx.exe);
    fx.release();
    (truth, crate::Outputs::load(out.path()))
}
