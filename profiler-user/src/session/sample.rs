//! A `profiler sample` session: the sampler attached to one process or
//! the whole system ([`Sampler::attach`]), its ticks until a stop
//! ([`Sampler::collect`]: `--dwarf` stacks drained, unwind tables kept
//! current, exited processes folded), and the CPU profile written
//! ([`Finished::write`]).
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use profiler_common::{DwarfSample, KIND_DWARF};

use crate::{
    analyze::{
        cpu_fold::{self, ExitedProcs},
        cpu_profile::{self, Unwound},
    },
    attach::{
        probes::{CounterMap, Probes, Samplers},
        rings::RingSpec,
        samplers::{self, CpuMaps, NewProcesses},
    },
    cli::{SampleArgs, UnwindMode},
    output::html::Page,
    output::writers,
    output::OutDir,
    session::collector::{self, StopReason},
    symbolize::Symbolizer,
    tracee::{
        cgroup,
        process::{thread_alive, thread_name, Target},
    },
    unwind::{
        tables::{self, Tables},
        DwarfUnwinder,
    },
    Error, Result,
};

/// Files the CPU profile writes.
pub const CPU_FILES: &[&str] = &[
    "report.html",
    "cpu.folded",
    "cpu.svg",
    "cpu.txt",
    "profile.pb.gz",
    "offcpu.folded",
    "offcpu.svg",
    "offcpu.txt",
];

/// `--dwarf` state: the ring of copied stacks, the unwinder, the counts.
struct Dwarf {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    unwinder: DwarfUnwinder,
    stacks: Unwound,
    names: HashMap<u32, String>,
}

impl Dwarf {
    /// Unwinds every pending sample; the kernel stacks of those taken in
    /// the kernel are read from `maps` now.
    fn drain(&mut self, pid: u32, maps: &CpuMaps) {
        while let Some(item) = self.ring.next() {
            let Some(s) = profiler_common::read::<DwarfSample>(&item) else {
                continue;
            };
            if s.event.kind() != KIND_DWARF {
                continue;
            }
            let len = (s.len as usize).min(s.stack.len());
            let addrs = self
                .unwinder
                .unwind(s.ip, s.event.sp, s.bp, &s.stack[..len]);
            let tid = s.event.tid;
            self.names
                .entry(tid)
                .or_insert_with(|| thread_name(pid, tid).unwrap_or_else(|| format!("tid-{tid}")));
            let kernel = cpu_profile::read_stack(maps, s.kernel_stack);
            *self.stacks.entry((s.pid, tid, addrs, kernel)).or_default() += 1;
        }
    }
}

/// Time spent on unwind tables per tick of `sample --all`; processes not
/// reached wait for the next tick (their stacks use frame pointers until
/// then, counted as `no tables`).
const TABLES_BUDGET: Duration = Duration::from_millis(300);

/// Time spent on the unwind tables of processes just told of; the rest
/// wait, as above.
const NOTICE_BUDGET: Duration = Duration::from_millis(100);

/// While notices of new processes keep coming, the agent reads them this
/// often, on a timer (a machine that starts hundreds of processes a second
/// costs 50 ticks a second; an idle one none).
const NOTICE_GAP: Duration = Duration::from_millis(20);

/// How often the scans, table refreshes and (every 10th) folds run.
const SLOW_TICK: Duration = Duration::from_secs(1);

/// The processes on a CPU now (those of `cgroup` only, with `--cgroup`:
/// the others are never sampled, so they need no unwind tables).
fn running(cgroup: Option<&cgroup::Cgroup>) -> Vec<u32> {
    let mut pids = tables::running_pids();
    if let Some(cg) = cgroup {
        pids.retain(|&p| cg.contains(p));
    }
    pids
}

/// `sample --all`: the processes whose mappings and cgroup were read while
/// they ran (at their first sample, told by the kernel or found by the
/// scan), and those found gone, so that neither is read again (except when
/// the kernel tells that a process's mappings changed).
#[derive(Debug, Default)]
struct Sighted {
    read: HashSet<u32>,
    gone: HashSet<u32>,
}

