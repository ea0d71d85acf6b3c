//! `Sinks`, everything the events are fed to: each record decoded from
//! the rings (or replayed from `profile.data`) and routed to the shadow
//! stacks, the dispatcher, the timeline, the stage trackers, the startup
//! watch, the per-process sections and `profile.data`; threads and
//! processes that ended folded away. The loop that feeds them is
//! [`crate::session::collector`].

use profiler_common::{
    decode, read, CommEvent, Event, GoEvent, ProcEvent, RecordKind, StackEvent, WakerEvent,
    KIND_ENTRY, MAX_KERNEL_FRAMES, MAX_USER_FRAMES, SCHED_BLOCKED, WAKER_KERNEL_THREAD,
};

use crate::{
    analyze::dedup::LinkDedup,
    analyze::dispatch::{wakers::WakeRec, Dispatcher},
    analyze::goroutines::Goroutines,
    analyze::processes::{ProcChange, Processes},
    analyze::stacks::Stacks,
    analyze::stages::StageTracker,
    analyze::startup::StartupWatch,
    analyze::tail_calls::TailCalls,
    clock::monotonic_ns,
    output::timeline::Timeline,
    session::datafile::{DataWriter, Entry},
    session::notices,
    session::probed::{DetachRecord, ProbedRecord},
    session::ring_reader::Rings,
    tracee::process::{thread_alive, thread_name},
};

/// Most children of the target given unwind tables (a cross-process wait
/// is often on a child). Other processes' wake-up stacks are walked with
/// frame pointers: building tables for whatever process an interrupt
/// happened to land in would stall the agent.
const MAX_CHILD_TABLES: usize = 16;

/// A [`WakerEvent`] as the dispatcher keeps it.
fn waker_rec(w: &WakerEvent) -> WakeRec {
    let comm = w.comm.split(|&b| b == 0).next().unwrap_or(&[]);
    WakeRec {
        ts_ns: w.event.ts_ns,
        tid: w.waker_tid,
        pid: w.waker_pid,
        comm: String::from_utf8_lossy(comm).into_owned(),
        kernel_thread: w.flags & WAKER_KERNEL_THREAD != 0,
        loop_wake: w.flags & profiler_common::WAKER_LOOP != 0,
        user: w.user[..(w.user_len as usize).min(MAX_USER_FRAMES)].into(),
        kernel: w.kernel[..(w.kernel_len as usize).min(MAX_KERNEL_FRAMES)].into(),
    }
}

