//! One watched process: its own eBPF object (the loop's waits, the
//! scheduler, the in-dispatch sampler and wakers; no uprobes), its rings
//! drained by the collector `record` uses into the same dispatcher, on a
//! thread of its own. Each tick hands what the dispatcher explained to the
//! journal ([`Msg`]), and checks what would make an iteration's time not
//! the program's: the process stopped, the system suspended, events lost.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
        Arc,
    },
    time::{Duration, Instant},
};

use super::{escalate::Escalator, Msg, StallMsg};
use crate::{
    analyze::{
        dispatch::{self, tree::Kind, Dispatcher, Notice, Streamed},
        flight::FlightRecorder,
        stacks::Stacks,
        windows::Windows,
    },
    attach::{
        probes::{self, CounterMap, Probes, Tracking},
        rings::RingSpec,
        task_btf,
    },
    cli::{RingMode, UnwindMode, WatchArgs},
    output::watch::{nest, StallLine, StallReport, MAX_LINE_NODES},
    session::{
        collector::{self, Steer, StopReason},
        ring_reader::Rings,
        sinks::Sinks,
        status::Status,
    },
    tracee::{process, select},
    unwind::tables::Tables,
    Error, Result,
};

/// Most samples the flight recorder holds (at 997 Hz, 5 s of a busy loop).
const FLIGHT_MAX: usize = 5_000;
/// How often a watched process's rings are drained when the kernel does
/// not wake the agent, and its hangs and stops checked: a fifth of
/// `record`'s pace, which took 1% of a core for an idle target.
const TICK: Duration = Duration::from_millis(50);
/// How often the kernel's loss counters are read.
const LOSS_EVERY: Duration = Duration::from_millis(100);
/// How long past a window's end its samples may still be in the rings.
const WINDOW_GRACE_NS: u64 = 300_000_000;
/// How often the loop's busy share and the losses go to the metrics.
const BUSY_EVERY: Duration = Duration::from_secs(1);
/// The seconds the busy share is over.
const BUSY_OVER: u64 = 10;

/// The share of the last complete seconds (at most [`BUSY_OVER`]) the
/// thread spent outside its loop's wait: libuv's idle metric, inverted.
fn busy_share(d: &Dispatcher, now_ns: u64) -> Option<f64> {
    if !d.by_waits() {
        return None;
    }
    let idle = d.loop_wait.recent_idle_share(now_ns, BUSY_OVER)?;
    Some(1.0 - idle)
}

/// A gap between ticks past this means the agent was behind (starved of
/// CPU, stopped): what ran meanwhile was not watched as it happened.
const BEHIND: Duration = Duration::from_millis(500);
/// A suspend shorter than this is not told (clock adjustments).
const SUSPEND_MIN_NS: u64 = 50_000_000;

/// What a worker needs of the command line.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    pub thread: Option<String>,
    pub threshold_ns: u64,
    pub hang_ns: u64,
    pub frame_interval_ns: u64,
    pub full_tree: bool,
    pub dispatch_hz: u64,
    pub wakers: bool,
    pub ring_size: u32,
    pub unwind: UnwindMode,
    pub unwind_memory: Option<u64>,
    pub keep_ns: u64,
    /// One tick in this many taken while an iteration is younger than
    /// `full_after_ns`.
    pub early_every: u32,
    pub full_after_ns: u64,
    /// `--profile-every`, ns.
    pub profile_every_ns: Option<u64>,
    /// The label the targets were chosen by (`unit` or `cgroup`), if any.
    pub origin: Option<(String, String)>,
    /// `--trace-stalls` (0: no escalation).
    pub trace_stalls: u32,
    /// `--max-overhead`, %.
    pub max_overhead: f64,
}

