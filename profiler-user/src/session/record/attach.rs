//! Attaching: the programs loaded, a probe hit's cost measured, the
//! samplers and the probes on, a launched command let go.
use super::*;

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
                early: (1, 0),
            },
            RingSpec {
                mode: args.rings,
                size: args.ring_size,
            },
            probes::Samplers {
                all: false,
                cpu: args.sample.is_some(),
                off_cpu: args.off_cpu,
            },
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
        // The kernel may take most of a second to load the in-dispatch
        // samplers and the programs that watch the loop's waits: loaded
        // now, so that they and the functions' probes go on together below.
        // Before the calibration: it attaches the same wait tracepoints,
        // where those are the way, as they make every syscall dearer, the
        // return uprobes' included.
        probes
            .prepare_watch(args.dispatch.dispatch_hz)
            .map_err(|e| self.gone(e))?;
        let costs = self.calibrate(probes.wait_tracepoints())?;
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
                 {:.2} µs on a 5-byte nop, {:.1} µs on a 4-byte nop, {:.1} µs on endbr64, {:.1} µs at a return site, {:.1} µs a return uprobe); functions are detached when a thread spends over {}% \
                 of its CPU time in probes (--max-overhead; 0 turns this off)",
                c.entry_ns / 1000.0,
                c.entry_push_ns / 1000.0,
                c.entry_nop_ns / 1000.0,
                c.entry_nopl_ns / 1000.0,
                c.entry_endbr_ns / 1000.0,
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
    fn calibrate(&mut self, waits: calibrate::WaitTracepoints) -> Result<Costs> {
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
            true => Some(calibrate::calibrate(waits)),
            false => None,
        };
        let hit_cost = (max_overhead > 0.0).then(|| match &calibrated {
            Some(Ok(c)) => *c,
            Some(Err(e)) => {
                eprintln!(
                    "profiler: warning: {}; the overhead governor assumes {} µs per probe hit, and durations keep the probes' cost",
                    crate::error::chain(e),
                    HitCost::FALLBACK.entry_ns / 1000.0
                );
                HitCost::FALLBACK
            }
            None => HitCost::FALLBACK,
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
            waits,
        })
    }
}
