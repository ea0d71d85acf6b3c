//! Driving child processes: a target that prints a ready line, a tracer whose
//! output we wait on, and guards that never leave either behind.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::util::display;

/// A child process that is killed and reaped when dropped.
pub struct Guard {
    pub child: Child,
    name: String,
    /// Wait for the child when dropped.
    reap: bool,
}

impl Guard {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let name = display(cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start `{name}`"))?;
        Ok(Guard {
            child,
            name,
            reap: true,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal (SIGINT to stop a tracer cleanly).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own
        // child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Wait up to `timeout` for the child to exit; `None` if it is still alive.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL the child without waiting for it: a process stuck in the
    /// kernel (e.g. tearing down thousands of uprobes) cannot be reaped until
    /// it is done; init reaps it once xtask exits.
    pub fn abandon(mut self) {
        self.child.kill().ok();
        self.reap = false;
    }

    /// Ask the child to stop with SIGINT, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) -> Result<std::process::ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.signal(libc::SIGINT);
        if let Some(status) = self.wait_timeout(grace)? {
            return Ok(status);
        }
        eprintln!(
            "xtask: `{}` ignored SIGINT for {grace:?}; killing it",
            self.name
        );
        self.child.kill().ok();
        Ok(self.child.wait()?)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            if self.reap {
                self.child.wait().ok();
            }
        }
    }
}

/// Lines read from a child's pipe on a background thread.
pub struct Lines {
    rx: Receiver<String>,
    /// Every line received so far.
    pub seen: Vec<String>,
}

impl Lines {
    /// Start reading `pipe`; with `echo`, copy each line to our stderr with
    /// `prefix`.
    pub fn tap(pipe: impl Read + Send + 'static, echo: Option<&'static str>) -> Self {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(prefix) = echo {
                    eprintln!("{prefix}{line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Wait for a line satisfying `pred`; fails on timeout or end of output.
    pub fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!(
                        "timed out after {timeout:?}; output so far:\n{}",
                        self.seen.join("\n")
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the output ended; it was:\n{}", self.seen.join("\n"))
                }
            }
        }
    }

    /// Collect whatever arrives until the pipe closes or `timeout` passes.
    pub fn drain(&mut self, timeout: Duration) -> &[String] {
        let deadline = Instant::now() + timeout;
        while let Ok(line) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        &self.seen
    }
}

/// A target program that prints a line containing `pid=` when ready, then
/// (for bench fixtures) waits for a line on stdin before it starts work.
pub struct Target {
    pub guard: Guard,
    pub stdout: Lines,
    stdin: Option<ChildStdin>,
}

impl Target {
    pub fn start(cmd: &mut Command) -> Result<Self> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut guard = Guard::spawn(cmd)?;
        let stdin = guard.child.stdin.take();
        let out = guard.child.stdout.take().expect("stdout is piped");
        let mut stdout = Lines::tap(out, None);
        stdout
            .wait_for(Duration::from_secs(10), |l| l.contains("ready"))
            .context("waiting for the target's ready line")?;
        Ok(Target {
            guard,
            stdout,
            stdin,
        })
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Release a fixture that waits on stdin.
    pub fn go(&mut self) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("stdin already closed"))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// Wait for the fixture's `result:` line and its exit.
    pub fn result(&mut self, timeout: Duration) -> Result<String> {
        let line = self
            .stdout
            .wait_for(timeout, |l| l.starts_with("result:"))
            .context("waiting for the fixture's result line")?;
        self.guard.wait_timeout(Duration::from_secs(5))?;
        Ok(line)
    }
}

/// A tracer (the profiler or bpftrace) whose readiness shows on one stream.
pub struct Tracer {
    pub guard: Guard,
    /// The stream that carries the readiness line.
    pub lines: Lines,
    /// Other stream, if captured.
    pub other: Option<Lines>,
    /// Time from spawn to the readiness line.
    pub ready_after: Duration,
    pub ready_line: String,
}

/// Which stream of a tracer carries its readiness line.
#[derive(Clone, Copy)]
pub enum ReadyOn {
    Stdout,
    Stderr,
}

impl Tracer {
    /// Spawn `cmd` and wait until a line containing `marker` appears.
    pub fn start(cmd: &mut Command, on: ReadyOn, marker: &'static str) -> Result<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut guard = Guard::spawn(cmd)?;
        let out = Lines::tap(guard.child.stdout.take().expect("piped"), None);
        let err = Lines::tap(guard.child.stderr.take().expect("piped"), None);
        let (mut lines, other) = match on {
            ReadyOn::Stdout => (out, err),
            ReadyOn::Stderr => (err, out),
        };
        let ready_line = lines
            .wait_for(Duration::from_secs(60), |l| {
                // `profiler: error: …` (not a warning that quotes an
                // `os error N`).
                l.contains(marker) || l.contains("error:")
            })
            .with_context(|| format!("waiting for `{marker}` from `{}`", display(cmd)))?;
        if !ready_line.contains(marker) {
            bail!("`{}` failed: {ready_line}", display(cmd));
        }
        Ok(Tracer {
            guard,
            lines,
            other: Some(other),
            ready_after: started.elapsed(),
            ready_line,
        })
    }

    /// Wait for the tracer to exit on its own for up to `wait`, then stop it.
    pub fn finish(&mut self, wait: Duration) -> Result<std::process::ExitStatus> {
        let status = match self.guard.wait_timeout(wait)? {
            Some(s) => s,
            None => self.guard.stop(Duration::from_secs(30))?,
        };
        self.lines.drain(Duration::from_secs(2));
        if let Some(o) = self.other.as_mut() {
            o.drain(Duration::from_secs(2));
        }
        Ok(status)
    }

    /// All captured output, both streams.
    pub fn output(&self) -> String {
        let mut all = self.lines.seen.clone();
        if let Some(o) = &self.other {
            all.extend(o.seen.iter().cloned());
        }
        all.join("\n")
    }
}

/// Parse the profiler's `attached N functions (2N probes) to PID P in X ms`
/// line into (N, X).
pub fn parse_attached(line: &str) -> Option<(u64, f64)> {
    let after = line.split("attached ").nth(1)?;
    let n = after.split_whitespace().next()?.parse().ok()?;
    let ms = after
        .split(" in ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((n, ms))
}

/// Read `functions.json` from a profiler output directory.
pub fn read_functions_json(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("functions.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `calls` of function `name` in a functions.json value, summed over binaries.
pub fn calls_of(json: &serde_json::Value, name: &str) -> u64 {
    json["functions"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter(|f| f["name"].as_str() == Some(name))
                .filter_map(|f| f["calls"].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_attached_line() {
        let line = "profiler: attached 1000 functions (2000 probes) to PID 42 in 123.4 ms; stop with Ctrl-C";
        assert_eq!(parse_attached(line), Some((1000, 123.4)));
        let line = "profiler: attached 2 functions (4 probes) to PID 7 in 3 ms; stop with Ctrl-C";
        assert_eq!(parse_attached(line), Some((2, 3.0)));
        assert_eq!(parse_attached("profiler: error: no such pid"), None);
    }

    #[test]
    fn sums_calls_by_name() {
        let json = serde_json::json!({"functions": [
            {"name": "leaf", "binary": "/a", "calls": 4},
            {"name": "mid", "binary": "/a", "calls": 2},
            {"name": "leaf", "binary": "/b", "calls": 1}
        ]});
        assert_eq!(calls_of(&json, "leaf"), 5);
        assert_eq!(calls_of(&json, "mid"), 2);
        assert_eq!(calls_of(&json, "none"), 0);
    }
}
