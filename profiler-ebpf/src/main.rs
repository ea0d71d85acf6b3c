//! Kernel programs of the profiler.
//!
//! - `prof_entry`, and `prof_ret` or `prof_exit`: one entry uprobe per
//!   traced function and either a uprobe on each of its return instructions
//!   (`prof_ret`) or a return uprobe (`prof_exit`), with the function's
//!   index as the probe cookie (plus [`COOKIE_DISPATCH`] for dispatch
//!   functions). Each hit writes a 24-byte [`Event`] to the `EVENTS` ring
//!   buffer.
//! - `prof_sched_switch` / `prof_sched_wakeup` (on `sched_waking`):
//!   scheduler transitions of the watched thread only, so the agent can
//!   split a dispatch's wall time into on-CPU, blocked and runnable time
//!   exactly; a wake-up while it is blocked in a dispatch also names the
//!   waker, with its stacks.
//! - `prof_peer_sample`: a `cpu-clock` sampler on every CPU that samples
//!   the target's other threads only while the watched thread is blocked in
//!   a dispatch (what its waker was doing meanwhile).
//! - `prof_sample`: a `cpu-clock` perf-event sampler on the watched thread;
//!   it writes stacks only while a dispatch is open, so fast dispatches and
//!   idle waits cost nothing.
#![no_std]
#![no_main]

// The programs read x86-64 registers (rsp, r14, the pt_regs layout) and
// rely on the x86-64 stack layout (the return address at CFA - 8): any
// other architecture needs its own accessors first.
#[cfg(any(
    bpf_target_arch = "aarch64",
    bpf_target_arch = "arm",
    bpf_target_arch = "loongarch64",
    bpf_target_arch = "mips",
    bpf_target_arch = "powerpc64",
    bpf_target_arch = "riscv64",
    bpf_target_arch = "s390x"
))]
compile_error!("profiler-ebpf supports x86_64 only: it reads x86-64 registers and stack frames");

mod python;
mod unwind;
mod v8;
mod wait;

use aya_ebpf::{
    bindings::{
        BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
    },
    btf_maps::{ArrayOfMaps, RingBuf},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_stack,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_get_attach_cookie, generated::bpf_get_current_ancestor_cgroup_id,
        generated::bpf_get_smp_processor_id,
        generated::bpf_probe_read_user as bpf_probe_read_user_raw, generated::bpf_ringbuf_query,
    },
    macros::{btf_map, map, perf_event, raw_tracepoint, uprobe, uretprobe},
    maps::{
        ring_buf::RingBufEntry, Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, StackTrace,
    },
    programs::{
        tracing::StackIdContext, PerfEventContext, ProbeContext, RawTracePointContext,
        RetProbeContext,
    },
    EbpfContext,
};
use profiler_common::{
    track, unwind_mode, CommEvent, DwarfSample, Event, GoEvent, OffCpuStart, ProcEvent, SampleKey,
    StackEvent, WakerEvent, COOKIE_DISPATCH, COOKIE_GO, COUNTER_COUNT, COUNTER_CPU_COUNTS_FULL,
    COUNTER_CPU_SAMPLES, COUNTER_CPU_USER_STACK_LOST, COUNTER_DWARF_LOST, COUNTER_FOREIGN,
    COUNTER_LOST, COUNTER_LOST_COMM, COUNTER_LOST_PROC, COUNTER_LOST_SCHED, COUNTER_NOTICES_LOST,
    COUNTER_STACK_ERRORS, COUNTER_TRACED_FULL, COUNTER_UNTRACED_CHILDREN, COUNTER_USER_STACKS_FULL,
    CPU_COUNTS_CAPACITY, CPU_STACKS_CAPACITY, DWARF_STACK_BYTES, EVENTS_SLOTS, GO_STACK_BASE,
    KIND_COMM, KIND_DWARF, KIND_ENTRY, KIND_EXIT, KIND_GO_ENTRY, KIND_GO_EXIT, KIND_NEW_PROCESS,
    KIND_PEER_SAMPLE, KIND_PROC, KIND_SAMPLE, KIND_SCHED_IN, KIND_SCHED_OUT, KIND_WAKER,
    KIND_WAKEUP, MAX_KERNEL_FRAMES, MAX_USER_FRAMES, NOTICED_CAPACITY, NOTICE_PENDING, PROC_EXEC,
    PROC_EXIT, PROC_FORK, SCHED_BLOCKED, SCHED_RUNNABLE, SEEN_THREADS_CAPACITY, TRACED_CAPACITY,
    WAKER_KERNEL_THREAD, WATCH_BLOCKED, WATCH_DEPTH, WATCH_ITER, WATCH_SLOTS, WATCH_TASK,
};