impl WorkerArgs {
    pub fn of(a: &WatchArgs) -> Self {
        WorkerArgs {
            thread: a.dispatch.thread.clone(),
            threshold_ns: a.dispatch.threshold.as_nanos() as u64,
            hang_ns: a.dispatch.hang.as_nanos() as u64,
            frame_interval_ns: a.dispatch.frame_interval.as_nanos() as u64,
            full_tree: a.dispatch.full_tree,
            dispatch_hz: a.dispatch.dispatch_hz,
            wakers: !a.dispatch.no_wakers,
            ring_size: a.ring_size,
            unwind: a.unwind,
            unwind_memory: a.unwind_memory,
            keep_ns: a.keep.as_nanos() as u64,
            early_every: (a.dispatch.dispatch_hz / a.flight_hz.max(1)).max(1) as u32,
            full_after_ns: a
                .full_rate_after
                .unwrap_or(a.dispatch.threshold / 4)
                .as_nanos() as u64,
            profile_every_ns: a.profile_every.map(|d| d.as_nanos() as u64),
            origin: None,
            trace_stalls: a.trace_stalls,
            max_overhead: a.max_overhead,
        }
    }
}

/// Watches process `pid` until it exits (or the watch is stopped), telling
/// `tx` everything; the last message is always [`Msg::Stopped`].
pub fn run(pid: u32, args: WorkerArgs, tx: Sender<Msg>, snapshot: Arc<AtomicBool>) {
    let reason = match watch(pid, &args, &tx, &snapshot) {
        Ok(r) => r,
        Err(e) => match process::thread_alive(pid, pid) {
            false => "it exited".to_string(),
            true => crate::error::chain(&e),
        },
    };
    let _ = tx.send(Msg::Stopped { pid, reason });
}

