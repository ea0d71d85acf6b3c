//! `profiler check`: what this kernel supports of what the profiler uses,
//! and what works (`attach::check`).
use std::process::ExitCode;

use crate::{attach::check, cli::CheckArgs, tracee::caps, Result};

/// Runs `profiler check`: exit status 1 when recording or sampling cannot
/// work on this kernel.
pub fn run(args: &CheckArgs) -> Result<ExitCode> {
    caps::check()?;
    crate::attach::probes::raise_fd_limit();
    let c = check::run();
    print!("{}", check::text(&c, args.verbose));
    Ok(if c.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
