//! Part q: `profiler watch` (issue 42). The throughput of Debian's
//! redis-server and of a node 20 HTTP server, unwatched and watched by
//! `profiler watch --pid P`, in interleaved rounds (the watcher attaches
//! and stops within each round, the order alternating, so that the other
//! load on a shared machine weighs on both sides alike); then the
//! watcher's own CPU time and memory with redis idle (its `hz 10`) and
//! with an epoll loop doing 1,000 iterations a second.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use super::median;
use super::redis::{benchmark, cpu_ns, pin, start_server};
use super::rings::cpu_of;
use crate::proc::{Guard, ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// The bench's own redis-server (part j uses 6391 and 6392).
const REDIS_PORT: &str = "6394";
/// Requests of each of SET and GET per redis-benchmark run: a few seconds.
const REDIS_REQUESTS: u64 = 100_000;
/// Connections of the HTTP load, and the length of one run.
pub(super) const NODE_CONNS: usize = 10;
pub(super) const NODE_RUN: Duration = Duration::from_secs(5);
/// From the watcher's attached line to the measured run.
const SETTLE: Duration = Duration::from_secs(1);
/// The watched CPU figures: this many windows of this long, after 1 s.
const CPU_WINDOW: Duration = Duration::from_secs(5);
const CPU_WINDOWS: u32 = 4;
/// The unwatched window of the target's own CPU time.
const TARGET_WINDOW: Duration = Duration::from_secs(10);
/// The loop fixture's timerfd period: 1,000 iterations a second.
const LOOP_PERIOD_US: u64 = 1000;

/// A node HTTP server on a loopback port of the kernel's choosing.
const NODE_SERVER: &str = r#"const http = require('http');
const body = 'ok\n';
const server = http.createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': body.length });
  res.end(body);
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => {
  console.log(`node: pid=${process.pid} port=${server.address().port} ready`);
});
"#;

/// One load run: requests per second, and the server's CPU time per
/// request in µs (every thread's schedstat run time).
#[derive(Clone, Copy, Debug)]
pub(super) struct Load {
    pub(super) rate: f64,
    pub(super) cpu_us: f64,
}

/// `NODE_CONNS` keep-alive `GET /` connections to 127.0.0.1:`port` for
/// `NODE_RUN` (the load on CPU 1 when `pinned`), against server `pid`.
pub(super) fn http_run(port: u16, pid: u32, pinned: bool) -> Result<Load> {
    let c0 = cpu_ns(pid);
    let (n, secs) = super::http_load::run(port, NODE_CONNS, NODE_RUN, pinned.then_some(1))?;
    let c = cpu_ns(pid).saturating_sub(c0);
    Ok(Load {
        rate: n as f64 / secs,
        cpu_us: c as f64 / 1e3 / n.max(1) as f64,
    })
}

