//! Loads the eBPF object, attaches the entry/exit uprobes by file offset
//! (cookie = function index, scope = the target PID), and reads the
//! per-CPU counters. Dropping [`Probes`] detaches everything: the links are
//! BPF links owned by file descriptors, so nothing outlives the agent, even
//! after SIGKILL.
use std::{
    num::NonZeroU32,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::Instant,
};

use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        raw_trace_point::RawTracePointLink,
        trace_point::TracePointLink,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        PerfEvent, ProgramError, RawTracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use profiler_common::{
    unwind_mode, COOKIE_DISPATCH, COOKIE_GO, COUNTERS_MAP, COUNTER_FOREIGN, COUNTER_LOST,
    COUNTER_LOST_COMM, COUNTER_LOST_SCHED, COUNTER_STACK_ERRORS, LINK_GEN, MAX_FUNCS, PROG_ENTRY,
    PROG_EXIT, PROG_PEER_SAMPLE, PROG_RET, PROG_SAMPLE, PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP,
    SAMPLE_ALL_GLOBAL, TAIL_CALL, TARGET_TGID_GLOBAL, UNWIND_MODE_GLOBAL, UNWIND_ROWS_MAP,
    WAKERS_GLOBAL, WAKEUP_BYTES_GLOBAL, WATCH_MAP, WATCH_TID_GLOBAL,
};

use super::{
    kernel,
    rings::{self, EventRing, RingSpec},
    task_btf::TaskOffsets,
    uprobe_multi as multi,
};
use crate::{
    cli::UnwindMode,
    error::chain,
    tracee::{cgroup::Cgroup, exits::ExitProbe, select::Selection},
    Error, Result,
};

pub(crate) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// A program that did not load: a verifier refusal is one line
/// ([`kernel::refused`]; `profiler check --verbose` prints the log).
fn load_error(name: &str, e: ProgramError) -> Error {
    match e {
        ProgramError::LoadError { io_error, .. } => kernel::refused(name, &io_error.to_string()),
        other => Error::Load(chain(&other)),
    }
}

/// Loads raw tracepoint program `name` and attaches it to `tp`; a
/// verifier rejection carries the verifier's log.
pub(crate) fn attach_raw_tp(ebpf: &mut Ebpf, name: &str, tp: &str) -> Result<()> {
    let prog = load_raw_tp(ebpf, name)?;
    prog.attach(tp)
        .map_err(|e| Error::Load(format!("attaching {tp}: {}", chain(&e))))?;
    Ok(())
}

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

/// Attaches the `sched_process_exit` program: the one that reads the
/// tracepoint's `group_dead`, else, where the kernel refuses it (the
/// tracepoint has only the task: Linux 6.1), the one that reads the
/// process's count of live threads.
pub(crate) fn attach_proc_exit(ebpf: &mut Ebpf) -> Result<()> {
    let tp = "sched_process_exit";
    attach_raw_tp(ebpf, profiler_common::PROG_PROC_EXIT, tp)
        .or_else(|_| attach_raw_tp(ebpf, profiler_common::PROG_PROC_EXIT_OLD, tp))
}

/// Loads raw tracepoint program `name` unless it is loaded already.
fn load_raw_tp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut RawTracePoint> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::Load(format!("program {name} missing")))?
        .try_into()
        .map_err(|e: ProgramError| Error::Load(chain(&e)))?;
    match prog.load() {
        Ok(()) | Err(ProgramError::AlreadyLoaded) => Ok(prog),
        Err(e) => Err(load_error(name, e)),
    }
}

/// Tracepoint program `name`, loaded unless it was already.
fn load_tp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::TracePoint> {
    let prog: &mut aya::programs::TracePoint = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::Load(format!("program {name} missing")))?
        .try_into()
        .map_err(|e: ProgramError| Error::Load(chain(&e)))?;
    match prog.load() {
        Ok(()) | Err(ProgramError::AlreadyLoaded) => Ok(prog),
        Err(e) => Err(load_error(name, e)),
    }
}

/// The counters the kernel side keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Events dropped because the ring buffer was full.
    pub lost: u64,
    /// Probe hits from other processes, filtered out.
    pub foreign: u64,
    /// Thread-name events dropped (ring full).
    pub lost_comm: u64,
    /// Scheduler and sample events dropped (ring full).
    pub lost_sched: u64,
    /// Stacks that could not be read.
    pub stack_errors: u64,
    /// CPU samples whose user stack could not be stored.
    pub cpu_stack_lost: u64,
    /// CPU samples not counted (the counts map was full).
    pub cpu_counts_full: u64,
    /// `--dwarf` samples dropped (the ring was full).
    pub dwarf_lost: u64,
    /// Children of traced processes that were not traced (no `--follow`).
    pub untraced_children: u64,
    /// Children not followed because the traced-process map was full.
    pub traced_full: u64,
    /// Process events (fork, exec, exit) dropped (ring full).
    pub lost_proc: u64,
}

/// The thread whose dispatches are watched, and what is recorded about it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watch {
    /// Its TID (0: none).
    pub tid: u32,
    /// Name who wakes it while it is blocked in a dispatch, and sample the
    /// target's other threads meanwhile (off with `record --no-wakers`).
    pub wakers: bool,
    /// Bound its dispatches by its event loop's wait syscalls
    /// (`prof_sys_enter`/`prof_sys_exit`).
    pub wait_loop: bool,
    /// While an iteration of its loop is younger than `.1` ns, the
    /// in-dispatch sampler takes one tick in `.0` (`watch`'s flight rate;
    /// (0 or 1, _): every tick).
    pub early: (u32, u64),
}

