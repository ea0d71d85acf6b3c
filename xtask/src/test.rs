//! `cargo xtask test`: unit tests, the release build, the eBPF
//! integration tests (root, one at a time), the fuzz targets for 30 s
//! each, and a 2-minute soak (root).
//!
//! Every step runs even when an earlier one failed (except the integration
//! tests, which need the build), and the failures are summed up at the end.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

use crate::libtest::Parser;
use crate::util::{build_profiler, cargo, display, is_root, profiler_bin};

/// Run a `cargo test` command (its test binaries given `--show-output`),
/// passing its output through, except the captured output of passing tests
/// but for their `SKIP` lines, and reading the results into `parser`.
pub fn cargo_test(cmd: &mut Command, parser: &mut Parser) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{}`", display(cmd)))?;
    let out = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(out).lines() {
        let line = line?;
        if parser.feed(&line) {
            println!("{line}");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// Minutes the fuzz targets' build may take inside `cargo xtask test`
/// (from scratch it takes 513 CPU seconds: about 5 minutes on 2 quiet
/// cores, 24 minutes at a load average of 8-12; BENCHMARKS.md).
const FUZZ_BUILD_BUDGET_MIN: u64 = 30;

pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    let mut failed = Vec::new();
    let mut counts = Parser::default();
    let mut step = |name: &str, r: Result<()>| {
        if let Err(e) = r {
            eprintln!("test: {name} FAILED: {e:#}");
            failed.push(name.to_string());
            false
        } else {
            true
        }
    };
    step(
        "unit tests",
        cargo_test(
            cargo()
                .args([
                    "test",
                    "--no-fail-fast",
                    "-p",
                    "profiler-common",
                    "-p",
                    "profiler-user",
                    "-p",
                    "xtask",
                ])
                .args(["--", "--show-output"]),
            &mut counts,
        ),
    );
    let built = step("release build", build_profiler());
    if !is_root() {
        eprintln!(
            "test: SKIPPED the integration tests (profiler-tests): they load eBPF programs and \
             attach uprobes, which needs root (CAP_BPF + CAP_PERFMON); re-run as root: \
             `sudo -E cargo xtask test`"
        );
    } else if built {
        step(
            "integration tests",
            cargo_test(
                cargo()
                    .args([
                        "test",
                        "--release",
                        "--no-fail-fast",
                        "-p",
                        "profiler-tests",
                    ])
                    .args(["--", "--test-threads=1", "--show-output"])
                    .env("PROFILER_BIN", profiler_bin()),
                &mut counts,
            ),
        );
    }
    // Every parser of untrusted input under libFuzzer, 30 s each, after
    // a build given at most FUZZ_BUILD_BUDGET_MIN (CI's limit is 90 min).
    step(
        "fuzz",
        crate::fuzz::run(&crate::fuzz::Args {
            minutes: None,
            seconds: Some(30),
            only: Vec::new(),
            no_build: false,
            asan: false,
            build_budget: Some(FUZZ_BUILD_BUDGET_MIN),
        }),
    );
    if is_root() && built {
        // Two minutes of a busy, forking target: no fd or memory growth.
        step("soak", crate::soak::run(&crate::soak::Args { minutes: 2 }));
    }
    // One plain closing line for whoever reads the log's end, after the
    // reasons of the skips.
    for line in &counts.skip_lines {
        println!("xtask: {line}");
    }
    let c = &counts.counts;
    println!(
        "xtask: {} passed, {} failed, {} ignored, {} skipped (passed without running; \
         the SKIP lines above say why)",
        c.passed - c.skipped,
        c.failed,
        c.ignored,
        c.skipped
    );
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