fn watch(
    pid: u32,
    args: &WorkerArgs,
    tx: &Sender<Msg>,
    snapshot: &Arc<AtomicBool>,
) -> Result<String> {
    let target = process::Target::open(pid)?;
    let (tid, thread_name) = target.resolve_thread(
        args.thread.as_deref(),
        &crate::symbolize::hotspot::thread_names,
    )?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string();
    let exe = target.exe.display().to_string();
    let tracking = Tracking {
        mode: profiler_common::track::ONE,
        offsets: task_btf::task_offsets().ok(),
    };
    let unwind = match args.unwind {
        UnwindMode::Copy => UnwindMode::Tables,
        u => u,
    };
    let rows = crate::unwind::budget::rows(args.unwind_memory, false, Some(pid));
    let mut probes = Probes::load(
        pid,
        probes::Watch {
            tid,
            wakers: args.wakers,
            wait_loop: true,
            early: (args.early_every, args.full_after_ns),
        },
        RingSpec {
            mode: RingMode::PerCpu,
            size: args.ring_size,
        },
        probes::Samplers {
            all: false,
            cpu: false,
            off_cpu: false,
        },
        (unwind, rows),
        tracking,
    )?;
    probes.attach_process_events(tracking)?;
    let tables = match unwind {
        UnwindMode::Tables => {
            let mut t = Tables::take(probes.ebpf_mut(), rows)?;
            t.add_process(pid);
            Some(t)
        }
        _ => None,
    };
    probes.prepare_watch(args.dispatch_hz)?;
    let session_start_ns = crate::clock::monotonic_ns();
    let mut rings = Rings::new(probes.take_rings())?;
    let counters = probes.take_counters()?;
    probes.attach_watch(args.dispatch_hz)?;
    if !target.alive() {
        return Err(Error::TargetGone(pid));
    }
    let mut d = Dispatcher::new(
        dispatch::Config {
            tid,
            thread_name: thread_name.clone(),
            rule: select::FALLBACK_RULE.to_string(),
            threshold_ns: args.threshold_ns,
            hang_ns: args.hang_ns,
            frame_interval_ns: args.frame_interval_ns,
            full_tree: args.full_tree,
            sample_period_ns: 1_000_000_000u64.checked_div(args.dispatch_hz).unwrap_or(0),
            wakers: args.wakers,
            wait_loop: true,
            preset: false,
        },
        pid,
        Vec::new(),
        Vec::new(),
        session_start_ns,
    );
    d.live();
    d.stream();
    // Its mappings kept now: a stall that ends as the process exits is
    // named from them, without waiting on a process that is gone.
    d.remember_maps();
    d.set_early_rate(args.early_every, args.full_after_ns);
    d.keys_from_samples();
    let mut sinks = Sinks::new(pid, Stacks::new(0), Some(d), None);
    sinks.tables = tables;
    sinks.flight = Some(FlightRecorder::new(args.keep_ns, FLIGHT_MAX));
    let unix_minus_mono_ns = crate::clock::unix_of_monotonic(0);
    let period_ns = 1_000_000_000u64.checked_div(args.dispatch_hz).unwrap_or(0);
    sinks.windows = args
        .profile_every_ns
        .map(|every| Windows::new(every, period_ns, session_start_ns, unix_minus_mono_ns));
    sinks.kept_notices = Some(Vec::new());
    sinks.loop_sp = Some(probes.loop_sp()?);
    if let (Some((nr, wargs, sp)), Some(d)) = (process::thread_wait(pid, tid), &mut sinks.dispatch)
    {
        d.loop_wait.at_attach(nr as u32, wargs[0], sp);
        if let (Some(l), Some(map)) = (d.loop_wait.take_untold(), &mut sinks.loop_sp) {
            map.set(l.sp, l.key);
        }
    }
    sinks.catch_up = probes.take_catch_up();
    sinks.exe = std::fs::canonicalize(&target.exe)
        .ok()
        .or_else(|| Some(target.exe.clone()));
    let thread = match tid == pid {
        true => "its main thread".to_string(),
        false => format!("thread {tid} ({thread_name})"),
    };
    let uprobes = match args.trace_stalls {
        0 => "no uprobes".to_string(),
        n => format!(
            "no uprobes until a new group of stalls, then on its functions for its next {n} stalls (--trace-stalls)"
        ),
    };
    let attached = format!(
        "profiler: watching PID {pid} ({comm}, {exe}), {thread}: its loop's waits, the scheduler, and samples of each iteration at {} Hz, {} Hz once it has run {}; {uprobes}",
        args.dispatch_hz / u64::from(args.early_every),
        args.dispatch_hz,
        crate::text::fmt_ns(args.full_after_ns)
    );
    let _ = tx.send(Msg::Watching {
        pid,
        comm: std::fs::read(format!("/proc/{pid}/comm"))
            .map(|mut c| {
                if c.last() == Some(&b'\n') {
                    c.pop();
                }
                c
            })
            .unwrap_or_default(),
        exe: target.exe.as_os_str().as_encoded_bytes().to_vec(),
    });
    let origin = args
        .origin
        .clone()
        .or_else(|| crate::tracee::cgroup::of_process(pid).map(|c| ("cgroup".to_string(), c)));
    let mut labels = vec![
        ("pid".to_string(), pid.to_string()),
        ("comm".to_string(), comm.clone()),
        ("exe".to_string(), exe.clone()),
    ];
    labels.extend(origin);
    labels.push(("thread".to_string(), thread_name.clone()));
    let mut steer = WatchSteer {
        tx: tx.clone(),
        snapshot: snapshot.clone(),
        counters: &counters,
        ctx: Ctx {
            pid,
            tid,
            comm,
            exe,
            session_start_ns,
            keep_ns: args.keep_ns,
        },
        profiles: ProfileCtx {
            labels,
            unix_minus_mono_ns,
            hold_ns: args.profile_every_ns.unwrap_or(0).max(args.hang_ns),
            threshold_ns: args.threshold_ns,
            hang_ns: args.hang_ns,
        },
        last_tick: Instant::now(),
        last_loss: Instant::now(),
        last_busy: Instant::now(),
        lost: 0,
        suspended_ns: crate::clock::suspended_ns(),
        uncertain: Vec::new(),
        told_stopped: false,
        esc: Escalator::new(
            pid,
            (args.trace_stalls, args.max_overhead),
            probes.wait_tracepoints(),
            tx.clone(),
        ),
        probes: Some(probes),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let mut status = Status::off();
    let collected = rt.block_on(collector::collect(
        &mut rings,
        &mut sinks,
        &target.pidfd,
        None,
        collector::Live {
            counters: &counters,
            status: &mut status,
            attached: &attached,
            tick: TICK,
        },
        &mut steer,
    ));
    // What the last drain ended goes out before the probes are detached,
    // which can take a second on a loaded machine: explained now, its
    // names waited for.
    sinks.finish_dispatches();
    steer.forward(&mut sinks);
    sinks.stop_at(crate::clock::monotonic_ns());
    sinks.catch_up = None;
    drop(steer.probes.take());
    sinks.flush(&mut rings);
    sinks.finish_dispatches();
    steer.forward(&mut sinks);
    // The partial window: nothing is lost at an exit or a SIGTERM.
    steer.end_windows(&mut sinks);
    let why = match &collected {
        Ok(StopReason::TargetExited) => "it exited",
        Ok(StopReason::Signal(_)) => "the watch was stopped",
        _ => "its watch stopped",
    };
    steer.esc.end(why);
    Ok(match collected {
        Ok(StopReason::TargetExited) => "it exited".into(),
        Ok(StopReason::TargetExeced) => "it exec'd another program".into(),
        Ok(StopReason::Signal(_)) => "the watch was stopped".into(),
        Ok(r) => r.as_str().to_string(),
        Err(_) if !target.alive() => "it exited".into(),
        Err(e) => crate::error::chain(&e),
    })
}

/// What every message of this process carries.
#[derive(Debug, Clone)]
struct Ctx {
    pid: u32,
    tid: u32,
    comm: String,
    exe: String,
    session_start_ns: u64,
    keep_ns: u64,
}

/// What `--profile-every`'s windows need.
#[derive(Debug, Clone)]
struct ProfileCtx {
    /// `pid`, `comm`, `exe`, `unit` or `cgroup`, `thread`.
    labels: Vec<(String, String)>,
    unix_minus_mono_ns: u64,
    /// A window waiting for a long iteration is written this long past
    /// its end anyway.
    hold_ns: u64,
    threshold_ns: u64,
    hang_ns: u64,
}

/// The tick's work for `watch`: forwards what the dispatcher explained,
/// and marks what was not the program's own time.
struct WatchSteer<'a> {
    tx: Sender<Msg>,
    snapshot: Arc<AtomicBool>,
    counters: &'a CounterMap,
    ctx: Ctx,
    profiles: ProfileCtx,
    last_tick: Instant,
    last_loss: Instant,
    last_busy: Instant,
    lost: u64,
    suspended_ns: u64,
    /// Windows (CLOCK_MONOTONIC) in which events were lost or the agent
    /// was behind, and why; the oldest dropped past a minute.
    uncertain: Vec<(u64, u64, String)>,
    told_stopped: bool,
    /// `--trace-stalls`: groups' functions probed for a few stalls.
    esc: Escalator,
    /// The process's probes (None once detached at the end).
    probes: Option<Probes>,
}

