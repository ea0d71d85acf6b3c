//! Benchmark l: one ring per CPU (`--rings per-cpu`, the default) against
//! one shared ring (`--rings shared`), in the same run: the highest
//! zero-loss rate with 1 and 2 writer threads, the agent's CPU per million
//! events, and a many-writer run with threads pinned to the CPUs so their
//! programs contend for the rings' locks.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::rate::{self, Sweep};
use crate::proc::{calls_of, read_functions_json, ReadyOn, Target, Tracer};

/// Both modes, per-CPU first.
pub const MODES: [&str; 2] = ["per-cpu", "shared"];

/// Online CPUs.
pub fn cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).max(1) as u64
}

/// Zero-loss sweeps: 1 and 2 threads, each mode, with `ring` bytes per
/// ring; the shared ring also with `ring` × CPUs (the same memory as the
/// per-CPU rings).
pub fn sweeps(bin: &Path, ring: u64, secs: f64, work: &Path) -> Vec<Sweep> {
    let mut v = Vec::new();
    for threads in [1, 2] {
        for mode in MODES {
            v.push(rate::sweep_rings(
                bin,
                threads,
                Some(ring),
                Some(mode),
                secs,
                work,
            ));
        }
        v.push(rate::sweep_rings(
            bin,
            threads,
            Some(ring * cpus()),
            Some("shared"),
            secs,
            work,
        ));
    }
    v
}

pub fn sweep_rows(sweeps: &[Sweep]) -> String {
    let mut s = String::from(
        "| threads | rings | bytes per ring | highest zero-loss rate | lowest lossy rate | note |\n\
         | ---: | --- | ---: | ---: | ---: | --- |\n",
    );
    for w in sweeps {
        let [ring, best, loss, note] = rate::cells(w, "");
        writeln!(
            s,
            "| {} | {} | {ring} | {best} | {loss} | {note} |",
            w.threads,
            w.rings.unwrap_or("default")
        )
        .unwrap();
    }
    s
}

/// One flat-out run.
#[derive(Clone, Debug, Default)]
pub struct Flat {
    pub mode: &'static str,
    pub threads: u32,
    pub pinned: bool,
    pub ring: Option<u64>,
    pub calls: u64,
    pub seen_calls: u64,
    pub events: u64,
    pub lost: u64,
    /// The fixture's calls per second, traced.
    pub calls_per_s: f64,
    /// The agent's CPU (user + system), seconds, from attach to exit.
    pub agent_cpu: f64,
}

