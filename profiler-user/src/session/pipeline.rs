//! Builds the event pipeline (`Sinks`): shadow stacks, the dispatcher, the
//! `trace.json` timeline, stage trackers and the startup watch. `record`
//! and `report` build it the same way, from the `profile.data` header
//! ([`Config::from_header`]: `record` always builds one), which is what
//! makes a replay reproduce a recording's outputs.
use crate::{
    analyze::dispatch::{self, Dispatcher},
    analyze::processes::{DispatchRule, Processes},
    analyze::stacks::Stacks,
    analyze::stages::{StageTracker, StagesConfig},
    analyze::startup::StartupWatch,
    analyze::tail_calls::TailCalls,
    output::timeline::Timeline,
    output::OutDir,
    session::datafile::Header,
    session::sinks::Sinks,
    tracee::exits::ExitProbe,
    tracee::select::Func,
    Error, Result,
};

/// What the pipeline is built from.
pub struct Config<'a> {
    /// Where `trace.json` and `hangs.log` go.
    pub out: &'a OutDir,
    /// Target PID and executable.
    pub pid: u32,
    /// Target executable, for the trace's process name.
    pub exe: &'a str,
    /// Probed functions, by cookie.
    pub funcs: &'a [Func],
    /// Dispatch settings.
    pub dispatch: dispatch::Config,
    /// CLOCK_MONOTONIC at the session start.
    pub session_start_ns: u64,
    /// Calls written to trace.json (0: none).
    pub trace_events: u64,
    /// Stages and scenarios.
    pub stages: &'a StagesConfig,
    /// Launch mode: exec time and `--ready`.
    pub startup: Option<(u64, Option<&'a str>)>,
    /// No dispatch function was known.
    pub dispatch_fallback: bool,
}

/// What `profiler report` may change when it replays a recording (None,
/// false: as recorded).
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// `--threshold`, ns.
    pub threshold_ns: Option<u64>,
    /// `--hang`, ns.
    pub hang_ns: Option<u64>,
    /// `--frame-interval`, ns.
    pub frame_interval_ns: Option<u64>,
    /// `--full-tree`.
    pub full_tree: bool,
    /// `--trace-events`.
    pub trace_events: Option<u64>,
}

impl Overrides {
    /// The dispatch rule of several traced processes' main threads.
    pub fn dispatch_rule(&self, h: &Header) -> DispatchRule {
        DispatchRule {
            threshold_ns: self.threshold_ns.unwrap_or(h.threshold_ns),
            frame_interval_ns: self.frame_interval_ns.unwrap_or(h.frame_interval_ns),
        }
    }

    /// Calls written to `trace.json`.
    pub fn trace_events(&self, h: &Header) -> u64 {
        self.trace_events.unwrap_or(h.trace_events)
    }
}

impl<'a> Config<'a> {
    /// The pipeline of the session `h` describes (what was asked when it
    /// was recorded), with `o` changed; `funcs` are the probed functions
    /// (`h.funcs`, or for a live session the selection they were written
    /// from) and `stages` the parsed `h.stages`.
    pub fn from_header(
        out: &'a OutDir,
        h: &'a Header,
        funcs: &'a [Func],
        stages: &'a StagesConfig,
        o: &Overrides,
    ) -> Self {
        Config {
            out,
            pid: h.pid,
            exe: &h.exe,
            funcs,
            dispatch: dispatch::Config {
                tid: h.watch_tid,
                thread_name: h.watch_name.clone(),
                rule: h.dispatch_rule.clone(),
                threshold_ns: o.threshold_ns.unwrap_or(h.threshold_ns),
                hang_ns: o.hang_ns.unwrap_or(h.hang_ns),
                frame_interval_ns: o.frame_interval_ns.unwrap_or(h.frame_interval_ns),
                full_tree: o.full_tree || h.full_tree,
                sample_period_ns: 1_000_000_000u64.checked_div(h.dispatch_hz).unwrap_or(0),
                wakers: !h.no_wakers,
                wait_loop: h.wait_loop,
                // Waits watched beside a preset's functions.
                preset: h.wait_loop && !h.dispatch_fallback,
            },
            session_start_ns: h.session_start_ns,
            trace_events: o.trace_events(h),
            stages,
            startup: h
                .launch
                .then_some((h.exec_ns.unwrap_or(0), h.ready.as_deref())),
            dispatch_fallback: h.dispatch_fallback,
        }
    }
}

