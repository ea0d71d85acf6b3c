//! Part m: the cost of finding event-loop iterations from the loop's
//! waits. A stripped epoll loop (`xtask/bench/bench_loop.c`, about 10,000
//! iterations a second from a 100 us timerfd) runs untraced and under
//! `profiler record --pid P` with default options (no function probed:
//! only the wait programs: fentry, kprobes or the `sys_enter`/`sys_exit`
//! tracepoints, whichever the kernel allows, and the scheduler ones).
//! What it costs is the fixture's extra CPU time (the tracepoint programs
//! run on its threads) plus the agent's CPU per iteration: the agent's
//! time over a long run minus a short one (loading, attaching and writing
//! the outputs are the same in both).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::median;
use super::rings::cpu_of;
use super::run::parse_result;
use crate::proc::{ReadyOn, Target, Tracer};

/// Iterations of the long and short runs.
pub const LONG: u64 = 50_000;
const SHORT: u64 = 2_000;

/// One run: fixture CPU and wall ns per iteration, agent CPU seconds, and
/// the iterations the profiler counted.
struct Run {
    cpu_ns: f64,
    wall_ns: f64,
    agent_s: f64,
    counted: u64,
}

fn once(fixture: &Path, n: u64, traced: bool, work: &Path) -> Result<Run> {
    let mut target = Target::start(Command::new(fixture).arg(n.to_string()))?;
    let out = work.join("prof-loop");
    let _ = std::fs::remove_dir_all(&out);
    let mut tracer = if traced {
        let mut cmd = Command::new(crate::util::profiler_bin());
        cmd.args(["record", "--pid", &target.pid().to_string()])
            .args(["--max-overhead", "0", "--trace-events", "0", "--out"])
            .arg(&out);
        Some(Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?)
    } else {
        None
    };
    let agent = tracer.as_ref().map(|t| t.guard.pid());
    target.go()?;
    let line = target.result(Duration::from_secs(120))?;
    let r = parse_result(&line);
    let get = |k: &str| r.get(k).copied().unwrap_or(f64::NAN);
    let (mut agent_s, mut counted) = (0.0, 0);
    if let (Some(t), Some(pid)) = (tracer.as_mut(), agent) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some((s, exited)) = cpu_of(pid) {
            agent_s = s;
            if exited || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = t.finish(Duration::from_secs(30))?;
        if !status.success() {
            bail!("the profiler exited with {status}:\n{}", t.output());
        }
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("dispatches.json"))?)?;
        counted = d["dispatches"].as_u64().unwrap_or(0);
    }
    Ok(Run {
        cpu_ns: get("cpu_ns") / n as f64,
        wall_ns: get("elapsed_ns") / n as f64,
        agent_s,
        counted,
    })
}

/// The measured figures, medians of `repeat` interleaved rounds.
pub struct Figures {
    pub untraced_cpu_ns: f64,
    pub traced_cpu_ns: f64,
    pub agent_ns: f64,
    pub wall_ns: f64,
    pub counted: u64,
    pub errors: Vec<String>,
}

pub fn measure(fixture: &Path, repeat: usize, work: &Path) -> Figures {
    let (mut un, mut tr, mut agent, mut wall) = (vec![], vec![], vec![], vec![]);
    let (mut counted, mut errors) = (0, Vec::new());
    for _ in 0..repeat {
        let round = || -> Result<(Run, Run, Run)> {
            Ok((
                once(fixture, LONG, false, work)?,
                once(fixture, LONG, true, work)?,
                once(fixture, SHORT, true, work)?,
            ))
        };
        match round() {
            Ok((u, t, s)) => {
                un.push(u.cpu_ns);
                tr.push(t.cpu_ns);
                wall.push(t.wall_ns);
                agent.push((t.agent_s - s.agent_s) * 1e9 / (LONG - SHORT) as f64);
                counted = t.counted;
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    Figures {
        untraced_cpu_ns: median(un),
        traced_cpu_ns: median(tr),
        agent_ns: median(agent),
        wall_ns: median(wall),
        counted,
        errors,
    }
}

pub fn rows(f: &Figures) -> String {
    let mut md = String::new();
    let kernel = f.traced_cpu_ns - f.untraced_cpu_ns;
    let per_iter = kernel + f.agent_ns;
    // Share of a core at 10,000 iterations a second.
    let share = per_iter * 10_000.0 / 1e9 * 100.0;
    md.push_str("| | ns per iteration |\n|---|---|\n");
    let _ = writeln!(md, "| loop CPU, untraced | {:.0} |", f.untraced_cpu_ns);
    let _ = writeln!(md, "| loop CPU, traced | {:.0} |", f.traced_cpu_ns);
    let _ = writeln!(
        md,
        "| added in the loop's thread (wait and scheduler programs) | {kernel:.0} |"
    );
    let _ = writeln!(md, "| agent CPU | {:.0} |", f.agent_ns);
    let _ = writeln!(
        md,
        "| **total** | **{per_iter:.0}**: {share:.2}% of a core at 10,000 iterations/s (goal: 1%) |"
    );
    let _ = writeln!(
        md,
        "\nIterations counted by the profiler in the last long run: {} of {} (wall {:.0} ns per iteration).",
        f.counted, LONG, f.wall_ns
    );
    for e in &f.errors {
        let _ = writeln!(md, "\nerror: {e}");
    }
    md
}
