//! `cargo xtask`: the project's developer tasks.
//!
//! Each subcommand lives in its own module; `util` holds the command-running
//! helpers and `proc` the helpers that drive a target program and a tracer.

mod bench;
mod browser;
mod demo;
mod dist;
mod fuzz;
mod kernels;
mod layers;
mod libtest;
mod links;
mod lint;
mod proc;
mod reliability;
mod screenshot;
mod setup;
mod soak;
mod test;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Developer tasks for the profiler workspace")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and testing need (nightly + rust-src, bpf-linker,
    /// Debian tools); does nothing when everything is present.
    Setup(setup::Args),
    /// Setup, then `cargo build --release -p profiler-user`.
    Build,
    /// Build, then profile the bundled event-loop demo for a few seconds.
    Demo(demo::Args),
    /// Setup, unit tests, release build, the root-only integration tests,
    /// 30 s of each fuzz target and a 2-minute soak.
    Test,
    /// rustfmt check, clippy on the workspace, clippy on the eBPF crate.
    Lint,
    /// Run the benchmarks and write a markdown table to target/bench.md.
    Bench(bench::Args),
    /// Run the demo, then screenshot its report.html into docs/report.png.
    Screenshot(screenshot::Args),
    /// Run the tests of every row of the failure-mode matrix (root) and
    /// write RELIABILITY.md.
    Reliability(reliability::Args),
    /// Run the root integration tests on other kernels (Debian's 6.1 and
    /// 6.12, and the host's), each in a virtual machine (QEMU, virtme-ng),
    /// and write the kernel × feature matrix into KERNELS.md.
    Kernels(kernels::Args),
    /// Build the libFuzzer targets (fuzz/) and run each for a while.
    Fuzz(fuzz::Args),
    /// Run the profiler for a long time on a busy, forking target and
    /// report its memory, fds and BPF maps over time (target/soak.md).
    Soak(soak::Args),
    /// Build the static (musl) release binary and package it into
    /// target/dist/: a tar.gz and a .deb, each with the man pages, bash,
    /// zsh and fish completions and the license.
    Dist,
    /// Write the man pages of `profiler` and its subcommands (profiler.1,
    /// profiler-record.1, …) into OUTDIR.
    Man(dist::man::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Setup(args) => setup::run(&args),
        Cmd::Build => build(),
        Cmd::Demo(args) => demo::run(&args),
        Cmd::Test => test::run(),
        Cmd::Lint => lint::run(),
        Cmd::Bench(args) => bench::run(&args),
        Cmd::Screenshot(args) => screenshot::run(&args),
        Cmd::Reliability(args) => reliability::run(&args),
        Cmd::Kernels(args) => kernels::run(&args),
        Cmd::Fuzz(args) => fuzz::run(&args),
        Cmd::Soak(args) => soak::run(&args),
        Cmd::Dist => dist::run(),
        Cmd::Man(args) => dist::man::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask build`: setup, then the release build of the profiler.
pub fn build() -> anyhow::Result<()> {
    setup::run(&setup::Args::default())?;
    util::build_profiler()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