/// Which processes the probes count ([`profiler_common::track`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tracking {
    /// A `track` constant.
    pub mode: u32,
    /// `task_struct` offsets (None: no BTF; forks are then not seen).
    pub offsets: Option<TaskOffsets>,
}

impl Tracking {
    /// True when the probes are for every process and the kernel's map of
    /// traced processes decides.
    pub fn by_map(&self) -> bool {
        self.mode != profiler_common::track::ONE
    }
}

/// The programs loaded for uprobe_multi links.
pub(crate) struct MultiPrograms {
    pub(crate) entry: OwnedFd,
    pub(crate) exit: OwnedFd,
    pub(crate) ret: OwnedFd,
}

/// The uprobe_multi links of one binary: exits first, the entry link last.
struct BinLinks {
    /// Index into [`Selection::binaries`].
    bin: usize,
    /// The functions these links probe.
    funcs: Vec<usize>,
    /// The [`LINK_GEN`] bit of their cookies.
    gen: bool,
    links: Vec<OwnedFd>,
    /// The binary, held open so that links rebuilt later name the same
    /// file even once its path in `/proc/PID` is gone (the target's main
    /// thread exited, or the target is exiting).
    file: Option<std::fs::File>,
}

impl BinLinks {
    /// Where to attach rebuilt links: the file held open, else its path.
    fn path(&self, sel: &Selection) -> PathBuf {
        match &self.file {
            Some(f) => format!("/proc/self/fd/{}", f.as_raw_fd()).into(),
            None => sel.binaries[self.bin].open_path.clone(),
        }
    }
}

/// The probe cookie of function `i`: its index, the link generation bit,
/// and the dispatch and Go flags.
fn cookie(sel: &Selection, i: usize, gen: bool) -> u64 {
    let f = &sel.funcs[i];
    let mut c = i as u64;
    if gen {
        c |= u64::from(LINK_GEN);
    }
    if f.dispatch {
        c |= COOKIE_DISPATCH;
    }
    if sel.binaries[f.binary as usize].go {
        c |= COOKIE_GO;
    }
    c
}

/// Which kind of probe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    /// A function's first instruction.
    Entry,
    /// A return uprobe on the function.
    Return,
    /// A return instruction (or tail-call jump) of the function.
    ReturnSite,
}

/// File offsets and cookies of the `kind` probes of functions `idx`, whose
/// tail calls are followed into functions `attached` (attached with them).
fn probe_points(
    sel: &Selection,
    idx: &[usize],
    attached: &[usize],
    kind: ProbeKind,
    cookie: impl Fn(usize) -> u64,
) -> (Vec<u64>, Vec<u64>) {
    let mut offsets = Vec::new();
    let mut cookies = Vec::new();
    // Tail calls are followed to the functions attached together (one
    // binary's link, or the functions attached one probe each) that have
    // an exit probe: their entry comes right after the jump, and their
    // return ends the caller's frame too. (A callee whose entry does not
    // come next leaves the caller's exit as it was: `tail_calls.rs`.)
    // (Their dispatch flag too: the kernel's dispatch depth counts the
    // caller's exit at the jump, so a dispatch function's tail call is
    // followed only into another, whose entry counts it back.)
    let callees: std::collections::HashMap<(u32, u64), bool> = match kind {
        ProbeKind::ReturnSite => attached
            .iter()
            .map(|&j| &sel.funcs[j])
            .filter(|f| !matches!(f.exit, ExitProbe::EntryOnly(_)))
            .map(|f| ((f.binary, f.offset), f.dispatch))
            .collect(),
        _ => Default::default(),
    };
    for &i in idx {
        let f = &sel.funcs[i];
        let entry = f.entry_offset();
        let points: &[u64] = match (kind, &f.exit) {
            (ProbeKind::Entry, _) | (ProbeKind::Return, ExitProbe::Uretprobe) => {
                std::slice::from_ref(&entry)
            }
            (ProbeKind::ReturnSite, ExitProbe::Sites(sites)) => sites,
            _ => &[],
        };
        // Not in Go (its events are keyed by goroutine).
        let follows = !f.tails.is_empty() && !sel.binaries[f.binary as usize].go;
        offsets.extend_from_slice(points);
        cookies.extend(points.iter().map(|site| {
            let tail = follows
                && f.tails.iter().any(|&(s, callee)| {
                    s == *site
                        && callee != f.offset
                        && callees
                            .get(&(f.binary, callee))
                            .is_some_and(|&dispatch| dispatch || !f.dispatch)
                });
            cookie(i) | if tail { u64::from(TAIL_CALL) } else { 0 }
        }));
    }
    (offsets, cookies)
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
enum Waits {
    /// fentry/fexit on the wait syscalls' kernel functions.
    Trampolines,
    /// kprobes/kretprobes on them.
    Kprobes(String),
    /// Their own `syscalls:sys_enter_NAME`/`sys_exit_NAME` tracepoints.
    SyscallTracepoints(String),
    /// The `sys_enter`/`sys_exit` raw tracepoints.
    Tracepoints(String),
}

/// Perf event program `name`, loaded unless it was already
/// ([`Probes::prepare_watch`]).
fn load_perf<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut PerfEvent> {
    let prog: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::Load(format!("program {name} missing")))?
        .try_into()
        .map_err(|e: ProgramError| Error::Load(chain(&e)))?;
    match prog.load() {
        Ok(()) | Err(ProgramError::AlreadyLoaded) => Ok(prog),
        Err(e) => Err(load_error(name, e)),
    }
}