/// A value the agent sets at load time (`.rodata`, through
/// `EbpfLoader::override_global`), read with a volatile load so the
/// compiler cannot fold the placeholder. Unlike aya's `Global`, it holds no
/// `MaybeUninit`: the kernel refuses that union's BTF, and without BTF a
/// program cannot use a `bpf_loop` callback (the table unwinder does).
#[repr(transparent)]
struct Setting<T>(T);

impl<T: Copy> Setting<T> {
    const fn new(value: T) -> Self {
        Setting(value)
    }

    #[inline(always)]
    fn load(&self) -> T {
        // SAFETY: a plain read of a static.
        unsafe { core::ptr::read_volatile(&self.0) }
    }
}

/// Set by the agent at load time: the traced process's tgid.
#[unsafe(no_mangle)]
static TARGET_TGID: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: how traced processes are told apart (a
/// `track` constant: `TARGET_TGID` alone, or the `TRACED` map, followed
/// through forks or not).
#[unsafe(no_mangle)]
static TRACK: Setting<u32> = Setting::new(0);

/// Set by the agent at load time, from the kernel's BTF: byte offsets of
/// `pid`, `tgid` and `exit_code` in `task_struct`.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: Setting<u32> = Setting::new(0);
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: Setting<u32> = Setting::new(0);
#[unsafe(no_mangle)]
static TASK_EXIT_CODE_OFFSET: Setting<u32> = Setting::new(0);

/// Set by the agent at load time, from the kernel's BTF: where a task's
/// pending return uprobes are (`profiler_common::uret`; zeros: unknown).
#[unsafe(no_mangle)]
static URETPROBE_OFFSETS: Setting<[u32; profiler_common::uret::COUNT]> =
    Setting::new([0; profiler_common::uret::COUNT]);

/// Set by the agent at load time: the watched thread (0: none).
#[unsafe(no_mangle)]
static WATCH_TID: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: name who wakes the watched thread while
/// it is blocked in a dispatch (1), or not (0, `record --no-wakers`): then
/// `WATCH_BLOCKED` is never set, so no waker record is written and the
/// waker sampler (not attached either) would have nothing to do.
#[unsafe(no_mangle)]
static WAKERS: Setting<u32> = Setting::new(1);

/// Set by the agent at load time: wake the agent only once this many bytes
/// are pending, so a busy target does not pay for a wake-up per event. The
/// agent also drains the ring on a short timer, so quiet periods are not
/// delayed by more than that tick.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: Setting<u64> = Setting::new(0);

/// Set by the agent at load time: copy user stacks of user-mode samples
/// for DWARF unwinding instead of walking frame pointers.
#[unsafe(no_mangle)]
static DWARF_MODE: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: how user stacks are walked (an
/// `unwind_mode` constant: frame pointers, or the compiled tables).
#[unsafe(no_mangle)]
static UNWIND_MODE: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: sample every process (1) or only the target.
#[unsafe(no_mangle)]
static SAMPLE_ALL: Setting<u32> = Setting::new(0);

/// Set by the agent at load time (`sample --all --cgroup`): sample only
/// tasks in the subtree of the cgroup v2 with this id (0: every task).
#[unsafe(no_mangle)]
static CGROUP_ID: Setting<u64> = Setting::new(0);

/// Set by the agent at load time: the level of that cgroup (root: 0).
#[unsafe(no_mangle)]
static CGROUP_LEVEL: Setting<u32> = Setting::new(0);

/// True when no cgroup filter is set, or the current task is in the
/// filter's subtree: its cgroup's ancestor at the filter's level is it.
#[inline(always)]
fn in_cgroup() -> bool {
    let id = CGROUP_ID.load();
    // SAFETY: a helper call with a plain integer argument.
    id == 0 || unsafe { bpf_get_current_ancestor_cgroup_id(CGROUP_LEVEL.load() as i32) } == id
}

/// Set by the agent at load time: 1 to write to the current CPU's ring,
/// 0 to write everything to the shared ring in slot 0 of `EVENTS`.
#[unsafe(no_mangle)]
static PER_CPU_RINGS: Setting<u32> = Setting::new(0);

/// A ring of `EVENTS`. Its size here only shapes the template the kernel
/// checks inner maps against (ring sizes may differ); the agent creates
/// the rings, `--ring-size` bytes each.
type Ring = RingBuf<u64, 4096>;

/// The rings, one per CPU (or one shared, in slot 0), filled in by the
/// agent after load; its slot count is set to the possible CPUs.
#[btf_map(name = "EVENTS")]
static EVENTS: ArrayOfMaps<Ring, { EVENTS_SLOTS as usize }> = ArrayOfMaps::new();

/// The ring this program writes to: the current CPU's, or the shared one.
/// Records of one thread in one ring keep its order; the agent merges the
/// rings by timestamp.
#[inline(always)]
fn ring() -> Option<&'static Ring> {
    let slot = if PER_CPU_RINGS.load() != 0 {
        // SAFETY: a helper without arguments.
        unsafe { bpf_get_smp_processor_id() }
    } else {
        0
    };
    EVENTS.get(slot)
}

/// Reserves a `T` in this CPU's ring, with the flags to submit it with (a
/// wake-up only once enough is pending in that ring). None: the ring is
/// full (or missing); the caller counts the loss.
#[inline(always)]
fn reserve<T: 'static>() -> Option<(RingBufEntry<T>, u64)> {
    let ring = ring()?;
    let slot = ring.reserve_untyped::<T>(0)?;
    Some((slot, wakeup_flags(ring)))
}

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

