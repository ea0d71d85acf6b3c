//! Benchmark d: time to attach 1,000 functions, and time to stop again.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::proc::{parse_attached, read_functions_json, ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// How long to wait for the profiler to exit after SIGINT.
const STOP_WAIT: Duration = Duration::from_secs(60);

pub struct Attach {
    /// The `in X ms` of the attached line.
    pub reported_ms: f64,
    /// Wall time from spawning the profiler to its attached line.
    pub wall_ms: f64,
    pub attached: u64,
    /// Probes (entries and exits) of the attached line.
    pub probes: u64,
    /// functions_probed from functions.json, if the profiler got to write it.
    pub probed: Option<u64>,
    /// Time from SIGINT to exit; `None` if it took longer than STOP_WAIT.
    pub stop_ms: Option<f64>,
}

/// Attach once to the 1,000-function fixture, then stop with SIGINT.
///
/// Only once: detaching each uprobe perf event waits for an RCU-tasks-trace
/// grace period in the kernel, so a stop can take minutes, and a second
/// attach would overlap the first one's teardown.
pub fn measure(bin: &Path, work: &Path) -> Result<Attach> {
    measure_n(bin, work, 5000)
}

/// As [`measure`], with `--max-funcs max_funcs`.
pub fn measure_n(bin: &Path, work: &Path, max_funcs: usize) -> Result<Attach> {
    let max = max_funcs.to_string();
    measure_target(
        &mut Command::new(bin),
        &["--func", "fn_*", "--max-funcs", &max],
        work,
    )
}

/// Attach time of `record --pid` with default options to node (Debian's,
/// 74,675 functions: the default selection is capped at `--max-funcs`),
/// idle in its event loop.
pub fn measure_node(work: &Path) -> Result<Attach> {
    measure_target(
        Command::new("node").args([
            "-e",
            "console.log('node: ready'); setInterval(() => {}, 1000)",
        ]),
        &[],
        work,
    )
}

/// Attaches `record --pid P --max-overhead 0 extra…` to the program `target`
/// starts (it prints a `ready` line), then stops it with SIGINT.
fn measure_target(target: &mut Command, extra: &[&str], work: &Path) -> Result<Attach> {
    let target = Target::start(target)?;
    let out = work.join("prof-attach");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["record", "--pid", &target.pid().to_string()])
        .args(extra)
        .args(["--max-overhead", "0", "--out"])
        .arg(&out);
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    let wall_ms = tracer.ready_after.as_secs_f64() * 1000.0;
    let Some((attached, reported_ms)) = parse_attached(&tracer.ready_line) else {
        bail!("cannot parse the attached line: {}", tracer.ready_line);
    };
    eprintln!("bench: {} (wall {wall_ms:.0} ms)", tracer.ready_line);
    let probes = tracer
        .ready_line
        .split(" probes)")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // Let the loop call every function a few times, then stop.
    std::thread::sleep(Duration::from_millis(300));
    let stopping = Instant::now();
    tracer.guard.signal(libc::SIGINT);
    let stop_ms = match tracer.guard.wait_timeout(STOP_WAIT)? {
        Some(_) => Some(stopping.elapsed().as_secs_f64() * 1000.0),
        None => {
            eprintln!(
                "bench: the profiler had not exited {STOP_WAIT:?} after SIGINT; killing it \
                 (the kernel finishes the uprobe teardown in the background)"
            );
            tracer.guard.abandon();
            None
        }
    };
    let probed = read_functions_json(&out)
        .ok()
        .and_then(|j| j["functions_probed"].as_u64());
    drop(target);
    Ok(Attach {
        reported_ms,
        wall_ms,
        attached,
        probes,
        probed,
        stop_ms,
    })
}

pub fn rows(r: &Result<Attach>) -> String {
    let mut s = String::from(
        "| functions | attach time reported (`in X ms`) | spawn → attached line | goal < 1 s | SIGINT → exit | functions_probed |\n\
         | ---: | ---: | ---: | --- | ---: | ---: |\n",
    );
    match r {
        Ok(a) => writeln!(
            s,
            "| {} | {:.0} ms | {:.0} ms | {} | {} | {} |",
            a.attached,
            a.reported_ms,
            a.wall_ms,
            if a.wall_ms < 1000.0 {
                "met"
            } else {
                "**missed**"
            },
            a.stop_ms
                .map_or(format!("**> {} s**", STOP_WAIT.as_secs()), |ms| format!(
                    "{ms:.0} ms"
                )),
            a.probed.map_or("—".into(), |p| p.to_string()),
        )
        .unwrap(),
        Err(e) => writeln!(
            s,
            "| 1000 | error: {} | | | | |",
            super::percall::one_line(e)
        )
        .unwrap(),
    }
    s
}
