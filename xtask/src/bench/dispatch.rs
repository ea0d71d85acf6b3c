//! Dispatch tracking: the cost the profiler adds per dispatch (a dispatch
//! function and one handler, both probed), with the in-dispatch sampler off
//! and at 997 Hz, and with waker tracking on, off (`--no-wakers`) and, when
//! given, in a profiler built before it (`--base-profiler`); dispatches
//! that block on a pipe to a worker; a storm of wake-ups outside any traced
//! dispatch; and the agent's peak memory. Every configuration is measured
//! once per round, rounds interleaved, and the median kept, so the ratios
//! compare runs made minutes apart on the same machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::median;
use super::run::parse_result;
use crate::proc::{ReadyOn, Target, Tracer};

/// What runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Load {
    /// The watched thread's dispatches call `handle_fast` and never block.
    Fast,
    /// Each dispatch blocks on a pipe to a worker thread (two wake-ups).
    Pipe,
    /// The same pipe round trips in an untraced process, while the profiler
    /// records an idle one: wake-ups outside any traced dispatch.
    Storm,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Fast => "fast dispatches",
            Load::Pipe => "dispatches blocked on a pipe",
            Load::Storm => "pipe round trips in another process",
        }
    }
}

/// Who records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum By {
    Nobody,
    /// This profiler, waker tracking on.
    Wakers,
    /// This profiler with `--no-wakers`.
    NoWakers,
    /// The profiler given with `--base-profiler` (built before waker tracking).
    Base,
}

impl By {
    fn name(self) -> &'static str {
        match self {
            By::Nobody => "untraced",
            By::Wakers => "wakers on",
            By::NoWakers => "--no-wakers",
            By::Base => "before waker tracking",
        }
    }
}

/// One measured configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub load: Load,
    pub n: u64,
    /// In-dispatch sampler rate (0: off).
    pub hz: u64,
    pub by: By,
}

/// What is compared: the fixture's wall time, or the CPU time of all its
/// threads (being preempted by other load does not count).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Metric {
    Wall,
    Cpu,
}

/// A configuration's runs.
pub struct Row {
    pub cfg: Config,
    /// Wall ns per dispatch (per round trip for [`Load::Storm`]), one per round.
    pub wall: Vec<f64>,
    /// CPU ns per dispatch (all the fixture's threads), one per round.
    pub cpu: Vec<f64>,
    pub errors: Vec<String>,
    /// Peak RSS of the agent over the rounds, KiB.
    pub peak_kib: Option<u64>,
    /// Dispatches the profiler counted (last round).
    pub counted: Option<u64>,
}

impl Row {
    fn of(&self, m: Metric) -> &[f64] {
        match m {
            Metric::Wall => &self.wall,
            Metric::Cpu => &self.cpu,
        }
    }

    fn median(&self, m: Metric) -> Option<f64> {
        let v = self.of(m);
        (!v.is_empty()).then(|| median(v.to_vec()))
    }
}

