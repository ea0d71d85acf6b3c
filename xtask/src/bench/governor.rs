//! Benchmark g: the overhead governor. `redis-server` under
//! `redis-benchmark -t get -c 20`, untraced and traced with default options
//! (`profiler record --pid P`: every function of the executable up to 2,000,
//! `--max-overhead 10`), in the same run; and the governor fixture
//! (`tests/fixtures/governor.c`) with `--max-overhead 5`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::proc::{read_functions_json, Guard, ReadyOn, Tracer};
use crate::util::{gcc, profiler_bin, workspace_root};

/// Port of the bench's own redis-server (not the system one).
const PORT: &str = "6391";

/// redis-benchmark runs per phase: the machine is shared, so each phase
/// reports its best run (other load only ever slows a run down).
const RUNS: usize = 3;

pub struct Redis {
    /// GET requests per second of each run: untraced before, untraced after.
    pub untraced: Vec<f64>,
    /// Traced runs, after a warm-up run that lets the governor act.
    pub traced: Vec<f64>,
    /// The warm-up run (the governor acting during it).
    pub warmup: f64,
    /// p50 latency in ms: untraced (first run), traced.
    pub p50: (f64, f64),
    /// Functions probed at attach.
    pub probed: u64,
    /// Detached functions: (name, seconds after attach, calls/s, est. %).
    pub detached: Vec<(String, f64, f64, f64)>,
    /// The calibrated cost line.
    pub cost: String,
    pub peak_pct: f64,
}

/// `redis-benchmark -t get -c 20 -n N --csv`: (requests/s, p50 ms).
fn benchmark(n: u64) -> Result<(f64, f64)> {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            PORT,
            "-t",
            "get",
            "-c",
            "20",
            "-n",
            &n.to_string(),
            "--csv",
        ])
        .output()
        .context("running redis-benchmark (Debian package redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("\"GET\""))
        .with_context(|| format!("no GET line from redis-benchmark: {text}"))?;
    let cols: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Ok((cols[0], cols[3]))
}

pub fn redis(requests: u64, work: &Path) -> Result<Redis> {
    let mut server = Guard::spawn(
        Command::new("redis-server")
            .args(["--port", PORT, "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null()),
    )
    .context("starting redis-server (Debian package redis-server)")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("redis-cli")
        .args(["-p", PORT, "ping"])
        .output()
        .map_or(true, |o| {
            !String::from_utf8_lossy(&o.stdout).contains("PONG")
        })
    {
        if Instant::now() > deadline {
            bail!("redis-server did not answer on port {PORT}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Populate the key GET reads, then warm up.
    benchmark(requests / 4)?;
    let mut untraced = Vec::new();
    let mut p50_untraced = f64::NAN;
    for _ in 0..RUNS {
        let (rps, p50) = benchmark(requests)?;
        untraced.push(rps);
        p50_untraced = p50_untraced.min(p50);
    }
    eprintln!("bench: redis untraced {untraced:?} GET/s");
    let out = work.join("prof-redis");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["record", "--pid", &server.pid().to_string(), "--out"])
        .arg(&out);
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    let (warmup, _) = benchmark(requests / 2)?;
    let mut traced = Vec::new();
    let mut p50_traced = f64::NAN;
    for _ in 0..RUNS {
        let (rps, p50) = benchmark(requests)?;
        traced.push(rps);
        p50_traced = p50_traced.min(p50);
    }
    eprintln!("bench: redis traced {traced:?} GET/s (warm-up {warmup:.0})");
    tracer.guard.signal(libc::SIGINT);
    tracer.finish(Duration::from_secs(60))?;
    for _ in 0..RUNS {
        untraced.push(benchmark(requests)?.0);
    }
    eprintln!("bench: redis untraced, all runs {untraced:?} GET/s");
    server.stop(Duration::from_secs(5))?;
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
        untraced,
        traced,
        warmup,
        p50: (p50_untraced, p50_traced),
        probed: json["functions_probed"].as_u64().unwrap_or(0),
        detached,
        cost,
        peak_pct: gov["peak_pct"].as_f64().unwrap_or(f64::NAN),
    })
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn redis_rows(r: &Redis, requests: u64) -> String {
    let base = best(&r.untraced);
    let (before, after) = r.untraced.split_at(RUNS);
    let mut md = String::from(
        "| phase | best GET requests/s | vs best untraced | best p50 latency | every run |\n| --- | ---: | ---: | ---: | --- |\n",
    );
    let _ = writeln!(
        md,
        "| untraced, before | {:.0} | — | {:.3} ms | {} |",
        best(before),
        r.p50.0,
        runs(before)
    );
    let _ = writeln!(
        md,
        "| traced, warm-up ({} requests, the governor acting) | {:.0} | {:.2}× | — | |",
        requests / 2,
        r.warmup,
        r.warmup / base
    );
    let _ = writeln!(
        md,
        "| traced, default options | {:.0} | **{:.2}×** | {:.3} ms | {} |",
        best(&r.traced),
        best(&r.traced) / base,
        r.p50.1,
        runs(&r.traced)
    );
    let _ = writeln!(
        md,
        "| untraced, after | {:.0} | — | — | {} |",
        best(after),
        runs(after)
    );
    let _ = writeln!(
        md,
        "\nProbed {} functions; the governor detached {} (highest per-thread estimate {:.1}%). `{}`\n",
        r.probed,
        r.detached.len(),
        r.peak_pct,
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
