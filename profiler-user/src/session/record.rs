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

/// The hit cost the governor assumes when calibration fails: this kernel's
/// int3 cost as measured by `cargo xtask bench` (BENCHMARKS.md, part a).
const FALLBACK_COST: HitCost = HitCost {
    entry_ns: 5000.0,
    entry_push_ns: 1500.0,
    entry_nop_ns: 500.0,
    ret_site_ns: 5000.0,
    uretprobe_ns: 3000.0,
    // Durations are not corrected with guesses.
    inside_ns: [0.0; 6],
    inside_spread_pct: 0.0,
};

/// How long a late failure waits for the target's exit to complete before
/// calling the failure an error: an exiting process loses its memory
/// (and `/proc/PID/exe`) before its last thread is gone.
const LATE_EXIT_WAIT: Duration = Duration::from_millis(500);

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

impl<'a> Recorder<'a> {
    /// Opens or launches the targets and chooses the functions to probe.
    /// `launch_no` is this launch's number when the command is launched
    /// several times (`--runs N` without `--stage`); `stage_cfg` is parsed
    /// from the arguments, with no `--runs` then.
    pub fn plan(
        args: &'a RecordArgs,
        launch_no: Option<usize>,
        stage_cfg: StagesConfig,
    ) -> Result<Self> {
        let launch = !args.command.is_empty();
        let out = OutDir::prepare(&args.out, writers::RECORD_FILES)?;
        let pids = if launch {
            Vec::new()
        } else {
            target_pids(args)?
        };
        let tracking = tracking(args, pids.len())?;
        let (target, child) = if launch {
            let child = launch_command(args)?;
            (Target::launched(child.pid, child.exe())?, Some(child))
        } else {
            (Target::open(pids[0])?, None)
        };
        let others = pids
            .iter()
            .skip(1)
            .map(|&pid| Target::open(pid))
            .collect::<Result<Vec<_>>>()?;
        let required = required(&stage_cfg.functions(), launch, args.stages.ready.as_deref());
        let mut rec = Recorder {
            args,
            runs: if launch_no.is_some() {
                None
            } else {
                args.stages.runs
            },
            stage_cfg,
            out,
            tracking,
            target,
            child,
            others,
            required,
            sel: Selection::default(),
            probed_set: Probed::default(),
            watch_tid: 0,
            watch_name: String::new(),
            wait_loop: false,
        };
        rec.select()?;
        Ok(rec)
    }

    /// A target that exits while we set up makes some step fail (no
    /// mappings, perf_event_open: ESRCH...): says that it exited.
    fn gone(&self, e: Error) -> Error {
        match self.child.is_none() && !self.target.alive() {
            true => Error::TargetGone(self.target.pid),
            false => e,
        }
    }

    /// Chooses the functions to probe in every target, and the watched
    /// thread.
    fn select(&mut self) -> Result<()> {
        let args = self.args;
        let launch = self.child.is_some();
        let mut sel =
            select::select(&self.target, &args.select, &self.required).map_err(|e| self.gone(e))?;
        let mut probed_set = Probed::of(&sel);
        for other in &self.others {
            let more = select::select(other, &args.select, &[])?;
            probed_set.merge(&mut sel, more, args.select.max_funcs);
        }
        // Too many functions for --max-funcs, none named: by PID, probe those
        // the watched thread runs and waits in, seen in a short sample.
        if sel.capped > 0 && !launch && self.others.is_empty() && args.select.funcs.is_empty() {
            match presample_selection(&self.target, args, &self.required) {
                Ok(Some((chosen, stacks))) => {
                    let of = chosen.funcs.len() + chosen.capped;
                    eprintln!(
                        "profiler: probing the {} functions of {} on the watched thread's stacks \
                         ({stacks} stacks in a {} ms sample; {of} match the default selection); \
                         --func names others, --max-funcs {} caps them",
                        chosen.presampled.unwrap_or(0),
                        self.target.exe.display(),
                        crate::session::presample::SPAN.as_millis(),
                        args.select.max_funcs
                    );
                    sel = chosen;
                    probed_set = Probed::of(&sel);
                }
                Ok(None) => {}
                Err(e) => eprintln!(
                    "profiler: warning: sampling the watched thread to choose functions failed ({}); \
                     probing the first {} in symbol order",
                    crate::error::chain(&e),
                    sel.funcs.len()
                ),
            }
        }
        if sel.capped > 0 && sel.presampled.is_none() {
            eprintln!(
                "profiler: probing the first {} of {} matching functions; raise --max-funcs to probe more \
                 (each probed call costs the target about 4 µs, or 0.3 µs where a function starts with a \
                 5-byte nop, and --max-overhead detaches the functions that cost too much; attaching or \
                 detaching 1,000 functions takes about 30 ms), or narrow the selection with --func/--exclude",
                sel.funcs.len(),
                sel.funcs.len() + sel.capped
            );
        }
        // Stage functions resolve now, so a bad --stage fails before attaching.
        for spec in &self.stage_cfg.stages {
            spec.resolve(|name| pipeline::index_of(&sel.funcs, name))?;
        }
        let (watch_tid, mut watch_name) = self
            .target
            .resolve_thread(&args.dispatch.thread)
            .map_err(|e| self.gone(e))?;
        if let Some(c) = self.child.as_ref().filter(|c| c.pid == watch_tid) {
            // Not exec'd yet: named after the program, as the kernel will.
            watch_name = c.comm();
        }
        // No dispatch function: the watched thread's event-loop iterations,
        // bounded by its wait syscalls (one process; several keep, per
        // process, every outermost call).
        self.wait_loop = sel.dispatch_fallback && !self.tracking.by_map();
        if sel.dispatch_fallback && self.tracking.by_map() {
            sel.dispatch_rule = select::FALLBACK_RULE_PER_PROCESS.to_string();
        }
        (self.sel, self.probed_set) = (sel, probed_set);
        (self.watch_tid, self.watch_name) = (watch_tid, watch_name);
        Ok(())
    }
}