/// The `sys_exit` tracepoint's program, attached beside the trampolines
/// or kretprobes while a wait the watched thread was in at attach has yet
/// to return ([`profiler_common::WATCH_CATCH_UP`]): they only see the
/// calls entered after them, so without it the first iteration after
/// attaching to an idle loop (the one its next event starts) would go
/// unseen. Dropping it detaches it; until then every syscall on the
/// machine costs one compare more.
pub struct CatchUp(#[allow(dead_code, reason = "held for its Drop")] RawTracePointLink);

/// A failure to reach the [`WATCH_MAP`] map.
fn watch_map_error(e: &dyn std::fmt::Display) -> Error {
    Error::Load(format!("the {WATCH_MAP} map: {e}"))
}

/// Loading a program, or attaching one loaded.
#[derive(Debug, Clone, Copy)]
enum Step {
    Load,
    Attach,
}

/// Which of the CPU samplers a session may start: their maps are sized
/// for them, or to one entry each when not (`record` without `--sample`
/// and `--off-cpu` saves 44 MiB of kernel memory, which a memory cgroup
/// counts).
#[derive(Debug, Clone, Copy)]
pub struct Samplers {
    /// Every process on the machine, not the target alone (`sample --all`).
    pub all: bool,
    /// The CPU profile (`CPU_STACKS`, `CPU_COUNTS`, `CPU_COMMS`).
    pub cpu: bool,
    /// Off-CPU time (`OFFCPU_START`, `OFFCPU_NS`, and the CPU profile's
    /// stacks and names).
    pub off_cpu: bool,
}

impl Samplers {
    /// Neither sampler, for the target's processes alone.
    pub const NONE: Samplers = Samplers {
        all: false,
        cpu: false,
        off_cpu: false,
    };

    /// Both samplers, for the target's processes alone or, with `all`,
    /// every process.
    pub fn both(all: bool) -> Self {
        Samplers {
            all,
            cpu: true,
            off_cpu: true,
        }
    }

    /// The entries of each CPU-sampler map: its capacity, or one.
    pub(crate) fn map_sizes(&self) -> [(&'static str, u32); 5] {
        use profiler_common::{
            CPU_COMMS_MAP, CPU_COUNTS_CAPACITY, CPU_COUNTS_MAP, CPU_STACKS_CAPACITY,
            CPU_STACKS_MAP, OFFCPU_NS_MAP, OFFCPU_START_MAP,
        };
        let either = self.cpu || self.off_cpu;
        let size = |used: bool, n: u32| if used { n } else { 1 };
        [
            (CPU_STACKS_MAP, size(either, CPU_STACKS_CAPACITY)),
            (CPU_COUNTS_MAP, size(self.cpu, CPU_COUNTS_CAPACITY)),
            (CPU_COMMS_MAP, size(either, CPU_COUNTS_CAPACITY)),
            (OFFCPU_START_MAP, size(self.off_cpu, CPU_COUNTS_CAPACITY)),
            (OFFCPU_NS_MAP, size(self.off_cpu, CPU_COUNTS_CAPACITY)),
        ]
    }
}

/// Loaded programs and their links.
pub struct Probes {
    /// uprobe_multi links, per binary (dropped first: each detaches all
    /// its probes in one RCU grace period).
    multi_links: Vec<BinLinks>,
    /// Programs loaded for the uprobe_multi links.
    multi: Option<MultiPrograms>,
    /// Probes attached one perf event each (the fallback path): function,
    /// program and link.
    per_probe: Vec<(usize, &'static str, UProbeLinkId)>,
    /// Functions behind a USDT semaphore attached one perf event a probe
    /// (no uprobe_multi links): function, and its links and events, the
    /// entry's first.
    gated: Vec<(usize, Vec<OwnedFd>)>,
    /// The rings, until [`Probes::take_rings`].
    rings: Vec<EventRing>,
    ebpf: Ebpf,
    /// The watched thread, as loaded.
    watch: Watch,
    /// The kernel's BTF, read at load (None where it cannot be read).
    btf: Option<aya::Btf>,
    /// How the loop's waits will be watched, once their programs are
    /// loaded ([`Probes::prepare_watch`]).
    waits: Option<Waits>,
    /// The `sys_exit` program attached for a wait the watched thread was
    /// in at attach, until [`Probes::take_catch_up`].
    catch_up: Option<CatchUp>,
    /// The wait syscalls' tracepoint links, when the loop's waits are
    /// watched by them.
    wait_links: Vec<TracePointLink>,
    /// How long attaching took.
    pub attach_ms: u128,
    /// Functions that could not be probed, with the reason.
    pub failed: Vec<(String, String)>,
}

impl Drop for Probes {
    /// Per-probe links go first, entries before exits, with expedited RCU
    /// grace periods when there are many ([`kernel::ExpeditedRcu`]); then
    /// the wait syscalls' tracepoints, together ([`detach_together`]: one
    /// after another, the 20 of them took a second and more on a loaded
    /// VM, which let an exec'd target's next program end before the
    /// agent); the rest go with the programs.
    fn drop(&mut self) {
        let links = std::mem::take(&mut self.per_probe);
        let _ = self.detach_per_probe(links);
        detach_together(std::mem::take(&mut self.wait_links));
    }
}

impl Probes {
    /// Loads the programs for process `tgid` with the rings `ring`
    /// (`--rings`, `--ring-size`), walking user stacks as `unwind` says
    /// (with tables: an array of `rows` rows for them,
    /// `unwind::budget::rows`).
    pub fn load(
        tgid: u32,
        watch: Watch,
        ring: RingSpec,
        samplers: Samplers,
        (unwind, rows): (UnwindMode, u32),
        tracking: Tracking,
    ) -> Result<Self> {
        Self::load_in_cgroup(tgid, watch, ring, samplers, (unwind, rows), None, tracking)
    }

    /// [`Probes::load`], the samplers limited to the subtree of `cgroup`
    /// (`sample --all --cgroup`).
    pub fn load_in_cgroup(
        tgid: u32,
        watch: Watch,
        ring: RingSpec,
        samplers: Samplers,
        (unwind, table_rows): (UnwindMode, u32),
        cgroup: Option<&Cgroup>,
        tracking: Tracking,
    ) -> Result<Self> {
        kernel::require()?;
        let (cgroup_id, cgroup_level) = cgroup.map_or((0u64, 0u32), |c| (c.id, c.level));
        let offsets = tracking.offsets.unwrap_or(TaskOffsets {
            pid: 0,
            tgid: 0,
            exit_code: 0,
        });
        let dwarf = unwind == UnwindMode::Copy;
        let (mode, rows) = match unwind {
            UnwindMode::Tables => (unwind_mode::TABLES, table_rows.max(1)),
            _ => (unwind_mode::FP, 1),
        };
        // Wake the agent only when a quarter of a ring is pending; the
        // agent's drain timer picks up the rest.
        let wakeup_bytes = u64::from(ring.size / 4);
        // Read once: the loader relocates with it, and the wait syscalls'
        // fentry programs are loaded against it later.
        let btf = aya::Btf::from_sys_fs().ok();
        // Where return uprobes keep the return addresses they replace, so
        // stacks walked through them name the callers (zeros: unknown, and
        // the trampoline's address stays in those stacks).
        let uret: [u32; profiler_common::uret::COUNT] = match super::task_btf::uretprobe_offsets() {
            Ok(o) => [
                o.task_utask,
                o.utask_return_instances,
                o.ri_orig_ret_vaddr,
                o.ri_chained,
                o.ri_next,
                o.task_mm,
                o.mm_xol_area,
                o.xol_vaddr,
                o.utask_vaddr,
                match super::kernel::at_least((6, 11)) {
                    true => profiler_common::uret::TRAMP_SYSCALL,
                    false => profiler_common::uret::TRAMP_INT3,
                },
            ],
            Err(_) => [0; profiler_common::uret::COUNT],
        };
        let mut loader = EbpfLoader::new();
        loader.btf(btf.as_ref());
        for (map, entries) in samplers.map_sizes() {
            loader.map_max_entries(map, entries);
        }
        let mut ebpf = ring
            .configure(&mut loader)?
            .override_global(TARGET_TGID_GLOBAL, &tgid, true)
            .override_global(WATCH_TID_GLOBAL, &watch.tid, true)
            .override_global(WAKERS_GLOBAL, &u32::from(watch.wakers), true)
            .override_global(
                profiler_common::WAIT_LOOP_GLOBAL,
                &u32::from(watch.wait_loop),
                true,
            )
            .override_global(SAMPLE_ALL_GLOBAL, &u32::from(samplers.all), true)
            .override_global(
                profiler_common::SAMPLE_EARLY_EVERY_GLOBAL,
                &watch.early.0.max(1),
                true,
            )
            .override_global(
                profiler_common::SAMPLE_FULL_AFTER_NS_GLOBAL,
                &watch.early.1,
                true,
            )
            .override_global(profiler_common::DWARF_MODE_GLOBAL, &u32::from(dwarf), true)
            .override_global(WAKEUP_BYTES_GLOBAL, &wakeup_bytes, true)
            .override_global(UNWIND_MODE_GLOBAL, &mode, true)
            .override_global(profiler_common::CGROUP_ID_GLOBAL, &cgroup_id, true)
            .override_global(profiler_common::CGROUP_LEVEL_GLOBAL, &cgroup_level, true)
            .override_global(profiler_common::TRACK_GLOBAL, &tracking.mode, true)
            .override_global(profiler_common::TASK_PID_OFFSET_GLOBAL, &offsets.pid, true)
            .override_global(
                profiler_common::TASK_TGID_OFFSET_GLOBAL,
                &offsets.tgid,
                true,
            )
            .override_global(
                profiler_common::TASK_EXIT_CODE_OFFSET_GLOBAL,
                &offsets.exit_code,
                true,
            )
            .override_global(profiler_common::uret::GLOBAL, &uret, true)
            .override_global(
                profiler_common::TASK_SIGNAL_LIVE_OFFSETS_GLOBAL,
                &super::task_btf::signal_live_offsets().unwrap_or_default(),
                true,
            )
            .map_max_entries(UNWIND_ROWS_MAP, rows)
            .load(EBPF_OBJECT)
            .map_err(|e| Error::Load(chain(&e)))?;
        let refused = std::env::var_os(profiler_common::TEST_REFUSED_ENV)
            .is_some()
            .then_some(profiler_common::PROG_TEST_REFUSED);
        for name in [PROG_ENTRY, PROG_EXIT, PROG_RET].into_iter().chain(refused) {
            let prog: &mut UProbe = program(&mut ebpf, name)?;
            prog.load().map_err(|e| load_error(name, e))?;
        }
        let rings = rings::create(&mut ebpf, ring)?;
        // Load the uprobe_multi copies now, while every map is still in
        // `ebpf` for the relocation.
        let multi = Self::multi_programs(&ebpf);
        Ok(Probes {
            rings,
            multi_links: Vec::new(),
            multi,
            per_probe: Vec::new(),
            gated: Vec::new(),
            ebpf,
            watch,
            btf,
            waits: None,
            catch_up: None,
            wait_links: Vec::new(),
            attach_ms: 0,
            failed: Vec::new(),
        })
    }

    /// Attaches exit probes (return-site uprobes or return uprobes), then
    /// entry probes, to every selected function. Exits first, so that a
    /// call entered mid-attach shows up as an orphan exit (counted) rather
    /// than as a frame that never closes. Returns the number of functions
    /// probed. `pid` scopes the probes to one process; 0 puts them on every
    /// process mapping the binaries, and the kernel's map of traced
    /// processes decides (`--follow`, several targets).
    pub fn attach(&mut self, sel: &Selection, pid: u32) -> Result<usize> {
        self.attach_from(sel, 0, pid)
    }

    /// [`Probes::attach`] for the functions from index `first` on (those a
    /// selection gained after an exec).
    pub fn attach_from(&mut self, sel: &Selection, first: usize, pid: u32) -> Result<usize> {
        assert!(sel.funcs.len() <= MAX_FUNCS as usize);
        let start = Instant::now();
        let cookie = |i: usize| cookie(sel, i, false);
        // Fast path: one uprobe_multi link per binary and program, which
        // also detaches in one grace period instead of one per probe.
        let mut pending: Vec<bool> = (0..sel.funcs.len()).map(|i| i >= first).collect();
        if let Some(progs) = self.multi.as_ref() {
            for (bi, bin) in sel.binaries.iter().enumerate() {
                let idx: Vec<usize> = (first..sel.funcs.len())
                    .filter(|&i| sel.funcs[i].binary as usize == bi)
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                // A set the kernel refuses (one unprobeable function, such
                // as libc's `pthread_spin_lock`) is split in halves and
                // retried, so only the refused functions fall back to one
                // perf link per probe: thousands of those take minutes to
                // close (one RCU grace period each).
                let mut todo = vec![idx];
                while let Some(idx) = todo.pop() {
                    match multi_links(progs, sel, &bin.open_path, &idx, false, pid) {
                        Ok(links) => {
                            for &i in &idx {
                                pending[i] = false;
                            }
                            self.multi_links.push(BinLinks {
                                bin: bi,
                                funcs: idx,
                                gen: false,
                                links,
                                file: std::fs::File::open(&bin.open_path).ok(),
                            });
                        }
                        Err(e) if e.contains("os error 3)") || e.contains("os error 2)") => {
                            return Err(Error::TargetGone(pid));
                        }
                        // The per-probe fallback below tells which function
                        // the kernel refused, and why.
                        Err(e) => {
                            if std::env::var_os("PROFILER_DEBUG").is_some() {
                                eprintln!(
                                    "profiler: debug: uprobe_multi attach of {} functions to {}: {e}",
                                    idx.len(),
                                    bin.open_path.display()
                                );
                            }
                            if idx.len() > 1 {
                                let (l, r) = idx.split_at(idx.len() / 2);
                                todo.push(r.to_vec());
                                todo.push(l.to_vec());
                            }
                        }
                    }
                }
            }
        }
        let scope = match NonZeroU32::new(pid) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let mut ok: Vec<bool> = (0..sel.funcs.len()).map(|i| i >= first).collect();
        // Probes behind a USDT semaphore: aya's per-probe attach has none.
        for (i, f) in sel.funcs.iter().enumerate() {
            if !ok[i] || !pending[i] || f.semaphores == [0; 2] {
                continue;
            }
            ok[i] = match self.attach_gated(sel, i, pid) {
                Ok(fds) => {
                    self.gated.push((i, fds));
                    true
                }
                Err(reason) => {
                    self.failed.push((f.name.clone(), reason));
                    false
                }
            };
            pending[i] = false;
        }
        let attached: Vec<usize> = (0..sel.funcs.len())
            .filter(|&i| ok[i] && pending[i])
            .collect();
        for (name, kind) in [
            (PROG_RET, ProbeKind::ReturnSite),
            (PROG_EXIT, ProbeKind::Return),
            (PROG_ENTRY, ProbeKind::Entry),
        ] {
            let prog: &mut UProbe = program(&mut self.ebpf, name)?;
            for (i, f) in sel.funcs.iter().enumerate() {
                if !ok[i] || !pending[i] {
                    continue;
                }
                let bin = &sel.binaries[f.binary as usize];
                // The sites' own cookies: a tail call's carries TAIL_CALL.
                let (offsets, cookies) = probe_points(sel, &[i], &attached, kind, cookie);
                for (offset, c) in offsets.into_iter().zip(cookies) {
                    let point = UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(offset),
                        cookie: Some(c),
                    };
                    match prog.attach(point, &bin.open_path, scope) {
                        Ok(id) => self.per_probe.push((i, name, id)),
                        Err(e) => {
                            let reason = chain(&e);
                            if reason.contains("Operation not permitted") {
                                return Err(Error::MissingCapability {
                                    missing: "CAP_SYS_ADMIN".into(),
                                });
                            }
                            if reason.contains("No such process") || reason.contains("No such file")
                            {
                                return Err(Error::TargetGone(pid));
                            }
                            ok[i] = false;
                            self.failed.push((f.name.clone(), reason));
                            break;
                        }
                    }
                }
            }
        }
        self.attach_ms = start.elapsed().as_millis();
        let attached = ok.iter().filter(|&&b| b).count();
        if attached == 0 && first < sel.funcs.len() {
            let (func, reason) = self.failed.first().cloned().unwrap_or_default();
            let f = &sel.funcs[first];
            return Err(Error::Attach {
                func,
                binary: sel.binaries[f.binary as usize].path.clone(),
                offset: f.offset,
                reason,
            });
        }
        Ok(attached)
    }

    /// Attaches function `i`, whose probes sit behind USDT semaphores, one
    /// perf event a probe ([`multi::attach_gated_probe`]): its exit sites,
    /// then its entry. Returns the fds, the entry's first.
    fn attach_gated(
        &mut self,
        sel: &Selection,
        i: usize,
        pid: u32,
    ) -> std::result::Result<Vec<OwnedFd>, String> {
        let f = &sel.funcs[i];
        let path = &sel.binaries[f.binary as usize].open_path;
        let c = cookie(sel, i, false);
        let ExitProbe::Sites(sites) = &f.exit else {
            return Err("a USDT pair without its second probe".into());
        };
        let prog = |ebpf: &mut Ebpf, name| -> std::result::Result<OwnedFd, String> {
            let p = program(ebpf, name).map_err(|e| e.to_string())?;
            p.fd()
                .map_err(|e| chain(&e))?
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| e.to_string())
        };
        let (ret, entry) = (
            prog(&mut self.ebpf, PROG_RET)?,
            prog(&mut self.ebpf, PROG_ENTRY)?,
        );
        let mut exits = Vec::new();
        for &site in sites {
            exits.extend(multi::attach_gated_probe(
                ret.as_fd(),
                path,
                (site, f.semaphores[1]),
                c,
                pid,
            )?);
        }
        let mut fds = Vec::from(multi::attach_gated_probe(
            entry.as_fd(),
            path,
            (f.entry_offset(), f.semaphores[0]),
            c,
            pid,
        )?);
        fds.extend(exits);
        Ok(fds)
    }

    /// Stops probing the functions `gone` (the overhead governor's call),
    /// leaving every other function probed without a gap. A binary's
    /// uprobe_multi links cannot be changed, so they are rebuilt without
    /// those functions: the new links (the other [`LINK_GEN`] bit in their
    /// cookies) are created first, then the old entry link is dropped, then
    /// the old exit links, so calls of a removed function still in flight
    /// return through a live exit probe. A hit that lands while both sets are
    /// attached is reported twice, once per generation; the agent keeps one
    /// (`analyze/dedup.rs`).
    pub fn detach_funcs(&mut self, sel: &Selection, gone: &[usize], pid: u32) -> Result<()> {
        let is_gone = |i: &usize| gone.contains(i);
        for set in &mut self.multi_links {
            if !set.funcs.iter().any(is_gone) {
                continue;
            }
            let keep: Vec<usize> = set.funcs.iter().copied().filter(|i| !is_gone(i)).collect();
            let gen = !set.gen;
            let links = match (&self.multi, keep.is_empty()) {
                (Some(progs), false) => multi_links(progs, sel, &set.path(sel), &keep, gen, pid)
                    .map_err(|e| match e.contains("os error 3)") {
                        // ESRCH: the process is gone.
                        true => Error::TargetGone(pid),
                        false => Error::Load(format!("rebuilding the probes: {e}")),
                    })?,
                _ => Vec::new(),
            };
            let old = std::mem::replace(&mut set.links, links);
            // The entry link is the last one: drop it first.
            for link in old.into_iter().rev() {
                drop(link);
            }
            set.funcs = keep;
            set.gen = gen;
        }
        self.gated.retain(|(i, _)| !is_gone(i));
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.per_probe)
            .into_iter()
            .partition(|(i, _, _)| is_gone(i));
        self.per_probe = kept;
        self.detach_per_probe(gone)
    }

    /// Detaches probes attached one perf event each: entries first, then
    /// exits, with expedited RCU grace periods when there are many
    /// ([`kernel::ExpeditedRcu`]).
    fn detach_per_probe(&mut self, links: Vec<(usize, &'static str, UProbeLinkId)>) -> Result<()> {
        let _fast =
            (links.len() >= kernel::ExpeditedRcu::FROM_LINKS).then(kernel::ExpeditedRcu::begin);
        let (entries, exits): (Vec<_>, Vec<_>) = links
            .into_iter()
            .partition(|(_, name, _)| *name == PROG_ENTRY);
        for (_, name, id) in entries.into_iter().chain(exits) {
            program(&mut self.ebpf, name)?
                .detach(id)
                .map_err(|e| Error::Load(format!("detaching a probe: {}", chain(&e))))?;
        }
        Ok(())
    }

    /// The entry, exit and return-site programs loaded for uprobe_multi
    /// links, or None when this kernel cannot (the per-probe path is used
    /// then).
    fn multi_programs(ebpf: &Ebpf) -> Option<MultiPrograms> {
        if !kernel::uprobe_multi() {
            return None;
        }
        let load = |name| {
            multi::load_multi_program(EBPF_OBJECT, ebpf, name)
                .map_err(|e| {
                    if std::env::var_os("PROFILER_DEBUG").is_some() {
                        eprintln!("profiler: debug: uprobe_multi load of {name}: {e}");
                    }
                })
                .ok()
        };
        Some(MultiPrograms {
            entry: load(PROG_ENTRY)?,
            exit: load(PROG_EXIT)?,
            ret: load(PROG_RET)?,
        })
    }

    /// One line per reason the kernel gave for refusing functions: how
    /// many, why, and the first few names (not one warning each).
    pub fn refused_summary(&self) -> Vec<String> {
        refused_summary(&self.failed)
    }

    /// How the probes were attached, for the attached line.
    pub fn attach_kind(&self) -> &'static str {
        if self.multi_links.is_empty() {
            "one perf event per probe"
        } else if self.failed.is_empty() && self.per_probe.is_empty() {
            "uprobe_multi"
        } else {
            "uprobe_multi + per-probe"
        }
    }

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
        for name in [PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP] {
            load_raw_tp(&mut self.ebpf, name)?;
        }
        if hz > 0 {
            let mut names = vec![PROG_SAMPLE];
            if self.watch.wakers {
                names.push(PROG_PEER_SAMPLE);
            }
            for name in names {
                load_perf(&mut self.ebpf, name)?;
            }
        }
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

    /// Adds processes to the kernel's map of traced processes (the
    /// session's own targets, parent 0).
    pub fn trace(&mut self, tgids: &[u32]) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(profiler_common::TRACED_MAP)
            .ok_or_else(|| Error::Load("no TRACED map".into()))?;
        let mut traced: aya::maps::HashMap<_, u32, u32> =
            aya::maps::HashMap::try_from(map).map_err(|e| Error::Load(chain(&e)))?;
        for &tgid in tgids {
            traced
                .insert(tgid, 0, 0)
                .map_err(|e| Error::Load(format!("tracing PID {tgid}: {}", chain(&e))))?;
        }
        Ok(())
    }

    /// Attaches the process tracepoints: forks of traced processes (counted,
    /// or followed), and with several targets or `--follow` their execs and
    /// exits. Without BTF offsets, forks are not seen (returns false).
    pub fn attach_process_events(&mut self, tracking: Tracking) -> Result<bool> {
        if tracking.offsets.is_none() {
            return Ok(false);
        }
        attach_raw_tp(
            &mut self.ebpf,
            profiler_common::PROG_PROC_FORK,
            "sched_process_fork",
        )?;
        if tracking.by_map() {
            attach_raw_tp(
                &mut self.ebpf,
                profiler_common::PROG_PROC_EXEC,
                "sched_process_exec",
            )?;
            attach_proc_exit(&mut self.ebpf)?;
        }
        Ok(true)
    }

    /// The loaded object, for the CPU profiler.
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Takes the rings out, so they outlive the programs.
    pub fn take_rings(&mut self) -> Vec<EventRing> {
        std::mem::take(&mut self.rings)
    }

    /// A handle on the watched thread's state that tells the kernel which
    /// wait is its loop's ([`LoopSp`]): a second descriptor of the map, so
    /// the programs keep theirs.
    pub fn loop_sp(&self) -> Result<LoopSp> {
        let err = watch_map_error;
        let Some(aya::maps::Map::Array(data)) = self.ebpf.map(WATCH_MAP) else {
            return Err(err(&"missing, or not an array"));
        };
        let id = data.info().map_err(|e| err(&e))?.id();
        let map = aya::maps::Map::Array(MapData::from_id(id).map_err(|e| err(&e))?);
        Ok(LoopSp(Array::try_from(map).map_err(|e| err(&e))?))
    }

    /// Takes the counters out, so they outlive the programs.
    pub fn take_counters(&mut self) -> Result<CounterMap> {
        let map = self
            .ebpf
            .take_map(COUNTERS_MAP)
            .ok_or_else(|| Error::Load("no COUNTERS map".into()))?;
        Ok(CounterMap(
            PerCpuArray::try_from(map).map_err(|e| Error::Load(chain(&e)))?,
        ))
    }
}