#[map(name = "SEEN_THREADS")]
static SEEN_THREADS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(SEEN_THREADS_CAPACITY, 0);

/// Traced tgid -> parent tgid (0: a target the agent named). Used when
/// `TRACK` is not `track::ONE`.
#[map(name = "TRACED")]
static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(TRACED_CAPACITY, 0);

#[map(name = "CPU_STACKS")]
static CPU_STACKS: StackTrace = StackTrace::with_max_entries(CPU_STACKS_CAPACITY, 0);

#[map(name = "CPU_COUNTS")]
static CPU_COUNTS: PerCpuHashMap<SampleKey, u64> =
    PerCpuHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "OFFCPU_START")]
static OFFCPU_START: HashMap<u64, OffCpuStart> = HashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "OFFCPU_NS")]
static OFFCPU_NS: PerCpuHashMap<SampleKey, u64> =
    PerCpuHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "CPU_COMMS")]
static CPU_COMMS: LruHashMap<u32, [u8; 16]> = LruHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "WATCH")]
static WATCH: Array<u64> = Array::with_max_entries(WATCH_SLOTS, 0);

/// Processes the agent was told of ([`notice_new_process`]): how many
/// times it was told again, and [`NOTICE_PENDING`] until it read the
/// process's mappings.
#[map(name = "NOTICED")]
static NOTICED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(NOTICED_CAPACITY, 0);

/// Nonzero while the agent reads notices on a timer, every few
/// milliseconds, as it does while they keep coming: a notice then wakes no
/// one (a wake-up costs the agent more than reading the ring).
#[map(name = "NOTICE_QUIET")]
static NOTICE_QUIET: Array<u64> = Array::with_max_entries(1, 0);

/// How many times one process is told of again because a stack left the
/// mappings the agent knows of: JIT code is in none of them, so this stops.
const RENOTICES: u8 = 4;

/// `sample --all`: tells the agent of a process sampled for the first time
/// (a [`KIND_NEW_PROCESS`] record), so that it reads the process's mappings
/// (names, unwind tables) within a tick, while a short-lived process still
/// runs, not at its next scan. Told again, a few times, when a new stack
/// has a frame outside the mappings it read (`outside`): a first sample in
/// the dynamic loader, before libc was mapped, or a `dlopen`. A notice the
/// ring had no room for is counted and forgotten, so the process's next new
/// stack tells the agent again.
#[inline(always)]
fn notice_new_process(pid: u32, outside: bool) {
    if SAMPLE_ALL.load() == 0 {
        return;
    }
    if NOTICED
        .insert(pid, NOTICE_PENDING, BPF_NOEXIST as u64)
        .is_err()
    {
        if !outside {
            return;
        }
        let Some(told) = NOTICED.get_ptr_mut(pid) else {
            return;
        };
        // SAFETY: a value of the map; two CPUs racing here at worst tell
        // the agent once more. While a notice is pending (the agent has
        // not read the mappings since), stacks outside them are expected
        // and use none of the process's few notices: the program's start
        // in the dynamic loader would spend them all before its `dlopen`.
        unsafe {
            if *told & NOTICE_PENDING != 0 || *told >= RENOTICES {
                return;
            }
            *told = (*told + 1) | NOTICE_PENDING;
        }
    }
    let Some((mut slot, _)) = reserve::<Event>() else {
        // Told at its next new stack instead.
        let _ = NOTICED.remove(pid);
        bump(COUNTER_NOTICES_LOST);
        return;
    };
    // SAFETY: a reserved slot of the right size, written whole.
    unsafe {
        slot.as_mut_ptr().write(Event {
            ts_ns: bpf_ktime_get_ns(),
            tid: pid,
            word: Event::pack(KIND_NEW_PROCESS, 0),
            sp: 0,
        });
    }
    // Wakes the agent if it waits for notices (not while it polls them).
    let quiet = NOTICE_QUIET.get(0).is_some_and(|q| *q != 0);
    slot.submit(if quiet { BPF_RB_NO_WAKEUP as u64 } else { 0 });
}