/// The processes named by `--pid` and `--pid-of`, first given first, each once.
fn target_pids(args: &RecordArgs) -> Result<Vec<u32>> {
    let mut pids = args.pid.clone();
    for name in &args.pid_of {
        let found = find::pids_named(name);
        if found.is_empty() {
            return Err(Error::Usage(if args.follow {
                format!(
                    "--follow --pid-of {name:?}: no running process is named {name:?}, so there is no tree to follow: start it first, or launch it with `profiler record --follow -- COMMAND`"
                )
            } else {
                format!(
                    "--pid-of {name:?}: no running process has that name (its comm or its executable's file name): check with `pgrep -l {name}`"
                )
            }));
        }
        pids.extend(found);
    }
    let mut seen = std::collections::HashSet::new();
    pids.retain(|p| seen.insert(*p));
    Ok(pids)
}

/// Which processes the probes count: several processes (or a tree) put
/// probes on every process mapping the binaries, the kernel's map of
/// traced processes deciding.
fn tracking(args: &RecordArgs, targets: usize) -> Result<Tracking> {
    Ok(Tracking {
        mode: if args.follow {
            profiler_common::track::FOLLOW
        } else if targets > 1 {
            profiler_common::track::MAP
        } else {
            profiler_common::track::ONE
        },
        offsets: match task_btf::task_offsets() {
            Ok(o) => Some(o),
            Err(e) if args.follow || targets > 1 => return Err(e),
            // One target: only the count of its untraced children is lost.
            Err(_) => None,
        },
    })
}

/// Launches `-- COMMAND`, held before its first instruction; a script or
/// wrapper is followed through its execs to the program that gets probed.
fn launch_command(args: &RecordArgs) -> Result<Launched> {
    let child = Launched::spawn(&args.command, args.keep_running)?;
    if child.follows {
        child.follow(args.duration.map(|d| Instant::now() + d))?;
        let passed: Vec<String> = child
            .passed_through()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        eprintln!(
            "profiler: followed {} (PID {}) through its execs to {}{}",
            child.program.display(),
            child.pid,
            child.exe().display(),
            match passed.is_empty() {
                true => String::new(),
                false => format!(" (passing {})", passed.join(", ")),
            }
        );
    }
    Ok(child)
}

/// The default selection chosen from a short sample of the watched thread
/// ([`crate::session::presample`]), and how many stacks it saw; None when
/// the sample saw none of the main executable's functions.
fn presample_selection(
    target: &Target,
    args: &RecordArgs,
    required: &[select::Required],
) -> Result<Option<(select::Selection, u64)>> {
    let (tid, _) = target.resolve_thread(&args.dispatch.thread)?;
    let rows = crate::unwind::budget::rows(args.unwind_memory, false, Some(target.pid));
    let seen = crate::session::presample::sample(target.pid, tid, rows)?;
    let maps = crate::tracee::process::read_maps(target.pid)
        .map_err(|e| Error::io("reading the target's mappings", e))?;
    let offsets =
        crate::session::presample::file_offsets(&seen, &maps, &target.exe.to_string_lossy());
    if offsets.is_empty() {
        return Ok(None);
    }
    let sel = select::select_among(target, &args.select, required, Some(&offsets))?;
    Ok(Some((sel, seen.stacks)).filter(|(s, _)| s.presampled.unwrap_or(0) > 0))
}

