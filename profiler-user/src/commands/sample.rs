//! `profiler sample`: a sampling profiler for one process or the whole
//! system. The arguments are checked here; the session is
//! [`crate::session::sample`].
use crate::{
    cli::{SampleArgs, UnwindMode},
    output::OutDir,
    session::sample::{Plan, Sampler, CPU_FILES},
    tracee::{caps, cgroup, process::Target},
    Error, Result,
};

/// Runs `profiler sample`.
pub fn run(args: &SampleArgs) -> Result<()> {
    crate::heap::tune();
    let cgroup = args.cgroup.as_deref().map(cgroup::resolve).transpose()?;
    caps::check()?;
    let target = args.pid.map(Target::open).transpose()?;
    let out = OutDir::prepare(&args.out, CPU_FILES)?;
    let hz = args.hz.unwrap_or(if args.all { 99 } else { 997 });
    if hz == 0 || hz > 100_000 {
        return Err(Error::Usage(format!(
            "--hz {hz} is out of range: use 1 to 100000"
        )));
    }
    let (hz, line) = crate::attach::samplers::sampler_hz(hz);
    if let Some(line) = line {
        eprintln!("profiler: note: {line}");
    }
    let unwind = if args.dwarf {
        UnwindMode::Copy
    } else {
        args.unwind
    };
    if unwind == UnwindMode::Copy && args.all {
        return Err(Error::Usage(
            "--unwind copy needs --pid (it copies 16 KiB of stack per sample); use --unwind tables with --all".into(),
        ));
    }
    Sampler::attach(Plan {
        args,
        target,
        cgroup,
        out,
        hz,
        unwind,
    })?
    .collect()?
    .write()
}