/// Everything events are fed to.
pub struct Sinks {
    /// Target PID.
    pub pid: u32,
    /// Shadow stacks of every thread.
    pub stacks: Stacks,
    /// Dispatch tracking of the watched thread.
    pub dispatch: Option<Dispatcher>,
    /// The `trace.json` timeline.
    pub timeline: Option<Timeline>,
    /// The CPU profile (`--sample`) and its symbolizer, whose snapshot of
    /// the target's mappings is refreshed every second.
    pub cpu: Option<(
        crate::attach::samplers::CpuMaps,
        crate::symbolize::Symbolizer,
    )>,
    /// One tracker per scenario.
    pub stages: Vec<StageTracker>,
    /// Stop once every scenario has its runs.
    pub stop_when_runs_done: bool,
    /// Launch mode: exec-to-ready timing, and the startup window's stacks
    /// (fed until ready).
    pub startup: Option<(StartupWatch, Stacks)>,
    /// Startup is ready at the first dispatch (no `--ready`, and dispatch
    /// functions are known).
    pub ready_on_first_dispatch: bool,
    /// `profile.data`, journaling what the pipeline sees.
    pub data: Option<DataWriter>,
    /// The target's executable as attached; checked once a second so an
    /// exec is noticed.
    pub exe: Option<std::path::PathBuf>,
    /// Where hangs are logged as they are noticed (`hangs.log`).
    pub hang_log: Option<std::path::PathBuf>,
    pub(super) execd: bool,
    pub(super) all_gone: bool,
    /// Per-CPU rings: every record up to this time has been handed out
    /// (None: live time).
    horizon: Option<u64>,
    pub(super) ticks: u32,
    /// When the ticks began, and the once-a-second passes made since:
    /// timed by the clock, not by counting ticks, which a busy loop
    /// spaces out.
    began: Option<std::time::Instant>,
    /// The second since `began` at which the next pass is due.
    next_second: u64,
    /// Passes made.
    passes: u32,
    /// This tick made a once-a-second pass.
    pub(super) second: bool,
    goroutines: Goroutines,
    /// The kernel's unwind tables (`--unwind tables`), refreshed once a
    /// second (dlopen, and the exec of a launched command).
    pub tables: Option<crate::unwind::tables::Tables>,
    /// A sample landed in a binary the unwind-table budget left without a
    /// table since the last tick (see `Tables::rebalance`).
    hot_stacks: bool,
    /// The target's executable mappings when its interpreters were last
    /// looked for (`Tables::add_interpreters`, the first seconds).
    interp_seen: Option<String>,
    /// `--lib`s not mapped when the probes went on, checked every 0.1 s
    /// until they are.
    pub libs: crate::tracee::libwatch::LibWatch,
    /// One section per traced process (`--follow`, several targets).
    pub processes: Option<Processes>,
    /// Processes that exec'd since the session last looked (live only:
    /// the agent probes their new programs).
    pub execs: Vec<u32>,
    /// Functions probed after an exec, beyond the first selection, and
    /// the binaries they are in.
    pub added: ProbedRecord,
    /// Function events per function index, for the overhead governor
    /// (empty when it is off).
    pub hits: Vec<u64>,
    /// Drops the second copy of a hit seen by two link generations (set
    /// when the governor may rebuild links).
    pub dedup: Option<LinkDedup>,
    /// Tells the kernel which wait is the watched thread's loop's, as the
    /// dispatcher learns it (live, event-loop iterations only).
    pub loop_sp: Option<crate::attach::probes::LoopSp>,
    /// The `sys_exit` program reporting a wait in flight at attach: dropped
    /// (detached) at the watched thread's first wait event.
    pub catch_up: Option<crate::attach::probes::CatchUp>,
    /// Detaches done, to apply once every event before them is read.
    pending_detach: Vec<DetachRecord>,
    /// Tail calls kept open until their callee returns; every function
    /// event passes it first.
    pub tails: TailCalls,
    /// `watch`'s flight recorder: every sample of the watched thread.
    pub flight: Option<crate::analyze::flight::FlightRecorder>,
    /// `watch --profile-every`'s windows: every sample of the watched
    /// thread, with its iteration.
    pub windows: Option<crate::analyze::windows::Windows>,
    /// The dispatcher's notices are kept here for the session to tell
    /// (`watch`), not printed (None: printed as they come).
    pub kept_notices: Option<Vec<crate::analyze::dispatch::Notice>>,
    /// The events it passes on (reused).
    call_buf: Vec<Event>,
}

impl Sinks {
    /// Applies one function entry or exit, through the tail-call rewriter.
    #[inline]
    fn on_call(&mut self, ev: &Event) {
        if self.tails.passes(ev) {
            self.apply_call(ev);
            return;
        }
        let mut buf = std::mem::take(&mut self.call_buf);
        self.tails.feed(ev, &mut buf);
        self.apply_calls(&mut buf);
    }

    /// Applies the events in `buf`, and keeps it for reuse.
    fn apply_calls(&mut self, buf: &mut Vec<Event>) {
        for e in buf.iter() {
            self.apply_call(e);
        }
        buf.clear();
        self.call_buf = std::mem::take(buf);
    }

    /// Passes on the tail-call exits still held (the end of the session).
    pub fn flush_tail_calls(&mut self) {
        let mut buf = std::mem::take(&mut self.call_buf);
        self.tails.flush(&mut buf);
        self.apply_calls(&mut buf);
        self.stacks.tail_calls_followed = self.tails.followed;
    }