/// The per-CPU counter map.
pub struct CounterMap(PerCpuArray<MapData, u64>);

impl CounterMap {
    /// One counter (a `COUNTER_*` index), summed over all CPUs.
    pub fn sum(&self, idx: u32) -> u64 {
        self.0
            .get(&idx, 0)
            .map(|v| v.iter().sum::<u64>())
            .unwrap_or(0)
    }

    /// Sums every counter over all CPUs.
    pub fn read(&self) -> Counters {
        let sum = |idx: u32| self.sum(idx);
        Counters {
            lost: sum(COUNTER_LOST),
            foreign: sum(COUNTER_FOREIGN),
            lost_comm: sum(COUNTER_LOST_COMM),
            lost_sched: sum(COUNTER_LOST_SCHED),
            stack_errors: sum(COUNTER_STACK_ERRORS),
            cpu_stack_lost: sum(profiler_common::COUNTER_CPU_USER_STACK_LOST),
            cpu_counts_full: sum(profiler_common::COUNTER_CPU_COUNTS_FULL),
            dwarf_lost: sum(profiler_common::COUNTER_DWARF_LOST),
            untraced_children: sum(profiler_common::COUNTER_UNTRACED_CHILDREN),
            traced_full: sum(profiler_common::COUNTER_TRACED_FULL),
            lost_proc: sum(profiler_common::COUNTER_LOST_PROC),
        }
    }
}

