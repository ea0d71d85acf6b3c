//! `cargo xtask fuzz`: builds the libFuzzer targets in `fuzz/` with
//! cargo-fuzz (nightly; `--dev`, opt-level 1, overflow checks off as in release: builds in
//! minutes where cargo-fuzz's default release build with one codegen unit
//! per crate took over an hour on a busy 2-core machine; `--asan` adds
//! AddressSanitizer) into `target/fuzz`, seeds them
//! from real inputs (`seeds.rs`), runs each for the time given, in turn,
//! and prints per target the runs, execs/s and crashes (with the input
//! that crashed). Fails when any target crashed, timed out or ran out of
//! memory.
//!
//! Directories, all under `target/`: `fuzz-seeds/T` (made afresh each
//! run), `fuzz-corpus/T` (what libFuzzer found, kept between runs),
//! `fuzz-artifacts/T` (crashing inputs; reproduce one with
//! `cargo +nightly fuzz run --dev -s none --fuzz-dir fuzz --target-dir target/fuzz T FILE`).

mod seeds;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::util::{display, workspace_root};

/// The fuzz targets (`fuzz/fuzz_targets/T.rs`, each one call into
/// `profiler::fuzzing`).
pub const TARGETS: &[&str] = &[
    "ring_record",
    "perf_map",
    "unwind_table",
    "cfi_section",
    "profile_data",
];

/// Where `cargo fuzz build --dev` puts the targets.
const BIN_DIR: &str = "target/fuzz/x86_64-unknown-linux-gnu/debug";

/// Memory a target may use before libFuzzer calls it a failure (unbounded
/// allocation).
const RSS_LIMIT_MB: u32 = 2048;
/// One input running longer than this is a hang.
const TIMEOUT_S: u32 = 10;

#[derive(clap::Args)]
pub struct Args {
    /// Minutes to run each target.
    #[arg(long, conflicts_with = "seconds")]
    pub minutes: Option<u64>,
    /// Seconds to run each target (default 30).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Run the targets as last built, without `cargo fuzz build`.
    #[arg(long)]
    pub no_build: bool,
    /// Build with AddressSanitizer (a longer build; Rust's own checks and
    /// overflow checks are on either way).
    #[arg(long)]
    pub asan: bool,
    /// Give up (and say so) when the build takes longer than this many
    /// minutes; the targets are then not run.
    #[arg(long, value_name = "MINUTES")]
    pub build_budget: Option<u64>,
    /// Run only this target (repeatable).
    #[arg(long = "only", value_name = "TARGET", value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub only: Vec<String>,
}

impl Args {
    /// Each target's time, in seconds.
    fn seconds(&self) -> u64 {
        self.minutes.map(|m| m * 60).or(self.seconds).unwrap_or(30)
    }
}

/// What one target's run did.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    runs: u64,
    execs_per_s: u64,
    /// Inputs that crashed, hung or ran out of memory.
    artifacts: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    let root = workspace_root();
    let targets: Vec<&str> = if args.only.is_empty() {
        TARGETS.to_vec()
    } else {
        args.only.iter().map(String::as_str).collect()
    };
    if !args.no_build {
        let started = Instant::now();
        let mut cmd = fuzz_cmd(&root);
        cmd.args(["build", "--dev", "--sanitizer"])
            .arg(if args.asan { "address" } else { "none" })
            .args(["--fuzz-dir", "fuzz", "--target-dir", "target/fuzz"]);
        build(
            &mut cmd,
            args.build_budget.map(|m| Duration::from_secs(m * 60)),
        )?;
        eprintln!(
            "fuzz: targets built in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    let seeds = root.join("target/fuzz-seeds");
    seeds::write_all(&seeds, &targets)?;
    let secs = args.seconds();
    let mut failed = Vec::new();
    let mut lines = Vec::new();
    for target in &targets {
        let outcome = run_target(&root, target, secs)?;
        let line = summary(target, &outcome);
        println!("{line}");
        lines.push(line);
        if !outcome.artifacts.is_empty() {
            failed.push(*target);
        }
    }
    println!("\nfuzz: {secs} s per target");
    for l in &lines {
        println!("  {l}");
    }
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {} (inputs under target/fuzz-artifacts/)",
            failed.join(", ")
        );
    }
    Ok(())
}

