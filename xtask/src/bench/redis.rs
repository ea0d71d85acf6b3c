//! Benchmark j, first row: the overhead governor on a real server. Two
//! copies of Debian's `redis-server` on private ports, pinned to the same
//! CPU; `redis-benchmark -t get,set -c 20` (pinned to the other CPU) runs
//! against each in turn, round after round, so that the other load on a
//! shared machine weighs on both alike. A few control rounds with neither
//! traced, then `profiler record --pid B` with default options (every
//! function of the executable up to 2,000, `--max-overhead 10`) on copy B
//! for the measured rounds. Steady state is the rounds that start after the
//! governor's last detach; the whole run counts every traced round,
//! warm-up included.

use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::proc::{read_functions_json, Guard, ReadyOn, Tracer};
use crate::util::profiler_bin;

/// Ports of the bench's own servers: A stays untraced, B is traced.
const PORTS: [&str; 2] = ["6391", "6392"];
/// Control rounds before the profiler attaches (both untraced).
const CONTROL: usize = 3;
/// A round starts this long after the last detach to count as steady.
const SETTLE_MARGIN_S: f64 = 0.5;

/// One `redis-benchmark -t get,set` run.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Seconds after the profiler attached when it started (negative in
    /// the control rounds).
    pub at_s: f64,
    pub set: f64,
    pub get: f64,
    /// GET p50 latency in ms.
    pub get_p50: f64,
    /// The server's CPU time per request, in µs (every thread's run time
    /// from /proc/PID/task/*/schedstat, over the run's SET and GET).
    pub cpu_us: f64,
}

impl Run {
    /// Requests per second over the whole run (SET and GET, `n` each).
    pub(super) fn both(&self) -> f64 {
        2.0 / (1.0 / self.set + 1.0 / self.get)
    }
}

/// One round: server A (untraced) and server B (traced after attach).
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub a: Run,
    pub b: Run,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.b.both() / self.a.both()
    }

    /// B's CPU time per request over A's.
    fn cpu_ratio(&self) -> f64 {
        self.b.cpu_us / self.a.cpu_us
    }
}

/// Nanoseconds `pid` has run on a CPU, all threads (schedstat: the
/// scheduler's own accounting, trap and probe handling included).
pub(super) fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

pub struct Redis {
    pub requests: u64,
    pub pinned: bool,
    pub control: Vec<Round>,
    pub rounds: Vec<Round>,
    /// Functions probed at attach.
    pub probed: u64,
    /// Detached functions: (name, seconds after attach, calls/s, est. %).
    pub detached: Vec<(String, f64, f64, f64)>,
    /// The calibrated cost line.
    pub cost: String,
    pub peak_pct: f64,
    /// The governor's estimate since its last detach, in % of CPU time.
    pub settled_pct: f64,
}

impl Redis {
    /// Seconds after attach of the governor's last detach (0 if none).
    pub fn settled_s(&self) -> f64 {
        self.detached.iter().map(|d| d.1).fold(0.0, f64::max)
    }

    pub fn steady(&self) -> Vec<Round> {
        let from = self.settled_s() + SETTLE_MARGIN_S;
        self.rounds
            .iter()
            .copied()
            .filter(|r| r.a.at_s.min(r.b.at_s) >= from)
            .collect()
    }
}