/// Creates the uprobe_multi links of binary `bi` for functions `idx`,
/// exits first and the entry link last, with generation bit `gen` in their
/// cookies. On failure, the links made so far are dropped.
fn multi_links(
    progs: &MultiPrograms,
    sel: &Selection,
    path: &Path,
    idx: &[usize],
    gen: bool,
    pid: u32,
) -> std::result::Result<Vec<OwnedFd>, String> {
    let mut links = Vec::new();
    // Probes behind a USDT semaphore get links of their own: a kernel that
    // refuses the semaphore leaves the functions' links alone.
    let (gated, plain): (Vec<usize>, Vec<usize>) = idx
        .iter()
        .partition(|&&i| sel.funcs[i].semaphores != [0; 2]);
    for (prog, kind) in [
        (&progs.ret, ProbeKind::ReturnSite),
        (&progs.exit, ProbeKind::Return),
        (&progs.entry, ProbeKind::Entry),
    ] {
        let (offsets, cookies) = probe_points(sel, &plain, &plain, kind, |i| cookie(sel, i, gen));
        if offsets.is_empty() {
            continue;
        }
        links.push(multi::attach_uprobe_multi(
            prog.as_fd(),
            path,
            &offsets,
            &cookies,
            &[],
            pid,
            kind == ProbeKind::Return,
        )?);
    }
    for &i in &gated {
        let f = &sel.funcs[i];
        let ExitProbe::Sites(sites) = &f.exit else {
            continue;
        };
        let c = cookie(sel, i, gen);
        let made = multi::attach_uprobe_multi(
            progs.ret.as_fd(),
            path,
            sites,
            &vec![c; sites.len()],
            &vec![f.semaphores[1]; sites.len()],
            pid,
            false,
        )
        .and_then(|exit| {
            multi::attach_uprobe_multi(
                progs.entry.as_fd(),
                path,
                &[f.entry_offset()],
                &[c],
                &[f.semaphores[0]],
                pid,
                false,
            )
            .map(|entry| [exit, entry])
        });
        match made {
            Ok(pair) => links.extend(pair),
            Err(e) => eprintln!("profiler: note: {} is not timed: {e}", f.name),
        }
    }
    Ok(links)
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    ebpf.program_mut(name)
        .ok_or_else(|| Error::Load(format!("program {name} missing from the eBPF object")))?
        .try_into()
        .map_err(|e: ProgramError| Error::Load(chain(&e)))
}

