//! `cargo xtask test`: unit tests, the release build, then the eBPF
//! integration tests, which need root and run one at a time.

use anyhow::Result;

use crate::util::{build_profiler, cargo, exec, is_root, profiler_bin};

pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    exec(cargo().args([
        "test",
        "-p",
        "profiler-common",
        "-p",
        "profiler-user",
        "-p",
        "xtask",
    ]))?;
    build_profiler()?;
    if !is_root() {
        eprintln!(
            "test: SKIPPED the integration tests (profiler-tests): they load eBPF programs and \
             attach uprobes, which needs root (CAP_BPF + CAP_PERFMON); re-run as root: \
             `sudo -E cargo xtask test`"
        );
        return Ok(());
    }
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
    )
}