impl Sighted {
    /// Reads `pid`'s mappings and its cgroup, unless done already (or
    /// `again`: its mappings changed). Returns the text of its
    /// `/proc/PID/maps` when read now (None: read before, or exited).
    fn read(
        &mut self,
        pid: u32,
        again: bool,
        sym: &mut Symbolizer,
        cgroups: &mut BTreeMap<u32, String>,
    ) -> Option<String> {
        if self.gone.contains(&pid) || (!self.read.insert(pid) && !again) {
            return None;
        }
        let Some(text) = sym.remember_maps_in_passing(pid) else {
            self.gone.insert(pid);
            return None;
        };
        // Read again after an exec too: a child's first sample may come
        // between its fork and its exec, before it joined its own cgroup
        // (a launcher writing `cgroup.procs` in the child, as systemd-run
        // and the tests do); the cgroup it runs its program in is the one
        // its samples are grouped by.
        if again || !cgroups.contains_key(&pid) {
            if let Some(cg) = cgroup::of_process(pid) {
                cgroups.insert(pid, cg);
            }
        }
        Some(text)
    }

    /// Forgets processes folded away (exited, named).
    fn forget(&mut self, pids: &[u32]) {
        for p in pids {
            self.read.remove(p);
            self.gone.remove(p);
        }
    }
}

/// What a sample session is: checked by the command (`commands/sample.rs`).
pub struct Plan<'a> {
    /// The command line.
    pub args: &'a SampleArgs,
    /// `--pid`'s process (None: `--all`).
    pub target: Option<Target>,
    /// `--cgroup`'s cgroup.
    pub cgroup: Option<cgroup::Cgroup>,
    /// The output directory, prepared for [`CPU_FILES`].
    pub out: OutDir,
    /// Samples a second.
    pub hz: u64,
    /// How user stacks are walked (`--dwarf` is `copy`).
    pub unwind: UnwindMode,
}

/// A sample session, attached.
pub struct Sampler<'a> {
    args: &'a SampleArgs,
    target: Option<Target>,
    out: OutDir,
    hz: u64,
    /// The sampler's event, as attached (`cpu-clock`, `cycles`).
    event: &'static str,
    /// What is sampled, for the messages and the page.
    what: String,
    probes: Probes,
    counters: CounterMap,
    started: Instant,
    ticks: Ticks,
}

/// The state a tick works on.
struct Ticks {
    all: bool,
    pid: u32,
    target_pid: Option<u32>,
    cgroup: Option<cgroup::Cgroup>,
    tables: Option<Tables>,
    /// Processes a tick's time budget did not reach, for the next one.
    pending: Vec<u32>,
    maps: CpuMaps,
    news: Option<NewProcesses>,
    sym: Symbolizer,
    dwarf: Option<Dwarf>,
    slow: collector::Pace,
    ticks: u32,
    /// System-wide: each sampled process's cgroup, read while it runs.
    cgroups: BTreeMap<u32, String>,
    seen: samplers::Seen,
    sighted: Sighted,
    notices_lost: u64,
    /// System-wide: processes that exit are folded as they go.
    exited: ExitedProcs,
}