/// Copies the top of the user stack and the registers of a user-mode
/// sample into the ring. Tries shorter copies when the stack's mapping ends
/// sooner (a read that crosses unmapped memory fails whole).
#[inline(always)]
fn emit_dwarf(ctx: &PerfEventContext, pid: u32, tid: u32, ip: u64, sp: u64, bp: u64) {
    let Some((mut slot, wake)) = reserve::<DwarfSample>() else {
        bump(COUNTER_DWARF_LOST);
        return;
    };
    let _ = ctx;
    let ev = slot.as_mut_ptr();
    unsafe {
        (*ev).event = Event {
            ts_ns: bpf_ktime_get_ns(),
            tid,
            word: Event::pack(KIND_DWARF, 0),
            sp,
        };
        (*ev).pid = pid;
        (*ev).ip = ip;
        (*ev).bp = bp;
        let dst = (*ev).stack.as_mut_ptr();
        let src = sp as *const core::ffi::c_void;
        let mut len = 0u32;
        for size in [DWARF_STACK_BYTES, 8192, 4096, 2048, 1024, 512] {
            if bpf_probe_read_user_raw(dst.cast(), size as u32, src) == 0 {
                len = size as u32;
                break;
            }
        }
        (*ev).len = len;
    }
    slot.submit(wake);
}

/// The arguments of the `sched_switch` raw tracepoint:
/// `(bool preempt, task *prev, task *next, unsigned prev_state)`. It runs
/// in `prev`'s context.
struct SchedSwitch {
    prev: u64,
    next: u64,
    /// `prev` left the CPU to sleep (not preempted, and not runnable).
    blocked: bool,
}

impl SchedSwitch {
    #[inline(always)]
    fn of(ctx: &RawTracePointContext) -> Self {
        let preempt: u64 = ctx.arg(0);
        let prev_state: u64 = ctx.arg(3);
        SchedSwitch {
            prev: ctx.arg(1),
            next: ctx.arg(2),
            blocked: preempt & 0xff == 0 && prev_state as u32 != 0,
        }
    }
}

/// True when user stacks are walked with the compiled tables.
#[inline(always)]
fn tables() -> bool {
    UNWIND_MODE.load() == unwind_mode::TABLES
}

/// The current user stack's id in `CPU_STACKS` (frame pointers) or key in
/// `USER_STACKS` (tables): `(user_stack, user_hash)`.
#[inline(always)]
fn user_stack_key<C: EbpfContext + StackIdContext>(ctx: &C, pid: u32) -> (i32, u64) {
    if tables() {
        return (-1, unwind::store(pid, || bump(COUNTER_USER_STACKS_FULL)));
    }
    match ctx.get_stackid(&CPU_STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => (id as i32, 0),
        Err(_) => {
            bump(COUNTER_CPU_USER_STACK_LOST);
            (-1, 0)
        }
    }
}