    /// Applies one function entry or exit, as written.
    #[inline]
    fn apply_call(&mut self, ev: &Event) {
        if let Some(p) = &mut self.processes {
            p.on_event(ev);
        }
        if let Some(h) = self.hits.get_mut(ev.func() as usize) {
            *h += 1;
        }
        if self.stacks.is_entry_only(ev.func()) {
            // No exit probe: counted, and seen by nothing that needs the
            // call's end.
            self.stacks.on_event(ev);
            return;
        }
        if let (Some(done), Some(tl)) = (self.stacks.on_event(ev), &mut self.timeline) {
            match self.processes.as_ref().and_then(|p| p.pid_of(ev.tid)) {
                Some(pid) => tl.call_in(pid, ev.tid, &done),
                None => tl.call(ev.tid, &done),
            }
        }
        if let Some(d) = &mut self.dispatch {
            if ev.tid == d.cfg.tid {
                d.on_call(ev);
                evicted_to_timeline(d, &mut self.timeline);
            }
        }
        for st in &mut self.stages {
            if ev.kind() == KIND_ENTRY {
                st.on_entry(ev.tid, ev.func(), ev.ts_ns);
            } else {
                st.on_exit(ev.tid, ev.func(), ev.ts_ns);
            }
        }
        if let Some((watch, window)) = &mut self.startup {
            if !watch.is_ready() {
                if ev.kind() == KIND_ENTRY {
                    watch.on_entry(ev.func(), ev.ts_ns);
                }
                if self.ready_on_first_dispatch {
                    if let Some(first) = self.dispatch.as_ref().and_then(|d| d.first_start_ns) {
                        watch.mark_ready(first);
                    }
                }
                if !watch.is_ready() {
                    window.on_event(ev);
                }
            }
        }
    }

    /// Applies one ring-buffer record.
    #[inline]
    fn on_record(&mut self, rec: &[u8]) {
        let Some((kind, ev)) = decode(rec) else {
            // A header of an unknown kind is counted; a shorter record has none.
            self.stacks.invalid_events += u64::from(rec.len() >= size_of::<Event>());
            return;
        };
        if let (
            Some(d),
            RecordKind::Entry | RecordKind::Exit | RecordKind::GoEntry | RecordKind::GoExit,
        ) = (&mut self.dedup, kind)
        {
            if d.is_copy(&ev) {
                return;
            }
        }
        match kind {
            RecordKind::GoEntry | RecordKind::GoExit => {
                let Some(g) = read::<GoEvent>(rec) else {
                    self.stacks.invalid_events += 1;
                    return;
                };
                let (ev, new) = self.goroutines.event(&g);
                if let Some(ev) = ev {
                    self.on_call(&ev);
                    if new {
                        self.stacks.set_name(ev.tid, "goroutine".into());
                    }
                }
            }
            RecordKind::Entry | RecordKind::Exit => self.on_call(&ev),
            RecordKind::Comm => match read::<CommEvent>(rec) {
                Some(c) => {
                    self.stacks.on_comm(&c);
                    if let Some(p) = &mut self.processes {
                        p.on_comm(&c);
                    }
                }
                None => self.stacks.invalid_events += 1,
            },
            RecordKind::Proc => match (read::<ProcEvent>(rec), &mut self.processes) {
                (Some(p), Some(procs)) => {
                    if let ProcChange::Execd(pid) = procs.on_proc(&p) {
                        self.execs.push(pid);
                    }
                }
                (Some(_), None) => {}
                (None, _) => self.stacks.invalid_events += 1,
            },
            RecordKind::Probed => match (DetachRecord::decode(rec), ProbedRecord::decode(rec)) {
                (Some(d), _) => self.detached(&d),
                (None, Some(added)) => self.add_functions(added),
                (None, None) => self.stacks.invalid_events += 1,
            },
            RecordKind::SchedOut | RecordKind::Sample => {
                let Some(d) = &mut self.dispatch else { return };
                let stacks = read::<StackEvent>(rec);
                let user = stacks
                    .as_ref()
                    .map(|s| &s.user[..(s.user_len as usize).min(MAX_USER_FRAMES)]);
                let kernel = stacks
                    .as_ref()
                    .map(|s| &s.kernel[..(s.kernel_len as usize).min(MAX_KERNEL_FRAMES)]);
                if kind == RecordKind::Sample {
                    if let Some(user) = user {
                        if d.is_open() {
                            if let Some(tl) = &mut self.timeline {
                                tl.sample(ev.tid, ev.ts_ns, user.len());
                            }
                        }
                        if let Some(f) = &mut self.flight {
                            f.record(ev.ts_ns, user);
                        }
                        if let Some(w) = &mut self.windows {
                            w.sample(ev.ts_ns, user, d.sampled_iteration(ev.ts_ns));
                        }
                        let end = stacks.as_ref().map_or(0, StackEvent::user_end);
                        d.on_sample(ev.ts_ns, user, kernel.unwrap_or_default(), end);
                        if let Some(t) = &mut self.tables {
                            // Its binaries get tables first.
                            self.hot_stacks |= t.note_samples(self.pid, user);
                        }
                    }
                } else {
                    d.on_switch_out(ev.ts_ns, ev.func() == SCHED_BLOCKED, user.zip(kernel));
                }
            }
            RecordKind::SchedIn => {
                if let Some(d) = &mut self.dispatch {
                    d.on_switch_in(ev.ts_ns);
                }
            }
            RecordKind::Wakeup => {
                if let Some(d) = &mut self.dispatch {
                    d.on_wakeup(ev.ts_ns);
                }
            }
            RecordKind::Waker => {
                let Some(d) = &mut self.dispatch else { return };
                let Some(w) = read::<WakerEvent>(rec) else {
                    self.stacks.invalid_events += 1;
                    return;
                };
                d.on_waker(waker_rec(&w));
            }
            RecordKind::PeerSample => {
                let Some(d) = &mut self.dispatch else { return };
                match read::<StackEvent>(rec) {
                    Some(s) => {
                        let user = &s.user[..(s.user_len as usize).min(MAX_USER_FRAMES)];
                        d.on_peer_sample(ev.ts_ns, ev.tid, user);
                    }
                    None => self.stacks.invalid_events += 1,
                }
            }
            RecordKind::Wait => {
                let Some(d) = &mut self.dispatch else { return };
                if ev.tid != d.cfg.tid {
                    return;
                }
                // The trampolines see every wait from here.
                self.catch_up = None;
                d.on_wait(&ev);
                evicted_to_timeline(d, &mut self.timeline);
            }
            // Only `sample` makes these.
            RecordKind::Dwarf | RecordKind::NewProcess => self.stacks.invalid_events += 1,
        }
    }