/// The stages and scenarios `h` was recorded with.
pub fn stages_of(h: &Header) -> Result<StagesConfig> {
    StagesConfig::parse(&h.stages, &h.scenarios, h.runs)
}

/// The per-process sections of a session that traced several processes
/// (`h.processes`), None for one.
pub fn processes_of(h: &Header, funcs: &[Func], o: &Overrides) -> Option<Processes> {
    (!h.processes.is_empty()).then(|| {
        processes(
            funcs,
            o.dispatch_rule(h),
            h.processes
                .iter()
                .map(|p| (p.pid, p.ppid, p.exe.clone(), p.start_ns)),
        )
    })
}

/// Index of the probed function named `name`.
pub fn index_of(funcs: &[Func], name: &str) -> Option<u32> {
    funcs.iter().position(|f| f.name == name).map(|i| i as u32)
}

/// The per-process sections for several traced processes: `targets` are
/// (pid, ppid, exe, start_ns) of the named ones; main-thread dispatches
/// are timed by `rule`.
pub fn processes(
    funcs: &[Func],
    rule: DispatchRule,
    targets: impl Iterator<Item = (u32, u32, String, u64)>,
) -> Processes {
    let mut p = Processes::new(
        funcs
            .iter()
            .map(|f| matches!(f.exit, ExitProbe::EntryOnly(_)))
            .collect(),
        funcs.iter().map(|f| f.dispatch).collect(),
        rule,
    );
    for (pid, ppid, exe, start_ns) in targets {
        p.add_target(pid, ppid, exe, start_ns);
    }
    p
}

/// Builds the pipeline; truncates `hangs.log` and starts `trace.json`.
pub fn build(config: Config) -> Result<Sinks> {
    let Config {
        out,
        pid,
        exe,
        funcs,
        dispatch,
        session_start_ns,
        trace_events,
        stages,
        startup,
        dispatch_fallback,
    } = config;
    let names: Vec<String> = funcs.iter().map(|f| f.name.clone()).collect();
    let index = |name: &str| index_of(funcs, name);
    out.write("hangs.log", b"")?;
    let mut dispatcher = Dispatcher::new(
        dispatch,
        pid,
        names.clone(),
        funcs.iter().map(|f| f.dispatch).collect(),
        session_start_ns,
    );
    // Durations without the probes' own cost (zero: as measured).
    dispatcher.set_costs(funcs.iter().map(|f| f.cost).collect());
    let timeline = match trace_events {
        0 => None,
        limit => Some(
            Timeline::create(
                out.create("trace.json")?,
                pid,
                exe,
                session_start_ns,
                names,
                limit,
            )
            .map_err(|e| Error::Output {
                path: out.path().join("trace.json"),
                reason: e.to_string(),
            })?,
        ),
    };
    let mut stacks = Stacks::new(funcs.len());
    stacks.set_entry_only(
        funcs
            .iter()
            .map(|f| matches!(f.exit, ExitProbe::EntryOnly(_)))
            .collect(),
    );
    stacks.set_costs(funcs.iter().map(|f| f.cost));
    let mut sinks = Sinks::new(pid, stacks, Some(dispatcher), timeline);
    sinks.tails = TailCalls::new(
        crate::tracee::select::tail_callees(funcs),
        funcs
            .iter()
            .map(|f| matches!(f.exit, ExitProbe::Uretprobe))
            .collect(),
    );
    sinks.hang_log = Some(out.path().join("hangs.log"));
    let resolved = stages
        .stages
        .iter()
        .map(|s| s.resolve(index))
        .collect::<Result<Vec<_>>>()?;
    sinks.stages = stages
        .roots
        .iter()
        .map(|&root| StageTracker::new(resolved.clone(), root, stages.runs))
        .collect();
    if let Some((exec_ns, ready)) = startup {
        let mut watch = StartupWatch::new(index("main"), ready.and_then(index));
        watch.set_exec(exec_ns);
        let mut window = Stacks::new(funcs.len());
        window.set_costs(funcs.iter().map(|f| f.cost));
        sinks.startup = Some((watch, window));
        sinks.ready_on_first_dispatch = ready.is_none() && !dispatch_fallback;
    }
    Ok(sinks)
}