/// The cost of a probe hit, and what the session does with it.
struct Costs {
    /// `--max-overhead`, in % (0: no governor).
    max_overhead: f64,
    /// What the governor assumes a hit costs (None: no governor).
    hit_cost: Option<HitCost>,
    /// Durations leave out the probes' cost: the calibration's spread.
    spread_pct: Option<f64>,
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

impl<'a> Recorder<'a> {
    /// Loads the programs, measures a probe's cost, and attaches the
    /// samplers and the probes; a launched command is let go.
    pub fn attach(mut self) -> Result<Attached<'a>> {
        let args = self.args;
        let launch = self.child.is_some();
        probes::raise_fd_limit();
        let unwind = match args.unwind {
            UnwindMode::Copy => return Err(Error::Usage(
                "--unwind copy is for `profiler sample --pid`; record walks stacks with tables or fp"
                    .into(),
            )),
            u => u,
        };
        // A launched command has not exec'd its program yet: the machine's
        // ceiling; a running process: what its binaries need.
        let table_rows = crate::unwind::budget::rows(
            args.unwind_memory,
            false,
            (!launch).then_some(self.target.pid),
        );
        let mut probes = Probes::load(
            self.target.pid,
            probes::Watch {
                tid: self.watch_tid,
                wakers: !args.dispatch.no_wakers,
                wait_loop: self.wait_loop,
            },
            RingSpec {
                mode: args.rings,
                size: args.ring_size,
            },
            false,
            (unwind, table_rows),
            self.tracking,
        )
        .map_err(|e| self.gone(e))?;
        if self.tracking.by_map() {
            probes.trace(&self.all_pids())?;
        }
        probes.attach_process_events(self.tracking)?;
        let tables = match unwind {
            UnwindMode::Tables => {
                let mut t = Tables::take(probes.ebpf_mut(), table_rows)?;
                t.add_process(self.target.pid);
                Some(t)
            }
            _ => None,
        };
        let costs = self.calibrate()?;
        // The session starts before the first probe that reports events goes
        // on: every time in the outputs counts from here, so none is earlier.
        let started = Instant::now();
        let session_start_ns = crate::clock::monotonic_ns();
        let rings = Rings::new(probes.take_rings())?;
        let counters = probes.take_counters()?;
        let gone = |e| self.gone(e);
        probes
            .attach_watch(args.dispatch.dispatch_hz)
            .map_err(gone)?;
        if let Some(hz) = args.sample {
            samplers::start(probes.ebpf_mut(), hz).map_err(gone)?;
        }
        if args.off_cpu {
            samplers::start_offcpu(probes.ebpf_mut()).map_err(gone)?;
        }
        let cpu_maps = match args.sample.is_some() || args.off_cpu {
            true => Some(samplers::CpuMaps::take(probes.ebpf_mut(), args.off_cpu)?),
            false => None,
        };
        let scope = if self.tracking.by_map() {
            0
        } else {
            self.target.pid
        };
        let probed = probes.attach(&self.sel, scope).map_err(gone)?;
        if self.child.is_none() && !self.target.alive() {
            return Err(Error::TargetGone(self.target.pid));
        }
        for line in probes.refused_summary() {
            eprintln!("{line}");
        }
        // Printed by the collector once it handles SIGINT and SIGTERM, so a
        // Ctrl-C right after it always ends the session cleanly.
        let attached = format!(
            "profiler: attached {probed} functions ({} probes) to {} in {} ms ({}); stop with Ctrl-C",
            self.sel.probe_count(),
            self.describe(),
            probes.attach_ms,
            probes.attach_kind()
        );
        if let Some(c) = &costs.hit_cost {
            eprintln!(
                "profiler: overhead governor: a probe hit costs {:.1} µs here ({:.1} µs on a push, \
                 {:.2} µs on a 5-byte nop, {:.1} µs at a return site, {:.1} µs a return uprobe); functions are detached when a thread spends over {}% \
                 of its CPU time in probes (--max-overhead; 0 turns this off)",
                c.entry_ns / 1000.0,
                c.entry_push_ns / 1000.0,
                c.entry_nop_ns / 1000.0,
                c.ret_site_ns / 1000.0,
                c.uretprobe_ns / 1000.0,
                costs.max_overhead,
            );
        }
        let mut exec_ns = 0;
        if let Some(c) = &self.child {
            c.release()?;
            exec_ns = c.exec_time_ns().unwrap_or(session_start_ns);
        }
        Ok(Attached {
            rec: self,
            probes,
            tables,
            rings,
            counters,
            cpu_maps,
            costs,
            started,
            session_start_ns,
            exec_ns,
            probed,
            attached,
        })
    }