/// Runs `cmd` on CPU `cpu` only, if `pin`.
pub(super) fn pin(cmd: &mut Command, pin: bool, cpu: usize) -> &mut Command {
    if pin {
        // SAFETY: between fork and exec, only async-signal-safe calls:
        // sched_setaffinity on a stack-local set.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// `redis-benchmark -p PORT -t get,set -c 20 -n N --csv`.
pub(super) fn benchmark(port: &str, pid: u32, n: u64, pinned: bool, t0: Instant) -> Result<Run> {
    let at_s = t0.elapsed().as_secs_f64();
    let cpu0 = cpu_ns(pid);
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-p", port, "-t", "get,set", "-c", "20", "-n"])
        .arg(n.to_string())
        .arg("--csv");
    let out = pin(&mut cmd, pinned, 1)
        .output()
        .context("running redis-benchmark (Debian package redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |test: &str| -> Result<Vec<f64>> {
        let l = text
            .lines()
            .find(|l| l.starts_with(&format!("\"{test}\"")))
            .with_context(|| format!("no {test} line from redis-benchmark: {text}"))?;
        Ok(l.split(',')
            .skip(1)
            .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
            .collect())
    };
    let (set, get) = (line("SET")?, line("GET")?);
    let cpu_us = cpu_ns(pid).saturating_sub(cpu0) as f64 / 1e3 / (2 * n) as f64;
    Ok(Run {
        at_s,
        cpu_us,
        set: set[0],
        get: get[0],
        get_p50: get[3],
    })
}

pub(super) fn start_server(port: &str, pinned: bool) -> Result<Guard> {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", port, "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null());
    let server = Guard::spawn(pin(&mut cmd, pinned, 0))
        .context("starting redis-server (Debian package redis-server)")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("redis-cli")
        .args(["-p", port, "ping"])
        .output()
        .map_or(true, |o| {
            !String::from_utf8_lossy(&o.stdout).contains("PONG")
        })
    {
        if Instant::now() > deadline {
            bail!("redis-server did not answer on port {port}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}

/// A round: both servers (A and B's pids), in the order given.
fn round(n: u64, pids: [u32; 2], pinned: bool, t0: Instant, b_first: bool) -> Result<Round> {
    let run = |i: usize| benchmark(PORTS[i], pids[i], n, pinned, t0);
    let (a, b) = if b_first {
        let b = run(1)?;
        (run(0)?, b)
    } else {
        let a = run(0)?;
        (a, run(1)?)
    };
    Ok(Round { a, b })
}

pub fn redis(requests: u64, rounds: usize, work: &Path) -> Result<Redis> {
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut a = start_server(PORTS[0], pinned)?;
    let mut b = start_server(PORTS[1], pinned)?;
    let pids = [a.pid(), b.pid()];
    let before = Instant::now();
    // Populate the key GET reads, and warm both up.
    for i in 0..2 {
        benchmark(PORTS[i], pids[i], requests / 2, pinned, before)?;
    }
    let mut control = Vec::new();
    for i in 0..CONTROL {
        control.push(round(requests, pids, pinned, before, i % 2 == 0)?);
    }
    let out = work.join("prof-redis");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["record", "--pid", &b.pid().to_string(), "--out"])
        .arg(&out);
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    let t0 = Instant::now();
    let shift = t0.duration_since(before).as_secs_f64();
    for r in &mut control {
        r.a.at_s -= shift;
        r.b.at_s -= shift;
    }
    let mut measured = Vec::new();
    for i in 0..rounds {
        let r = round(requests, pids, pinned, t0, i % 2 == 0)?;
        eprintln!(
            "bench: redis round {i}: untraced {:.0}, traced {:.0} req/s ({:.2}×); CPU {:.1} / {:.1} µs per request ({:.2}×)",
            r.a.both(),
            r.b.both(),
            r.ratio(),
            r.a.cpu_us,
            r.b.cpu_us,
            r.cpu_ratio()
        );
        measured.push(r);
    }
    tracer.guard.signal(libc::SIGINT);
    tracer.finish(Duration::from_secs(60))?;
    a.stop(Duration::from_secs(5))?;
    b.stop(Duration::from_secs(5))?;
    let json = read_functions_json(&out)?;
    let gov = &json["governor"];
    let detached = gov["detached"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or("?").to_string(),
                d["at_ns"].as_f64().unwrap_or(0.0) / 1e9,
                d["calls_per_s"].as_f64().unwrap_or(0.0),
                d["overhead_pct"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    let cost = tracer
        .output()
        .lines()
        .find(|l| l.contains("a probe hit costs"))
        .unwrap_or_default()
        .to_string();
    Ok(Redis {
        requests,
        pinned,
        control,
        rounds: measured,
        probed: json["functions_probed"].as_u64().unwrap_or(0),
        detached,
        cost,
        peak_pct: gov["peak_pct"].as_f64().unwrap_or(f64::NAN),
        settled_pct: gov["settled_pct"].as_f64().unwrap_or(f64::NAN),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Total requests over total time: what a client saw over the phase.
fn aggregate(runs: impl Iterator<Item = Run>) -> f64 {
    let (n, t) = runs.fold((0.0, 0.0), |(n, t), r| {
        (n + 2.0, t + 1.0 / r.set + 1.0 / r.get)
    });
    n / t
}

/// One summary row of `rs`.
fn summary(md: &mut String, what: &str, rs: &[Round]) {
    if rs.is_empty() {
        let _ = writeln!(md, "| {what} | 0 | | | | | | | | |");
        return;
    }
    let med = |f: fn(&Run) -> f64, b: bool| {
        median(rs.iter().map(|r| f(if b { &r.b } else { &r.a })).collect())
    };
    let ratios = median(rs.iter().map(Round::ratio).collect());
    let lo = rs.iter().map(Round::ratio).fold(f64::INFINITY, f64::min);
    let hi = rs.iter().map(Round::ratio).fold(0.0, f64::max);
    let whole = aggregate(rs.iter().map(|r| r.b)) / aggregate(rs.iter().map(|r| r.a));
    let cpu = median(rs.iter().map(Round::cpu_ratio).collect());
    let cpu_lo = rs
        .iter()
        .map(Round::cpu_ratio)
        .fold(f64::INFINITY, f64::min);
    let cpu_hi = rs.iter().map(Round::cpu_ratio).fold(0.0, f64::max);
    let cpu_all =
        rs.iter().map(|r| r.b.cpu_us).sum::<f64>() / rs.iter().map(|r| r.a.cpu_us).sum::<f64>();
    let _ = writeln!(
        md,
        "| {what} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2}× / {:.2}× | **{ratios:.2}×** ({lo:.2}–{hi:.2}) | {whole:.2}× | {:.1} / {:.1} µs | **{cpu:.2}×** ({cpu_lo:.2}–{cpu_hi:.2}), all {cpu_all:.2}× | {:.3} / {:.3} ms |",
        rs.len(),
        med(|r| r.set, false),
        med(|r| r.get, false),
        med(|r| r.set, true),
        med(|r| r.get, true),
        med(|r| r.set, true) / med(|r| r.set, false),
        med(|r| r.get, true) / med(|r| r.get, false),
        med(|r| r.cpu_us, false),
        med(|r| r.cpu_us, true),
        med(|r| r.get_p50, false),
        med(|r| r.get_p50, true),
    );
}

pub fn rows(r: &Redis) -> String {
    let mut md = String::from(
        "| rounds | n | A untraced SET / GET req/s (median) | B SET / GET (median) | B/A SET / GET | B/A req/s per round: median (min–max) | B/A all requests | server CPU per request A / B (median) | B/A CPU per request: median (min–max) | GET p50 A / B |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    summary(&mut md, "control: neither traced", &r.control);
    summary(&mut md, "B traced: whole run", &r.rounds);
    let steady = r.steady();
    summary(
        &mut md,
        &format!(
            "B traced: steady state (from {:.1} s)",
            r.settled_s() + SETTLE_MARGIN_S
        ),
        &steady,
    );
    let _ = writeln!(
        md,
        "\nEvery round (`-n {}` each of SET and GET; req/s over both; rounds alternate which server goes first):\n",
        r.requests
    );
    md.push_str("| round | starts after attach | A req/s | B req/s | B/A | A / B CPU µs per request | B/A CPU |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let control = r
        .control
        .iter()
        .enumerate()
        .map(|(i, x)| (format!("control {}", i + 1), x));
    let traced = r
        .rounds
        .iter()
        .enumerate()
        .map(|(i, x)| ((i + 1).to_string(), x));
    for (round, x) in control.chain(traced) {
        let _ = writeln!(
            md,
            "| {round} | {:.1} s | {:.0} | {:.0} | {:.2}× | {:.1} / {:.1} | {:.2}× |",
            x.a.at_s.min(x.b.at_s),
            x.a.both(),
            x.b.both(),
            x.ratio(),
            x.a.cpu_us,
            x.b.cpu_us,
            x.cpu_ratio()
        );
    }
    let _ = writeln!(
        md,
        "\nProbed {} functions; the governor detached {}, the last {:.2} s after attach (highest per-thread estimate {:.1}% of CPU time; {:.1}% since the last detach, which predicts B/A CPU per request {:.2}×). {}`{}`\n",
        r.probed,
        r.detached.len(),
        r.settled_s(),
        r.peak_pct,
        r.settled_pct,
        1.0 / (1.0 - r.settled_pct / 100.0),
        if r.pinned {
            "Both servers on CPU 0, redis-benchmark on CPU 1, the profiler unpinned. "
        } else {
            "Not pinned (one CPU). "
        },
        r.cost.trim_start_matches("profiler: ")
    );
    md.push_str("| detached | after | calls/s | est. overhead |\n| --- | ---: | ---: | ---: |\n");
    let mut by_cost = r.detached.clone();
    by_cost.sort_by(|a, b| b.3.total_cmp(&a.3));
    for (name, at, cps, pct) in by_cost.iter().take(15) {
        let _ = writeln!(md, "| `{name}` | {at:.2} s | {cps:.0} | {pct:.1}% |");
    }
    if by_cost.len() > 15 {
        let _ = writeln!(md, "| … {} more | | | |", by_cost.len() - 15);
    }
    md
}
