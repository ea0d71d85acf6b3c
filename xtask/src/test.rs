//! `cargo xtask test`: unit tests, the release build, then the eBPF
//! integration tests, which need root and run one at a time.
//!
//! Every step runs even when an earlier one failed (except the integration
//! tests, which need the build), and the failures are summed up at the end.

use anyhow::{bail, Result};

use crate::util::{build_profiler, cargo, exec, is_root, profiler_bin};

pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    let mut failed = Vec::new();
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
        exec(cargo().args([
            "test",
            "-p",
            "profiler-common",
            "-p",
            "profiler-user",
            "-p",
            "xtask",
        ])),
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
            exec(
                cargo()
                    .args([
                        "test",
                        "--release",
                        "-p",
                        "profiler-tests",
                        "--",
                        "--test-threads=1",
                    ])
                    .env("PROFILER_BIN", profiler_bin()),
            ),
        );
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
