//! Part r: `profiler watch`'s escalation (issue 43): a server's
//! throughput while watch traces one of its stall groups with uprobes,
//! and after the probes come off, against the same server unwatched and
//! watched before any stall (samples only). The server
//! (`xtask/bench/bench_escalation.c`) runs every request through the
//! chain its stalls are in, so the functions escalation probes are the
//! ones every request pays for.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use super::median;
use super::redis::pin;
use super::watch::{http_run, min_max, port_of, Load, NODE_CONNS, NODE_RUN};
use crate::proc::{ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// Traced stalls before the probes come off (`--trace-stalls`).
const TRACE_STALLS: usize = 3;
/// A slow request's stall, ms (over watch's 100 ms threshold).
const STALL_MS: u64 = 200;
/// From the watcher's attached line to the first measured run.
const SETTLE: Duration = Duration::from_secs(1);
/// Between slow requests: the loop runs other iterations.
const STALL_GAP: Duration = Duration::from_millis(300);
/// The escalation's steps (attach, detach) are awaited this long.
const STEP_WAIT: Duration = Duration::from_secs(20);

/// `--max-overhead` of each configuration, and its heading.
const CONFIGS: [(&str, &str); 2] = [
    (
        "10",
        "With the overhead governor (`--max-overhead 10`, the default)",
    ),
    (
        "0",
        "Governor off (`--max-overhead 0`): the group's probes stay on",
    ),
];

/// The four phases of a round, in the order the rows show them.
const PHASES: [&str; 4] = [
    "unwatched",
    "watched, samples only (before any stall)",
    "watched, a group traced (uprobes on)",
    "watched, after its probes came off",
];

/// One round: a load run in each phase, and what watch said and wrote.
struct Round {
    /// In the order of `PHASES`; the unwatched one is the mean of
    /// `before` and `after_all`.
    runs: [Load; 4],
    /// The unwatched runs before the watcher started and after it stopped.
    before: Load,
    after_all: Load,
    /// watch's `escalation: attached …` line.
    attached: String,
    /// Its `escalation: detached …` line.
    detached: String,
    /// The overhead governor's lines while the group was traced.
    governor: Vec<String>,
    /// Lines of stalls.jsonl, and of those, `"tree": "traced"`.
    lines: usize,
    traced: usize,
    /// The server's own stall lines in the round.
    truth: usize,
}

impl Round {
    fn ratio(&self, phase: usize) -> f64 {
        self.runs[phase].rate / self.runs[0].rate
    }

    fn cpu_ratio(&self, phase: usize) -> f64 {
        self.runs[phase].cpu_us / self.runs[0].cpu_us
    }
}

/// The figures of part r.
pub struct Escalation {
    /// Per configuration (`CONFIGS`), its rounds.
    rounds: Vec<Vec<Round>>,
    errors: Vec<String>,
    pinned: bool,
}

/// One `GET /slow` on a connection of its own, answered after its stall.
fn slow_request(port: u16) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: bench\r\n\r\n")?;
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 512]);
    while super::http_load::response_len(&buf)?.is_none() {
        let k = s.read(&mut chunk).context("reading the slow response")?;
        if k == 0 {
            bail!("the server closed the slow request's connection");
        }
        buf.extend_from_slice(&chunk[..k]);
    }
    Ok(())
}