impl Ticks {
    /// One tick: `--dwarf` stacks unwound, new processes read, and on the
    /// slow tick the scans, table refreshes and folds. Returns whether to
    /// tick again after [`NOTICE_GAP`] (notices keep coming).
    fn tick(&mut self, counters: &CounterMap) -> bool {
        let Ticks {
            all,
            pid,
            target_pid,
            cgroup,
            tables,
            pending,
            maps,
            news,
            sym,
            dwarf,
            slow,
            ticks,
            cgroups,
            seen,
            sighted,
            notices_lost,
            exited,
        } = self;
        if let Some(d) = dwarf {
            d.drain(*pid, maps);
        }
        // Python code objects first: a process may exec or exit at any
        // moment, and the rest of the tick (tables) can take a while.
        let py_early = tables.as_mut().map_or(0, Tables::learn_python);
        if let Some(n) = news {
            // Told of again, a process's mappings changed (an exec, libc
            // mapped after a first sample in the dynamic loader).
            let read: Vec<(u32, String)> = n
                .drain()
                .into_iter()
                .filter_map(|p| Some((p, sighted.read(p, true, sym, cgroups)?)))
                .collect();
            let told: Vec<u32> = read.iter().map(|(p, _)| *p).collect();
            if let (Some(t), false) = (tables.as_mut(), read.is_empty()) {
                // Exited processes are looked for at the next slow tick.
                *pending = t.add_read(read, &std::mem::take(pending), NOTICE_BUDGET);
            }
            n.mappings_read(told.into_iter().filter(|p| !pending.contains(p)));
        }
        if slow.due(Instant::now()) {
            *ticks = ticks.wrapping_add(1);
            if ticks.is_multiple_of(10) {
                if *all {
                    // Processes that exited: named now, then forgotten, so
                    // a machine that runs short-lived processes all day
                    // does not grow the agent.
                    let gone = |p: u32| !std::path::Path::new(&format!("/proc/{p}")).exists();
                    let folded = exited.fold(maps, sym, gone, |p| cgroups.get(&p).cloned());
                    seen.forget(&folded);
                    sighted.forget(&folded);
                    let keep = |p: &u32| !folded.contains(p) || exited.counts_under(*p);
                    cgroups.retain(|p, _| keep(p));
                }
                // Exited threads' samples out of the kernel's map, which
                // would fill up with them.
                maps.fold_exited(thread_alive);
                crate::heap::release_free();
            }
            if !*all {
                cpu_profile::remember_maps(maps, sym, *target_pid);
                if let Some(t) = tables {
                    t.add_process(*pid);
                    // Binaries samples landed in get tables first.
                    cpu_profile::note_hot(maps, t);
                }
            } else {
                // Only what changed since the last scan: processes sampled
                // for the first time (their cgroup, their mappings), and
                // those with a new stack (exec, dlopen) or on a CPU now get
                // their tables refreshed. An exited process is not looked
                // for again. With notices, the kernel tells all that (a
                // process whose notice found the ring full is told again),
                // so the scan, which reads every key of the counts map,
                // runs every 10 s as a safety net, or at once after a
                // notice was lost.
                let lost = counters.sum(profiler_common::COUNTER_NOTICES_LOST);
                let scan = match news.is_none() || ticks.is_multiple_of(10) || lost > *notices_lost
                {
                    true => maps.scan(seen),
                    false => Default::default(),
                };
                *notices_lost = lost;
                for &p in &scan.new {
                    sighted.read(p, false, sym, cgroups);
                }
                if let Some(t) = tables {
                    // Busy now first, then those with new stacks, then
                    // those the last tick's budget did not reach.
                    // (With notices, a process is told of at its first
                    // sample: none is busy unknown.)
                    let mut pids = match news.is_some() {
                        true => Vec::new(),
                        false => running(cgroup.as_ref()),
                    };
                    let changed = !scan.changed.is_empty();
                    pids.extend(scan.changed);
                    pids.append(pending);
                    pids.retain(|p| !sighted.gone.contains(p));
                    *pending = t.sync(&pids, false, TABLES_BUDGET);
                    if changed {
                        // Binaries samples landed in get tables first.
                        cpu_profile::note_hot(maps, t);
                    }
                    if let Some(n) = news {
                        n.mappings_read(pids.into_iter().filter(|p| !pending.contains(p)));
                    }
                }
            }
            if let Some(d) = dwarf {
                d.unwinder.refresh();
            }
        }
        // Python code objects met since the last tick, read while their
        // processes run.
        let py_told = py_early + tables.as_mut().map_or(0, Tables::learn_python) > 0;
        // Notices came: read them again after the gap, unwoken.
        news.as_ref().is_some_and(|n| n.polling() || py_told)
    }
}