    /// Applies a record the agent made (functions probed after an exec),
    /// journaling it for replay.
    pub fn inject(&mut self, rec: &[u8]) {
        if let Some(w) = &mut self.data {
            w.record(rec);
        }
        self.on_record(rec);
    }

    /// The session stopped at `ts_ns` (CLOCK_MONOTONIC): no dispatch begins
    /// after it ([`Dispatcher::stop_at`]).
    pub fn stop_at(&mut self, ts_ns: u64) {
        if let Some(d) = &mut self.dispatch {
            d.stop_at(ts_ns);
        }
    }

    /// The governor chose to detach `func` at `decided_ns`: its returns
    /// from then on without an entry are not orphans, and its frames
    /// proven gone are closed by the detach.
    pub fn detach_from(&mut self, func: u32, decided_ns: u64) {
        self.stacks.detach_from(func, decided_ns);
        if let Some((_, window)) = &mut self.startup {
            window.detach_from(func, decided_ns);
        }
        if let Some(d) = &mut self.dispatch {
            d.detach_from(func, decided_ns);
        }
    }

    /// The governor's detach of `d.funcs` is done (at `d.ts_ns`): once
    /// every record up to then has been read, [`DetachRecord`] is applied
    /// and journaled, so a replay closes the same frames at the same point.
    pub fn detach_later(&mut self, d: DetachRecord) {
        self.pending_detach.push(d);
    }

    /// Applies the pending detaches done by `upto_ns` (all with None).
    fn apply_detaches(&mut self, upto_ns: Option<u64>) {
        while let Some(i) = self
            .pending_detach
            .iter()
            .position(|d| upto_ns.is_none_or(|t| d.ts_ns <= t))
        {
            let d = self.pending_detach.remove(i);
            self.inject(&d.encode());
        }
    }

