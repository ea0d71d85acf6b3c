//! What follows the watched thread: its scheduler transitions, the
//! in-dispatch and waker samplers, and its loop's wait syscalls, watched
//! by fentry/fexit, kprobes or tracepoints (best first), with the catch-up
//! program for a wait it was in at attach.

use aya::{
    maps::Array,
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        raw_trace_point::RawTracePointLink,
        trace_point::TracePointLink,
        Program, ProgramError,
    },
    Ebpf,
};
use profiler_common::{
    PROG_PEER_SAMPLE, PROG_SAMPLE, PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP, WATCH_MAP,
};

use super::{
    attach_raw_tp, kernel, load_perf, load_raw_tp, load_tp, watch_map_error, Probes, Watch,
};
use crate::{error::chain, Error, Result};

/// Attaches the programs that watch the loop's waits through tracepoints:
/// each wait syscall's own (on a failure, what did attach is detached), or
/// the raw `sys_enter`/`sys_exit`. The session's, and the calibration's
/// from its own copy (`calibrate.rs`), which prices hits as they will be.
pub(crate) fn attach_wait_tracepoints(
    ebpf: &mut Ebpf,
    waits: WaitTracepoints,
) -> std::result::Result<Vec<TracePointLink>, String> {
    use profiler_common::{
        PROG_SYSCALL_ENTER, PROG_SYSCALL_EXIT, PROG_SYS_ENTER, PROG_SYS_EXIT, WAIT_SYSCALLS,
    };
    match waits {
        WaitTracepoints::None => Ok(Vec::new()),
        WaitTracepoints::Raw => {
            for (name, tp) in [(PROG_SYS_ENTER, "sys_enter"), (PROG_SYS_EXIT, "sys_exit")] {
                attach_raw_tp(ebpf, name, tp).map_err(|e| chain(&e))?;
            }
            Ok(Vec::new())
        }
        WaitTracepoints::Syscall => {
            let mut links = Vec::new();
            let mut attach = || -> std::result::Result<(), String> {
                for (prog, side) in [(PROG_SYSCALL_ENTER, "enter"), (PROG_SYSCALL_EXIT, "exit")] {
                    let p = load_tp(ebpf, prog).map_err(|e| chain(&e))?;
                    for name in WAIT_SYSCALLS {
                        let tp = format!("sys_{side}_{name}");
                        let id = p
                            .attach("syscalls", &tp)
                            .map_err(|e| format!("syscalls:{tp}: {}", chain(&e)))?;
                        links.push((prog, id));
                    }
                }
                Ok(())
            };
            let result = attach();
            // Each link owned, so that they can be detached together
            // ([`detach_together`]).
            let owned: Vec<TracePointLink> = links
                .into_iter()
                .filter_map(|(prog, id)| tracepoint(ebpf, prog)?.take_link(id).ok())
                .collect();
            match result {
                Ok(()) => Ok(owned),
                Err(e) => {
                    detach_together(owned);
                    Err(e)
                }
            }
        }
    }
}

/// Program `prog`, a tracepoint's.
fn tracepoint<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Option<&'a mut aya::programs::TracePoint> {
    ebpf.program_mut(prog).and_then(|p| p.try_into().ok())
}

/// Detaches tracepoint links each on a thread of its own: each waits for
/// RCU Tasks Trace grace periods of its own (two, 25-50 ms apiece on the
/// loaded VM), which concurrent detaches share; one after another, the 20
/// wait syscalls' tracepoints took a second and more.
pub(crate) fn detach_together(links: Vec<TracePointLink>) {
    std::thread::scope(|s| {
        for link in links {
            // Without a thread, the link is detached here, by the failed
            // spawn dropping it.
            let _ = std::thread::Builder::new().spawn_scoped(s, move || drop(link));
        }
    });
}

/// Tracepoints the session watches the loop's waits with, which the
/// calibration attaches too (`calibrate.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitTracepoints {
    /// None: trampolines or kprobes (or no loop watched).
    #[default]
    None,
    /// Each wait syscall's `syscalls:sys_enter_NAME`/`sys_exit_NAME`.
    Syscall,
    /// The raw `sys_enter`/`sys_exit`.
    Raw,
}

