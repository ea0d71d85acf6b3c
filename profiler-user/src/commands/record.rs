//! `profiler record`: checks the arguments, then runs the session
//! ([`crate::session::record`]): attach (to a PID, or to a command it
//! launches, before its first instruction), collect until told to stop,
//! detach, then write every output. In launch mode with `--runs N` and no
//! `--stage`, the command is launched N times.
use crate::{
    analyze::stages::StagesConfig,
    analyze::startup::StartupReport,
    cli::RecordArgs,
    session::record::{self, Recorder},
    tracee::{caps, select},
    Error, Result,
};

/// Checks option combinations that need launch mode or a running process.
fn check_mode(args: &RecordArgs) -> Result<()> {
    let launch = !args.command.is_empty();
    if launch && (!args.pid.is_empty() || !args.pid_of.is_empty()) {
        return Err(Error::Usage(
            "--pid and --pid-of attach to running processes, a command after -- is launched: give one or the other".into(),
        ));
    }
    if args.keep_running && args.stages.stages.is_empty() && args.stages.runs.is_some_and(|n| n > 1)
    {
        return Err(Error::Usage(
            "--keep-running leaves the command running, and --runs N launches it N times: give one or the other".into(),
        ));
    }
    if !launch && (args.stages.ready.is_some() || args.stages.startup_threshold.is_some()) {
        return Err(Error::Usage(
            "--ready and --startup-threshold time a launch: use `profiler record [options] -- COMMAND`".into(),
        ));
    }
    Ok(())
}

/// Runs `profiler record`. Returns the exit status to leave with: 0, or in
/// launch mode the command's. In launch mode with `--runs N` and no
/// `--stage`, the command is launched N times and the spread of its startup
/// times is reported.
pub fn run(args: &mut RecordArgs) -> Result<u8> {
    crate::heap::tune();
    default_max_funcs(&mut args.select);
    timer_rates(args);
    let args = &*args;
    let launches = match (
        args.command.is_empty(),
        args.stages.stages.is_empty(),
        args.stages.runs,
    ) {
        (false, true, Some(n)) if n > 1 => n,
        _ => return record_once(args, None).map(|(code, _)| code),
    };
    let mut reports = Vec::new();
    let mut code = 0;
    for i in 0..launches {
        eprintln!("profiler: launch {} of {launches}", i + 1);
        let (c, report) = record_once(args, Some(i))?;
        code = c;
        reports.extend(report);
    }
    record::write_startup_summary(args, launches, &reports)?;
    Ok(code)
}

/// The in-dispatch sampler (always `cpu-clock`) at no more than this
/// kernel's timers deliver ([`crate::attach::samplers::timer_hz`]), and
/// `--sample` at no more than its event does (hardware cycles, which no
/// timer limits, where the machine has them), said once.
fn timer_rates(args: &mut RecordArgs) {
    use crate::attach::samplers::{sampler_hz, timer_hz};
    let mut said = false;
    type Rate = fn(u64) -> (u64, Option<String>);
    let dispatch = (&mut args.dispatch.dispatch_hz, timer_hz as Rate);
    let sample = args.sample.as_mut().map(|hz| (hz, sampler_hz as Rate));
    for (hz, rate) in [Some(dispatch), sample]
        .into_iter()
        .flatten()
        .filter(|(hz, _)| **hz > 0)
    {
        let (can, line) = rate(*hz);
        if let Some(line) = line.filter(|_| !said) {
            eprintln!("profiler: note: {line}");
            said = true;
        }
        *hz = can;
    }
}

/// Without `--max-funcs`: 2000 functions where a binary's probes are one
/// uprobe_multi link, 250 where each probe is a perf event of its own
/// (before Linux 6.10), attached and detached one at a time (about 14 ms
/// each under software emulation on 6.1). The planner's line about the
/// cap says why, when the cap cuts the selection
/// (`session::record::plan::cap_reason`), not before the target is even
/// checked.
fn default_max_funcs(select: &mut crate::cli::SelectArgs) {
    if select.max_funcs.is_some() {
        return;
    }
    let per_probe = !crate::attach::kernel::uprobe_multi();
    select.max_funcs = Some(match per_probe {
        true => crate::cli::PER_PROBE_MAX_FUNCS,
        false => crate::cli::DEFAULT_MAX_FUNCS,
    });
}

/// One recording session (one launch in launch mode): the arguments
/// checked, then planned, attached, collected and finished. Returns the
/// exit status and, in launch mode, the startup report.
fn record_once(args: &RecordArgs, launch_no: Option<usize>) -> Result<(u8, Option<StartupReport>)> {
    select::compile(&args.select)?;
    let stage_runs = if launch_no.is_some() {
        None
    } else {
        args.stages.runs
    };
    let stage_cfg = StagesConfig::parse(&args.stages.stages, &args.stages.scenarios, stage_runs)?;
    check_mode(args)?;
    caps::check()?;
    crate::attach::kernel::restore_left_expedited();
    Recorder::plan(args, launch_no, stage_cfg)?
        .attach()?
        .collect()?
        .finish()
}
