//! Benchmark j, second row: the overhead governor on its fixture
//! (`tests/fixtures/governor.c`) with `--max-overhead 5`. The redis-server
//! row is `redis.rs`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::proc::{read_functions_json, Guard, ReadyOn, Tracer};
use crate::util::{gcc, profiler_bin, workspace_root};

pub struct Fixture {
    pub untraced: f64,
    pub after: f64,
    pub detached_at_s: f64,
    pub detached: Vec<String>,
    pub cold: (u64, u64),
}

/// 75th percentile of the fixture's 100 ms window rates ending after `from`.
fn p75(phase: &serde_json::Value, from: u64) -> f64 {
    let mut v: Vec<f64> = phase["windows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w[0].as_u64().unwrap_or(0) > from)
        .filter_map(|w| w[1].as_f64())
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() * 3 / 4).copied().unwrap_or(f64::NAN)
}

pub fn fixture(work: &Path) -> Result<Fixture> {
    let bin = work.join("governor");
    gcc(
        &workspace_root().join("tests/fixtures/governor.c"),
        &bin,
        &["-O2", "-g"],
    )?;
    let mut guard = Guard::spawn(
        Command::new(&bin)
            .args(["2", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    )?;
    let mut stdin = guard.child.stdin.take().expect("piped");
    let mut lines = BufReader::new(guard.child.stdout.take().expect("piped")).lines();
    let mut next = || -> Result<String> {
        lines
            .next()
            .context("the governor fixture ended early")?
            .map_err(Into::into)
    };
    next()?; // ready
    let baseline: serde_json::Value = serde_json::from_str(&next()?)?;
    let out = work.join("prof-governor");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args([
        "record",
        "--pid",
        &guard.pid().to_string(),
        "--func",
        "gov_*",
    ])
    .args(["--max-overhead", "5", "--out"])
    .arg(&out);
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    writeln!(stdin, "go")?;
    let traced: serde_json::Value = serde_json::from_str(&next()?)?;
    tracer.guard.signal(libc::SIGINT);
    tracer.finish(Duration::from_secs(60))?;
    writeln!(stdin, "exit")?;
    guard.wait_timeout(Duration::from_secs(5))?;
    let json = read_functions_json(&out)?;
    let detached: Vec<String> = json["governor"]["detached"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["name"].as_str().unwrap_or("?").to_string())
        .collect();
    let at = json["governor"]["detached"][0]["at_ns"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let cold_seen = crate::proc::calls_of(&json, "gov_cold");
    let start = traced["start_ns"].as_u64().unwrap_or(0);
    Ok(Fixture {
        untraced: p75(&baseline, 0),
        after: p75(&traced, start + 1_300_000_000),
        detached_at_s: at / 1e9,
        detached,
        cold: (cold_seen, traced["cold_calls"].as_u64().unwrap_or(0)),
    })
}

pub fn fixture_rows(f: &Fixture) -> String {
    let mut md = String::from(
        "| fixture | untraced units/s | after the detach | ratio | detached | after | cold calls seen / made |\n\
         | --- | ---: | ---: | ---: | --- | ---: | ---: |\n",
    );
    let _ = writeln!(
        md,
        "| `governor.c`, `--max-overhead 5` | {:.0} | {:.0} | **{:.2}×** | {} | {:.2} s | {} / {} {} |",
        f.untraced,
        f.after,
        f.after / f.untraced,
        f.detached.join(", "),
        f.detached_at_s,
        f.cold.0,
        f.cold.1,
        if f.cold.0 == f.cold.1 { "✓" } else { "✗" }
    );
    md
}