/// One round: a load run unwatched, then watch attached, a load run with
/// samples only, one slow request and the escalation's attach, a load run
/// while traced, `TRACE_STALLS` slow requests and the detach, a load run
/// after; watch stopped, a load run unwatched again.
fn round(
    server: &mut Target,
    port: u16,
    pinned: bool,
    max_overhead: &str,
    work: &Path,
) -> Result<Round> {
    let pid = server.pid();
    let truth0 = stalls_of(server);
    let run = || http_run(port, pid, pinned);
    let before = run()?;
    let out = work.join("escalation-out");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["watch", "--pid", &pid.to_string(), "--duration", "10m"])
        .args(["--trace-stalls", &TRACE_STALLS.to_string()])
        .args(["--max-overhead", max_overhead])
        .arg("--out")
        .arg(&out);
    let mut w = Tracer::start(&mut cmd, ReadyOn::Stderr, "no uprobes")?;
    std::thread::sleep(SETTLE);
    let sampled = run()?;
    slow_request(port)?;
    let attached = w
        .lines
        .wait_for(STEP_WAIT, |l| l.contains("escalation: attached"))
        .context("waiting for watch to escalate the slow requests' group")?;
    let seen = w.lines.seen.len();
    let traced = run()?;
    for _ in 0..TRACE_STALLS {
        slow_request(port)?;
        std::thread::sleep(STALL_GAP);
    }
    let detached = w
        .lines
        .wait_for(STEP_WAIT, |l| l.contains("escalation: detached"))
        .context("waiting for watch to take the group's probes off")?;
    let governor = w.lines.seen[seen..]
        .iter()
        .filter(|l| l.contains("overhead governor"))
        .cloned()
        .collect();
    let after = run()?;
    w.guard.signal(libc::SIGINT);
    let status = w.finish(Duration::from_secs(30))?;
    if !status.success() {
        bail!("`profiler watch` exited with {status}:\n{}", w.output());
    }
    let after_all = run()?;
    let text = std::fs::read_to_string(out.join("stalls.jsonl")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    server.stdout.drain(Duration::from_millis(200));
    let unwatched = Load {
        rate: (before.rate + after_all.rate) / 2.0,
        cpu_us: (before.cpu_us + after_all.cpu_us) / 2.0,
    };
    Ok(Round {
        runs: [unwatched, sampled, traced, after],
        before,
        after_all,
        attached,
        detached,
        governor,
        lines: lines.len(),
        traced: lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["tree"] == "traced")
            .count(),
        truth: stalls_of(server) - truth0,
    })
}

/// Runs part r: a warm-up run, then `rounds` rounds, each with an
/// unwatched run before the watcher starts and after it stops, whose mean
/// is the round's unwatched figure (the host's speed drifts, and the
/// watched phases come in one order).
pub fn measure(server_bin: &Path, rounds: usize, work: &Path) -> Escalation {
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut e = Escalation {
        rounds: Vec::new(),
        errors: Vec::new(),
        pinned,
    };
    let mut cmd = Command::new(server_bin);
    cmd.arg(STALL_MS.to_string());
    let mut server = match Target::start(pin(&mut cmd, pinned, 0)) {
        Ok(s) => s,
        Err(err) => {
            e.errors.push(format!("starting the server: {err:#}"));
            return e;
        }
    };
    let (pid, port) = match port_of(&server) {
        Ok(p) => (server.pid(), p),
        Err(err) => {
            e.errors.push(format!("{err:#}"));
            return e;
        }
    };
    if let Err(err) = http_run(port, pid, pinned) {
        e.errors.push(format!("warm-up: {err:#}"));
        return e;
    }
    for (c, (max_overhead, _)) in CONFIGS.iter().enumerate() {
        e.rounds.push(Vec::new());
        for i in 0..rounds {
            eprintln!("bench: escalation --max-overhead {max_overhead}: round {i}");
            match round(&mut server, port, pinned, max_overhead, work) {
                Ok(r) => {
                    eprintln!(
                    "bench: escalation round {i}: {:.0} / {:.0} / {:.0} / {:.0} req/s; {} lines, {} traced, {} stalls",
                    r.runs[0].rate, r.runs[1].rate, r.runs[2].rate, r.runs[3].rate, r.lines, r.traced, r.truth
                );
                    e.rounds[c].push(r);
                }
                Err(err) => e
                    .errors
                    .push(format!("--max-overhead {max_overhead}, round {i}: {err:#}")),
            }
        }
    }
    if let Err(err) = server.guard.stop(Duration::from_secs(5)) {
        eprintln!("bench: escalation: stopping the server: {err:#}");
    }
    e
}

/// The server's stall lines so far.
fn stalls_of(server: &Target) -> usize {
    server
        .stdout
        .seen
        .iter()
        .filter(|l| l.starts_with("stall "))
        .count()
}

/// The part of a watch line after `escalation: `.
fn step(line: &str) -> &str {
    line.split_once("escalation: ").map_or(line, |(_, s)| s)
}