impl<'a> Sampler<'a> {
    /// Loads the programs, takes the maps and starts the samplers.
    pub fn attach(plan: Plan<'a>) -> Result<Self> {
        let Plan {
            args,
            target,
            cgroup,
            out,
            hz,
            unwind,
        } = plan;
        let pid = target.as_ref().map_or(0, |t| t.pid);
        let copy = unwind == UnwindMode::Copy;
        // copy: 16 KiB per sample through the ring, drained every 20 ms. One
        // shared ring: the samples need no order.
        // --all: the notices of new processes (24 bytes each), read every
        // 20 ms.
        let ring_size = match (copy, args.all) {
            (true, _) => 64 << 20,
            (false, true) => 64 << 10,
            (false, false) => 4096,
        };
        let table_rows = crate::unwind::budget::rows(args.unwind_memory, args.all, args.pid);
        let mut probes = Probes::load_in_cgroup(
            pid,
            Default::default(),
            RingSpec::shared(ring_size),
            Samplers::both(args.all),
            (unwind, table_rows),
            cgroup.as_ref(),
            Default::default(),
        )?;
        let mut tables = match unwind {
            UnwindMode::Tables => Some(Tables::take(probes.ebpf_mut(), table_rows)?),
            _ => None,
        };
        // The processes whose stacks get tables: the target; with --all, those
        // on a CPU now and, from then on, those sampled (so that busy
        // processes get the table memory first).
        // Processes a tick's time budget did not reach, for the next one.
        let mut pending: Vec<u32> = Vec::new();
        if let Some(t) = &mut tables {
            match args.all {
                false => t.add_process(pid),
                true => pending = t.sync(&running(cgroup.as_ref()), false, TABLES_BUDGET),
            }
        }
        let event = samplers::start(probes.ebpf_mut(), hz)?;
        if args.off_cpu {
            samplers::start_offcpu(probes.ebpf_mut())?;
        }
        let maps = CpuMaps::take(probes.ebpf_mut(), args.off_cpu)?;
        let news = match args.all && !copy {
            true => {
                let ring = probes
                    .take_rings()
                    .pop()
                    .ok_or_else(|| Error::Load("no event ring".into()))?
                    .ring;
                let news = NewProcesses::take(probes.ebpf_mut(), ring)?;
                samplers::notice_execs_and_exits(probes.ebpf_mut())?;
                Some(news)
            }
            false => None,
        };
        let counters = probes.take_counters()?;
        let what = match &target {
            Some(t) => format!("PID {} ({})", t.pid, t.exe.display()),
            None => match &cgroup {
                Some(c) => format!("all processes in cgroup {}", c.name),
                None => "all processes".to_string(),
            },
        };
        eprintln!("profiler: attached {event} sampler at {hz} Hz to {what}; stop with Ctrl-C");
        let started = Instant::now();
        let dwarf = match copy {
            true => Some(Dwarf {
                ring: probes
                    .take_rings()
                    .pop()
                    .ok_or_else(|| Error::Load("no event ring".into()))?
                    .ring,
                unwinder: DwarfUnwinder::new(pid),
                stacks: Unwound::new(),
                names: HashMap::new(),
            }),
            false => None,
        };
        let ticks = Ticks {
            all: args.all,
            pid,
            target_pid: target.as_ref().map(|t| t.pid),
            cgroup,
            tables,
            pending,
            maps,
            news,
            sym: Symbolizer::new(pid),
            dwarf,
            slow: collector::Pace::new(SLOW_TICK),
            ticks: 0,
            cgroups: Default::default(),
            seen: Default::default(),
            sighted: Sighted::default(),
            notices_lost: 0,
            exited: ExitedProcs::default(),
        };
        Ok(Sampler {
            args,
            target,
            out,
            hz,
            event,
            what,
            probes,
            counters,
            started,
            ticks,
        })
    }