    /// Frames of functions whose probes are all gone can never see their
    /// return: they close at the detach, marked detached.
    fn detached(&mut self, d: &DetachRecord) {
        for &f in &d.funcs {
            self.detach_from(f, d.decided_ns);
        }
        let mut buf = std::mem::take(&mut self.call_buf);
        self.tails.detached(&d.funcs, d.ts_ns, &mut buf);
        self.apply_calls(&mut buf);
        self.stacks.detached(&d.funcs, d.ts_ns);
        if let Some((_, window)) = &mut self.startup {
            window.detached(&d.funcs, d.ts_ns);
        }
        if let Some(disp) = &mut self.dispatch {
            disp.on_detached(&d.funcs, d.ts_ns);
            evicted_to_timeline(disp, &mut self.timeline);
        }
    }

    /// Functions probed after process `added.pid` exec'd: every aggregate
    /// grows to hold them.
    fn add_functions(&mut self, added: ProbedRecord) {
        let funcs = added.funcs();
        let entry_only: Vec<bool> = funcs
            .iter()
            .map(|f| matches!(f.exit, crate::tracee::exits::ExitProbe::EntryOnly(_)))
            .collect();
        let names: Vec<String> = funcs.iter().map(|f| f.name.clone()).collect();
        self.stacks.add_functions(&entry_only);
        self.tails.add_functions(entry_only.len());
        if let Some((_, window)) = &mut self.startup {
            window.add_functions(&entry_only);
        }
        if let Some(d) = &mut self.dispatch {
            let dispatch: Vec<bool> = funcs.iter().map(|f| f.dispatch).collect();
            d.add_functions(&names, &dispatch);
        }
        if let Some(tl) = &mut self.timeline {
            tl.add_functions(&names);
        }
        if let Some(p) = &mut self.processes {
            p.set_exe(added.pid, added.exe.clone());
            if !funcs.is_empty() {
                let dispatch: Vec<bool> = funcs.iter().map(|f| f.dispatch).collect();
                p.add_functions(&entry_only, &dispatch, added.pid, added.ts_ns);
            }
        }
        self.added.absorb(added);
    }

    /// Copies the pending records out of the rings (per-CPU rings: those
    /// the merge's watermark has passed), then names the threads seen for
    /// the first time (while they are most likely alive).
    pub fn drain(&mut self, rings: &mut Rings) {
        self.drain_rings(rings, false);
    }

    /// Copies every record still in the rings or held by their merge: for
    /// the end, once the probes are detached.
    pub fn flush(&mut self, rings: &mut Rings) {
        self.drain_rings(rings, true);
    }

    fn drain_rings(&mut self, rings: &mut Rings, flush: bool) {
        // Every record stamped before this is in the rings by now.
        let before = monotonic_ns();
        self.horizon = rings.drain(flush, |item| {
            // A detach applies before the first record after it.
            if let Some(first) = self.pending_detach.first() {
                if decode(item).is_some_and(|(_, ev)| ev.ts_ns > first.ts_ns) {
                    let upto = first.ts_ns;
                    self.apply_detaches(Some(upto));
                }
            }
            if let Some(w) = &mut self.data {
                w.record(item);
            }
            self.on_record(item);
        });
        if let (Some(map), Some(d)) = (&mut self.loop_sp, &mut self.dispatch) {
            if let Some(l) = d.loop_wait.take_untold() {
                map.set(l.sp, l.key);
            }
        }
        if !self.pending_detach.is_empty() {
            let read_up_to = match flush {
                true => None,
                false => Some(self.horizon.map_or(before, |h| h.min(before))),
            };
            self.apply_detaches(read_up_to);
        }
        self.tell_notices();
        let pid = self.pid;
        let named = self.stacks.name_new_threads(|tid| thread_name(pid, tid));
        if let Some(w) = &mut self.data {
            for (tid, name) in &named {
                w.name(*tid, name);
            }
            w.seal_if_due();
        }
    }

    /// Folds the threads that have exited (journaled for replay).
    pub fn reap(&mut self, now: bool) {
        let pid = self.pid;
        let many = self.processes.is_some();
        let gone = self.stacks.reap(
            |tid| match many {
                // Threads of several processes: /proc finds any thread by id.
                true => std::path::Path::new(&format!("/proc/{tid}/stat")).exists(),
                false => thread_alive(pid, tid),
            },
            now,
        );
        if let Some(d) = &mut self.dedup {
            d.forget(&gone);
        }
        if let Some(w) = &mut self.data {
            if !gone.is_empty() {
                w.reap(now, &gone);
            }
        }
    }