/// One configuration's tables, and round 1's steps.
fn config_rows(rs: &[Round]) -> String {
    let mut md = String::new();
    md.push_str(
        "| phase | req/s (median) | / unwatched per round: median (min–max) | server CPU per request (median) | / unwatched per round: median (min–max) |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (p, what) in PHASES.iter().enumerate() {
        if rs.is_empty() {
            break;
        }
        let (lo, hi) = min_max(rs.iter().map(|r| r.ratio(p)));
        let (clo, chi) = min_max(rs.iter().map(|r| r.cpu_ratio(p)));
        let _ = writeln!(
            md,
            "| {what} | {:.0} | **{:.3}×** ({lo:.3}–{hi:.3}) | {:.2} µs | {:.3}× ({clo:.3}–{chi:.3}) |",
            median(rs.iter().map(|r| r.runs[p].rate).collect()),
            median(rs.iter().map(|r| r.ratio(p)).collect()),
            median(rs.iter().map(|r| r.runs[p].cpu_us).collect()),
            median(rs.iter().map(|r| r.cpu_ratio(p)).collect()),
        );
    }
    md.push_str(
        "\n| round | req/s: unwatched before / samples only / traced / after / unwatched after | stalls.jsonl lines (traced) / the server's stalls | governor lines while traced |\n\
         | ---: | ---: | ---: | ---: |\n",
    );
    for (i, r) in rs.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {:.0} / {:.0} / {:.0} / {:.0} / {:.0} | {} ({}) / {} | {} |",
            i + 1,
            r.before.rate,
            r.runs[1].rate,
            r.runs[2].rate,
            r.runs[3].rate,
            r.after_all.rate,
            r.lines,
            r.traced,
            r.truth,
            r.governor.len()
        );
    }
    if let Some(r) = rs.first() {
        let _ = writeln!(
            md,
            "\nRound 1's steps, as watch said them: `{}`; `{}`.",
            step(&r.attached),
            step(&r.detached)
        );
        for g in r.governor.iter().take(3) {
            let _ = writeln!(md, "Its governor: `{g}`.");
        }
    }
    md.push('\n');
    md
}

pub fn rows(e: &Escalation) -> String {
    let mut md = String::new();
    for ((_, what), rs) in CONFIGS.iter().zip(&e.rounds) {
        let _ = writeln!(md, "### {what}\n");
        md.push_str(&config_rows(rs));
    }
    for err in &e.errors {
        let _ = writeln!(md, "\nerror: {err}");
    }
    let _ = writeln!(
        md,
        "\nThe server, `xtask/bench/bench_escalation.c` (`-O2 -g -fno-omit-frame-pointer`, each \
         function starting with `push %rbp`, which the kernel emulates), is a single-threaded epoll \
         HTTP/1.1 server on loopback{}; every request runs serve -> handle_request -> parse_body -> \
         tokenize (a few µs), and `GET /slow` spins {STALL_MS} ms in tokenize. Each round: the load \
         ({NODE_CONNS} keep-alive connections of `GET /`, {} s a run) unwatched; `profiler watch --pid P --trace-stalls {TRACE_STALLS}`, a run {:.0} s after its \
         attached line (samples only); one `GET /slow`, whose group watch escalates, a run once \
         watch says `escalation: attached` (the uprobes on); {TRACE_STALLS} more `GET /slow`, \
         {} ms apart, traced, and a run once watch says `escalation: detached` (the probes off); the watcher stopped, the load unwatched \
         again. The unwatched figure of a round is the mean of its two unwatched runs: this \
         host's vCPUs change speed by up to 25% within minutes, and the phases run in one order. \
         Server CPU per request is its schedstat run time over the run's requests (the probes' \
         cost falls there). With the governor, it holds `--max-overhead 10` meanwhile and may take \
         functions off while the group is traced: its lines are counted.",
        if e.pinned {
            ", pinned to CPU 0, its load to CPU 1, the watcher unpinned"
        } else {
            ", not pinned (one CPU)"
        },
        NODE_RUN.as_secs(),
        SETTLE.as_secs_f64(),
        STALL_GAP.as_millis()
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_what_follows_escalation() {
        assert_eq!(
            step("profiler: PID 7: escalation: attached 4 functions in 3 ms for group g"),
            "attached 4 functions in 3 ms for group g"
        );
        assert_eq!(step("other"), "other");
    }
}