    /// Ticks until the session is told to stop (duration, signal, the
    /// target's exit); then takes what is still pending and detaches.
    /// Returns why it stopped and how long it ran.
    pub fn collect(mut self) -> Result<Finished<'a>> {
        crate::symbolize::collection_started();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the runtime", e))?;
        // `--unwind copy`: a fast tick reads the copied stacks. Otherwise a tick
        // a second, and with `--all` also one when the kernel tells of new
        // processes (then every [`NOTICE_GAP`] while they keep coming). The rest
        // is done once a second, and once every 10 s.
        let every = match self.ticks.dwarf.is_some() {
            true => Duration::from_millis(20),
            false => Duration::from_secs(1),
        };
        let wake = self.ticks.news.as_ref().map(NewProcesses::poll_fd);
        let (ticks, counters) = (&mut self.ticks, &self.counters);
        let reason = rt.block_on(collector::wait_for_stop(
            self.target.as_ref().map(|t| &t.pidfd),
            self.args.duration,
            every,
            wake.map(|fd| (fd, NOTICE_GAP)),
            || ticks.tick(counters),
        ))?;
        let t = &mut self.ticks;
        if let Some(d) = &mut t.dwarf {
            d.drain(t.pid, &t.maps);
        }
        if let Some(tables) = &mut t.tables {
            tables.learn_python();
        }
        cpu_profile::remember_maps(&t.maps, &mut t.sym, None);
        let duration_ns = self.started.elapsed().as_nanos() as u64;
        let Sampler {
            args,
            out,
            hz,
            event,
            what,
            probes,
            counters,
            ticks,
            ..
        } = self;
        drop(probes);
        crate::symbolize::collection_ended();
        eprintln!("profiler: stopped ({}); symbolizing", reason.as_str());
        Ok(Finished {
            args,
            out,
            hz,
            event,
            what,
            counters,
            ticks,
            reason,
            duration_ns,
        })
    }
}

/// A sample session stopped and detached, its maps still to read.
pub struct Finished<'a> {
    args: &'a SampleArgs,
    out: OutDir,
    hz: u64,
    event: &'static str,
    what: String,
    counters: CounterMap,
    ticks: Ticks,
    reason: StopReason,
    duration_ns: u64,
}

impl Finished<'_> {
    /// Symbolizes the profile and writes [`CPU_FILES`].
    pub fn write(self) -> Result<()> {
        let Finished {
            args,
            out,
            hz,
            event,
            what,
            counters,
            ticks: mut t,
            reason,
            duration_ns,
        } = self;
        let placement = t.tables.as_ref().map(Tables::placement);
        let mut prof = cpu_fold::collect_with_exited(&t.maps, &mut t.sym, &t.exited, placement);
        let c = counters.read();
        prof.lost = (c.cpu_stack_lost, c.cpu_counts_full, c.dwarf_lost);
        prof.unwinding = t.tables.as_ref().map(|t| t.stats.clone());
        if let Some(d) = &t.dwarf {
            cpu_profile::add_unwound(&mut prof, &d.stacks, &d.names, &mut t.sym);
        }
        if args.all {
            for &p in prof.per_pid.keys() {
                if let Some(cg) = t.cgroups.remove(&p).or_else(|| cgroup::of_process(p)) {
                    prof.cgroups.insert(p, cg);
                }
            }
        }
        let mut page = Page::new(&format!("profiler sample: {what}"), duration_ns);
        page.fact("target", &what);
        page.fact("duration", crate::text::fmt_ns(duration_ns));
        page.fact("stopped", reason.as_str());
        page.fact(
            "sampling",
            format!("{event} at {hz} Hz, {} samples", prof.samples),
        );
        let (stack_lost, counts_full, dwarf_lost) = prof.lost;
        if stack_lost + counts_full + dwarf_lost > 0 {
            page.warn(format!(
                "lost: {stack_lost} user stacks unreadable, {counts_full} samples not counted (map full), {dwarf_lost} --dwarf samples dropped (ring full)"
            ));
        }
        let text = writers::write_cpu(&out, &prof, &what, hz, duration_ns, &mut page)?;
        for note in writers::unwind_notes(&prof).warnings {
            eprintln!("profiler: warning: {note}");
        }
        let start = crate::output::export::unix_ns_ago(duration_ns);
        let pprof = match args.all {
            true => crate::output::export::cpu_pprof_by_cgroup(
                &prof.by_pid,
                &prof.cgroups,
                hz,
                duration_ns,
                start,
            ),
            false => crate::output::export::cpu_pprof(&prof.folded, hz, duration_ns, start),
        };
        out.write("profile.pb.gz", &pprof)?;
        print!("{text}");
        if let Some(off) = cpu_fold::collect_offcpu(&t.maps, &mut t.sym) {
            print!("\n{}", writers::write_offcpu(&out, &off, &what, &mut page)?);
        }
        page.write(&out)?;
        eprintln!(
            "profiler: wrote {}/{{{}}}",
            out.path().display(),
            CPU_FILES.join(",")
        );
        Ok(())
    }
}