    /// Applies one entry of a `profile.data` stream (offline replay).
    pub fn replay(&mut self, entry: &Entry) {
        match entry {
            Entry::Record(rec) => self.on_record(rec),
            Entry::Tick(now) => {
                if let Some(d) = &mut self.dispatch {
                    d.tick(*now);
                }
            }
            Entry::Reap(_, tids) => {
                self.stacks.fold_exited(tids);
                if let Some(d) = &mut self.dedup {
                    d.forget(tids);
                }
            }
            Entry::Name(tid, name) => self.stacks.set_name(*tid, name.clone()),
            Entry::Lost(..) => {}
        }
        // Replay has no probes to add: the recorded additions follow.
        self.execs.clear();
        self.tell_notices();
    }

    /// Tells what the dispatcher noticed since the last call.
    fn tell_notices(&mut self) {
        if let Some(d) = &mut self.dispatch {
            let notices = d.take_notices();
            if let Some(kept) = &mut self.kept_notices {
                kept.extend(notices);
            } else if !notices.is_empty() {
                notices::tell(&notices, self.hang_log.as_deref());
            }
        }
    }

    /// Explains the slow dispatches still waiting for names (waiting for
    /// them), and tells them.
    pub fn finish_dispatches(&mut self) {
        if let Some(d) = &mut self.dispatch {
            d.finish();
            evicted_to_timeline(d, &mut self.timeline);
        }
        self.tell_notices();
    }

    /// True when the session should end: every scenario has its runs.
    pub fn finished(&self) -> bool {
        self.stop_when_runs_done && !self.stages.is_empty() && self.stages.iter().all(|s| s.done())
    }

    /// A new set of sinks.
    pub fn new(
        pid: u32,
        stacks: Stacks,
        dispatch: Option<Dispatcher>,
        timeline: Option<Timeline>,
    ) -> Self {
        Sinks {
            pid,
            stacks,
            dispatch,
            timeline,
            cpu: None,
            stages: Vec::new(),
            stop_when_runs_done: false,
            startup: None,
            ready_on_first_dispatch: false,
            data: None,
            exe: None,
            hang_log: None,
            execd: false,
            all_gone: false,
            horizon: None,
            ticks: 0,
            began: None,
            next_second: 0,
            passes: 0,
            second: false,
            goroutines: Goroutines::default(),
            tables: None,
            hot_stacks: false,
            interp_seen: None,
            libs: Default::default(),
            processes: None,
            execs: Vec::new(),
            added: ProbedRecord::default(),
            hits: Vec::new(),
            dedup: None,
            loop_sp: None,
            catch_up: None,
            pending_detach: Vec::new(),
            tails: TailCalls::default(),
            flight: None,
            windows: None,
            kept_notices: None,
            call_buf: Vec::new(),
        }
    }

    /// Periodic work: hang detection, and once a second the CPU profile's
    /// snapshot of the target's mappings.
    pub(super) fn tick(&mut self) {
        let began = std::time::Instant::now();
        self.tick_inner();
        if std::env::var_os("PROFILER_DEBUG").is_some() && began.elapsed().as_millis() >= 50 {
            eprintln!(
                "profiler: debug: tick {} took {} ms",
                self.ticks,
                began.elapsed().as_millis()
            );
        }
    }