/// The `port=N` of a target's ready line.
pub(super) fn port_of(target: &Target) -> Result<u16> {
    target
        .stdout
        .seen
        .iter()
        .find_map(|l| {
            l.split("port=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .context("no port= in the target's ready line")
}

/// One round: the load unwatched and watched, and the watcher's CPU
/// during the watched run (% of a core).
#[derive(Clone, Copy, Debug)]
struct Round {
    watched_first: bool,
    un: Load,
    w: Load,
    watcher_pct: f64,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.w.rate / self.un.rate
    }

    fn cpu_ratio(&self) -> f64 {
        self.w.cpu_us / self.un.cpu_us
    }
}

struct Throughput {
    what: &'static str,
    load: String,
    rounds: Vec<Round>,
    /// The watcher's highest VmHWM over the rounds, KiB.
    hwm_kb: u64,
    errors: Vec<String>,
}

/// The watcher's CPU and memory with one target.
struct Cpu {
    what: String,
    /// Iterations a second, as stated or measured.
    rate: String,
    target_un_pct: f64,
    target_w_pct: f64,
    watcher_pct: f64,
    windows: Vec<f64>,
    rss_kb: u64,
    hwm_kb: u64,
}

/// A running `profiler watch --pid P`, killed if dropped.
struct Watcher {
    tracer: Tracer,
}

impl Watcher {
    /// Starts it and waits for its attached line (`… no uprobes`).
    fn start(pid: u32, work: &Path) -> Result<Self> {
        let out = work.join("watch-out");
        let _ = std::fs::remove_dir_all(&out);
        let mut cmd = Command::new(profiler_bin());
        cmd.args(["watch", "--pid", &pid.to_string(), "--duration", "10m"])
            .arg("--out")
            .arg(&out);
        let tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "no uprobes")?;
        std::thread::sleep(SETTLE);
        Ok(Watcher { tracer })
    }

    fn pid(&self) -> u32 {
        self.tracer.guard.pid()
    }

    /// Its utime + stime so far, seconds.
    fn cpu_s(&self) -> f64 {
        cpu_of(self.pid()).map_or(f64::NAN, |c| c.0)
    }

    /// SIGINT and its exit; what watched the loop's waits.
    fn stop(mut self) -> Result<String> {
        self.tracer.guard.signal(libc::SIGINT);
        let status = self.tracer.finish(Duration::from_secs(30))?;
        let out = self.tracer.output();
        if !status.success() {
            bail!("`profiler watch` exited with {status}:\n{out}");
        }
        Ok(waits_path(&out))
    }
}

/// What watched the loop's waits, from the watcher's stderr: its note
/// when it fell back from fentry, else fentry.
fn waits_path(stderr: &str) -> String {
    const NOTE: &str = "note: watching the loop's waits with ";
    stderr.lines().find_map(|l| l.split_once(NOTE)).map_or_else(
        || "fentry/fexit on the wait syscalls' kernel functions (no fallback note)".into(),
        |(_, rest)| rest.to_string(),
    )
}

/// What watched the loop's waits, each with the watched runs that used
/// it (the fallback taken can change while the machine changes: tracefs
/// mounted by someone else, say).
type Paths = Vec<(String, usize)>;

fn tally(paths: &mut Paths, path: String) {
    match paths.iter_mut().find(|(p, _)| *p == path) {
        Some((_, n)) => *n += 1,
        None => paths.push((path, 1)),
    }
}

/// VmRSS and VmHWM of `pid`, KiB.
pub(super) fn mem_kb(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

/// Read syscalls `pid` has made (/proc/PID/io `syscr`).
fn reads(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("syscr:")?.trim().parse().ok())
}

/// One round against `pid`; also the watcher's VmHWM and its waits path.
fn round(
    pid: u32,
    work: &Path,
    watched_first: bool,
    run: &mut dyn FnMut() -> Result<Load>,
) -> Result<(Round, u64, String)> {
    let (mut un, mut w) = (None, None);
    let (mut watcher_pct, mut hwm, mut waits) = (f64::NAN, 0, String::new());
    for watched in [watched_first, !watched_first] {
        if !watched {
            un = Some(run()?);
            continue;
        }
        let watcher = Watcher::start(pid, work)?;
        let (c0, t0) = (watcher.cpu_s(), Instant::now());
        w = Some(run()?);
        watcher_pct = (watcher.cpu_s() - c0) / t0.elapsed().as_secs_f64() * 100.0;
        hwm = mem_kb(watcher.pid()).1;
        waits = watcher.stop()?;
    }
    let (Some(un), Some(w)) = (un, w) else {
        bail!("a round without both runs");
    };
    let r = Round {
        watched_first,
        un,
        w,
        watcher_pct,
    };
    Ok((r, hwm, waits))
}

/// A warm-up run, then `rounds` interleaved rounds of `run` against `pid`.
fn throughput(
    what: &'static str,
    load: String,
    pid: u32,
    rounds: usize,
    work: &Path,
    waits: &mut Paths,
    run: &mut dyn FnMut() -> Result<Load>,
) -> Throughput {
    eprintln!("bench: watch: {what}, {rounds} rounds unwatched and watched");
    let mut t = Throughput {
        what,
        load,
        rounds: Vec::new(),
        hwm_kb: 0,
        errors: Vec::new(),
    };
    if let Err(e) = run() {
        t.errors.push(format!("warm-up: {e:#}"));
        return t;
    }
    for i in 0..rounds {
        match round(pid, work, i % 2 == 1, run) {
            Ok((r, hwm, w)) => {
                eprintln!(
                    "bench: watch {what} round {i}: unwatched {:.0}, watched {:.0} req/s ({:.3}×); CPU per request {:.1} / {:.1} µs; watcher {:.2}% of a core",
                    r.un.rate, r.w.rate, r.ratio(), r.un.cpu_us, r.w.cpu_us, r.watcher_pct
                );
                t.rounds.push(r);
                t.hwm_kb = t.hwm_kb.max(hwm);
                tally(waits, w);
            }
            Err(e) => t.errors.push(format!("round {i}: {e:#}")),
        }
    }
    t
}

/// The node server, pinned to CPU 0 with `pinned`, and its port.
fn start_node(work: &Path, pinned: bool) -> Result<(Target, u16)> {
    let script = work.join("watch-http.js");
    std::fs::write(&script, NODE_SERVER)?;
    let mut cmd = Command::new("node");
    cmd.arg(&script);
    let target =
        Target::start(pin(&mut cmd, pinned, 0)).context("starting node (Debian's nodejs, 20)")?;
    let port = port_of(&target)?;
    Ok((target, port))
}

/// The watcher's CPU and memory while it watches `target` (and the
/// target's own CPU, unwatched then watched); with `count_reads`, the
/// target's iterations a second from its read syscalls (one timerfd
/// read per iteration).
fn cpu_row(
    what: String,
    rate: String,
    target: u32,
    count_reads: bool,
    work: &Path,
    waits: &mut Paths,
) -> Result<Cpu> {
    let pct = |ns: u64, d: Duration| ns as f64 / 1e9 / d.as_secs_f64() * 100.0;
    let (c, t) = (cpu_ns(target), Instant::now());
    std::thread::sleep(TARGET_WINDOW);
    let target_un_pct = pct(cpu_ns(target).saturating_sub(c), t.elapsed());
    let watcher = Watcher::start(target, work)?;
    std::thread::sleep(Duration::from_secs(1));
    let (c0, tc0, r0, t0) = (
        watcher.cpu_s(),
        cpu_ns(target),
        reads(target),
        Instant::now(),
    );
    let mut windows = Vec::new();
    for _ in 0..CPU_WINDOWS {
        let (a, s) = (watcher.cpu_s(), Instant::now());
        std::thread::sleep(CPU_WINDOW);
        windows.push((watcher.cpu_s() - a) / s.elapsed().as_secs_f64() * 100.0);
    }
    let secs = t0.elapsed().as_secs_f64();
    let watcher_pct = (watcher.cpu_s() - c0) / secs * 100.0;
    let target_w_pct = pct(cpu_ns(target).saturating_sub(tc0), t0.elapsed());
    let rate = match (count_reads, r0, reads(target)) {
        (true, Some(a), Some(b)) => format!("{:.0} (measured)", b.saturating_sub(a) as f64 / secs),
        _ => rate,
    };
    let (rss_kb, hwm_kb) = mem_kb(watcher.pid());
    tally(waits, watcher.stop()?);
    Ok(Cpu {
        what,
        rate,
        target_un_pct,
        target_w_pct,
        watcher_pct,
        windows,
        rss_kb,
        hwm_kb,
    })
}

/// The figures of part q.
pub struct Watch {
    waits: Paths,
    requests: u64,
    throughput: Vec<Throughput>,
    cpu: Vec<(String, Result<Cpu>)>,
    pinned: bool,
}

/// Runs part q: `rounds` rounds of each server; `loop_fixture` is
/// bench_loop.c.
pub fn measure(loop_fixture: &Path, rounds: usize, work: &Path) -> Watch {
    let requests = REDIS_REQUESTS;
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut waits = Paths::new();
    let mut loads = Vec::new();
    let mut cpu = Vec::new();
    let redis_load = format!("`redis-benchmark -t get,set -c 20 -n {requests}`");
    match start_server(REDIS_PORT, pinned) {
        Ok(server) => {
            let pid = server.pid();
            let t0 = Instant::now();
            let mut run = || {
                benchmark(REDIS_PORT, pid, requests, pinned, t0).map(|r| Load {
                    rate: r.both(),
                    cpu_us: r.cpu_us,
                })
            };
            loads.push(throughput(
                "redis-server (SET and GET)",
                redis_load,
                pid,
                rounds,
                work,
                &mut waits,
                &mut run,
            ));
            eprintln!("bench: watch: the watcher's CPU, redis idle");
            cpu.push((
                "redis-server, idle".to_string(),
                cpu_row(
                    "redis-server, idle".into(),
                    "10 (`hz 10`)".into(),
                    pid,
                    false,
                    work,
                    &mut waits,
                ),
            ));
            stop(server);
        }
        Err(e) => loads.push(Throughput {
            what: "redis-server (SET and GET)",
            load: redis_load,
            rounds: Vec::new(),
            hwm_kb: 0,
            errors: vec![format!("{e:#}")],
        }),
    }
    let node_load = format!(
        "{NODE_CONNS} keep-alive connections, `GET /`, {} s",
        NODE_RUN.as_secs()
    );
    match start_node(work, pinned) {
        Ok((node, port)) => {
            let pid = node.pid();
            let mut run = || http_run(port, pid, pinned);
            loads.push(throughput(
                "node 20 `http` server",
                node_load,
                pid,
                rounds,
                work,
                &mut waits,
                &mut run,
            ));
            stop(node.guard);
        }
        Err(e) => loads.push(Throughput {
            what: "node 20 `http` server",
            load: node_load,
            rounds: Vec::new(),
            hwm_kb: 0,
            errors: vec![format!("{e:#}")],
        }),
    }
    eprintln!("bench: watch: the watcher's CPU, a loop at 1,000 iterations/s");
    let what = format!("`bench_loop.c`, a {LOOP_PERIOD_US} µs timerfd");
    let looped = (|| -> Result<Cpu> {
        // At most 60 s of iterations: longer than the measurement.
        let mut target = Target::start(
            Command::new(loop_fixture)
                .arg((60 * 1_000_000 / LOOP_PERIOD_US).to_string())
                .arg(LOOP_PERIOD_US.to_string()),
        )?;
        target.go()?;
        let row = cpu_row(
            what.clone(),
            "1000".into(),
            target.pid(),
            true,
            work,
            &mut waits,
        );
        stop(target.guard);
        row
    })();
    cpu.push((what, looped));
    Watch {
        waits,
        requests,
        throughput: loads,
        cpu,
        pinned,
    }
}

fn stop(mut g: Guard) {
    if let Err(e) = g.stop(Duration::from_secs(5)) {
        eprintln!("bench: watch: stopping a target: {e:#}");
    }
}

pub(super) fn min_max(v: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    (
        v.clone().fold(f64::INFINITY, f64::min),
        v.fold(f64::NEG_INFINITY, f64::max),
    )
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

/// Whether every watched run's waits went through fentry.
fn fentry(w: &Watch) -> bool {
    !w.waits.is_empty() && w.waits.iter().all(|(p, _)| p.starts_with("fentry"))
}

pub fn rows(w: &Watch) -> String {
    let mut md = String::new();
    if w.waits.is_empty() {
        md.push_str("No watched run succeeded.\n\n");
    }
    for (path, n) in &w.waits {
        let _ = writeln!(
            md,
            "The loop's waits were watched with **{path}** ({n} of the watched runs).\n"
        );
    }
    md.push_str("### Throughput, unwatched and watched, interleaved\n\n");
    md.push_str(
        "| server | load | rounds | unwatched (median) | watched (median) | watched / unwatched per round: median (min–max) | server CPU per request, unwatched / watched (median) | its ratio per round: median (min–max) | watcher CPU during the load (median) | watcher VmHWM |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for t in &w.throughput {
        let rs = &t.rounds;
        if rs.is_empty() {
            let _ = writeln!(md, "| {} | {} | 0 | | | | | | | |", t.what, t.load);
            continue;
        }
        let med = |f: &dyn Fn(&Round) -> f64| median(rs.iter().map(f).collect());
        let (lo, hi) = min_max(rs.iter().map(Round::ratio));
        let (clo, chi) = min_max(rs.iter().map(Round::cpu_ratio));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} req/s | {:.0} req/s | **{:.3}×** ({lo:.3}–{hi:.3}) | {:.1} / {:.1} µs | {:.3}× ({clo:.3}–{chi:.3}) | {:.2}% of a core | {} |",
            t.what,
            t.load,
            rs.len(),
            med(&|r| r.un.rate),
            med(&|r| r.w.rate),
            med(&Round::ratio),
            med(&|r| r.un.cpu_us),
            med(&|r| r.w.cpu_us),
            med(&Round::cpu_ratio),
            med(&|r| r.watcher_pct),
            mb(t.hwm_kb)
        );
    }
    md.push_str(
        "\n| server | round | first | unwatched req/s | watched req/s | ratio | CPU µs per request, unwatched / watched | watcher CPU |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for t in &w.throughput {
        for (i, r) in t.rounds.iter().enumerate() {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.3}× | {:.1} / {:.1} | {:.2}% |",
                t.what,
                i + 1,
                if r.watched_first {
                    "watched"
                } else {
                    "unwatched"
                },
                r.un.rate,
                r.w.rate,
                r.ratio(),
                r.un.cpu_us,
                r.w.cpu_us,
                r.watcher_pct
            );
        }
        for e in &t.errors {
            let _ = writeln!(md, "\n{}: error: {e}\n", t.what);
        }
    }
    md.push_str("\n### The watcher's CPU and memory\n\n");
    md.push_str(
        "| target | loop iterations/s | target CPU, unwatched / watched | watcher CPU | CPU-seconds per hour | 5-s windows (min–max) | watcher VmRSS / VmHWM at the end |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (what, c) in &w.cpu {
        match c {
            Ok(c) => {
                let (lo, hi) = min_max(c.windows.iter().copied());
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.2}% / {:.2}% | **{:.2}% of a core** | {:.1} s | {lo:.2}–{hi:.2}% | {} / {} |",
                    c.what,
                    c.rate,
                    c.target_un_pct,
                    c.target_w_pct,
                    c.watcher_pct,
                    c.watcher_pct / 100.0 * 3600.0,
                    mb(c.rss_kb),
                    mb(c.hwm_kb)
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| {what} | failed: {e:#} | | | | | |");
            }
        }
    }
    let _ = writeln!(
        md,
        "\nThroughput: one server (Debian's `redis-server --save '' --appendonly no` on 127.0.0.1:{REDIS_PORT}; \
         `node` running a 10-line `http.createServer` that answers `ok`){}; a warm-up run, then \
         rounds of one unwatched and one watched run, in alternating order. The watched run starts \
         {:.1} s after `profiler watch --pid P --out DIR` printed its attached line (`… no uprobes`), \
         and the watcher is stopped (SIGINT) after it: nothing of the watcher runs during an unwatched \
         run, which matters with a tracepoint fallback, whose cost falls on every syscall on the \
         machine. redis req/s is over SET and GET (`-n {}` each); node req/s counts responses read by \
         xtask's own loopback load (`{NODE_CONNS}` threads, each one connection sending the next \
         `GET /` once the last response is read). Server CPU per request is the server's run time \
         (every thread's schedstat; the wait programs run in its context) over the run's requests: on \
         a shared machine it is steadier than req/s. Watcher CPU is its utime + stime (/proc/PID/stat, in 10 ms ticks).\n\n\
         The watcher's CPU: the target's own CPU time over {} s unwatched, then the watcher's over \
         {CPU_WINDOWS} windows of {} s from 1 s after it attached, and its VmRSS and VmHWM \
         (/proc/PID/status) at the end. redis idle runs its `serverCron` 10 times a second; the loop \
         fixture (`xtask/bench/bench_loop.c {LOOP_PERIOD_US}`) waits in `epoll_wait` on a timerfd and \
         reads it each iteration, so its iterations a second are its read syscalls (/proc/PID/io).\n",
        if w.pinned {
            " pinned to CPU 0, its load to CPU 1, the watcher unpinned"
        } else {
            ", not pinned (one CPU)"
        },
        SETTLE.as_secs_f64(),
        w.requests,
        TARGET_WINDOW.as_secs(),
        CPU_WINDOW.as_secs()
    );
    let ratios: Vec<String> = w
        .throughput
        .iter()
        .filter(|t| !t.rounds.is_empty())
        .map(|t| {
            format!(
                "{} {:.3}×",
                t.what,
                median(t.rounds.iter().map(Round::ratio).collect())
            )
        })
        .collect();
    let goal = if fentry(w) {
        let met = w.throughput.iter().all(|t| {
            !t.rounds.is_empty() && median(t.rounds.iter().map(Round::ratio).collect()) >= 0.99
        });
        format!(
            "**Goal ≥ 0.99× throughput with fentry: {}** ({}).",
            if met { "met" } else { "not met" },
            ratios.join(", ")
        )
    } else {
        format!(
            "**Goal ≥ 0.99× throughput with fentry: not measurable in this run**, which used the \
             fallback above; its figure is {}. The goal is set for fentry because fentry/fexit \
             programs run only on the wait syscalls' own kernel functions, a few per loop \
             iteration, and nothing else pays. A syscall tracepoint, raw (`sys_enter`/`sys_exit`) \
             or the wait syscalls' own, puts every syscall of every process on the machine (the \
             servers' reads and writes, the load generator's own) on the kernel's slower traced \
             path, and the raw ones run a program on each (BENCHMARKS.md, part m: a `getppid` \
             took about 250 ns more on this VM while they were attached).",
            ratios.join(", ")
        )
    };
    let agent: Vec<String> = w
        .cpu
        .iter()
        .filter_map(|(_, c)| c.as_ref().ok())
        .map(|c| {
            format!(
                "{}: {:.2}% ({})",
                c.what,
                c.watcher_pct,
                if c.watcher_pct < 1.0 {
                    "met"
                } else {
                    "not met"
                }
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "{goal} **The watcher under 1% of a core:** {}.",
        agent.join("; ")
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_waits_path() {
        let out = "profiler: watching PID 7 for stalls\nprofiler: note: watching the loop's waits with the sys_enter and sys_exit tracepoints (meanwhile every syscall on the machine costs a little more): fentry: EPERM\nprofiler: watching PID 7 (x, /x), its main thread: …; no uprobes";
        assert!(waits_path(out).starts_with("the sys_enter and sys_exit tracepoints"));
        assert!(waits_path("profiler: watching PID 7 …; no uprobes").starts_with("fentry"));
    }
}