/// utime + stime of `pid` in seconds, and whether it has exited (zombie).
pub(super) fn cpu_of(pid: u32) -> Option<(f64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3, utime 14, stime 15 (1-based).
    let (state, ut, st) = (f.first()?, f.get(11)?, f.get(12)?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let t = (ut.parse::<f64>().ok()? + st.parse::<f64>().ok()?) / hz;
    Some((t, *state == "Z"))
}

/// The nop fixture's load: `threads` threads of `iters` iterations each
/// (pinned round-robin to the CPUs with `pin`), and the rings' size.
#[derive(Clone, Copy)]
pub struct Load {
    pub threads: u32,
    pub iters: u64,
    pub ring: Option<u64>,
    pub pin: bool,
}

/// Runs the nop fixture `bin` flat out with `load` under
/// `prof record --rings mode`.
pub fn flat(prof: &Path, bin: &Path, mode: &'static str, load: Load, work: &Path) -> Result<Flat> {
    let Load {
        threads,
        iters,
        ring,
        pin,
    } = load;
    let out = work.join(format!("prof-rings-{mode}"));
    let _ = std::fs::remove_dir_all(&out);
    let mut target = Target::start(
        Command::new(bin)
            .args([iters.to_string(), threads.to_string()])
            .env("BENCH_PIN", if pin { "1" } else { "0" }),
    )?;
    let mut cmd = Command::new(prof);
    cmd.args(["record", "--pid", &target.pid().to_string()])
        .args(["--func", "leaf", "--func", "mid", "--max-overhead", "0"])
        .args(["--trace-events", "0", "--rings", mode, "--out"])
        .arg(&out);
    if let Some(r) = ring {
        cmd.args(["--ring-size", &r.to_string()]);
    }
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    let agent = tracer.guard.pid();
    target.go()?;
    let line = target.result(Duration::from_secs(300))?;
    let fields = super::run::parse_result(&line);
    // The agent's CPU just before it is reaped: it drains what is left,
    // writes its outputs and exits when the target does.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut agent_cpu = 0.0;
    while let Some((t, exited)) = cpu_of(agent) {
        agent_cpu = t;
        if exited || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = tracer.finish(Duration::from_secs(30))?;
    if !status.success() {
        bail!("the profiler exited with {status}:\n{}", tracer.output());
    }
    let json = read_functions_json(&out)?;
    let get = |k: &str| fields.get(k).copied().unwrap_or(0.0);
    Ok(Flat {
        mode,
        threads,
        pinned: pin,
        ring,
        calls: (get("calls_leaf") + get("calls_mid")) as u64,
        seen_calls: calls_of(&json, "leaf") + calls_of(&json, "mid"),
        events: json["events"].as_u64().unwrap_or(0),
        lost: json["lost_events"].as_u64().unwrap_or(0),
        calls_per_s: get("calls_per_s"),
        agent_cpu,
    })
}

/// Agent CPU per million events, per build and mode: a flat-out run of
/// `iters` iterations against one of 1,000 (the fixed cost of loading,
/// attaching and writing the outputs), median of `repeat` of each. The
/// builds' and modes' runs are interleaved, so a change in the machine's
/// speed falls on all of them.
pub struct CpuRow {
    pub build: &'static str,
    pub mode: &'static str,
    pub events: u64,
    pub lost: u64,
    pub cpu_big: f64,
    pub cpu_small: f64,
}

pub fn cpu_rows_measure(
    profs: &[(&'static str, PathBuf)],
    bin: &Path,
    iters: u64,
    repeat: usize,
    work: &Path,
) -> Vec<Result<CpuRow>> {
    let cells: Vec<(&'static str, &Path, &'static str)> = profs
        .iter()
        .flat_map(|(build, p)| MODES.iter().map(move |&mode| (*build, p.as_path(), mode)))
        .collect();
    // Per cell: the big runs' CPU, the small runs', events, lost.
    type Acc = (Vec<f64>, Vec<f64>, u64, u64);
    let mut runs: Vec<Result<Acc>> = cells
        .iter()
        .map(|_| Ok((Vec::new(), Vec::new(), 0, 0)))
        .collect();
    for _ in 0..repeat {
        for (cell, run) in cells.iter().zip(runs.iter_mut()) {
            let Ok((big, small, events, lost)) = run else {
                continue;
            };
            let (build, prof, mode) = *cell;
            let one = |iters| Load {
                threads: 1,
                iters,
                ring: None,
                pin: false,
            };
            let measured = flat(prof, bin, mode, one(iters), work)
                .and_then(|b| Ok((b, flat(prof, bin, mode, one(1_000), work)?)));
            match measured {
                Ok((b, s)) => {
                    eprintln!(
                        "bench: rings cpu {build} {mode}: {} events, {} lost, agent {:.3} s (small run {:.3} s)",
                        b.events, b.lost, b.agent_cpu, s.agent_cpu
                    );
                    *events = b.events;
                    *lost += b.lost;
                    big.push(b.agent_cpu);
                    small.push(s.agent_cpu);
                }
                Err(e) => *run = Err(e),
            }
        }
    }
    cells
        .iter()
        .zip(runs)
        .map(|(&(build, _, mode), run)| {
            let (big, small, events, lost) = run?;
            Ok(CpuRow {
                build,
                mode,
                events,
                lost,
                cpu_big: super::median(big),
                cpu_small: super::median(small),
            })
        })
        .collect()
}

pub fn cpu_rows(rows: &[Result<CpuRow>]) -> String {
    let mut s = String::from(
        "| build | rings | events | lost | agent CPU (run) | agent CPU (1,000-iteration run) | agent CPU per M events | events per agent CPU second | goal ≥ 5 M/s |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for r in rows {
        match r {
            Ok(r) => {
                let marginal = (r.cpu_big - r.cpu_small).max(1e-3);
                let per_m = marginal / (r.events as f64 / 1e6);
                let rate = r.events as f64 / marginal;
                writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.2} s | {:.2} s | {:.0} ms | {:.1} M/s | {} |",
                    r.build,
                    r.mode,
                    r.events,
                    r.lost,
                    r.cpu_big,
                    r.cpu_small,
                    per_m * 1e3,
                    rate / 1e6,
                    if rate >= 5e6 { "met" } else { "not met" }
                )
                .unwrap();
            }
            Err(e) => writeln!(s, "| failed: {e:#} | | | | | | | | | |").unwrap(),
        }
    }
    s
}

pub fn flat_rows(rows: &[Result<Flat>]) -> String {
    let mut s = String::from(
        "| rings | threads (pinned) | bytes per ring | calls | calls seen | events | lost | lost share | traced calls/s |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        match r {
            Ok(r) => writeln!(
                s,
                "| {} | {}{} | {} | {} | {} | {} | {} | {:.3}% | {:.2} M |",
                r.mode,
                r.threads,
                if r.pinned { " (pinned)" } else { "" },
                r.ring
                    .map_or("default".into(), |b| format!("{} KiB", b >> 10)),
                r.calls,
                r.seen_calls,
                r.events,
                r.lost,
                100.0 * r.lost as f64 / (r.events + r.lost).max(1) as f64,
                r.calls_per_s / 1e6
            )
            .unwrap(),
            Err(e) => writeln!(s, "| failed: {e:#} | | | | | | | | |").unwrap(),
        }
    }
    s
}