    /// Every target's PID, the first first.
    fn all_pids(&self) -> Vec<u32> {
        std::iter::once(self.target.pid)
            .chain(self.others.iter().map(|t| t.pid))
            .collect()
    }

    /// What is recorded, in words, for the `attached` line.
    fn describe(&self) -> String {
        let mut what = match &self.child {
            Some(c) if c.follows => format!(
                "{} (PID {}, launched as {})",
                c.exe().display(),
                c.pid,
                c.program.display()
            ),
            Some(c) => format!("{} (PID {}, launched)", c.program.display(), c.pid),
            None if self.others.is_empty() => format!("PID {}", self.target.pid),
            None => format!(
                "PIDs {}",
                self.all_pids()
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        if self.args.follow {
            what.push_str(" and the processes they make (--follow)");
        }
        what
    }

    /// The cost of one probe hit here, measured before the target is
    /// probed: for the overhead governor (default 10% with --pid, off in
    /// launch mode), and to take the probes' own cost out of the durations
    /// (each selected function's cost set).
    fn calibrate(&mut self) -> Result<Costs> {
        let args = self.args;
        // Probing exec'd programs and detaching hot functions both change the
        // probes while the session runs; with several processes only the first
        // is done for now.
        if self.tracking.by_map() && args.max_overhead.is_some_and(|p| p > 0.0) {
            return Err(Error::Usage(
                "--max-overhead does not work with --follow or several targets yet: drop it (the governor is off for them)".into(),
            ));
        }
        let max_overhead = match self.tracking.by_map() {
            true => 0.0,
            false => args
                .max_overhead
                .unwrap_or(if self.child.is_some() { 0.0 } else { 10.0 }),
        };
        let calibrated = match max_overhead > 0.0 || !args.raw_durations {
            true => Some(calibrate::calibrate()),
            false => None,
        };
        let hit_cost = (max_overhead > 0.0).then(|| match &calibrated {
            Some(Ok(c)) => *c,
            Some(Err(e)) => {
                eprintln!(
                    "profiler: warning: {}; the overhead governor assumes {} µs per probe hit, and durations keep the probes' cost",
                    crate::error::chain(e),
                    FALLBACK_COST.entry_ns / 1000.0
                );
                FALLBACK_COST
            }
            None => FALLBACK_COST,
        });
        let spread_pct = match &calibrated {
            Some(Ok(c)) if !args.raw_durations => Some(c.inside_spread_pct),
            _ => None,
        };
        match &calibrated {
            Some(Ok(c)) if !args.raw_durations => calibrate::set_costs(&mut self.sel, c),
            Some(Err(e)) if max_overhead <= 0.0 => eprintln!(
                "profiler: warning: {}; durations keep the probes' own cost",
                crate::error::chain(e)
            ),
            _ => {}
        }
        Ok(Costs {
            max_overhead,
            hit_cost,
            spread_pct,
        })
    }
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
    probed: usize,
    failed_probes: usize,
}

impl<'a> Attached<'a> {
    /// What is known when recording starts: the `profile.data` header,
    /// which the pipeline is built from, as `report` builds it.
    fn header(&self) -> datafile::Header {
        let (rec, args) = (&self.rec, self.rec.args);
        let targets: Vec<datafile::TargetInfo> = match rec.tracking.by_map() {
            false => Vec::new(),
            true => std::iter::once(&rec.target)
                .chain(rec.others.iter())
                .map(|t| datafile::TargetInfo {
                    pid: t.pid,
                    ppid: match &rec.child {
                        Some(_) => std::process::id(),
                        None => find::parent_of(t.pid),
                    },
                    exe: t.exe.display().to_string(),
                    start_ns: self.session_start_ns,
                })
                .collect(),
        };
        datafile::Header {
            pid: rec.target.pid,
            exe: rec.target.exe.display().to_string(),
            binaries: rec
                .sel
                .binaries
                .iter()
                .map(|b| b.path.display().to_string())
                .collect(),
            funcs: rec.sel.funcs.iter().map(datafile::FuncInfo::of).collect(),
            dispatch_rule: rec.sel.dispatch_rule.clone(),
            dispatch_fallback: rec.sel.dispatch_fallback,
            wait_loop: rec.wait_loop,
            exit_rule: rec.sel.exit_rule.clone(),
            watch_tid: rec.watch_tid,
            watch_name: rec.watch_name.clone(),
            session_start_ns: self.session_start_ns,
            start_unix_ns: crate::output::export::unix_ns_ago(0),
            dispatch_hz: args.dispatch.dispatch_hz,
            no_wakers: args.dispatch.no_wakers,
            exec_ns: rec.child.as_ref().map(|_| self.exec_ns),
            launch: rec.child.is_some(),
            stages: args.stages.stages.clone(),
            scenarios: args.stages.scenarios.clone(),
            runs: rec.runs,
            ready: args.stages.ready.clone(),
            startup_threshold_ns: args.stages.startup_threshold.map(|d| d.as_nanos() as u64),
            threshold_ns: args.dispatch.threshold.as_nanos() as u64,
            hang_ns: args.dispatch.hang.as_nanos() as u64,
            frame_interval_ns: args.dispatch.frame_interval.as_nanos() as u64,
            full_tree: args.dispatch.full_tree,
            trace_events: args.trace_events,
            processes: targets,
            follow: args.follow,
            cost_spread_pct: self.costs.spread_pct,
        }
    }

    /// Builds the pipeline from `header`, as `report` does, and adds what
    /// only a live session has: the CPU maps, the unwind tables, the wait
    /// the loop blocks in, the `--lib`s to watch, and `profile.data`.
    fn pipeline(&mut self, header: &datafile::Header) -> Result<Sinks> {
        let rec = &self.rec;
        let (args, pid) = (rec.args, rec.target.pid);
        let o = pipeline::Overrides::default();
        let mut sinks = pipeline::build(pipeline::Config::from_header(
            &rec.out,
            header,
            &rec.sel.funcs,
            &rec.stage_cfg,
            &o,
        ))?;
        sinks.cpu = self.cpu_maps.take().map(|m| (m, Symbolizer::new(pid)));
        sinks.tables = self.tables.take();
        if rec.wait_loop {
            sinks.loop_sp = Some(self.probes.loop_sp()?);
            // Blocked in a wait now: most likely idle in its loop, the first
            // guess of which wait is the loop's.
            let blocked = process::thread_syscall(pid, rec.watch_tid);
            if let (Some((nr, args, sp)), Some(d)) = (blocked, &mut sinks.dispatch) {
                let getevents = args[3] & profiler_common::wait::IORING_ENTER_GETEVENTS != 0;
                let io_uring = nr as u32 == profiler_common::wait::NR_IO_URING_ENTER;
                if profiler_common::wait::is_wait(nr) && (!io_uring || getevents) {
                    d.loop_wait.at_attach(
                        nr as u32,
                        args[0].min(profiler_common::wait::FD_MAX) as u32,
                        sp,
                    );
                }
            }
        }
        sinks.libs = LibWatch::new(
            pid,
            rec.sel
                .binaries
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.unmapped.map(|id| (i as u32, b.path.clone(), id))),
        );
        for l in &sinks.libs.libs {
            eprintln!(
                "profiler: {} is not mapped by PID {} yet: its probes fire once it is",
                l.path.display(),
                pid
            );
        }
        sinks.stop_when_runs_done = !args.stages.keep_going;
        sinks.processes = pipeline::processes_of(header, &rec.sel.funcs, &o);
        if !rec.tracking.by_map() {
            // One target: its exec ends the session (the probes are its
            // program's); with several, each exec is followed.
            sinks.exe = std::fs::canonicalize(&rec.target.exe)
                .ok()
                .or_else(|| Some(rec.target.exe.clone()));
        }
        if args.data_limit > 0 {
            let file = rec.out.create("profile.data")?;
            sinks.data = Some(
                datafile::DataWriter::create(file, header, args.data_limit).map_err(|e| {
                    Error::Output {
                        path: rec.out.path().join("profile.data"),
                        reason: e.to_string(),
                    }
                })?,
            );
        }
        if self.costs.hit_cost.is_some() {
            sinks.hits = vec![0; rec.sel.funcs.len()];
            sinks.dedup = Some(Default::default());
        }
        Ok(sinks)
    }

    /// Drains the rings into the pipeline until the session is told to stop
    /// (duration, signal, the target's exit, every run done), steering the
    /// probes meanwhile (the overhead governor, or new programs probed);
    /// then detaches and takes what was still in flight.
    pub fn collect(mut self) -> Result<Collected<'a>> {
        let header = self.header();
        let mut sinks = self.pipeline(&header)?;
        let Attached {
            mut rec,
            mut probes,
            mut rings,
            counters,
            costs,
            started,
            session_start_ns,
            probed,
            attached,
            ..
        } = self;
        let protected: Vec<bool> = rec
            .sel
            .funcs
            .iter()
            .map(|f| rec.required.iter().any(|r| r.name == f.name))
            .collect();
        let failed_probes = probes.failed.len();
        let mut status = Status::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the runtime", e))?;
        let mut steer = match costs.hit_cost {
            Some(cost) => Steering::Govern(Box::new(Governor::new(
                &mut probes,
                &rec.sel,
                rec.target.pid,
                costs.max_overhead,
                cost,
                &protected,
                session_start_ns,
            ))),
            None if rec.tracking.by_map() => Steering::Follow(ExecProber {
                probes: &mut probes,
                sel: &mut rec.sel,
                probed: std::mem::take(&mut rec.probed_set),
                args: crate::cli::SelectArgs {
                    libs: Vec::new(),
                    dispatch: Vec::new(),
                    ..rec.args.select.clone()
                },
            }),
            None => Steering::Neither(NoSteer),
        };
        if rec.child.is_some() {
            launch::watch_stop_signals();
        }
        let collected = rt.block_on(collector::collect(
            &mut rings,
            &mut sinks,
            &rec.target.pidfd,
            rec.args.duration,
            collector::Live {
                counters: &counters,
                status: &mut status,
                attached: &attached,
            },
            steer.as_mut(),
        ));
        // A failure from here on (the target exiting while the governor
        // rebuilds its probes, a ring that cannot be polled) ends the session,
        // never the recording: every output is still written.
        let (reason, failure) = match collected {
            Ok(reason) => (reason, None),
            Err(e)
                if matches!(e, Error::TargetGone(_)) || rec.target.exits_within(LATE_EXIT_WAIT) =>
            {
                status.finish();
                eprintln!(
                    "profiler: PID {} exited while the session was changing its probes ({})",
                    rec.target.pid,
                    crate::error::chain(&e)
                );
                (StopReason::TargetExited, None)
            }
            Err(e) => {
                status.finish();
                eprintln!(
                    "profiler: the session stopped early: {}; writing the outputs",
                    crate::error::chain(&e)
                );
                (StopReason::Failed, Some(e))
            }
        };
        let governed = steer.governed();
        let duration_ns = started.elapsed().as_nanos() as u64;
        // Detach first, so the target runs unprobed while we finish up; then
        // take what was still in flight.
        if rec.target.alive() {
            sinks.libs.poll();
        }
        drop(probes);
        sinks.flush(&mut rings);
        if rings.late() > 0 {
            eprintln!(
                "profiler: warning: {} events reached the agent more than {} ms after they happened; the order of their threads' events may be off",
                rings.late(),
                crate::session::ring_merge::SLACK_NS / 1_000_000
            );
        }
        Ok(Collected {
            rec,
            status,
            header,
            sinks,
            counters,
            reason,
            failure,
            governed,
            duration_ns,
            probed,
            failed_probes,
        })
    }
}