/// Runs the build, stopping it (its whole process group) past `budget`.
fn build(cmd: &mut Command, budget: Option<Duration>) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    let mut child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start `{}`", display(cmd)))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("`{}` failed: {status}", display(cmd));
            }
            return Ok(());
        }
        if budget.is_some_and(|b| started.elapsed() > b) {
            // SAFETY: signals the process group this function made.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
            let _ = child.wait();
            bail!(
                "the fuzz targets' build took over its budget of {} min and was stopped: \
                 no target ran (run `cargo xtask fuzz` alone to build them)",
                budget.unwrap_or_default().as_secs() / 60
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `cargo +nightly fuzz` in the workspace root.
fn fuzz_cmd(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly").arg("fuzz").current_dir(root);
    // The parent cargo's variables would pin the stable toolchain.
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Runs one target for `secs` seconds; a crash stops it early.
fn run_target(root: &Path, target: &str, secs: u64) -> Result<Outcome> {
    let corpus = root.join("target/fuzz-corpus").join(target);
    let artifacts = root.join("target/fuzz-artifacts").join(target);
    for d in [&corpus, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let seeds: PathBuf = root.join("target/fuzz-seeds").join(target);
    // The binary `cargo fuzz build` made; run directly, so nothing is
    // rebuilt between targets.
    let mut cmd = Command::new(root.join(BIN_DIR).join(target));
    cmd.current_dir(root)
        .arg(&corpus)
        .arg(&seeds)
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={TIMEOUT_S}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("$ {}", display(&cmd));
    let mut child = cmd.spawn().with_context(|| format!("starting {target}"))?;
    let err = child.stderr.take().expect("piped");
    let mut log = Vec::new();
    for line in BufReader::new(err).lines() {
        let line = line?;
        // libFuzzer's progress lines are many; show the first and the
        // failures, keep all for parsing.
        if line.contains("ERROR") || line.contains("panicked") || line.starts_with("INFO: seed") {
            eprintln!("  {target}: {line}");
        }
        log.push(line);
    }
    let status = child.wait()?;
    let outcome = parse(&log);
    if !status.success() && outcome.artifacts.is_empty() {
        // Not a finding: the build or libFuzzer itself failed.
        let tail = log[log.len().saturating_sub(20)..].join("\n");
        bail!("fuzz target {target} failed to run ({status}):\n{tail}");
    }
    Ok(outcome)
}

/// Runs, execs/s and artifacts from libFuzzer's stderr: the final stats
/// when it finished, else its last progress line (`#N ... exec/s: E`).
fn parse(log: &[String]) -> Outcome {
    let mut o = Outcome::default();
    for line in log {
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
            o.runs = v.trim().parse().unwrap_or(o.runs);
        } else if let Some(v) = line.strip_prefix("stat::average_exec_per_sec:") {
            o.execs_per_s = v.trim().parse().unwrap_or(o.execs_per_s);
        } else if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.split_whitespace();
            if let Some(n) = words.next().and_then(|n| n.parse().ok()) {
                o.runs = o.runs.max(n);
            }
            if let Some(e) = rest.split("exec/s: ").nth(1) {
                let e = e.split_whitespace().next().unwrap_or("");
                o.execs_per_s = e.parse().unwrap_or(o.execs_per_s);
            }
        } else if let Some(path) = line.split("Test unit written to ").nth(1) {
            o.artifacts.push(path.trim().to_string());
        }
    }
    o
}

fn summary(target: &str, o: &Outcome) -> String {
    let mut s = format!(
        "{target:<13} {:>11} runs  {:>7} execs/s  {} crashes",
        o.runs,
        o.execs_per_s,
        o.artifacts.len()
    );
    for a in &o.artifacts {
        s.push_str(&format!("\n                crashing input: {a}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_final_stats_and_crashes() {
        let log: Vec<String> = [
            "#2\tINITED cov: 10 ft: 10 corp: 1/1b exec/s: 0 rss: 30Mb",
            "#65536\tpulse  cov: 99 ft: 120 corp: 9/90b lim: 4 exec/s: 21845 rss: 40Mb",
            "stat::number_of_executed_units: 700123",
            "stat::average_exec_per_sec:     23337",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            parse(&log),
            Outcome {
                runs: 700123,
                execs_per_s: 23337,
                artifacts: vec![]
            }
        );
        let log: Vec<String> = [
            "#1024\tNEW    cov: 99 ft: 120 corp: 9/90b lim: 4 exec/s: 512 rss: 40Mb",
            "thread '<unnamed>' panicked at src/x.rs:1:1:",
            "artifact_prefix='t/'; Test unit written to t/crash-abc",
        ]
        .map(String::from)
        .to_vec();
        let o = parse(&log);
        assert_eq!((o.runs, o.execs_per_s), (1024, 512));
        assert_eq!(o.artifacts, vec!["t/crash-abc".to_string()]);
    }
}