/// What one run measured.
struct Sample {
    wall: f64,
    cpu: f64,
    peak_kib: Option<u64>,
    counted: Option<u64>,
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The profilers measured: this build and, optionally, an older one.
pub struct Profilers {
    pub new: PathBuf,
    pub base: Option<PathBuf>,
}

fn start_profiler(profs: &Profilers, cfg: &Config, pid: u32, out: &Path) -> Result<Option<Tracer>> {
    let bin = match cfg.by {
        By::Nobody => return Ok(None),
        By::Base => profs.base.as_ref().context("no --base-profiler")?,
        By::Wakers | By::NoWakers => &profs.new,
    };
    let _ = std::fs::remove_dir_all(out);
    let mut cmd = Command::new(bin);
    cmd.args(["record", "--pid", &pid.to_string()])
        .args(["--dispatch", "dispatch_message", "--func", "handle_*"])
        .args(["--trace-events", "0", "--max-overhead", "0"])
        .args(["--dispatch-hz", &cfg.hz.to_string()]);
    if cfg.by == By::NoWakers {
        cmd.arg("--no-wakers");
    }
    cmd.arg("--out").arg(out);
    Tracer::start(&mut cmd, ReadyOn::Stderr, "attached").map(Some)
}

/// Waits for the fixture's result line, polling the agent's peak RSS.
/// Returns (wall, CPU) ns per dispatch.
fn result_of(
    target: &mut Target,
    tracer: Option<&Tracer>,
    peak: &mut Option<u64>,
) -> Result<(f64, f64)> {
    let line = loop {
        if let Some(t) = tracer {
            *peak = vm_hwm_kib(t.guard.pid()).or(*peak);
        }
        match target
            .stdout
            .wait_for(Duration::from_millis(100), |l| l.starts_with("result:"))
        {
            Ok(l) => break l,
            Err(_) if target.guard.wait_timeout(Duration::ZERO)?.is_none() => continue,
            Err(e) => return Err(e.context("the fixture exited without a result line")),
        }
    };
    let r = parse_result(&line);
    let get = |k| r.get(k).copied().unwrap_or(f64::NAN);
    Ok((get("ns_per_dispatch"), get("cpu_ns_per_dispatch")))
}

/// One run of `cfg`.
fn once(fixture: &Path, profs: &Profilers, cfg: &Config, out: &Path) -> Result<Sample> {
    let n = cfg.n.to_string();
    let mut traced = match cfg.load {
        Load::Fast => Target::start(Command::new(fixture).arg(&n))?,
        Load::Pipe => Target::start(Command::new(fixture).args([n.as_str(), "pipe"]))?,
        // An idle target: it waits on stdin, outside any dispatch.
        Load::Storm => Target::start(Command::new(fixture).arg("1"))?,
    };
    let mut tracer = start_profiler(profs, cfg, traced.pid(), out)?;
    let mut peak = None;
    let (wall, cpu) = match cfg.load {
        Load::Storm => {
            let mut storm = Target::start(Command::new(fixture).args([n.as_str(), "pipe"]))?;
            storm.go()?;
            let storm_ns = result_of(&mut storm, tracer.as_ref(), &mut peak)?;
            traced.go()?;
            result_of(&mut traced, None, &mut None)?;
            storm_ns
        }
        Load::Fast | Load::Pipe => {
            traced.go()?;
            result_of(&mut traced, tracer.as_ref(), &mut peak)?
        }
    };
    let mut counted = None;
    if let Some(t) = tracer.as_mut() {
        peak = vm_hwm_kib(t.guard.pid()).or(peak);
        let status = t.finish(Duration::from_secs(60))?;
        anyhow::ensure!(status.success(), "the profiler failed: {}", t.output());
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("dispatches.json"))
                .context("reading dispatches.json")?,
        )?;
        counted = json["dispatches"].as_u64();
    }
    Ok(Sample {
        wall,
        cpu,
        peak_kib: peak,
        counted,
    })
}

/// The configurations, in the order of one round.
pub fn configs(fast_n: u64, pipe_n: u64, storm_n: u64, base: bool) -> Vec<Config> {
    let mut v = Vec::new();
    let tracers: &[By] = if base {
        &[By::Wakers, By::NoWakers, By::Base]
    } else {
        &[By::Wakers, By::NoWakers]
    };
    let mut add = |load, n, hz, with_untraced: bool| {
        if with_untraced {
            v.push(Config {
                load,
                n,
                hz: 0,
                by: By::Nobody,
            });
        }
        for &by in tracers {
            v.push(Config { load, n, hz, by });
        }
    };
    add(Load::Fast, fast_n, 0, true);
    add(Load::Fast, fast_n, 997, false);
    add(Load::Pipe, pipe_n, 997, true);
    add(Load::Storm, storm_n, 997, true);
    // Agent memory after fewer dispatches (flat: fast ones leave nothing).
    for hz in [0, 997] {
        v.push(Config {
            load: Load::Fast,
            n: fast_n / 5,
            hz,
            by: By::Wakers,
        });
    }
    v
}

/// Measures every configuration once per round, `rounds` times.
pub fn measure(
    fixture: &Path,
    profs: &Profilers,
    cfgs: &[Config],
    rounds: usize,
    work: &Path,
) -> Vec<Row> {
    let out = work.join("prof-dispatch");
    let mut rows: Vec<Row> = cfgs
        .iter()
        .map(|&cfg| Row {
            cfg,
            wall: Vec::new(),
            cpu: Vec::new(),
            errors: Vec::new(),
            peak_kib: None,
            counted: None,
        })
        .collect();
    for round in 1..=rounds.max(1) {
        for row in rows.iter_mut() {
            let c = row.cfg;
            eprintln!(
                "bench: dispatch round {round}/{rounds}: {}, {} × {}, sampler {} Hz",
                c.by.name(),
                c.n,
                c.load.name(),
                c.hz
            );
            match once(fixture, profs, &c, &out) {
                Ok(s) => {
                    row.wall.push(s.wall);
                    row.cpu.push(s.cpu);
                    row.peak_kib = s.peak_kib.max(row.peak_kib);
                    row.counted = s.counted.or(row.counted);
                }
                Err(e) => {
                    eprintln!("bench: dispatch: {e:#}");
                    row.errors
                        .push(format!("{e:#}").lines().next().unwrap_or("").to_string());
                }
            }
        }
    }
    rows
}