impl Collected<'_> {
    /// Stops or leaves the launched command, writes every output and
    /// `profile.data`'s trailer. Returns the exit status to leave with (0,
    /// or in launch mode the command's) and, in launch mode, the startup
    /// report.
    pub fn finish(mut self) -> Result<(u8, Option<StartupReport>)> {
        let (args, pid) = (self.rec.args, self.rec.target.pid);
        let never_mapped = never_mapped(&self.sinks, &self.rec.sel, pid);
        for line in &never_mapped {
            eprintln!("profiler: {line}");
        }
        if args.sample.is_none() {
            // Without --sample, cpu.txt is not there to say it (with it, the
            // warning comes with the CPU profile, with shares).
            if let Some(line) = self.sinks.tables.as_ref().and_then(|t| t.starved_note()) {
                eprintln!("profiler: warning: {line}");
            }
        }
        let counters = self.counters.read();
        self.status.finish();
        match self.reason {
            StopReason::TargetExited => eprintln!("profiler: PID {pid} exited; writing the outputs"),
            StopReason::RunsComplete => eprintln!("profiler: every scenario has its runs; probes detached"),
            StopReason::AllExited => eprintln!("profiler: every traced process exited; writing the outputs"),
            StopReason::TargetExeced => eprintln!(
                "profiler: PID {pid} exec'd another program, which the probes do not cover; writing the outputs"
            ),
            _ => {}
        }
        let left = self.stop_child()?;
        // Everything is drained: fold the threads that have exited.
        self.sinks.reap(true);
        let thread_names: HashMap<u32, String> = self
            .sinks
            .stacks
            .threads()
            .filter_map(|t| {
                let live = (t.exited_threads == 0)
                    .then(|| process::thread_name(pid, t.tid))
                    .flatten();
                live.or_else(|| t.name.clone()).map(|n| (t.tid, n))
            })
            .collect();
        let (cpu, offcpu) = self.cpu_profiles(&counters);
        if counters.traced_full + counters.lost_proc > 0 {
            eprintln!(
                "profiler: warning: {} child processes were not followed (the map of traced processes was full) and {} process events were lost (ring full)",
                counters.traced_full, counters.lost_proc
            );
        }
        let sel = &self.rec.sel;
        let mut names: Vec<(u32, String)> =
            thread_names.iter().map(|(t, n)| (*t, n.clone())).collect();
        names.sort();
        let trailer = datafile::Trailer {
            duration_ns: self.duration_ns,
            stop_reason: self.reason.as_str().to_string(),
            functions_probed: self.probed,
            lost_events: counters.lost,
            lost_sched: counters.lost_sched,
            lost_comm: counters.lost_comm,
            capped: sel.capped,
            failed_probes: self.failed_probes,
            thread_names: names,
            symbols: match &self.sinks.data {
                Some(_) => self
                    .sinks
                    .dispatch
                    .as_ref()
                    .map(|d| d.symbol_journal())
                    .unwrap_or_default(),
                None => Vec::new(),
            },
            cpu,
            offcpu,
            complete: true,
            never_mapped,
            untraced_children: counters.untraced_children,
            governor: self.governed.take(),
            totals: None,
        };
        let out = &self.rec.out;
        let mut data_result = Ok(());
        if let Some(data) = self.sinks.data.take() {
            // A failure (a full disk) is told after the other outputs, so the
            // summary of what was recorded is still printed.
            data_result = match data.finish(&trailer) {
                Ok(w) => {
                    print_data_line(&w, self.duration_ns);
                    Ok(())
                }
                Err(e) => Err(Error::Output {
                    path: out.path().join("profile.data"),
                    reason: e.to_string(),
                }),
            };
        }
        let written = finish::write(
            finish::Finish::recorded(
                out,
                &sel.funcs,
                &sel.binaries,
                &self.header,
                trailer,
                None,
                thread_names,
                self.header.trace_events,
            ),
            self.sinks,
        );
        data_result?;
        let startup_report = written?;
        if self.rec.child.is_some() {
            jit_map_note(&self.rec.target);
        }
        eprintln!("profiler: wrote the outputs to {}", out.path().display());
        if let Some(e) = self.failure {
            return Err(e);
        }
        match self.rec.child {
            // Still running on purpose, or stopped because the recording was
            // as long as asked: the session succeeded.
            Some(_) if left => Ok((0, startup_report)),
            Some(c) => {
                if c.try_wait()?.is_none() {
                    eprintln!("profiler: waiting for {} to exit", c.describe());
                }
                Ok((
                    launch::exit_code(c.wait()?).clamp(0, 255) as u8,
                    startup_report,
                ))
            }
            None => Ok((0, None)),
        }
    }

    /// The session ended before the launched command did: it is stopped
    /// (its probes are gone already), or with `--keep-running` left
    /// running. True when it was left running, or stopped because the
    /// recording was as long as asked.
    fn stop_child(&self) -> Result<bool> {
        let (Some(c), reason) = (&self.rec.child, self.reason) else {
            return Ok(false);
        };
        let terminal = reason == StopReason::Signal(libc::SIGINT) && launch::sigint_from_terminal();
        let ends = matches!(reason, StopReason::Duration | StopReason::Signal(_));
        if !ends || c.try_wait()?.is_some() {
            return Ok(false);
        }
        if self.rec.args.keep_running {
            eprintln!(
                "profiler: left {} running, every probe removed (--keep-running){}",
                c.describe(),
                match terminal {
                    true => "; it got the terminal's SIGINT too",
                    false => "",
                }
            );
            return Ok(true);
        }
        let first = match reason {
            // Ctrl-C on a terminal reached the command directly
            // (same process group).
            StopReason::Signal(libc::SIGINT) if terminal => None,
            StopReason::Signal(sig) => Some(sig),
            _ => Some(libc::SIGTERM),
        };
        c.stop(first, launch::STOP_GRACE)?;
        Ok(reason == StopReason::Duration)
    }

    /// The CPU profile (`--sample`) and the off-CPU one (`--off-cpu`),
    /// read from the kernel's maps.
    fn cpu_profiles(
        &mut self,
        counters: &probes::Counters,
    ) -> (Option<(u64, CpuProfile)>, Option<CpuProfile>) {
        let sinks = &mut self.sinks;
        let Some((maps, sym)) = &mut sinks.cpu else {
            return (None, None);
        };
        let offcpu = cpu_fold::collect_offcpu(maps, sym);
        let cpu = self.rec.args.sample.map(|hz| {
            let placement = sinks.tables.as_ref().map(|t| t.placement());
            let mut prof = cpu_fold::collect(maps, sym, placement);
            prof.unwinding = sinks.tables.as_ref().map(|t| t.stats.clone());
            for note in crate::output::writers::unwind_notes(&prof).warnings {
                eprintln!("profiler: warning: {note}");
            }
            prof.lost = (counters.cpu_stack_lost, counters.cpu_counts_full, 0);
            prof.unwinding = sinks.tables.as_ref().map(|t| t.stats.clone());
            (hz, prof)
        });
        (cpu, offcpu)
    }
}

