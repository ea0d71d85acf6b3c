//! Benchmark d: time to attach 1,000 functions.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};

use super::median;
use crate::proc::{parse_attached, read_functions_json, ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

pub struct Attach {
    /// The `in X ms` of the attached line.
    pub reported_ms: f64,
    /// Wall time from spawning the profiler to its attached line.
    pub wall_ms: f64,
    pub attached: u64,
    pub probed: Option<u64>,
}

/// Attach to the 1,000-function fixture `repeat` times; medians.
pub fn measure(bin: &Path, repeat: usize, work: &Path) -> Result<Attach> {
    let (mut reported, mut wall) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let a = once(bin, work)?;
        reported.push(a.reported_ms);
        wall.push(a.wall_ms);
        last = Some(a);
    }
    let last = last.expect("at least one attach");
    Ok(Attach {
        reported_ms: median(reported),
        wall_ms: median(wall),
        ..last
    })
}

/// One attach, stopped with SIGINT shortly after.
fn once(bin: &Path, work: &Path) -> Result<Attach> {
    let target = Target::start(&mut Command::new(bin))?;
    let out = work.join("prof-attach");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args([
        "record",
        "--pid",
        &target.pid().to_string(),
        "--func",
        "fn_*",
    ])
    .args(["--max-funcs", "5000", "--out"])
    .arg(&out);
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    let wall_ms = tracer.ready_after.as_secs_f64() * 1000.0;
    let Some((attached, reported_ms)) = parse_attached(&tracer.ready_line) else {
        bail!("cannot parse the attached line: {}", tracer.ready_line);
    };
    eprintln!("bench: {} (wall {wall_ms:.0} ms)", tracer.ready_line);
    // Let the loop call every function a few times, then stop.
    std::thread::sleep(Duration::from_millis(300));
    tracer.guard.stop(Duration::from_secs(30))?;
    let probed = read_functions_json(&out)
        .ok()
        .and_then(|j| j["functions_probed"].as_u64());
    drop(target);
    Ok(Attach {
        reported_ms,
        wall_ms,
        attached,
        probed,
    })
}

pub fn rows(r: &Result<Attach>) -> String {
    let mut s = String::from(
        "| functions | attach time reported (`in X ms`) | spawn → attached line | functions_probed | goal < 1 s |\n\
         | ---: | ---: | ---: | ---: | --- |\n",
    );
    match r {
        Ok(a) => writeln!(
            s,
            "| {} | {:.0} ms | {:.0} ms | {} | {} |",
            a.attached,
            a.reported_ms,
            a.wall_ms,
            a.probed.map_or("—".into(), |p| p.to_string()),
            if a.wall_ms < 1000.0 {
                "met"
            } else {
                "**missed**"
            }
        )
        .unwrap(),
        Err(e) => writeln!(s, "| 1000 | error: {} | | | |", super::percall::one_line(e)).unwrap(),
    }
    s
}
