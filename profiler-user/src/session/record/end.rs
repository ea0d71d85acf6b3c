//! Finishing: the launched command stopped or left, the CPU profiles,
//! `profile.data`'s trailer and every output.
use super::*;

impl Collected<'_> {
    /// Calibrates again, the probes detached, and says how much more (or
    /// less) the traced calls' hits cost now than at attach, in %: the
    /// host's speed moves while a session runs, and what was taken out of
    /// the durations was priced at attach. Not when no priced call
    /// returned: there is nothing to compare.
    fn cost_drift(&self, waits: calibrate::WaitTracepoints) -> Option<f64> {
        let funcs = &self.sinks.stacks.funcs;
        let calls = |i: usize| funcs.get(i).map_or(0, |f| f.calls);
        let sel = &self.rec.sel;
        if !(0..sel.funcs.len()).any(|i| calls(i) > 0 && sel.funcs[i].cost.hits_ns() > 0) {
            return None;
        }
        match calibrate::calibrate(waits) {
            Ok(end) => calibrate::drift_pct(sel, &end, calls),
            Err(e) => {
                eprintln!(
                    "profiler: warning: {}; report.txt gives the durations' uncertainty from the calibration at attach only",
                    crate::error::chain(&e)
                );
                None
            }
        }
    }

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
        // Slow dispatches still waiting for names are explained now,
        // before the symbols' journal goes into the trailer.
        self.sinks.finish_dispatches();
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
        let cost_drift_pct = self.recalibrate.and_then(|waits| self.cost_drift(waits));
        let sel = &self.rec.sel;
        let mut names: Vec<(u32, String)> =
            thread_names.iter().map(|(t, n)| (*t, n.clone())).collect();
        names.sort();
        let trailer = datafile::Trailer {
            duration_ns: self.duration_ns,
            stop_ns: self.stop_ns,
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
            cost_drift_pct,
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