/// One line for each `--lib` the target never mapped while recording (not
/// seen in its maps, checked every 0.1 s, and none of its probes fired).
fn never_mapped(sinks: &Sinks, sel: &Selection, pid: u32) -> Vec<String> {
    let stats = &sinks.stacks.funcs;
    sinks
        .libs
        .libs
        .iter()
        .filter(|l| !l.seen)
        .filter_map(|l| {
            let mine: Vec<usize> = (0..sel.funcs.len())
                .filter(|&i| sel.funcs[i].binary == l.binary)
                .collect();
            let calls: u64 = mine.iter().map(|&i| stats[i].calls).sum();
            let probes: usize = mine.iter().map(|&i| sel.funcs[i].exit.probes()).sum();
            (calls == 0).then(|| {
                format!(
                    "{}: never seen mapped by PID {pid} (its maps read every 0.1 s and at the end); its {probes} probes saw nothing",
                    l.path.display()
                )
            })
        })
        .collect()
}

/// Launch mode asked JIT runtimes for perf maps (launch.rs): says whether
/// the command's runtime wrote one.
fn jit_map_note(target: &Target) {
    let map = format!("/tmp/perf-{}.map", target.pid);
    let exe = target.exe.file_name().unwrap_or_default().to_string_lossy();
    if std::path::Path::new(&map).exists() {
        eprintln!("profiler: {exe} wrote a JIT perf map ({map}): its JIT frames are named");
    } else if exe.starts_with("python") || exe.starts_with("node") {
        eprintln!(
            "profiler: {exe} wrote no JIT perf map (CPython needs 3.12+ for PYTHONPERFSUPPORT); \
             its JIT frames stay unnamed"
        );
    }
}