    fn tick_inner(&mut self) {
        self.ticks = self.ticks.wrapping_add(1);
        let began = *self.began.get_or_insert_with(std::time::Instant::now);
        let elapsed = began.elapsed();
        // The first pass at the first tick, then one a second (a late
        // tick makes one pass, not one for each second it missed).
        self.second = elapsed.as_secs() >= self.next_second;
        if self.second {
            self.next_second = elapsed.as_secs() + 1;
            self.passes = self.passes.wrapping_add(1);
        }
        if let Some(t) = &mut self.tables {
            // Python code objects met since the last tick, read while the
            // target runs.
            t.learn_python();
            // For the first 5 s, every 50 ms: a launched command's (or a
            // dlopened) interpreter is told of as soon as it is mapped, not
            // at the next once-a-second pass, which a loaded machine can
            // delay past a short script's first slow calls.
            if elapsed.as_secs() < 5 && self.ticks % 5 == 1 {
                if let Some(exec) = t.add_interpreters(self.pid, self.interp_seen.as_deref()) {
                    self.interp_seen = Some(exec);
                }
            }
        }
        // Every 10 ms for the first second (a launched command maps its
        // libraries at once), then every 0.1 s.
        if (elapsed.as_secs() < 1 || self.ticks % 10 == 1) && self.libs.waiting() {
            for l in self.libs.poll() {
                eprintln!(
                    "profiler: PID {} mapped {}: its probes are live",
                    self.pid,
                    l.path.display()
                );
            }
        }
        if self.second {
            // Every 10 s, from the first pass.
            let tenth = self.passes % 10 == 1;
            if let Some((maps, sym)) = &mut self.cpu {
                crate::analyze::cpu_profile::remember_maps(maps, sym, Some(self.pid));
                if tenth {
                    // Every 10 s: exited threads' samples out of the
                    // kernel's map, which would fill up with them.
                    maps.fold_exited(thread_alive);
                }
            }
            if let Some(d) = &mut self.dispatch {
                d.remember_maps();
            }
            if tenth {
                // Every 10 s: the heap's free pages back to the kernel.
                crate::heap::release_free();
            }
            if let Some(t) = &mut self.tables {
                // Binaries samples landed in that the budget left without
                // a table get room from those no sample touched.
                if let Some((maps, _)) = &self.cpu {
                    crate::analyze::cpu_profile::note_hot(maps, t);
                }
                if std::mem::take(&mut self.hot_stacks) {
                    t.rebalance();
                }
                // Children that exited since: their entries and table uses
                // go (a target forking all day would fill the map).
                t.forget(|_| false);
                let began = std::time::Instant::now();
                t.add_process(self.pid);
                if std::env::var_os("PROFILER_DEBUG").is_some() && began.elapsed().as_millis() >= 50
                {
                    eprintln!(
                        "profiler: debug: tick {}: tables of {} in {} ms",
                        self.ticks,
                        self.pid,
                        began.elapsed().as_millis()
                    );
                }
                if self.dispatch.is_some() {
                    for child in crate::tracee::process::children(self.pid)
                        .into_iter()
                        .take(MAX_CHILD_TABLES)
                    {
                        t.add_process(child);
                    }
                }
            }
            // Exited threads' state folds into one aggregate per name.
            self.reap(false);
            // An exit event lost (ring full) must not keep the session
            // going: every process still counted as running is gone.
            if let Some(p) = &self.processes {
                self.all_gone = p
                    .running()
                    .all(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
            }
        }
        // Every 0.1 s: an exec is told, and the probes detached, while the
        // new program runs its first moments (detaching takes a second on
        // a loaded machine; once a second, the agent outlived a 1.5-s
        // shell the target exec'd).
        if self.second || self.ticks.is_multiple_of(10) {
            if let Some(exe) = &self.exe {
                let now = std::fs::read_link(format!("/proc/{}/exe", self.pid));
                // Gone (exited) is the pidfd's business; a different path is an exec.
                let strip = |p: &std::path::Path| {
                    let s = p.to_string_lossy();
                    s.strip_suffix(" (deleted)").unwrap_or(&s).to_string()
                };
                if now.is_ok_and(|p| strip(&p) != strip(exe)) {
                    self.execd = true;
                }
            }
        }
        if let Some(d) = &mut self.dispatch {
            // Slow dispatches whose names were not read in time.
            d.explain_waiting();
            evicted_to_timeline(d, &mut self.timeline);
            if d.is_open() {
                // Per-CPU rings: no later than the records handed out.
                let now = monotonic_ns();
                let now = self.horizon.map_or(now, |h| h.min(now));
                if let Some(w) = &mut self.data {
                    w.tick(now);
                }
                d.tick(now);
            }
        }
        self.tell_notices();
    }
}

/// Slow dispatches let go from detail (or explained late) go to the
/// timeline, which writes them at the end ([`Timeline::let_go`]).
fn evicted_to_timeline(d: &mut Dispatcher, timeline: &mut Option<Timeline>) {
    for s in d.take_evicted() {
        if let Some(tl) = timeline {
            tl.let_go(&d.cfg, s);
        }
    }
}