impl Steer for WatchSteer<'_> {
    fn on_tick(&mut self, sinks: &mut Sinks) -> Result<()> {
        let now = Instant::now();
        let now_ns = crate::clock::monotonic_ns();
        let gap = now - self.last_tick;
        self.last_tick = now;
        if gap > BEHIND {
            let from = now_ns.saturating_sub(gap.as_nanos() as u64);
            self.uncertain.push((
                from,
                now_ns,
                format!(
                    "the agent was behind for {}",
                    crate::text::fmt_ns(gap.as_nanos() as u64)
                ),
            ));
        }
        if now - self.last_loss >= LOSS_EVERY {
            self.last_loss = now;
            let c = self.counters.read();
            let lost = c.lost + c.lost_sched;
            if now - self.last_busy >= BUSY_EVERY {
                self.last_busy = now;
                let busy = sinks.dispatch.as_ref().and_then(|d| busy_share(d, now_ns));
                let _ = self.tx.send(Msg::Loop {
                    pid: self.ctx.pid,
                    busy,
                    lost,
                });
            }
            if lost > self.lost {
                self.uncertain.push((
                    now_ns.saturating_sub(LOSS_EVERY.as_nanos() as u64 * 2),
                    now_ns,
                    format!("{} events lost (a ring was full)", lost - self.lost),
                ));
                self.lost = lost;
            }
            self.uncertain
                .retain(|(_, to, _)| *to + 60_000_000_000 > now_ns);
        }
        if let Some(d) = &mut sinks.dispatch {
            self.not_the_programs(d);
        }
        if self.snapshot.swap(false, Ordering::Relaxed) {
            self.snapshot(sinks, now_ns);
        }
        self.forward(sinks);
        if let Some(p) = &mut self.probes {
            self.esc.on_tick(p, sinks);
        }
        Ok(())
    }
}