fn find(rows: &[Row], load: Load, n: u64, hz: u64, by: By) -> Option<&Row> {
    rows.iter().find(|r| {
        let c = r.cfg;
        c.load == load && c.n == n && c.by == by && (by == By::Nobody || c.hz == hz)
    })
}

/// `median (min–max)` ns, or the first error.
fn cell(r: Option<&Row>, m: Metric) -> String {
    let Some(r) = r else { return "—".into() };
    match r.median(m) {
        Some(med) => {
            let lo = r.of(m).iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.of(m).iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{med:.0} ({lo:.0}–{hi:.0})")
        }
        None => format!("error: {}", r.errors.first().map_or("", String::as_str)),
    }
}

/// Added ns (traced − untraced medians).
fn added(r: Option<&Row>, base: Option<f64>, m: Metric) -> Option<f64> {
    Some(r?.median(m)? - base?)
}

fn fmt_added(a: Option<f64>) -> String {
    a.map_or("—".into(), |a| format!("{:.2} µs", a / 1000.0))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "—".into(),
    }
}

/// The comparison table: per load and sampler rate, the added cost with
/// waker tracking on against `--no-wakers` and the older build.
pub fn comparison(rows: &[Row], fast_n: u64, pipe_n: u64, storm_n: u64, m: Metric) -> String {
    let has_base = rows.iter().any(|r| r.cfg.by == By::Base);
    let mut s = String::from(
        "| load | sampler | untraced ns | wakers on: ns (min–max) | added | `--no-wakers`: ns | added |",
    );
    if has_base {
        s.push_str(" before waker tracking: ns | added |");
    }
    s.push_str(" on / `--no-wakers` (added) |");
    if has_base {
        s.push_str(" on / before (added) |");
    }
    s.push('\n');
    let cols = if has_base { 11 } else { 8 };
    s.push_str(&"| --- ".repeat(2));
    s.push_str(&"| ---: ".repeat(cols - 2));
    s.push_str("|\n");
    for (load, n, hz) in [
        (Load::Fast, fast_n, 0),
        (Load::Fast, fast_n, 997),
        (Load::Pipe, pipe_n, 997),
        (Load::Storm, storm_n, 997),
    ] {
        let untraced = find(rows, load, n, hz, By::Nobody);
        let u = untraced.and_then(|r| r.median(m));
        let on = find(rows, load, n, hz, By::Wakers);
        let off = find(rows, load, n, hz, By::NoWakers);
        let base = find(rows, load, n, hz, By::Base);
        let (a_on, a_off, a_base) = (added(on, u, m), added(off, u, m), added(base, u, m));
        let sampler = if hz == 0 {
            "off".to_string()
        } else {
            format!("{hz} Hz")
        };
        write!(
            s,
            "| {} × {n} | {sampler} | {} | {} | {} | {} | {} |",
            load.name(),
            cell(untraced, m),
            cell(on, m),
            fmt_added(a_on),
            cell(off, m),
            fmt_added(a_off),
        )
        .unwrap();
        if has_base {
            write!(s, " {} | {} |", cell(base, m), fmt_added(a_base)).unwrap();
        }
        write!(s, " {} |", ratio(a_on, a_off)).unwrap();
        if has_base {
            write!(s, " {} |", ratio(a_on, a_base)).unwrap();
        }
        s.push('\n');
    }
    s
}

/// The agent's peak memory and the dispatches it counted, per run size.
pub fn memory(rows: &[Row]) -> String {
    let mut s = String::from(
        "| recorded by | dispatches | sampler | dispatches counted | agent peak RSS |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows
        .iter()
        .filter(|r| r.cfg.load == Load::Fast && r.cfg.by != By::Nobody)
    {
        writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.cfg.by.name(),
            r.cfg.n,
            if r.cfg.hz == 0 {
                "off".to_string()
            } else {
                format!("{} Hz", r.cfg.hz)
            },
            r.counted.map_or("—".into(), |c| c.to_string()),
            r.peak_kib
                .map_or("—".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
        )
        .unwrap();
    }
    s
}
