//! Loads the eBPF object, attaches the entry/exit uprobes by file offset
//! (cookie = function index, scope = the target PID), and reads the
//! per-CPU counters. Dropping [`Probes`] detaches everything: the links are
//! BPF links owned by file descriptors, so nothing outlives the agent, even
//! after SIGKILL.
//!
//! By concept: this file loads the object and its programs and holds what
//! the session reads back (counters, rings, the loop's wait rule);
//! [`uprobes`] attaches and detaches the functions' probes (uprobe_multi
//! links, or one perf event a probe); [`watched`] attaches what follows
//! the watched thread (the scheduler's tracepoints, the in-dispatch and
//! waker samplers, and the loop's wait syscalls).
mod uprobes;
mod watched;

use uprobes::{program, BinLinks, MultiPrograms};
use watched::Waits;
pub(crate) use watched::{attach_wait_tracepoints, detach_together};
pub use watched::{CatchUp, WaitTracepoints};

use std::os::fd::OwnedFd;

use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::{
        trace_point::TracePointLink, uprobe::UProbeLinkId, PerfEvent, ProgramError, RawTracePoint,
        UProbe,
    },
    Ebpf, EbpfLoader,
};
use profiler_common::{
    unwind_mode, COUNTERS_MAP, COUNTER_FOREIGN, COUNTER_LOST, COUNTER_LOST_COMM,
    COUNTER_LOST_SCHED, COUNTER_STACK_ERRORS, PROG_ENTRY, PROG_EXIT, PROG_RET, SAMPLE_ALL_GLOBAL,
    TARGET_TGID_GLOBAL, UNWIND_MODE_GLOBAL, UNWIND_ROWS_MAP, WAKERS_GLOBAL, WAKEUP_BYTES_GLOBAL,
    WATCH_MAP, WATCH_TID_GLOBAL,
};

use super::{
    kernel,
    rings::{self, EventRing, RingSpec},
    task_btf::TaskOffsets,
};
use crate::{cli::UnwindMode, error::chain, tracee::cgroup::Cgroup, Error, Result};

pub(crate) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// The `URETPROBE_OFFSETS` setting: where return uprobes keep the return
/// addresses they replace, so stacks walked through them name the callers
/// (zeros: unknown, and the trampoline's address stays in those stacks).
pub(crate) fn uret_setting() -> [u32; profiler_common::uret::COUNT] {
    match super::task_btf::uretprobe_offsets() {
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
        Err(e) => Err(kernel::load_error(name, e)),
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
        Err(e) => Err(kernel::load_error(name, e)),
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
        Err(e) => Err(kernel::load_error(name, e)),
    }
}

/// A failure to reach the [`WATCH_MAP`] map.
fn watch_map_error(e: &dyn std::fmt::Display) -> Error {
    Error::Load(format!("the {WATCH_MAP} map: {e}"))
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
        let uret = uret_setting();
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
            prog.load().map_err(|e| kernel::load_error(name, e))?;
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