#[inline(always)]
fn bump(counter: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter) {
        // Per-CPU slot; tracing programs do not nest on one CPU for these
        // hooks, so a plain increment is exact.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn watch_get(slot: u32) -> u64 {
    WATCH.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn watch_set(slot: u32, value: u64) {
    if let Some(p) = WATCH.get_ptr_mut(slot) {
        // SAFETY: a u64 slot of an array map; a racing writer on another
        // CPU writes the same kind of value.
        unsafe { *p = value };
    }
}

/// True while the watched thread is inside a dispatch: a dispatch
/// function's frame is open, or an iteration of its event loop runs.
#[inline(always)]
fn in_dispatch() -> bool {
    watch_get(WATCH_DEPTH) > 0 || watch_get(WATCH_ITER) != 0
}

#[inline(always)]
fn watch_ptr(slot: u32) -> Option<*mut u64> {
    WATCH.get_ptr_mut(slot)
}

/// Flags for submitting to `ring`: wake the agent only when enough is
/// pending in it.
#[inline(always)]
fn wakeup_flags(ring: &Ring) -> u64 {
    let map = core::ptr::from_ref(ring).cast_mut().cast();
    // SAFETY: `ring` is a ring-buffer map the kernel handed out.
    let pending = unsafe { bpf_ringbuf_query(map, BPF_RB_AVAIL_DATA as u64) };
    if pending >= WAKEUP_BYTES.load() {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Writes a 24-byte event, counting a failed reservation in `lost_counter`.
#[inline(always)]
fn emit_event(ts_ns: u64, tid: u32, kind: u32, func: u32, sp: u64, lost_counter: u32) {
    match reserve::<Event>() {
        Some((mut slot, wake)) => {
            slot.write(Event {
                ts_ns,
                tid,
                word: Event::pack(kind, func),
                sp,
            });
            slot.submit(wake);
        }
        None => bump(lost_counter),
    }
}

/// Fills `user` (MAX_USER_FRAMES slots) with the current user stack,
/// innermost first; returns the frames used and why the table unwinder's
/// walk ended (0 for the kernel's frame-pointer walk).
#[inline(always)]
unsafe fn fill_user<C: EbpfContext>(ctx: &C, user: *mut u64) -> (u32, u32) {
    if tables() {
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let Some((stack, _)) = unwind::walk(pid, MAX_USER_FRAMES as u32) else {
            bump(COUNTER_STACK_ERRORS);
            return (0, 0);
        };
        let len = ((*stack).len as usize).min(MAX_USER_FRAMES);
        for i in 0..MAX_USER_FRAMES {
            if i >= len {
                break;
            }
            *user.add(i) = (*stack).frames[i];
        }
        return (len as u32, (*stack).end);
    }
    let n = bpf_get_stack(
        ctx.as_ptr(),
        user.cast(),
        (MAX_USER_FRAMES * 8) as u32,
        BPF_F_USER_STACK as u64,
    );
    if n < 0 {
        bump(COUNTER_STACK_ERRORS);
    }
    if n > 0 {
        ((n / 8) as u32, 0)
    } else {
        (0, 0)
    }
}

/// Fills `kernel` (MAX_KERNEL_FRAMES slots) with the current kernel stack,
/// innermost first; returns the frames used.
#[inline(always)]
unsafe fn fill_kernel<C: EbpfContext>(ctx: &C, kernel: *mut u64) -> u32 {
    let n = bpf_get_stack(
        ctx.as_ptr(),
        kernel.cast(),
        (MAX_KERNEL_FRAMES * 8) as u32,
        0,
    );
    if n > 0 {
        (n / 8) as u32
    } else {
        0
    }
}

/// Writes an event with the current user and kernel stacks.
#[inline(always)]
fn emit_stacks<C: EbpfContext>(ctx: &C, ts_ns: u64, tid: u32, kind: u32, state: u32) {
    let Some((mut slot, wake)) = reserve::<StackEvent>() else {
        bump(COUNTER_LOST_SCHED);
        return;
    };
    let ev = slot.as_mut_ptr();
    unsafe {
        (*ev).event = Event {
            ts_ns,
            tid,
            word: Event::pack(kind, state),
            sp: 0,
        };
        let (len, end) = fill_user(ctx, (*ev).user.as_mut_ptr());
        (*ev).user_len = len;
        // Why the walk ended, for the sampler's quality figures.
        (*ev).event.sp = u64::from(end);
        (*ev).kernel_len = fill_kernel(ctx, (*ev).kernel.as_mut_ptr());
    }
    slot.submit(wake);
}

/// Writes who is waking the watched thread (the current task, in
/// `sched_waking`), with its stacks.
#[inline(always)]
fn emit_waker(ctx: &RawTracePointContext, ts_ns: u64, tid: u32) {
    let Some((mut slot, wake)) = reserve::<WakerEvent>() else {
        bump(COUNTER_LOST_SCHED);
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let ev = slot.as_mut_ptr();
    unsafe {
        (*ev).event = Event {
            ts_ns,
            tid,
            word: Event::pack(KIND_WAKER, 0),
            sp: 0,
        };
        (*ev).waker_tid = pid_tgid as u32;
        (*ev).waker_pid = (pid_tgid >> 32) as u32;
        (*ev).pad = 0;
        (*ev).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        if unwind::has_user_regs() {
            (*ev).flags = 0;
            (*ev).user_len = fill_user(ctx, (*ev).user.as_mut_ptr()).0;
        } else {
            (*ev).flags = WAKER_KERNEL_THREAD;
            (*ev).user_len = 0;
        }
        (*ev).kernel_len = fill_kernel(ctx, (*ev).kernel.as_mut_ptr());
    }
    slot.submit(wake);
}

/// True when process `tgid` is traced.
#[inline(always)]
fn is_traced(tgid: u32) -> bool {
    if TRACK.load() == track::ONE {
        tgid == TARGET_TGID.load()
    } else {
        unsafe { TRACED.get(tgid) }.is_some()
    }
}

/// Announces a thread the first time it hits a probe, with its name and
/// its process (the header's function field).
#[inline(always)]
fn announce_thread(tid: u32, tgid: u32, ts_ns: u64) {
    if unsafe { SEEN_THREADS.get(tid) }.is_some() {
        return;
    }
    let _ = SEEN_THREADS.insert(tid, 0, 0);
    match reserve::<CommEvent>() {
        Some((mut slot, wake)) => {
            slot.write(CommEvent {
                event: Event {
                    ts_ns,
                    tid,
                    word: Event::pack(KIND_COMM, tgid),
                    sp: 0,
                },
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            });
            let _ = wake;
            slot.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => bump(COUNTER_LOST_COMM),
    }
}

/// Keeps the watched thread's dispatch depth and task pointer current.
#[inline(always)]
fn track_watched(kind: u32, cookie: u64) {
    if let Some(task) = watch_ptr(WATCH_TASK) {
        unsafe { *task = bpf_get_current_task() };
    }
    if cookie & COOKIE_DISPATCH == 0 {
        return;
    }
    if let Some(depth) = watch_ptr(WATCH_DEPTH) {
        unsafe {
            if kind == KIND_ENTRY {
                *depth += 1;
            } else if *depth > 0 {
                *depth -= 1;
            }
        }
    }
}

/// Writes a Go function's entry or exit, keyed by goroutine (`g`, in r14
/// under Go's register ABI) with the depth below the goroutine stack's top
/// (`g.stack.hi`, at offset 8 of `runtime.g`). Returns false when `g`
/// cannot be read; the caller then writes a plain event.
#[inline(always)]
fn emit_go(ts_ns: u64, tid: u32, kind: u32, func: u32, sp: u64, g: u64) -> bool {
    if g == 0 {
        return false;
    }
    // SAFETY: bpf_probe_read_user copes with any address; failure is an Err.
    let Ok(hi) = (unsafe { bpf_probe_read_user((g + 8) as *const u64) }) else {
        return false;
    };
    if hi < sp || hi - sp >= GO_STACK_BASE {
        return false;
    }
    let kind = if kind == KIND_ENTRY {
        KIND_GO_ENTRY
    } else {
        KIND_GO_EXIT
    };
    match reserve::<GoEvent>() {
        Some((mut slot, wake)) => {
            slot.write(GoEvent {
                event: Event {
                    ts_ns,
                    tid,
                    word: Event::pack(kind, func),
                    sp: sp - hi + GO_STACK_BASE,
                },
                goroutine: g,
            });
            slot.submit(wake);
        }
        None => bump(COUNTER_LOST),
    }
    true
}

/// Handles one probe hit. Does nothing for other processes (the probes are
/// scoped to the PID already; this is a second guard). `g` is register r14
/// (Go's current goroutine, for Go functions).
#[inline(always)]
fn on_probe<C: EbpfContext>(ctx: &C, kind: u32, sp: u64, g: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_traced(tgid) {
        bump(COUNTER_FOREIGN);
        return;
    }
    let tid = pid_tgid as u32;
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if tid == WATCH_TID.load() {
        track_watched(kind, cookie);
    }
    announce_thread(tid, tgid, ts_ns);
    if cookie & COOKIE_GO != 0 && emit_go(ts_ns, tid, kind, cookie as u32, sp, g) {
        return;
    }
    emit_event(ts_ns, tid, kind, cookie as u32, sp, COUNTER_LOST);
}

#[uprobe]
pub fn prof_entry(ctx: ProbeContext) -> u32 {
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_ENTRY, sp, g);
    0
}

#[uretprobe]
pub fn prof_exit(ctx: RetProbeContext) -> u32 {
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_EXIT, sp, g);
    0
}

/// Return-site probe: a plain uprobe on one of a function's `ret`
/// instructions (or a tail-call `jmp`), which leaves the return address on
/// the stack alone, unlike a uretprobe. The frame is torn down there, so
/// the stack pointer points at the return address, as at entry; adding 8
/// gives what a uretprobe would report after the return, and the agent
/// pairs both the same way.
#[uprobe]
pub fn prof_ret(ctx: ProbeContext) -> u32 {
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_EXIT, sp.wrapping_add(8), g);
    0
}

/// Writes a process event about `tgid`.
#[inline(always)]
fn emit_proc(tgid: u32, what: u32, parent: u32, code: u32) {
    match reserve::<ProcEvent>() {
        Some((mut slot, wake)) => {
            slot.write(ProcEvent {
                event: Event {
                    ts_ns: unsafe { bpf_ktime_get_ns() },
                    tid: tgid,
                    word: Event::pack(KIND_PROC, what),
                    sp: 0,
                },
                parent,
                code,
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            });
            let _ = wake;
            slot.submit(BPF_RB_FORCE_WAKEUP as u64);
        }
        None => bump(COUNTER_LOST_PROC),
    }
}

/// Reads a `u32` at `offset` in a kernel `task_struct`.
#[inline(always)]
fn task_u32(task: u64, offset: u32) -> Option<u32> {
    // SAFETY: bpf_probe_read_kernel copes with any address.
    unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u32) }.ok()
}