impl WatchSteer<'_> {
    /// A stopped or traced process, or a suspended system, holds the open
    /// iteration: it is not the program's stall.
    fn not_the_programs(&mut self, d: &mut Dispatcher) {
        let suspended = crate::clock::suspended_ns();
        let slept = suspended.saturating_sub(self.suspended_ns);
        self.suspended_ns = suspended;
        if slept >= SUSPEND_MIN_NS && d.not_the_programs("the system was suspended") {
            eprintln!(
                "profiler: the system was suspended for {}: PID {}'s iteration open then is not counted as a stall",
                crate::text::fmt_ns(slept),
                self.ctx.pid
            );
        }
        if !d.is_open() {
            self.told_stopped = false;
            return;
        }
        if let Some(state @ ('T' | 't')) = thread_state(self.ctx.pid, self.ctx.tid) {
            let (why, what) = match state {
                'T' => ("the process was stopped (SIGSTOP)", "SIGSTOP"),
                _ => (
                    "the process was stopped by a debugger (ptrace)",
                    "traced by a debugger",
                ),
            };
            d.not_the_programs(why);
            if !self.told_stopped {
                self.told_stopped = true;
                eprintln!(
                    "profiler: PID {} is stopped ({what}): the iteration it stopped in is not counted as a stall, nor told as a hang",
                    self.ctx.pid
                );
            }
        }
    }

    /// Everything the dispatcher told since the last call, to the journal;
    /// then each stall's group escalated, or its traced stalls counted.
    fn forward(&mut self, sinks: &mut Sinks) {
        let stalls = self.forward_told(sinks);
        let Some(p) = &mut self.probes else { return };
        for (gid, key, span, traced) in stalls {
            self.esc
                .on_stall(p, sinks, &gid, &key, span, traced, &self.ctx.exe);
        }
    }

    /// [`WatchSteer::forward`]'s telling: returns each stall's group id,
    /// key, span (CLOCK_MONOTONIC), and whether it was traced (its group's
    /// probes on all along, within the budget), whether its tree has
    /// traced frames, and its time in probes in % of its on-CPU time.
    #[expect(clippy::type_complexity, reason = "one stall's facts, once")]
    fn forward_told(
        &mut self,
        sinks: &mut Sinks,
    ) -> Vec<(String, String, (u64, u64), (bool, bool, f64))> {
        let mut told = Vec::new();
        let notices = sinks
            .kept_notices
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let Some(d) = &mut sinks.dispatch else {
            return told;
        };
        for n in notices {
            let msg = match n {
                Notice::Hang {
                    index,
                    running_ns,
                    stack,
                    ..
                } => Msg::Hang {
                    line: Box::new(self.hang_line(index, running_ns, &stack)),
                },
                Notice::Excluded { reason, .. } => Msg::Excluded { reason },
                Notice::Note(line) => {
                    eprintln!("{line}");
                    continue;
                }
                Notice::Slow { .. } => continue,
            };
            let _ = self.tx.send(msg);
        }
        let mut stalls = Vec::new();
        for s in d.take_streamed() {
            stalls.push(s.slow.index);
            let gid = super::journal::group_id(&s.slow.key);
            let start_ns = self.ctx.session_start_ns + s.slow.start_ns;
            let end_ns = start_ns + s.slow.duration_ns + s.slow.probe_ns;
            // (Its root, the iteration, is a traced node in every tree.)
            let has_traced = s
                .slow
                .tree
                .iter()
                .any(|n| n.depth > 0 && n.kind == Kind::Traced);
            // Its time in the probes, as its samples (in uprobe handling)
            // or their calibrated cost say, whichever is more, in % of
            // its time on the CPU.
            let probe_pct = 100.0 * s.slow.probe_ns as f64
                / (s.slow.split.on_cpu_ns + s.slow.probe_ns).max(1) as f64;
            let traced = self
                .esc
                .is_traced(&gid, (start_ns, end_ns), has_traced, probe_pct);
            let note = self
                .esc
                .stall_note(&gid, (start_ns, end_ns), traced, probe_pct);
            told.push((
                gid,
                s.slow.key.clone(),
                (start_ns, end_ns),
                (traced, has_traced, probe_pct),
            ));
            let mut report = self.report(d, sinks.flight.as_ref(), s);
            if traced {
                report.line.tree = "traced".into();
            }
            report.line.escalation = note;
            let _ = self.tx.send(Msg::Stall(Box::new(StallMsg { report })));
        }
        let Some(w) = &mut sinks.windows else {
            return told;
        };
        // Slow iterations still being explained are stalls already.
        w.decide(
            stalls.into_iter().chain(d.slow_waiting()),
            d.decided_below(),
        );
        let now = crate::clock::monotonic_ns();
        // Held past `hold_ns`, the open iteration has run past it: over
        // the threshold, it will be a stall.
        let open_stalled = d
            .open_running_ns(now)
            .is_some_and(|r| r >= self.profiles.threshold_ns);
        for win in w.ready(now, WINDOW_GRACE_NS, self.profiles.hold_ns, open_stalled) {
            self.send_window(d, &win, w.period_ns());
        }
        told
    }

    /// The watch ends: every window left written, the last one partial;
    /// the iteration still open counts as a stall if it was told as a
    /// hang (a line of `stalls.jsonl`), not otherwise (it is not a line).
    fn end_windows(&mut self, sinks: &mut Sinks) {
        let (Some(d), Some(w)) = (&mut sinks.dispatch, &mut sinks.windows) else {
            return;
        };
        w.decide(d.slow_waiting().collect::<Vec<_>>(), d.decided_below());
        let now = crate::clock::monotonic_ns();
        let open_stalled = d
            .open_running_ns(now)
            .is_some_and(|r| r >= self.profiles.hang_ns);
        let period_ns = w.period_ns();
        for win in w.drain(now, open_stalled) {
            self.send_window(d, &win, period_ns);
        }
    }

    fn send_window(
        &self,
        d: &mut Dispatcher,
        win: &crate::analyze::windows::Window,
        period_ns: u64,
    ) {
        if win.decided.is_empty() {
            return;
        }
        let p = &self.profiles;
        let gz = super::profiles::window_pprof(d, win, &p.labels, period_ns, p.unix_minus_mono_ns);
        let _ = self.tx.send(Msg::Profile {
            pid: self.ctx.pid,
            unix_ns: win.start_ns + p.unix_minus_mono_ns,
            gz,
        });
    }

    fn hang_line(&self, index: u64, running_ns: u64, stack: &[String]) -> StallLine {
        let now = crate::clock::monotonic_ns();
        let start_ns = now.saturating_sub(running_ns);
        let key = stack
            .first()
            .cloned()
            .unwrap_or_else(|| "(loop iteration)".into());
        StallLine {
            pid: self.ctx.pid,
            tid: self.ctx.tid,
            comm: self.ctx.comm.clone(),
            exe: self.ctx.exe.clone(),
            index,
            start_ns,
            time: crate::clock::rfc3339(crate::clock::unix_of_monotonic(start_ns)),
            duration_ns: running_ns,
            on_cpu_ns: 0,
            blocked_ns: 0,
            runnable_ns: 0,
            key: key.clone(),
            group: String::new(),
            verdict: format!(
                "still running after {}: {}",
                crate::text::fmt_ns(running_ns),
                dispatch::hang_stack_text(stack)
            ),
            waker: None,
            source: None,
            tree: "sampled".into(),
            escalation: None,
            probe_ns: 0,
            samples: 0,
            hang: true,
            uncertain: None,
            rate_limited: false,
            report: None,
            call_tree: None,
        }
    }

    /// A stall's line and full report, with the flight recorder's samples
    /// of the `keep` before it.
    fn report(
        &mut self,
        d: &mut Dispatcher,
        flight: Option<&FlightRecorder>,
        s: Streamed,
    ) -> StallReport {
        let Streamed { slow, folded } = s;
        let start_ns = self.ctx.session_start_ns + slow.start_ns;
        let end_ns = start_ns + slow.duration_ns + slow.probe_ns;
        let uncertain: Vec<&str> = self
            .uncertain
            .iter()
            .filter(|(from, to, _)| *from < end_ns && *to > start_ns)
            .map(|(_, _, why)| why.as_str())
            .collect();
        let mut uncertain = match uncertain.is_empty() {
            true => None,
            false => Some(uncertain.join("; ")),
        };
        if slow.truncated {
            let why = "its records overflowed the agent's buffer: the tree is cut".to_string();
            uncertain = Some(uncertain.map_or(why.clone(), |u| format!("{u}; {why}")));
        }
        let before = flight.map_or_else(Vec::new, |f| {
            fold(d, f, start_ns.saturating_sub(f.keep_ns()), start_ns)
        });
        let waker = slow
            .wakers
            .first()
            .map(|w| format!("{} in {}", w.who(), w.function));
        let mut wakers = Vec::new();
        for w in &slow.wakers {
            wakers.push(format!(
                "woken by {} in {}: blocked {}",
                w.who(),
                w.function,
                crate::text::fmt_ns(w.blocked_ns)
            ));
        }
        let line = StallLine {
            pid: self.ctx.pid,
            tid: self.ctx.tid,
            comm: self.ctx.comm.clone(),
            exe: self.ctx.exe.clone(),
            index: slow.index,
            start_ns,
            time: crate::clock::rfc3339(crate::clock::unix_of_monotonic(start_ns)),
            duration_ns: slow.duration_ns,
            on_cpu_ns: slow.split.on_cpu_ns,
            blocked_ns: slow.split.blocked_ns,
            runnable_ns: slow.split.runnable_ns,
            key: slow.key.clone(),
            group: String::new(),
            verdict: slow.verdict.clone(),
            waker,
            source: slow.source.as_ref().map(dispatch::wakers::source_text),
            tree: "sampled".into(),
            escalation: None,
            probe_ns: slow.probe_ns,
            samples: slow.samples,
            hang: false,
            uncertain,
            rate_limited: false,
            report: None,
            call_tree: nest(&slow.tree, slow.duration_ns, MAX_LINE_NODES),
        };
        StallReport {
            line,
            folded,
            before,
            keep_ns: self.ctx.keep_ns,
            blocking_stacks: slow.blocking_stacks.clone(),
            wakers,
        }
    }

    /// SIGUSR1: the flight recorder's last `keep`, as a report of its own.
    fn snapshot(&mut self, sinks: &mut Sinks, now_ns: u64) {
        let (Some(d), Some(f)) = (&mut sinks.dispatch, &sinks.flight) else {
            return;
        };
        let from = now_ns.saturating_sub(f.keep_ns());
        let samples = f.between(from, u64::MAX).count();
        let folded = fold(d, f, from, u64::MAX);
        let _ = self.tx.send(Msg::Snapshot {
            pid: self.ctx.pid,
            comm: self.ctx.comm.clone(),
            samples,
            keep_ns: self.ctx.keep_ns,
            folded,
        });
    }
}

/// The flight recorder's samples in `[from_ns, to_ns)`, named, as folded
/// lines (`outermost;…;innermost count`), sorted.
fn fold(d: &mut Dispatcher, f: &FlightRecorder, from_ns: u64, to_ns: u64) -> Vec<String> {
    let mut counts: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let stacks: Vec<Box<[u64]>> = f.between(from_ns, to_ns).map(|(_, u)| u.clone()).collect();
    for user in &stacks {
        let mut names = d.name_user_stack(user);
        names.reverse();
        *counts.entry(names.join(";").replace(' ', "_")).or_default() += 1;
    }
    let mut lines: Vec<String> = counts
        .into_iter()
        .map(|(l, n)| format!("{l} {n}"))
        .collect();
    lines.sort_unstable();
    lines
}

/// The state letter of thread `tid` (`R`, `S`, `D`, `T` stopped, `t`
/// traced, ...), from `/proc/PID/task/TID/stat`.
fn thread_state(pid: u32, tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_runs() {
        let me = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(thread_state(me, tid), Some('R'));
        assert_eq!(thread_state(me, u32::MAX), None);
    }
}