/// Raises the open-file limit: every probe attached on its own holds a perf
/// event and a link descriptor, two per function or more (3,000 of libc's
/// functions on 6.1 ran out at a hard limit of 4,096). Root raises the hard
/// limit too, up to the kernel's `fs.nr_open`; otherwise the soft limit
/// goes to the hard one.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit on a valid rlimit on our stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(0);
    let want = libc::rlimit {
        rlim_cur: lim.rlim_max.max(nr_open),
        rlim_max: lim.rlim_max.max(nr_open),
    };
    // SAFETY: setrlimit with a valid rlimit; refused without
    // CAP_SYS_RESOURCE, then the soft limit alone is raised.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 && lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above, within the hard limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

/// Tells the kernel the stack pointer and key of the watched thread's loop
/// wait (`WATCH_LOOP_SP`, `WATCH_LOOP_KEY`), as the agent learns them.
pub struct LoopSp(Array<MapData, u64>);

impl LoopSp {
    /// Waits at `sp` or shallower, of `key`'s family and object
    /// (`profiler_common::wait::key`), are the loop's from now on.
    pub fn set(&mut self, sp: u64, key: u64) {
        // An array slot always exists; a failure leaves the old rule. The
        // key first: a wait judged between the two writes sees the new
        // key at the old level, never a level without its key.
        let _ = self.0.set(profiler_common::WATCH_LOOP_KEY, key, 0);
        let _ = self.0.set(profiler_common::WATCH_LOOP_SP, sp, 0);
    }
}