/// `sched_process_fork(task *parent, task *child)`, in the parent's
/// context, before the child first runs. A new process (not a thread) of a
/// traced one is added to `TRACED` under `--follow`, so its first
/// instruction is already traced; otherwise it is only counted.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn prof_proc_fork(ctx: RawTracePointContext) -> i32 {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_traced(parent) {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let (Some(pid), Some(tgid)) = (
        task_u32(child, TASK_PID_OFFSET.load()),
        task_u32(child, TASK_TGID_OFFSET.load()),
    ) else {
        return 0;
    };
    if pid != tgid {
        // A thread of the same process.
        return 0;
    }
    if TRACK.load() != track::FOLLOW {
        bump(COUNTER_UNTRACED_CHILDREN);
        return 0;
    }
    if TRACED.insert(tgid, parent, 0).is_err() {
        bump(COUNTER_TRACED_FULL);
        return 0;
    }
    emit_proc(tgid, PROC_FORK, parent, 0);
    0
}

/// `sched_process_exec(task *p, pid_t old_pid, linux_binprm *bprm)`, in the
/// process's context once the new image is in place.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn prof_proc_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if SAMPLE_ALL.load() != 0 {
        // A new image, new mappings: its next sample tells the agent again
        // (a process first sampled between fork and exec was read as its
        // parent's image).
        let _ = NOTICED.remove(tgid);
    }
    if is_traced(tgid) {
        emit_proc(tgid, PROC_EXEC, 0, 0);
    }
    0
}

