//! `cargo xtask test`: unit tests, the release build, then the eBPF
//! integration tests, which need root and run one at a time.
//!
//! Every step runs even when an earlier one failed (except the integration
//! tests, which need the build), and the failures are summed up at the end.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

use crate::util::{build_profiler, cargo, display, is_root, profiler_bin};

/// Test counts summed over the `test result:` lines of cargo test.
#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Counts {
    /// Add the counts of one `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Run a `cargo test` command, passing its output through and counting tests.
fn cargo_test(cmd: &mut Command, counts: &mut Counts) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{}`", display(cmd)))?;
    let out = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(out).lines() {
        let line = line?;
        println!("{line}");
        counts.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    let mut failed = Vec::new();
    let mut counts = Counts::default();
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
            cargo().args([
                "test",
                "--no-fail-fast",
                "-p",
                "profiler-common",
                "-p",
                "profiler-user",
                "-p",
                "xtask",
            ]),
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
                    .args(["--", "--test-threads=1"])
                    .env("PROFILER_BIN", profiler_bin()),
                &mut counts,
            ),
        );
    }
    // One plain closing line for whoever reads the log's end.
    println!(
        "xtask: {} passed, {} failed, {} skipped",
        counts.passed, counts.failed, counts.ignored
    );
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_result_lines() {
        let mut c = Counts::default();
        c.add_line("test result: ok. 72 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.56s");
        c.add_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        c.add_line("test foo ... ok");
        assert_eq!((c.passed, c.failed, c.ignored), (75, 2, 1));
    }
}