/// How the loop's waits are watched (best first), as chosen when their
/// programs were loaded; each carries why the better ones were refused.
#[derive(Debug)]
pub(super) enum Waits {
    /// fentry/fexit on the wait syscalls' kernel functions.
    Trampolines,
    /// kprobes/kretprobes on them.
    Kprobes(String),
    /// Their own `syscalls:sys_enter_NAME`/`sys_exit_NAME` tracepoints.
    SyscallTracepoints(String),
    /// The `sys_enter`/`sys_exit` raw tracepoints.
    Tracepoints(String),
}

/// The `sys_exit` tracepoint's program, attached beside the trampolines
/// or kretprobes while a wait the watched thread was in at attach has yet
/// to return ([`profiler_common::WATCH_CATCH_UP`]): they only see the
/// calls entered after them, so without it the first iteration after
/// attaching to an idle loop (the one its next event starts) would go
/// unseen. Dropping it detaches it; until then every syscall on the
/// machine costs one compare more.
pub struct CatchUp(#[allow(dead_code, reason = "held for its Drop")] RawTracePointLink);

/// Loads programs `names` (raw tracepoints and perf events) side by
/// side, a thread each: the kernel verifies a program in the thread that
/// loads it, and each of these walks stacks, which took its verifier 0.6
/// to 1.1 s here (3.3 s for the four one after the other, before a
/// watch or a record could start).
fn load_side_by_side(ebpf: &mut Ebpf, names: &[&str]) -> Result<()> {
    let progs: Vec<(&str, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(n, _)| names.contains(n))
        .collect();
    if let Some(missing) = names
        .iter()
        .find(|n| !progs.iter().any(|(have, _)| have == *n))
    {
        return Err(Error::Load(format!("program {missing} missing")));
    }
    std::thread::scope(|s| {
        let loading: Vec<_> = progs
            .into_iter()
            .map(|(name, prog)| {
                s.spawn(move || {
                    let loaded = match prog {
                        Program::RawTracePoint(p) => p.load(),
                        Program::PerfEvent(p) => p.load(),
                        _ => {
                            return Err(Error::Load(format!(
                                "program {name}: not a tracepoint or perf event"
                            )))
                        }
                    };
                    match loaded {
                        Ok(()) | Err(ProgramError::AlreadyLoaded) => Ok(()),
                        Err(e) => Err(kernel::load_error(name, e)),
                    }
                })
            })
            .collect();
        // Every thread joined, the first error kept.
        let mut first = Ok(());
        for t in loading {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(Error::Load("a program's loading thread panicked".into())));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// Loading a program, or attaching one loaded.
#[derive(Debug, Clone, Copy)]
enum Step {
    Load,
    Attach,
}

impl Probes {
    /// Follows the watched thread's scheduler transitions, and samples its
    /// stacks at `hz` (0: off) while a dispatch is open, and (unless
    /// `--no-wakers`) the target's other threads, on every CPU, while it is
    /// blocked in one.
    ///
    /// With [`Watch::wait_loop`], also its wait syscalls (`sys_enter` and
    /// `sys_exit`: every syscall in the system then costs one compare).
    pub fn attach_watch(&mut self, hz: u64) -> Result<()> {
        let Watch {
            tid,
            wakers,
            wait_loop,
            ..
        } = self.watch;
        for (name, tp) in [
            (PROG_SCHED_SWITCH, "sched_switch"),
            (PROG_SCHED_WAKEUP, "sched_waking"),
        ] {
            attach_raw_tp(&mut self.ebpf, name, tp)?;
        }
        if wait_loop {
            self.attach_waits()?;
        }
        if hz > 0 {
            let prog = load_perf(&mut self.ebpf, PROG_SAMPLE)?;
            prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::OneProcess {
                    pid: tid,
                    cpu: None,
                },
                SamplePolicy::Frequency(hz),
                false,
            )
            .map_err(|e| Error::Load(format!("starting the cpu-clock sampler: {}", chain(&e))))?;
            if wakers {
                self.attach_peer_sampler(hz)?;
            }
        }
        Ok(())
    }

    /// Loads the programs [`Probes::attach_watch`] will attach: the
    /// in-dispatch samplers (the kernel's verifier takes most of a second
    /// over their stack walk here) and those that watch the loop's waits,
    /// choosing how (fentry is tried first). Loaded before the session
    /// starts, they go on together with the functions' probes; otherwise
    /// the first iterations would have no calls in them.
    /// `attach_watch` loads whatever this did not.
    pub fn prepare_watch(&mut self, hz: u64) -> Result<()> {
        let mut names = vec![PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP];
        if hz > 0 {
            names.push(PROG_SAMPLE);
            if self.watch.wakers {
                names.push(PROG_PEER_SAMPLE);
            }
        }
        load_side_by_side(&mut self.ebpf, &names)?;
        self.prepare_waits();
        if let Some(Waits::SyscallTracepoints(_)) = self.waits {
            for name in [
                profiler_common::PROG_SYSCALL_ENTER,
                profiler_common::PROG_SYSCALL_EXIT,
            ] {
                load_tp(&mut self.ebpf, name)?;
            }
        }
        if let Some(Waits::Tracepoints(_)) = self.waits {
            for name in [
                profiler_common::PROG_SYS_ENTER,
                profiler_common::PROG_SYS_EXIT,
            ] {
                load_raw_tp(&mut self.ebpf, name)?;
            }
        }
        Ok(())
    }

    /// Which tracepoints will watch the loop's waits, once
    /// [`Probes::prepare_watch`] chose: none (trampolines, kprobes, or no
    /// loop watched), the wait syscalls' own, or the raw ones. Every
    /// syscall then takes the kernel's tracing path, the return uprobes'
    /// and 5-byte-nop entries' own included (6.11+ and 6.18): the
    /// calibration attaches the same so that it prices them alike.
    pub fn wait_tracepoints(&self) -> WaitTracepoints {
        match self.waits {
            Some(Waits::SyscallTracepoints(_)) => WaitTracepoints::Syscall,
            Some(Waits::Tracepoints(_)) => WaitTracepoints::Raw,
            _ => WaitTracepoints::None,
        }
    }

    /// Loads the programs that will watch the loop's waits (with
    /// `--wait-loop`), choosing how.
    fn prepare_waits(&mut self) {
        if !self.watch.wait_loop || self.waits.is_some() {
            return;
        }
        let waits = match self.wait_trampolines(Step::Load) {
            Ok(()) => Waits::Trampolines,
            Err(why) => {
                self.unload_wait_trampolines();
                self.kprobes_else_tracepoints(why)
            }
        };
        self.waits = Some(waits);
    }

    /// Loads the kprobes on the wait syscalls, else settles for the
    /// tracepoints; `why` says why the trampolines were refused.
    fn kprobes_else_tracepoints(&mut self, why: String) -> Waits {
        match self.wait_kprobes(Step::Load) {
            Ok(()) => Waits::Kprobes(why),
            Err(k) => {
                self.unload_wait_kprobes();
                self.syscall_tracepoints_else_raw(format!("{why}; kprobes: {k}"))
            }
        }
    }

    /// The wait syscalls' own tracepoints where their programs load (the
    /// kernel has `CONFIG_FTRACE_SYSCALLS`), else the raw `sys_enter` and
    /// `sys_exit`.
    fn syscall_tracepoints_else_raw(&mut self, why: String) -> Waits {
        let loaded = [
            profiler_common::PROG_SYSCALL_ENTER,
            profiler_common::PROG_SYSCALL_EXIT,
        ]
        .into_iter()
        .try_for_each(|name| load_tp(&mut self.ebpf, name).map(|_| ()));
        let event = format!(
            "events/syscalls/sys_enter_{}",
            profiler_common::WAIT_SYSCALLS[0]
        );
        let exists = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .any(|root| std::path::Path::new(root).join(&event).exists());
        match loaded {
            Ok(()) if exists => Waits::SyscallTracepoints(why),
            Ok(()) => Waits::Tracepoints(format!(
                "{why}; syscall tracepoints: no tracefs {event} (CONFIG_FTRACE_SYSCALLS)"
            )),
            Err(e) => Waits::Tracepoints(format!("{why}; syscall tracepoints: {}", chain(&e))),
        }
    }

    /// The watched thread's wait syscalls: an fentry and an fexit program
    /// on each wait syscall's kernel function (nothing runs for other
    /// syscalls), else, where the kernel cannot (no BTF, no trampolines),
    /// a kprobe and a kretprobe on each (nothing for other syscalls either;
    /// a little dearer per wait), else the `sys_enter`/`sys_exit`
    /// tracepoints, which slow every syscall of every task a little.
    fn attach_waits(&mut self) -> Result<()> {
        self.prepare_waits();
        let mut waits = self
            .waits
            .take()
            .unwrap_or(Waits::Tracepoints(String::new()));
        loop {
            waits = match waits {
                Waits::Trampolines => match self.wait_trampolines(Step::Attach) {
                    Ok(()) => return self.catch_up_or_warn(),
                    Err(why) => {
                        // Detach the ones that did attach.
                        self.unload_wait_trampolines();
                        self.kprobes_else_tracepoints(why)
                    }
                },
                Waits::Kprobes(why) => match self.wait_kprobes(Step::Attach) {
                    Ok(()) => {
                        eprintln!(
                            "profiler: note: watching the loop's waits with kprobes, as the kernel \
                             refused trampolines ({why})"
                        );
                        return self.catch_up_or_warn();
                    }
                    Err(k) => {
                        self.unload_wait_kprobes();
                        self.syscall_tracepoints_else_raw(format!("{why}; kprobes: {k}"))
                    }
                },
                Waits::SyscallTracepoints(why) => {
                    match attach_wait_tracepoints(&mut self.ebpf, WaitTracepoints::Syscall) {
                        Ok(links) => {
                            self.wait_links = links;
                            eprintln!(
                                "profiler: note: watching the loop's waits with their syscall \
                             tracepoints (meanwhile every syscall on the machine takes the \
                             kernel's slower tracing path): {why}"
                            );
                            return Ok(());
                        }
                        Err(t) => Waits::Tracepoints(format!("{why}; syscall tracepoints: {t}")),
                    }
                }
                Waits::Tracepoints(why) => {
                    eprintln!(
                        "profiler: note: watching the loop's waits with the sys_enter and \
                         sys_exit tracepoints (meanwhile every syscall on the machine costs a \
                         little more): {why}"
                    );
                    return attach_wait_tracepoints(&mut self.ebpf, WaitTracepoints::Raw)
                        .map(drop)
                        .map_err(Error::Load);
                }
            };
        }
    }

    /// [`Probes::arm_catch_up`]; a failure costs at most the first
    /// iteration, so it is said and the session goes on.
    fn catch_up_or_warn(&mut self) -> Result<()> {
        if let Err(e) = self.arm_catch_up() {
            eprintln!(
                "profiler: warning: the wait the watched thread is in now cannot be watched to \
                 its return ({}): the iteration its next event starts may go unseen",
                chain(&e)
            );
        }
        Ok(())
    }

    /// With the trampolines or kprobes attached: if the watched thread is
    /// inside a wait already (an idle loop), its return would go unseen,
    /// and with it the iteration its next event starts. The `sys_exit`
    /// program reports that one return ([`CatchUp`]).
    fn arm_catch_up(&mut self) -> Result<()> {
        let tid = self.watch.tid;
        if crate::tracee::process::thread_wait(tid, tid).is_none() {
            return Ok(());
        }
        let err = watch_map_error;
        let map = self
            .ebpf
            .map_mut(WATCH_MAP)
            .ok_or_else(|| err(&"missing"))?;
        Array::<_, u64>::try_from(map)
            .map_err(|e| err(&e))?
            .set(
                profiler_common::WATCH_CATCH_UP,
                profiler_common::CATCH_UP_ARMED,
                0,
            )
            .map_err(|e| err(&e))?;
        let prog = load_raw_tp(&mut self.ebpf, profiler_common::PROG_SYS_EXIT)?;
        let attach_err =
            |e: ProgramError| Error::Load(format!("attaching sys_exit: {}", chain(&e)));
        let id = prog.attach("sys_exit").map_err(attach_err)?;
        self.catch_up = Some(CatchUp(prog.take_link(id).map_err(attach_err)?));
        Ok(())
    }

    /// The catch-up of a wait in flight at attach, if armed: the session
    /// drops it once the watched thread's first wait event arrives.
    pub fn take_catch_up(&mut self) -> Option<CatchUp> {
        self.catch_up.take()
    }

    fn unload_wait_trampolines(&mut self) {
        for name in profiler_common::WAIT_SYSCALLS {
            let prog = self.ebpf.program_mut(&format!("prof_enter_{name}"));
            if let Some(Ok(p)) = prog.map(<&mut aya::programs::FEntry>::try_from) {
                let _ = p.unload();
            }
            let prog = self.ebpf.program_mut(&format!("prof_exit_{name}"));
            if let Some(Ok(p)) = prog.map(<&mut aya::programs::FExit>::try_from) {
                let _ = p.unload();
            }
        }
    }

    fn unload_wait_kprobes(&mut self) {
        for name in profiler_common::WAIT_SYSCALLS {
            for prog in [format!("prof_kenter_{name}"), format!("prof_kexit_{name}")] {
                let prog = self.ebpf.program_mut(&prog);
                if let Some(Ok(p)) = prog.map(<&mut aya::programs::KProbe>::try_from) {
                    let _ = p.unload();
                }
            }
        }
    }

    /// Loads, or attaches, a kprobe and a kretprobe on each wait
    /// syscall's kernel function.
    fn wait_kprobes(&mut self, step: Step) -> std::result::Result<(), String> {
        for name in profiler_common::WAIT_SYSCALLS {
            let func = format!("__x64_sys_{name}");
            for prog in [format!("prof_kenter_{name}"), format!("prof_kexit_{name}")] {
                let p: &mut aya::programs::KProbe = self
                    .ebpf
                    .program_mut(&prog)
                    .ok_or("program missing")?
                    .try_into()
                    .map_err(|e: ProgramError| chain(&e))?;
                match step {
                    Step::Load => p.load().map_err(|e| format!("{func}: {}", chain(&e)))?,
                    Step::Attach => {
                        p.attach(&func, 0)
                            .map_err(|e| format!("{func}: {}", chain(&e)))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Loads, or attaches, an fentry and an fexit program on each wait
    /// syscall's kernel function.
    fn wait_trampolines(&mut self, step: Step) -> std::result::Result<(), String> {
        let btf = self
            .btf
            .as_ref()
            .ok_or("the kernel's BTF could not be read")?;
        for name in profiler_common::WAIT_SYSCALLS {
            let func = format!("__x64_sys_{name}");
            let entry: &mut aya::programs::FEntry = self
                .ebpf
                .program_mut(&format!("prof_enter_{name}"))
                .ok_or("program missing")?
                .try_into()
                .map_err(|e: ProgramError| chain(&e))?;
            match step {
                Step::Load => entry.load(&func, btf),
                Step::Attach => entry.attach().map(|_| ()),
            }
            .map_err(|e| format!("{func}: {}", chain(&e)))?;
            let exit: &mut aya::programs::FExit = self
                .ebpf
                .program_mut(&format!("prof_exit_{name}"))
                .ok_or("program missing")?
                .try_into()
                .map_err(|e: ProgramError| chain(&e))?;
            match step {
                Step::Load => exit.load(&func, btf),
                Step::Attach => exit.attach().map(|_| ()),
            }
            .map_err(|e| format!("{func}: {}", chain(&e)))?;
        }
        Ok(())
    }

    /// The waker sampler: `cpu-clock` at `hz` on every online CPU. It only
    /// writes while the watched thread is blocked inside a dispatch.
    fn attach_peer_sampler(&mut self, hz: u64) -> Result<()> {
        let prog = load_perf(&mut self.ebpf, PROG_PEER_SAMPLE)?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| Error::io(what.to_string(), e))?;
        for cpu in cpus {
            prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(hz),
                false,
            )
            .map_err(|e| {
                Error::Load(format!(
                    "starting the waker sampler on CPU {cpu}: {}",
                    chain(&e)
                ))
            })?;
        }
        Ok(())
    }
}
