//! The plan: the targets opened or launched, the functions chosen.
use super::*;

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
    pub(super) fn gone(&self, e: Error) -> Error {
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
            probed_set.merge(&mut sel, more, args.select.max_funcs());
        }
        // Too many functions for --max-funcs, none named: by PID, probe those
        // the watched thread runs and waits in, seen in a short sample.
        if sel.capped > 0 && !launch && self.others.is_empty() && args.select.funcs.is_empty() {
            match presample_selection(&self.target, args, &self.required) {
                Ok(Some((chosen, stacks))) => {
                    let of = chosen.funcs.len() + chosen.capped;
                    let callers = match chosen.tail_callers {
                        0 => String::new(),
                        n => format!(", and {n} that tail-call them"),
                    };
                    eprintln!(
                        "profiler: probing the {} functions of {} on the watched thread's stacks{callers} \
                         ({stacks} stacks in a {} ms sample; {of} match the default selection); \
                         --func names others, --max-funcs {} caps them{}",
                        chosen.presampled.unwrap_or(0),
                        self.target.exe.display(),
                        crate::session::presample::SPAN.as_millis(),
                        args.select.max_funcs(),
                        cap_reason(args.select.max_funcs())
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
                 detaching 1,000 functions takes about 30 ms), or narrow the selection with --func/--exclude{}",
                sel.funcs.len(),
                sel.funcs.len() + sel.capped,
                cap_reason(args.select.max_funcs())
            );
        }
        // Stage functions resolve now, so a bad --stage fails before attaching.
        for spec in &self.stage_cfg.stages {
            spec.resolve(|name| pipeline::index_of(&sel.funcs, name))?;
        }
        let (watch_tid, mut watch_name) = self
            .target
            .resolve_thread(
                args.dispatch.thread.as_deref(),
                &crate::symbolize::hotspot::thread_names,
            )
            .map_err(|e| self.gone(e))?;
        if let Some(c) = self.child.as_ref().filter(|c| c.pid == watch_tid) {
            // Not exec'd yet: named after the program, as the kernel will.
            watch_name = c.comm();
        }
        // No dispatch function: the watched thread's event-loop iterations,
        // bounded by its wait syscalls (one process; several keep, per
        // process, every outermost call). A preset's functions, which the
        // watched thread may never call, with its waits watched beside.
        self.wait_loop = (sel.dispatch_fallback || sel.preset) && !self.tracking.by_map();
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
    let (tid, _) = target.resolve_thread(
        args.dispatch.thread.as_deref(),
        &crate::symbolize::hotspot::thread_names,
    )?;
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

/// Why the cap is `max_funcs`, when it is the default of a kernel that
/// attaches each probe on its own; else nothing.
pub fn cap_reason(max_funcs: usize) -> String {
    use crate::attach::kernel;
    if max_funcs != crate::cli::PER_PROBE_MAX_FUNCS || kernel::uprobe_multi() {
        return String::new();
    }
    format!(
        "; {max_funcs} is the default on this kernel ({}), which attaches each probe on its own \
         (uprobe_multi links came in Linux 6.10)",
        kernel::release()
    )
}