/// One line on what `profile.data` took (the bench reads it).
fn print_data_line(w: &datafile::Written, duration_ns: u64) {
    let t = &w.totals;
    let per = |bytes: u64| bytes as f64 / t.records.max(1) as f64;
    eprintln!(
        "profiler: profile.data: {} bytes for {} records ({} entry/exit events) in {} blocks, \
         {:.2} bytes per record (format 2: {:.2}); its writing thread used {:.3} s of CPU in {:.3} s",
        w.bytes,
        t.records,
        t.events,
        t.blocks,
        per(w.bytes),
        per(t.format2_bytes),
        w.cpu_ns as f64 / 1e9,
        duration_ns as f64 / 1e9,
    );
}

/// What the session does to its probes while it runs (one of them: both
/// change the probes).
enum Steering<'a> {
    /// The overhead governor detaches hot functions.
    Govern(Box<Governor<'a>>),
    /// New programs of traced processes are probed after an exec.
    Follow(ExecProber<'a>),
    Neither(NoSteer),
}

impl Steering<'_> {
    fn as_mut(&mut self) -> &mut dyn Steer {
        match self {
            Steering::Govern(g) => g.as_mut(),
            Steering::Follow(p) => p,
            Steering::Neither(n) => n,
        }
    }

    /// What the governor did, if it ran.
    fn governed(self) -> Option<crate::analyze::overhead::GovernorReport> {
        match self {
            Steering::Govern(g) => Some(g.report),
            _ => None,
        }
    }
}