/// See [`Probes::refused_summary`].
fn refused_summary(failed: &[(String, String)]) -> Vec<String> {
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (func, reason) in failed {
        match by_reason.iter_mut().find(|(r, _)| r == reason) {
            Some((_, funcs)) => funcs.push(func),
            None => by_reason.push((reason, vec![func])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, funcs)| {
            // ENOTSUPP from the kernel's uprobe instruction check.
            let why = if reason.contains("error 524") {
                " (ENOTSUPP: the kernel cannot place a uprobe on their first instruction)"
            } else {
                ""
            };
            let mut names = funcs.iter().take(3).copied().collect::<Vec<_>>().join(", ");
            if funcs.len() > 3 {
                names.push_str(&format!(" and {} more", funcs.len() - 3));
            }
            format!(
                "profiler: warning: the kernel refused {} function{}: {reason}{why}; not traced: {names}",
                funcs.len(),
                if funcs.len() == 1 { "" } else { "s" }
            )
        })
        .collect()
}

#[cfg(test)]
mod refused_tests {
    use super::refused_summary;

    #[test]
    fn refused_functions_are_summed_up_by_reason() {
        let e524 = "perf_event_open failed: Unknown error 524".to_string();
        let failed: Vec<(String, String)> = ["a", "b", "c", "d"]
            .iter()
            .map(|f| (f.to_string(), e524.clone()))
            .chain([("z".to_string(), "other".to_string())])
            .collect();
        let lines = refused_summary(&failed);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("refused 4 functions"), "{}", lines[0]);
        assert!(lines[0].contains("ENOTSUPP"), "{}", lines[0]);
        assert!(lines[0].ends_with("a, b, c and 1 more"), "{}", lines[0]);
        assert!(
            lines[1].contains("refused 1 function: other"),
            "{}",
            lines[1]
        );
    }
}