/// `sched_process_exit(task *p, bool group_dead)`, in the exiting thread's
/// context; the process is gone when `group_dead`.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn prof_proc_exit(ctx: RawTracePointContext) -> i32 {
    let group_dead: u64 = ctx.arg(1);
    if group_dead & 0xff == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if SAMPLE_ALL.load() != 0 {
        // A process given this PID later is told of too.
        let _ = NOTICED.remove(tgid);
    }
    if !is_traced(tgid) {
        return 0;
    }
    let task = unsafe { bpf_get_current_task() };
    let code = task_u32(task, TASK_EXIT_CODE_OFFSET.load()).unwrap_or(0);
    emit_proc(tgid, PROC_EXIT, 0, code);
    if TRACK.load() != track::ONE {
        let _ = TRACED.remove(tgid);
    }
    0
}

/// `sched_switch(bool preempt, task *prev, task *next, unsigned prev_state)`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn prof_sched_switch(ctx: RawTracePointContext) -> i32 {
    let task = watch_get(WATCH_TASK);
    if task == 0 {
        return 0;
    }
    let SchedSwitch {
        prev,
        next,
        blocked,
    } = SchedSwitch::of(&ctx);
    if wait::idle_in_loop() {
        return 0;
    }
    let tid = WATCH_TID.load();
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if prev == task {
        if blocked && in_dispatch() {
            // Set first: a waker on another CPU may run before this
            // switch has finished.
            if WAKERS.load() != 0 {
                watch_set(WATCH_BLOCKED, 1);
            }
            // Runs in the context of `prev`: these are its stacks.
            emit_stacks(&ctx, ts_ns, tid, KIND_SCHED_OUT, SCHED_BLOCKED);
        } else {
            let state = if blocked {
                SCHED_BLOCKED
            } else {
                SCHED_RUNNABLE
            };
            emit_event(ts_ns, tid, KIND_SCHED_OUT, state, 0, COUNTER_LOST_SCHED);
        }
    }
    if next == task {
        if WAKERS.load() != 0 {
            watch_set(WATCH_BLOCKED, 0);
        }
        emit_event(ts_ns, tid, KIND_SCHED_IN, 0, 0, COUNTER_LOST_SCHED);
    }
    0
}

/// `sched_waking(task *p)`, in the waker's context. Every wake-up in the
/// system runs it: anything but the watched thread costs one map read and
/// a compare. A wake-up of the watched thread while it is blocked inside a
/// dispatch first writes who woke it ([`WakerEvent`]).
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn prof_sched_wakeup(ctx: RawTracePointContext) -> i32 {
    let task = watch_get(WATCH_TASK);
    let p: u64 = ctx.arg(0);
    if task != 0 && p == task && !wait::idle_in_loop() {
        let ts_ns = unsafe { bpf_ktime_get_ns() };
        let tid = WATCH_TID.load();
        if watch_get(WATCH_BLOCKED) != 0 {
            watch_set(WATCH_BLOCKED, 0);
            emit_waker(&ctx, ts_ns, tid);
        }
        emit_event(ts_ns, tid, KIND_WAKEUP, 0, 0, COUNTER_LOST_SCHED);
    }
    0
}

