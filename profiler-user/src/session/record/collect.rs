//! Collecting: the header and the pipeline built from it, the rings
//! drained until a stop, the probes steered meanwhile, then detached.
use super::*;

/// How long a late failure waits for the target's exit to complete before
/// calling the failure an error: an exiting process loses its memory
/// (and `/proc/PID/exe`) before its last thread is gone.
const LATE_EXIT_WAIT: Duration = Duration::from_millis(500);

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
        if let Some(d) = &mut sinks.dispatch {
            // The thread that reads the rings does not wait for a binary's
            // symbols to be read: hangs are told while they run.
            d.live();
        }
        if rec.wait_loop {
            sinks.loop_sp = Some(self.probes.loop_sp()?);
            // Blocked in a wait now: most likely idle in its loop, the first
            // guess of which wait is the loop's.
            let blocked = process::thread_wait(pid, rec.watch_tid);
            if let (Some((nr, args, sp)), Some(d)) = (blocked, &mut sinks.dispatch) {
                d.loop_wait.at_attach(nr as u32, args[0], sp);
                // Told now, not at the first drain: a wait inside the
                // first iterations (a handler's poll()) is judged by it.
                if let (Some(l), Some(map)) = (d.loop_wait.take_untold(), &mut sinks.loop_sp) {
                    map.set(l.sp, l.key);
                }
            }
            sinks.catch_up = self.probes.take_catch_up();
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
        crate::symbolize::collection_started();
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
                tick: collector::DRAIN_TICK,
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
        let stop_ns = crate::clock::monotonic_ns();
        sinks.stop_at(stop_ns);
        let governed = steer.governed();
        let duration_ns = started.elapsed().as_nanos() as u64;
        // Detach first, so the target runs unprobed while we finish up; then
        // take what was still in flight.
        if rec.target.alive() {
            sinks.libs.poll();
        }
        sinks.catch_up = None;
        crate::symbolize::collection_ended();
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
            stop_ns,
            probed,
            failed_probes,
            recalibrate: costs.spread_pct.map(|_| costs.waits),
        })
    }
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
