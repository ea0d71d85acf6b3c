//! A `profiler record` session: the plan ([`Recorder::plan`]: the targets
//! opened or launched, the functions chosen), the probes attached
//! ([`Recorder::attach`]), the rings drained into the pipeline until a stop
//! ([`Attached::collect`]), and every output written ([`Collected::finish`]).
//! Anything that can be refused is refused before a probe is attached.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::{
    analyze::cpu_fold,
    analyze::cpu_profile::CpuProfile,
    analyze::stages::StagesConfig,
    analyze::startup::StartupReport,
    attach::{
        calibrate::{self, HitCost},
        probes::{self, CounterMap, Probes, Tracking},
        rings::RingSpec,
        samplers, task_btf,
    },
    cli::{RecordArgs, UnwindMode},
    output::writers,
    output::OutDir,
    session::{
        collector::{self, NoSteer, Steer, StopReason},
        datafile, finish,
        follow::ExecProber,
        governor::Governor,
        pipeline,
        ring_reader::Rings,
        sinks::Sinks,
        status::Status,
    },
    symbolize::Symbolizer,
    tracee::{
        find,
        launch::{self, Launched},
        libwatch::LibWatch,
        probe_set::Probed,
        process::{self, Target},
        select::{self, Required, Selection},
    },
    unwind::tables::Tables,
    Error, Result,
};

mod attach;
mod collect;
mod end;
mod plan;

/// The functions the session needs probed besides `--func`: stage triggers
/// (must exist), and in launch mode `main` (if present) and `--ready`.
pub fn required(stage_funcs: &[&str], launch: bool, ready: Option<&str>) -> Vec<Required> {
    let mut req: Vec<Required> = stage_funcs
        .iter()
        .map(|f| Required {
            name: f.to_string(),
            must: true,
            why: "--stage".into(),
        })
        .collect();
    if launch {
        req.push(Required {
            name: "main".into(),
            must: false,
            why: "startup timing".into(),
        });
        if let Some(r) = ready {
            req.push(Required {
                name: r.to_string(),
                must: true,
                why: "--ready".into(),
            });
        }
    }
    req
}

/// Writes the spread of `reports`, the startup reports of `launches`
/// launches (`--runs N` without `--stage`), to `startup.txt` and
/// `startup.json`, and prints it.
pub fn write_startup_summary(
    args: &RecordArgs,
    launches: usize,
    reports: &[StartupReport],
) -> Result<()> {
    let summary = crate::analyze::startup::StartupSummary::of(reports);
    let ready_what = args
        .stages
        .ready
        .as_ref()
        .map_or("first dispatch".to_string(), |f| format!("entry of {f}"));
    let text = summary.render_text(&ready_what);
    let out = OutDir::prepare(&args.out, writers::RECORD_FILES)?;
    out.write("startup.txt", text.as_bytes())?;
    out.write("startup.json", summary.render_json().as_bytes())?;
    print!("\nOver {launches} launches (startup.txt; the other outputs are the last launch's):\n{text}");
    Ok(())
}

/// A recording planned: its targets opened (or launched, held before their
/// first instruction) and its functions chosen; nothing attached yet.
pub struct Recorder<'a> {
    args: &'a RecordArgs,
    /// `--runs`, unless this is one of several launches.
    runs: Option<usize>,
    stage_cfg: StagesConfig,
    out: OutDir,
    tracking: Tracking,
    target: Target,
    child: Option<Launched>,
    /// The targets after the first.
    others: Vec<Target>,
    required: Vec<Required>,
    sel: Selection,
    probed_set: Probed,
    watch_tid: u32,
    watch_name: String,
    /// Dispatches are the watched thread's event-loop iterations.
    wait_loop: bool,
}

/// The cost of a probe hit, and what the session does with it.
struct Costs {
    /// `--max-overhead`, in % (0: no governor).
    max_overhead: f64,
    /// What the governor assumes a hit costs (None: no governor).
    hit_cost: Option<HitCost>,
    /// Durations leave out the probes' cost: the calibration's spread.
    spread_pct: Option<f64>,
    /// The wait tracepoints the calibration ran with, to calibrate again at
    /// the end.
    waits: calibrate::WaitTracepoints,
}

/// A recording attached: its probes on, its rings and maps taken.
pub struct Attached<'a> {
    rec: Recorder<'a>,
    probes: Probes,
    tables: Option<Tables>,
    rings: Rings,
    counters: CounterMap,
    cpu_maps: Option<samplers::CpuMaps>,
    costs: Costs,
    started: Instant,
    session_start_ns: u64,
    /// CLOCK_MONOTONIC at the launched command's exec (0: none).
    exec_ns: u64,
    /// Functions probed.
    probed: usize,
    /// The `attached …` line.
    attached: String,
}

/// A recording stopped: its probes detached, its rings drained.
pub struct Collected<'a> {
    rec: Recorder<'a>,
    status: Status,
    header: datafile::Header,
    sinks: Sinks,
    counters: CounterMap,
    reason: StopReason,
    /// What ended the session early, told after the outputs are written.
    failure: Option<Error>,
    governed: Option<crate::analyze::overhead::GovernorReport>,
    duration_ns: u64,
    /// CLOCK_MONOTONIC when the session decided to stop.
    stop_ns: u64,
    probed: usize,
    failed_probes: usize,
    /// Durations leave out the probes' cost: calibrate again at the end,
    /// with these wait tracepoints, to say how far the costs moved.
    recalibrate: Option<calibrate::WaitTracepoints>,
}