/// `cpu-clock` tick on some CPU (the waker sampler): while the watched
/// thread is blocked inside a dispatch, samples the other threads of the
/// target, so the agent can tell what the thread that woke it was doing
/// meanwhile. Otherwise one map read.
#[perf_event]
pub fn prof_peer_sample(ctx: PerfEventContext) -> u32 {
    if watch_get(WATCH_BLOCKED) == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if (pid_tgid >> 32) as u32 != TARGET_TGID.load() || tid == WATCH_TID.load() {
        return 0;
    }
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    emit_stacks(&ctx, ts_ns, tid, KIND_PEER_SAMPLE, 0);
    0
}

/// `cpu-clock` sample of the watched thread.
#[perf_event]
pub fn prof_sample(ctx: PerfEventContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if tid == WATCH_TID.load() && tid != 0 && in_dispatch() {
        let ts_ns = unsafe { bpf_ktime_get_ns() };
        emit_stacks(&ctx, ts_ns, tid, KIND_SAMPLE, 0);
    }
    0
}

/// CPU profile: one `cpu-clock` tick on some CPU. Counts the (process,
/// thread, user stack, kernel stack) that was running, in the kernel, so the
/// ring buffer carries nothing per sample.
#[perf_event]
pub fn prof_cpu_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 || (SAMPLE_ALL.load() == 0 && pid != TARGET_TGID.load()) || !in_cgroup() {
        return 0;
    }
    bump(COUNTER_CPU_SAMPLES);
    if DWARF_MODE.load() != 0 {
        let regs = unsafe { &(*ctx.ctx).regs };
        if regs.cs & 3 == 3 {
            emit_dwarf(&ctx, pid, tid, regs.rip, regs.rsp, regs.rbp);
            return 0;
        }
    }
    let (user_stack, user_hash) = user_stack_key(&ctx, pid);
    let kernel_stack = match ctx.get_stackid(&CPU_STACKS, 0) {
        Ok(id) => id as i32,
        // No kernel stack: the sample was taken in user mode.
        Err(_) => -1,
    };
    let key = SampleKey {
        pid,
        tid,
        user_stack,
        kernel_stack,
        user_hash,
    };
    match CPU_COUNTS.get_ptr_mut(key) {
        // Per-CPU values: no other CPU writes this slot.
        Some(count) => unsafe { *count += 1 },
        None => {
            if CPU_COUNTS.insert(key, 1, 0).is_err() {
                bump(COUNTER_CPU_COUNTS_FULL);
            }
            notice_new_process(pid, tables() && unwind::left_known_mappings());
            // A new key: the thread's current name (it changes at exec,
            // and the stacks of the new program are new keys).
            let _ = CPU_COMMS.insert(tid, bpf_get_current_comm().unwrap_or([0; 16]), 0);
        }
    }
    0
}

/// Off-CPU time: when a target thread blocks (leaves the CPU not runnable),
/// remember when and where (stack ids, read in its own context); when that
/// task gets a CPU again, add the time in between to its (thread, stacks)
/// count. `sched_switch(bool preempt, task *prev, task *next, unsigned prev_state)`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn prof_offcpu(ctx: RawTracePointContext) -> i32 {
    let SchedSwitch {
        prev,
        next,
        blocked,
    } = SchedSwitch::of(&ctx);
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    // The switch runs in `prev`'s context: current is prev.
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let wanted = tid != 0 && (SAMPLE_ALL.load() != 0 || pid == TARGET_TGID.load()) && in_cgroup();
    if wanted && blocked {
        let (user_stack, user_hash) = user_stack_key(&ctx, pid);
        let kernel_stack = ctx.get_stackid(&CPU_STACKS, 0).map_or(-1, |id| id as i32);
        let key = SampleKey {
            pid,
            tid,
            user_stack,
            kernel_stack,
            user_hash,
        };
        let _ = OFFCPU_START.insert(prev, OffCpuStart { ts_ns, key }, 0);
        if unsafe { CPU_COMMS.get(tid) }.is_none() {
            let _ = CPU_COMMS.insert(tid, bpf_get_current_comm().unwrap_or([0; 16]), 0);
        }
    }
    if let Some(start) = unsafe { OFFCPU_START.get(next) } {
        let start = *start;
        let blocked = ts_ns.saturating_sub(start.ts_ns);
        match OFFCPU_NS.get_ptr_mut(start.key) {
            // Per-CPU values: no other CPU writes this slot.
            Some(ns) => unsafe { *ns += blocked },
            None => {
                if OFFCPU_NS.insert(start.key, blocked, 0).is_err() {
                    bump(COUNTER_CPU_COUNTS_FULL);
                }
            }
        }
        let _ = OFFCPU_START.remove(next);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
