//! Types shared by the kernel programs (`profiler-ebpf`) and the agent
//! (`profiler-user`). Everything here is `#[repr(C)]`, made of `u32`/`u64`
//! fields only, with no implicit padding, so both sides agree on the layout.
#![no_std]

/// Array of ring buffers that carry [`Event`]s from the kernel to the
/// agent (`BPF_MAP_TYPE_ARRAY_OF_MAPS` of `BPF_MAP_TYPE_RINGBUF`): one ring
/// per CPU, selected by the CPU a program runs on, or with
/// [`PER_CPU_RINGS_GLOBAL`] 0 one shared ring in slot 0. The agent creates
/// the rings and puts them in.
pub const EVENTS_MAP: &str = "EVENTS";
/// Slots of [`EVENTS_MAP`] in the object (the agent sets the number of
/// possible CPUs at load).
pub const EVENTS_SLOTS: u32 = 1024;
/// Global (`.rodata`): 1 to write to the ring of the current CPU, 0 to
/// write every event to the shared ring in slot 0 of [`EVENTS_MAP`].
pub const PER_CPU_RINGS_GLOBAL: &str = "PER_CPU_RINGS";
/// Per-CPU `u64` counters, indexed by the `COUNTER_*` constants.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Global (`.rodata`) holding the traced process's tgid.
pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";
/// Global (`.rodata`) holding the watched thread's tid (0: none), whose
/// dispatches are timed, sampled and explained.
pub const WATCH_TID_GLOBAL: &str = "WATCH_TID";
/// Global: 1 to record who wakes the watched thread inside a dispatch
/// (`WakerEvent`s and the waker sampler), 0 for `record --no-wakers`.
pub const WAKERS_GLOBAL: &str = "WAKERS";
/// Array of `u64` state about the watched thread, indexed by `WATCH_*`.
pub const WATCH_MAP: &str = "WATCH";
/// [`WATCH_MAP`] slot: open dispatch frames on the watched thread.
pub const WATCH_DEPTH: u32 = 0;
/// [`WATCH_MAP`] slot: the watched thread's `task_struct` pointer, learnt
/// from its first probe hit; the scheduler programs compare against it.
pub const WATCH_TASK: u32 = 1;
/// [`WATCH_MAP`] slot: 1 while the watched thread is blocked inside an
/// open dispatch (set at its switch-out, cleared when it is woken or runs
/// again). The waker sampler samples the target's other threads only then.
pub const WATCH_BLOCKED: u32 = 2;
/// [`WATCH_MAP`] slot: 1 while the watched thread runs an iteration of its
/// event loop (from the return of the loop's wait to its next entry), with
/// [`WAIT_LOOP_GLOBAL`] set. Like [`WATCH_DEPTH`], it opens the samplers.
pub const WATCH_ITER: u32 = 3;
/// [`WATCH_MAP`] slot, written by the agent: the user stack pointer of the
/// loop's own wait. A wait at this stack pointer or above (shallower) is
/// the loop's; a deeper one is a wait inside an iteration. 0: not learnt
/// yet, every wait counts as the loop's.
pub const WATCH_LOOP_SP: u32 = 4;
/// [`WATCH_MAP`] slot: the [`wait`] word of the wait the watched thread is
/// in (plus one, so 0 means none), from its entry to its return.
pub const WATCH_IN_WAIT: u32 = 5;
/// Number of slots in [`WATCH_MAP`].
pub const WATCH_SLOTS: u32 = 6;
/// Global (`.rodata`): 1 to bound the watched thread's dispatches by its
/// event loop's wait syscalls (`prof_sys_enter`/`prof_sys_exit` attached),
/// 0 otherwise.
pub const WAIT_LOOP_GLOBAL: &str = "WAIT_LOOP";
/// Name of the `sys_enter` raw tracepoint program (the watched thread's
/// wait syscalls).
pub const PROG_SYS_ENTER: &str = "prof_sys_enter";
/// Name of the `sys_exit` raw tracepoint program.
pub const PROG_SYS_EXIT: &str = "prof_sys_exit";
/// The wait syscalls' kernel functions, each with an fentry program
/// `prof_enter_NAME` and an fexit program `prof_exit_NAME` (preferred to
/// the `sys_enter`/`sys_exit` tracepoints, which slow every syscall).
pub const WAIT_SYSCALLS: [&str; 8] = [
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "io_uring_enter",
];

/// The watched thread's wait syscalls: the function field of a
/// [`KIND_WAIT`] event packs the syscall number, the direction, whether it
/// is the loop's own wait, and its first argument (the epoll or io_uring
/// descriptor, clipped).
pub mod wait {
    /// x86-64 `poll`.
    pub const NR_POLL: u32 = 7;
    /// x86-64 `select`.
    pub const NR_SELECT: u32 = 23;
    /// x86-64 `epoll_wait`.
    pub const NR_EPOLL_WAIT: u32 = 232;
    /// x86-64 `pselect6`.
    pub const NR_PSELECT6: u32 = 270;
    /// x86-64 `ppoll`.
    pub const NR_PPOLL: u32 = 271;
    /// x86-64 `epoll_pwait`.
    pub const NR_EPOLL_PWAIT: u32 = 281;
    /// x86-64 `io_uring_enter` (a wait only with `IORING_ENTER_GETEVENTS`).
    pub const NR_IO_URING_ENTER: u32 = 426;
    /// x86-64 `epoll_pwait2`.
    pub const NR_EPOLL_PWAIT2: u32 = 441;
    /// `IORING_ENTER_GETEVENTS`.
    pub const IORING_ENTER_GETEVENTS: u64 = 1;
    /// Bits of the syscall number.
    pub const NR_MASK: u32 = 0x3ff;
    /// Set on the return of the wait; clear on its entry.
    pub const EXIT: u32 = 1 << 10;
    /// Set when the kernel judged it the loop's own wait ([`super::WATCH_LOOP_SP`]).
    pub const LOOP: u32 = 1 << 11;
    /// Shift of the first argument (descriptor), clipped to [`FD_MAX`].
    pub const FD_SHIFT: u32 = 12;
    /// Largest descriptor kept; larger ones read as this.
    pub const FD_MAX: u64 = 0x7fff;

    /// True for the syscalls an event loop waits in.
    #[inline(always)]
    pub const fn is_wait(nr: u64) -> bool {
        nr <= NR_MASK as u64
            && matches!(
                nr as u32,
                NR_POLL
                    | NR_SELECT
                    | NR_EPOLL_WAIT
                    | NR_PSELECT6
                    | NR_PPOLL
                    | NR_EPOLL_PWAIT
                    | NR_IO_URING_ENTER
                    | NR_EPOLL_PWAIT2
            )
    }

    /// The function field of a wait event.
    #[inline(always)]
    pub const fn word(nr: u64, fd: u64, exit: bool, is_loop: bool) -> u32 {
        let fd = if fd > FD_MAX { FD_MAX } else { fd };
        (nr as u32 & NR_MASK)
            | if exit { EXIT } else { 0 }
            | if is_loop { LOOP } else { 0 }
            | ((fd as u32) << FD_SHIFT)
    }

    /// The syscall's name.
    pub const fn name(nr: u32) -> &'static str {
        match nr {
            NR_POLL => "poll",
            NR_SELECT => "select",
            NR_EPOLL_WAIT => "epoll_wait",
            NR_PSELECT6 => "pselect6",
            NR_PPOLL => "ppoll",
            NR_EPOLL_PWAIT => "epoll_pwait",
            NR_IO_URING_ENTER => "io_uring_enter",
            NR_EPOLL_PWAIT2 => "epoll_pwait2",
            _ => "wait",
        }
    }
}
/// Bit of a probe cookie that marks a dispatch function.
pub const COOKIE_DISPATCH: u64 = 1 << 32;
/// Bit of a probe cookie that marks a Go function: its events are
/// [`GoEvent`]s, keyed by goroutine rather than by thread.
pub const COOKIE_GO: u64 = 1 << 33;
/// Offset added to a Go event's stack depth so that it reads like a stack
/// pointer: `sp - g.stack.hi + GO_STACK_BASE`. It is the same for a frame
/// before and after Go copies the goroutine's stack to grow it, and, as
/// with a real stack pointer, deeper frames have lower values.
pub const GO_STACK_BASE: u64 = 1 << 46;
/// Global (`.rodata`) holding the wake-up threshold in bytes: an event
/// submitted while less than this much is pending does not wake the agent.
pub const WAKEUP_BYTES_GLOBAL: &str = "WAKEUP_BYTES";

/// LRU hash of thread ids already announced with a [`CommEvent`].
pub const SEEN_THREADS_MAP: &str = "SEEN_THREADS";
/// Capacity of [`SEEN_THREADS_MAP`].
pub const SEEN_THREADS_CAPACITY: u32 = 16384;
/// Processes `sample --all` remembers having told the agent of (LRU).
pub const NOTICED_CAPACITY: u32 = 16384;
/// Name of that map.
pub const NOTICED_MAP: &str = "NOTICED";
/// Bit of a [`NOTICED_MAP`] value: the agent was told of the process and
/// has not yet read its mappings (it clears the bit when it has).
pub const NOTICE_PENDING: u8 = 0x80;
/// One-slot array: nonzero while the agent polls the notices on a timer
/// (notices then do not wake it).
pub const NOTICE_QUIET_MAP: &str = "NOTICE_QUIET";

/// Entry/exit events that could not be reserved in the ring buffer (it was full).
pub const COUNTER_LOST: u32 = 0;
/// Probe hits that were filtered out because they came from another process.
pub const COUNTER_FOREIGN: u32 = 1;
/// Thread-name events that could not be reserved (the ring was full).
pub const COUNTER_LOST_COMM: u32 = 2;
/// Scheduler and sample events that could not be reserved.
pub const COUNTER_LOST_SCHED: u32 = 3;
/// Samples or blocked stacks whose user stack could not be read.
pub const COUNTER_STACK_ERRORS: u32 = 4;
/// CPU-profile samples taken.
pub const COUNTER_CPU_SAMPLES: u32 = 5;
/// CPU-profile samples whose user stack could not be stored.
pub const COUNTER_CPU_USER_STACK_LOST: u32 = 6;
/// CPU-profile samples not counted because the counts map was full.
pub const COUNTER_CPU_COUNTS_FULL: u32 = 7;
/// DWARF-mode samples that could not be put in the ring (it was full).
pub const COUNTER_DWARF_LOST: u32 = 8;
/// User stacks the table unwinder could not store (the stacks map was full).
pub const COUNTER_USER_STACKS_FULL: u32 = 9;
/// Processes the traced ones started (fork, vfork, clone without
/// `CLONE_THREAD`, posix_spawn) that were not traced (no `--follow`).
pub const COUNTER_UNTRACED_CHILDREN: u32 = 10;
/// Children not followed because [`TRACED_MAP`] was full.
pub const COUNTER_TRACED_FULL: u32 = 11;
/// Process events (fork, exec, exit) that could not be reserved.
pub const COUNTER_LOST_PROC: u32 = 12;
/// `sample --all`: new-process notices that could not be reserved (the
/// process is told of again at its next new stack).
pub const COUNTER_NOTICES_LOST: u32 = 13;
/// Python code objects the agent could not be told of (`PY_NEWS` full):
/// named at the end instead, if their process still runs.
pub const COUNTER_PY_NOTICES_LOST: u32 = 14;
/// Number of counters in [`COUNTERS_MAP`].
pub const COUNTER_COUNT: u32 = 15;

/// Hash of traced tgid -> parent tgid (0 for a session's own targets):
/// the processes whose probe hits count when [`TRACK_GLOBAL`] is set.
pub const TRACED_MAP: &str = "TRACED";
/// Capacity of [`TRACED_MAP`].
pub const TRACED_CAPACITY: u32 = 16384;
/// Global (`.rodata`): 0: one target, `TARGET_TGID`, its probes scoped to
/// it; [`track::MAP`]: the probes are for every process and [`TRACED_MAP`]
/// decides, with process events; [`track::FOLLOW`]: that, and children of
/// traced processes are added to the map as they are made.
pub const TRACK_GLOBAL: &str = "TRACK";
/// [`TRACK_GLOBAL`] values.
pub mod track {
    /// One target (`TARGET_TGID`); its forks are only counted.
    pub const ONE: u32 = 0;
    /// Several targets, in [`super::TRACED_MAP`]; forks counted.
    pub const MAP: u32 = 1;
    /// Targets in [`super::TRACED_MAP`], and their children as they are made.
    pub const FOLLOW: u32 = 2;
}
/// Global (`.rodata`): byte offset of `pid` in the kernel's `task_struct`
/// (from its BTF; the fork tracepoint reads the child's ids with it).
pub const TASK_PID_OFFSET_GLOBAL: &str = "TASK_PID_OFFSET";
/// Global (`.rodata`): byte offset of `tgid` in `task_struct`.
pub const TASK_TGID_OFFSET_GLOBAL: &str = "TASK_TGID_OFFSET";
/// Global (`.rodata`): byte offset of `exit_code` in `task_struct`.
pub const TASK_EXIT_CODE_OFFSET_GLOBAL: &str = "TASK_EXIT_CODE_OFFSET";
/// Name of the `sched_process_fork` raw tracepoint program.
pub const PROG_PROC_FORK: &str = "prof_proc_fork";
/// Name of the `sched_process_exec` raw tracepoint program.
pub const PROG_PROC_EXEC: &str = "prof_proc_exec";
/// Name of the `sched_process_exit` raw tracepoint program.
pub const PROG_PROC_EXIT: &str = "prof_proc_exit";

/// Name of the `sched_switch` raw tracepoint program.
pub const PROG_SCHED_SWITCH: &str = "prof_sched_switch";
/// Name of the wake-up raw tracepoint program (attached to `sched_waking`,
/// which runs in the waker's context).
pub const PROG_SCHED_WAKEUP: &str = "prof_sched_wakeup";
/// Name of the waker sampler: a `cpu-clock` perf event on every CPU that
/// samples the target's other threads while the watched thread is blocked
/// inside a dispatch ([`WATCH_BLOCKED`]).
pub const PROG_PEER_SAMPLE: &str = "prof_peer_sample";
/// Name of the CPU-profile sampling program (kernel-aggregated stacks).
pub const PROG_CPU_SAMPLE: &str = "prof_cpu_sample";
/// Stack-trace map of the CPU profile (stack id -> frames).
pub const CPU_STACKS_MAP: &str = "CPU_STACKS";
/// Per-CPU hash of [`SampleKey`] -> sample count (the agent sums the CPUs).
pub const CPU_COUNTS_MAP: &str = "CPU_COUNTS";
/// Hash of tid -> `[u8; 16]` comm, for sampled threads.
pub const CPU_COMMS_MAP: &str = "CPU_COMMS";
/// Capacity of [`CPU_STACKS_MAP`].
pub const CPU_STACKS_CAPACITY: u32 = 16384;
/// Capacity of [`CPU_COUNTS_MAP`] and [`CPU_COMMS_MAP`].
pub const CPU_COUNTS_CAPACITY: u32 = 65536;
/// Global (`.rodata`): sample every process (1) or only `TARGET_TGID` (0).
pub const SAMPLE_ALL_GLOBAL: &str = "SAMPLE_ALL";
/// Global (`.rodata`): with `sample --all --cgroup`, the id of the cgroup
/// (v2) whose subtree alone is sampled; 0 for no filter.
pub const CGROUP_ID_GLOBAL: &str = "CGROUP_ID";
/// Global (`.rodata`): that cgroup's level (the root is 0).
pub const CGROUP_LEVEL_GLOBAL: &str = "CGROUP_LEVEL";
/// Name of the off-CPU program (`sched_switch`, every target thread).
pub const PROG_OFFCPU: &str = "prof_offcpu";
/// Hash of task pointer -> [`OffCpuStart`]: threads currently blocked.
pub const OFFCPU_START_MAP: &str = "OFFCPU_START";
/// Per-CPU hash of [`SampleKey`] -> nanoseconds blocked.
pub const OFFCPU_NS_MAP: &str = "OFFCPU_NS";
/// Name of the perf-event sampling program.
pub const PROG_SAMPLE: &str = "prof_sample";

/// Name of the entry uprobe program.
pub const PROG_ENTRY: &str = "prof_entry";
/// Name of the return uprobe program (a uretprobe).
pub const PROG_EXIT: &str = "prof_exit";
/// Name of the return-site program: a plain uprobe on a `ret` instruction
/// (or a tail-call `jmp`), which reports the stack pointer plus 8, as a
/// return uprobe would after the return.
pub const PROG_RET: &str = "prof_ret";

/// Kind of an [`Event`], stored in the top bits of [`Event::word`].
pub const KIND_ENTRY: u32 = 0;
/// A function returned.
pub const KIND_EXIT: u32 = 1;
/// A thread seen for the first time: a [`CommEvent`] with its name.
pub const KIND_COMM: u32 = 2;
/// The watched thread left the CPU; the function field is a `SCHED_*`
/// state. While a dispatch is open and the thread blocked, the record is a
/// [`StackEvent`] with the user and kernel stacks where it blocked.
pub const KIND_SCHED_OUT: u32 = 3;
/// The watched thread got the CPU back.
pub const KIND_SCHED_IN: u32 = 4;
/// The watched thread was woken (it is runnable from now on).
pub const KIND_WAKEUP: u32 = 5;
/// A `cpu-clock` sample of the watched thread during a dispatch: a [`StackEvent`].
pub const KIND_SAMPLE: u32 = 6;
/// Left the CPU while still runnable (preempted or yielded).
pub const SCHED_RUNNABLE: u32 = 0;
/// Left the CPU to sleep (I/O, a lock, a timer, …).
pub const SCHED_BLOCKED: u32 = 1;
/// A user-mode CPU sample with a copy of the user stack, for `.eh_frame`
/// unwinding in the agent (`sample --dwarf`): a [`DwarfSample`].
pub const KIND_DWARF: u32 = 7;
/// Bytes of user stack a [`DwarfSample`] copies (from the stack pointer up).
pub const DWARF_STACK_BYTES: usize = 16384;
/// Global (`.rodata`): copy user stacks for DWARF unwinding (1) or not (0).
pub const DWARF_MODE_GLOBAL: &str = "DWARF_MODE";
/// Deepest user stack a [`StackEvent`] holds.
pub const MAX_USER_FRAMES: usize = 64;
/// Deepest kernel stack a [`StackEvent`] holds.
pub const MAX_KERNEL_FRAMES: usize = 32;
/// A Go function was entered: a [`GoEvent`].
pub const KIND_GO_ENTRY: u32 = 8;
/// A Go function returned: a [`GoEvent`].
pub const KIND_GO_EXIT: u32 = 9;
/// A traced process forked, exec'd or exited: a [`ProcEvent`]; the
/// function field is a `PROC_*` constant.
pub const KIND_PROC: u32 = 10;
/// Functions the agent started probing after an exec: written by the
/// agent into `profile.data` (never by the kernel), an [`Event`] header
/// (`tid`: the process, function field: how many) then JSON.
pub const KIND_PROBED: u32 = 11;
/// [`ProcEvent`]: a traced process made a child (`event.tid`), which is
/// traced from its first instruction (`--follow`).
pub const PROC_FORK: u32 = 0;
/// [`ProcEvent`]: the process (`event.tid`) exec'd; `comm` is the new name.
pub const PROC_EXEC: u32 = 1;
/// [`ProcEvent`]: the process's last thread exited; `code` is the wait
/// status (`exit_code` of the task: exit status << 8, or the signal).
pub const PROC_EXIT: u32 = 2;
/// Who woke the watched thread while it was blocked inside a dispatch: a
/// [`WakerEvent`], written before the [`KIND_WAKEUP`] event of that wake-up.
pub const KIND_WAKER: u32 = 12;
/// A `cpu-clock` sample of another thread of the target, taken while the
/// watched thread was blocked inside a dispatch: a [`StackEvent`] whose
/// `tid` is the sampled thread.
pub const KIND_PEER_SAMPLE: u32 = 13;
/// `sample --all`: a process was sampled for the first time (an [`Event`]
/// whose `tid` is the process), so the agent reads its mappings while it
/// runs rather than at its next scan.
pub const KIND_NEW_PROCESS: u32 = 14;
/// The watched thread entered or returned from a wait syscall (with
/// [`WAIT_LOOP_GLOBAL`]): an [`Event`] whose function field is a
/// [`wait::word`] and whose `sp` is the user stack pointer at the syscall.
pub const KIND_WAIT: u32 = 15;
/// [`WakerEvent::flags`] bit: the waker has no user-mode state (a kernel
/// thread, or the idle task an interrupt arrived on).
pub const WAKER_KERNEL_THREAD: u32 = 1;
/// Bits of [`Event::word`] below the kind: the function index, the
/// tail-call bit and the link generation bit.
pub const FUNC_BITS: u32 = 28;
/// Mask of the function index in [`Event::word`].
pub const FUNC_MASK: u32 = (1 << (FUNC_BITS - 2)) - 1;
/// Bit of [`Event::word`] (and of a probe cookie): the exit was a
/// tail-call `jmp` to the start of another probed function, whose entry
/// comes next. The agent keeps the frame open until that callee returns
/// (`analyze/tail_calls.rs`). The kernel passes it through untouched.
pub const TAIL_CALL: u32 = 1 << (FUNC_BITS - 2);
/// Bit of [`Event::word`] (and of the low 32 bits of a probe cookie) that
/// tells which generation of a binary's uprobe_multi links fired. When the
/// overhead governor rebuilds a binary's links without its hottest
/// functions, the new links are created before the old ones are dropped, so
/// for a moment one hit runs both; the two events differ only in this bit,
/// and the agent keeps one (`analyze/dedup.rs`).
pub const LINK_GEN: u32 = 1 << (FUNC_BITS - 1);
/// Largest number of functions a session can probe.
pub const MAX_FUNCS: u32 = FUNC_MASK + 1;

/// One function entry or exit: 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the probe.
    pub ts_ns: u64,
    /// Thread id (the kernel's pid) of the thread that hit the probe.
    pub tid: u32,
    /// `kind << FUNC_BITS | function index`.
    pub word: u32,
    /// Stack pointer at the probe (0 when not a function probe). At entry
    /// it points at the return address; at return it is 8 bytes higher. The
    /// agent pairs an exit with its entry by it, which stays exact when the
    /// kernel skips returns (the 64-deep uretprobe nesting limit), or when
    /// `longjmp` or an exception unwinds probed frames.
    pub sp: u64,
}

impl Event {
    /// Packs a kind and a function index into an event word.
    #[inline(always)]
    pub const fn pack(kind: u32, func: u32) -> u32 {
        (kind << FUNC_BITS) | (func & (FUNC_MASK | LINK_GEN | TAIL_CALL))
    }
    /// The event's kind (`KIND_*`).
    #[inline(always)]
    pub const fn kind(&self) -> u32 {
        self.word >> FUNC_BITS
    }
    /// The function index (the probe cookie).
    #[inline(always)]
    pub const fn func(&self) -> u32 {
        self.word & FUNC_MASK
    }
    /// The tail-call bit ([`TAIL_CALL`]) of a function exit.
    #[inline(always)]
    pub const fn tail_call(&self) -> bool {
        self.word & TAIL_CALL != 0
    }
    /// The link generation bit ([`LINK_GEN`]) of a function event.
    #[inline(always)]
    pub const fn link_gen(&self) -> bool {
        self.word & LINK_GEN != 0
    }
}

/// An entry or exit of a Go function: 32 bytes. Goroutines move between
/// threads and their stacks move when they grow, so calls pair by
/// goroutine and by depth from the stack's top, not by thread and raw
/// stack pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoEvent {
    /// Header: [`KIND_GO_ENTRY`] or [`KIND_GO_EXIT`]; `tid` is the thread
    /// the goroutine ran on, `sp` is `sp - g.stack.hi + GO_STACK_BASE`.
    pub event: Event,
    /// The goroutine's `g` (register r14 under Go's register ABI).
    pub goroutine: u64,
}

/// A thread's first appearance, with its name and process: 40 bytes
/// (the header's function field is the thread's tgid). Sent once per
/// thread (per [`SEEN_THREADS_MAP`] eviction), so that threads which exit
/// before the agent can read `/proc` still have names.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommEvent {
    /// Header; its kind is [`KIND_COMM`] and its function index is 0.
    pub event: Event,
    /// `bpf_get_current_comm()`, NUL-padded.
    pub comm: [u8; 16],
}

/// A traced process's fork, exec or exit: 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEvent {
    /// Header: [`KIND_PROC`]; `tid` is the process (its tgid); the function
    /// field is `PROC_FORK`, `PROC_EXEC` or `PROC_EXIT`.
    pub event: Event,
    /// Fork: the parent's tgid; otherwise 0.
    pub parent: u32,
    /// Exit: the task's `exit_code` (a wait status); otherwise 0.
    pub code: u32,
    /// The process's name (the parent's at fork, the new one at exec).
    pub comm: [u8; 16],
}

/// An event with the current thread's user and kernel stacks (innermost
/// frame first): samples, and switches out to a blocked state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackEvent {
    /// Header: [`KIND_SAMPLE`] or [`KIND_SCHED_OUT`]. Its `sp` carries why
    /// the table unwinder's walk of `user` ended (see [`StackEvent::user_end`]).
    pub event: Event,
    /// Frames used in `user`.
    pub user_len: u32,
    /// Frames used in `kernel`.
    pub kernel_len: u32,
    /// User return addresses, innermost first.
    pub user: [u64; MAX_USER_FRAMES],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// Who woke the watched thread, read in the waker's context at
/// `sched_waking`: the running task (in an interrupt, whatever task it
/// interrupted; the kernel stack tells which), its name, and its user and
/// kernel stacks, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakerEvent {
    /// Header: [`KIND_WAKER`]; `tid` is the watched (woken) thread.
    pub event: Event,
    /// The waking task's thread id (0: the idle task).
    pub waker_tid: u32,
    /// Its process id.
    pub waker_pid: u32,
    /// `WAKER_*` bits.
    pub flags: u32,
    /// Zero.
    pub pad: u32,
    /// `bpf_get_current_comm()`, NUL-padded.
    pub comm: [u8; 16],
    /// Frames used in `user`.
    pub user_len: u32,
    /// Frames used in `kernel`.
    pub kernel_len: u32,
    /// User return addresses, innermost first.
    pub user: [u64; MAX_USER_FRAMES],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// Key of a CPU-profile count: who was running, and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// User stack id in [`CPU_STACKS_MAP`] (frame-pointer walk), or -1.
    pub user_stack: i32,
    /// Kernel stack id in [`CPU_STACKS_MAP`], or -1.
    pub kernel_stack: i32,
    /// Key of the user stack in [`USER_STACKS_MAP`] (table unwinder), or 0.
    pub user_hash: u64,
}

/// How user stacks are walked in the kernel ([`UNWIND_MODE_GLOBAL`]).
pub mod unwind_mode {
    /// Frame pointers only (the kernel's own walk).
    pub const FP: u32 = 0;
    /// Compiled unwind tables, frame pointers where a mapping has none.
    pub const TABLES: u32 = 1;
}
/// Global (`.rodata`): an [`unwind_mode`] constant.
pub const UNWIND_MODE_GLOBAL: &str = "UNWIND_MODE";
/// Deepest user stack the table unwinder walks.
pub const MAX_UNWIND_FRAMES: usize = 128;
/// Most executable mappings of one process the table unwinder knows.
pub const MAX_MAPPINGS: usize = 256;
/// Array of [`UnwindRow`]s: every compiled table, each a contiguous range.
pub const UNWIND_ROWS_MAP: &str = "UNWIND_ROWS";
/// Hash of tgid -> [`ProcMaps`].
pub const UNWIND_PROCS_MAP: &str = "UNWIND_PROCS";
/// Hash of stack key -> [`UserStack`] (the table unwinder's stacks).
pub const USER_STACKS_MAP: &str = "USER_STACKS";
/// Capacity of [`UNWIND_PROCS_MAP`].
pub const UNWIND_PROCS_CAPACITY: u32 = 8192;

/// Why the table unwinder stopped ([`UserStack::end`]).
pub mod unwind_end {
    /// The outermost frame: its return address is undefined by the CFI.
    pub const ROOT: u32 = 1;
    /// A frame-pointer walk reached a null frame pointer or return address.
    pub const FP_END: u32 = 2;
    /// Reading the stack failed (unmapped, or paged out in the sampler).
    pub const READ_FAULT: u32 = 3;
    /// [`super::MAX_UNWIND_FRAMES`] frames.
    pub const DEPTH: u32 = 4;
    /// A CFI rule the unwinder does not follow.
    pub const UNSUPPORTED: u32 = 5;
    /// The process has no tables (yet): the kernel's frame-pointer walk.
    pub const NO_TABLES: u32 = 6;
    /// The walk went nowhere (the stack pointer did not move up).
    pub const BAD_FRAME: u32 = 7;
    /// Bits of `end` that hold the reason.
    pub const REASON: u32 = 0xff;
    /// Flag beside the reason: some frame was stepped by frame pointers
    /// because its binary had no table (yet, or not within the budget), or
    /// the process had none.
    pub const FP_NO_TABLE: u32 = 0x100;

    /// The reason alone, without the flags.
    pub const fn reason(end: u32) -> u32 {
        end & REASON
    }
}

/// A user stack walked with the unwind tables.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UserStack {
    /// Frames used.
    pub len: u32,
    /// Why the walk stopped: an [`unwind_end`] constant.
    pub end: u32,
    /// Return addresses, innermost first (the first is the sampled pc).
    pub frames: [u64; MAX_UNWIND_FRAMES],
}

/// One executable file mapping of a process, for the table unwinder.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMapping {
    /// First address.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// Subtracted from an address to give the ELF virtual address.
    pub bias: u64,
    /// First row of its table in [`UNWIND_ROWS_MAP`].
    pub table_start: u32,
    /// Rows in its table; 0: no table, walk frame pointers.
    pub table_len: u32,
}

/// A process's executable mappings, sorted by `start`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcMaps {
    /// Entries used in `maps`.
    pub len: u32,
    /// Zero.
    pub pad: u32,
    /// The mappings.
    pub maps: [ExecMapping; MAX_MAPPINGS],
}

/// Where and since when a thread has been off the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuStart {
    /// When it left the CPU.
    pub ts_ns: u64,
    /// Who and where.
    pub key: SampleKey,
}

/// A user-mode sample: registers and a copy of the top of the user stack.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DwarfSample {
    /// Header: [`KIND_DWARF`]; `sp` is the stack pointer.
    pub event: Event,
    /// Process id.
    pub pid: u32,
    /// Bytes of `stack` that are valid (0 if none could be read).
    pub len: u32,
    /// Instruction pointer.
    pub ip: u64,
    /// Frame pointer register.
    pub bp: u64,
    /// `len` bytes of user stack from `event.sp` up.
    pub stack: [u8; DWARF_STACK_BYTES],
}

/// How to find the canonical frame address (CFA: the stack pointer just
/// before the call that made this frame) in an [`UnwindRow`].
pub mod cfa {
    /// `rsp + offset`.
    pub const RSP: u8 = 1;
    /// `rbp + offset`.
    pub const RBP: u8 = 2;
    /// A lazy-binding PLT stub (`.plt`): `rsp + 8`, plus 8 more once the
    /// stub has pushed its index, i.e. when `(rip & 15) >= cfa_offset`
    /// (11 in classic PLTs, 10 in some linkers' output), as the standard
    /// `DW_CFA_def_cfa_expression` of x86-64 PLTs computes.
    pub const PLT: u8 = 3;
    /// The return address is undefined: the outermost frame (`_start`,
    /// `clone`, a thread's start). The stack is complete.
    pub const END: u8 = 4;
    /// A rule the unwinder cannot follow (another DWARF expression, or a
    /// return address not at `CFA - 8`): unwinding stops, counted.
    pub const UNSUPPORTED: u8 = 5;
}

/// Where the caller's `rbp` is, in an [`UnwindRow`].
pub mod rbp {
    /// Unchanged (not saved by this frame).
    pub const SAME: u8 = 0;
    /// Saved at `CFA + offset`.
    pub const AT_CFA: u8 = 1;
    /// A rule the unwinder cannot follow: `rbp` becomes unknown.
    pub const UNSUPPORTED: u8 = 2;
}

/// One row of a compiled unwind table: how to unwind one frame whose
/// program counter is at or after `pc` (an ELF virtual address of its
/// binary) and before the next row's. The return address is always at
/// `CFA - 8` on x86-64. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindRow {
    /// First ELF virtual address the row covers.
    pub pc: u64,
    /// How to compute the CFA: a [`cfa`] constant.
    pub cfa_kind: u8,
    /// Where the caller's `rbp` is: a [`rbp`] constant.
    pub rbp_kind: u8,
    /// Offset of the CFA from its base register.
    pub cfa_offset: i16,
    /// Offset of the saved `rbp` from the CFA (for [`rbp::AT_CFA`]).
    pub rbp_offset: i16,
    /// Zero.
    pub pad: u16,
}

/// What a ring record is, from its header's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A function entry: an [`Event`].
    Entry,
    /// A function exit: an [`Event`].
    Exit,
    /// A thread's first appearance: a [`CommEvent`].
    Comm,
    /// The watched thread left the CPU: an [`Event`], or a [`StackEvent`]
    /// when it blocked inside a dispatch.
    SchedOut,
    /// The watched thread got the CPU back: an [`Event`].
    SchedIn,
    /// The watched thread was woken: an [`Event`].
    Wakeup,
    /// An in-dispatch sample: a [`StackEvent`].
    Sample,
    /// A user-mode sample with a stack copy: a [`DwarfSample`].
    Dwarf,
    /// A Go function's entry: a [`GoEvent`].
    GoEntry,
    /// A Go function's exit: a [`GoEvent`].
    GoExit,
    /// A traced process forked, exec'd or exited: a [`ProcEvent`].
    Proc,
    /// Functions probed after an exec (an agent record): an [`Event`]
    /// header followed by JSON.
    Probed,
    /// Who woke the watched thread inside a dispatch: a [`WakerEvent`].
    Waker,
    /// A sample of another thread while the watched one was blocked in a
    /// dispatch: a [`StackEvent`].
    PeerSample,
    /// A process sampled for the first time (`sample --all`): an [`Event`].
    NewProcess,
    /// The watched thread entered or left a wait syscall: an [`Event`].
    Wait,
}

impl RecordKind {
    /// The kind of an [`Event::kind`] value, if it is one.
    pub const fn of(kind: u32) -> Option<RecordKind> {
        Some(match kind {
            KIND_ENTRY => RecordKind::Entry,
            KIND_EXIT => RecordKind::Exit,
            KIND_COMM => RecordKind::Comm,
            KIND_SCHED_OUT => RecordKind::SchedOut,
            KIND_SCHED_IN => RecordKind::SchedIn,
            KIND_WAKEUP => RecordKind::Wakeup,
            KIND_SAMPLE => RecordKind::Sample,
            KIND_DWARF => RecordKind::Dwarf,
            KIND_GO_ENTRY => RecordKind::GoEntry,
            KIND_GO_EXIT => RecordKind::GoExit,
            KIND_PROC => RecordKind::Proc,
            KIND_PROBED => RecordKind::Probed,
            KIND_WAKER => RecordKind::Waker,
            KIND_PEER_SAMPLE => RecordKind::PeerSample,
            KIND_NEW_PROCESS => RecordKind::NewProcess,
            KIND_WAIT => RecordKind::Wait,
            _ => return None,
        })
    }
}

/// A type the kernel writes into the ring as a whole record, starting with
/// an [`Event`] header.
///
/// # Safety
/// Implementors are `#[repr(C)]`, made of integers and arrays of them, so
/// any bytes are a valid value.
pub unsafe trait Record: Copy {}
// SAFETY: each is #[repr(C)] plain integers (see the type's layout test).
unsafe impl Record for Event {}
// SAFETY: as above.
unsafe impl Record for CommEvent {}
// SAFETY: as above.
unsafe impl Record for GoEvent {}
// SAFETY: as above.
unsafe impl Record for StackEvent {}

impl StackEvent {
    /// Why the table unwinder stopped walking `user`: an [`unwind_end`]
    /// constant, or 0 when the stack came from the kernel's frame-pointer
    /// walk (`--unwind fp`, or a recording made before this field was set).
    pub fn user_end(&self) -> u32 {
        self.event.sp as u32
    }
}
// SAFETY: as above.
unsafe impl Record for ProcEvent {}
// SAFETY: as above.
unsafe impl Record for DwarfSample {}
// SAFETY: as above.
unsafe impl Record for WakerEvent {}
// SAFETY: as above.
unsafe impl Record for python::PyCodeNotice {}

/// The one decoder of ring records: the record's kind, and its header.
/// None for a record too short for a header, or of an unknown kind.
pub fn decode(bytes: &[u8]) -> Option<(RecordKind, Event)> {
    let ev: Event = read(bytes)?;
    Some((RecordKind::of(ev.kind())?, ev))
}

/// Reads a whole record of type `T` from its bytes (any alignment), or
/// None when there are too few.
pub fn read<T: Record>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < core::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: enough bytes, `T: Record` accepts any bit pattern, and
    // `read_unaligned` copes with any alignment.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for python::PyProc {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for v8::V8Proc {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for UnwindRow {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for UserStack {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for ExecMapping {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcMaps {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for DwarfSample {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for SampleKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for OffCpuStart {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Event {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for StackEvent {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for CommEvent {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for GoEvent {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcEvent {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for WakerEvent {}

#[cfg(test)]
mod tests {
    #[test]
    fn python_frames_round_trip_and_never_look_like_addresses() {
        let code = 0x7f12_3456_78a8;
        let slot = python::encode(code, 77, true);
        assert!(python::is_frame(slot));
        assert_eq!(python::decode(slot), (code, 77, true));
        assert_eq!(
            python::decode(python::encode(code, 1 << 20, false)),
            (code, python::INSTR_MAX, false)
        );
        assert!(!python::is_frame(0x7fff_ffff_f000));
        let js = v8::encode(0x1234_5678_9a00);
        assert!(v8::is_frame(js) && !python::is_frame(js) && is_runtime_frame(js));
        assert_eq!(v8::decode(js), 0x1234_5678_9a00);
        assert_eq!(v8::marker(js), None);
        let m = v8::encode_marker(13);
        assert!(v8::is_frame(m) && !python::is_frame(m));
        assert_eq!(v8::marker(m), Some(13));
        assert!(!v8::is_frame(slot) && !v8::is_frame(0x7fff_ffff_f000));
        assert!(!python::is_frame(0xffff_ffff_8100_0000));
    }

    use super::*;

    #[test]
    fn records_decode_by_kind_and_length() {
        let e = Event {
            ts_ns: 7,
            tid: 3,
            word: Event::pack(KIND_GO_EXIT, 9),
            sp: 100,
        };
        let g = GoEvent {
            event: e,
            goroutine: 0xabc,
        };
        // SAFETY: viewing a repr(C) value's bytes.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&g as *const GoEvent).cast::<u8>(),
                core::mem::size_of::<GoEvent>(),
            )
        };
        assert_eq!(decode(bytes), Some((RecordKind::GoExit, e)));
        assert_eq!(read::<GoEvent>(bytes), Some(g));
        assert_eq!(read::<GoEvent>(&bytes[..31]), None);
        assert_eq!(decode(&bytes[..23]), None);
        // Every 4-bit kind is taken (15: KIND_WAIT); a damaged header is
        // caught by its record's length, or by the value checks after.
        let mut wait = e;
        wait.word = Event::pack(KIND_WAIT, 0);
        assert_eq!(RecordKind::of(wait.kind()), Some(RecordKind::Wait));
        assert_eq!(RecordKind::of(1 << (32 - FUNC_BITS)), None);
    }

    #[test]
    fn layouts_and_packing() {
        assert_eq!(core::mem::size_of::<Event>(), 24);
        assert_eq!(core::mem::size_of::<CommEvent>(), 40);
        assert_eq!(core::mem::size_of::<GoEvent>(), 32);
        assert_eq!(core::mem::size_of::<ProcEvent>(), 48);
        assert_eq!(core::mem::size_of::<UnwindRow>(), 16);
        assert_eq!(core::mem::size_of::<SampleKey>(), 24);
        assert_eq!(core::mem::size_of::<ExecMapping>(), 32);
        assert_eq!(core::mem::size_of::<ProcMaps>(), 8 + 32 * MAX_MAPPINGS);
        assert_eq!(core::mem::size_of::<UserStack>(), 8 + 8 * MAX_UNWIND_FRAMES);
        assert_eq!(
            core::mem::size_of::<StackEvent>(),
            32 + 8 * (MAX_USER_FRAMES + MAX_KERNEL_FRAMES)
        );
        assert_eq!(
            core::mem::size_of::<WakerEvent>(),
            64 + 8 * (MAX_USER_FRAMES + MAX_KERNEL_FRAMES)
        );
        assert_eq!(RecordKind::of(KIND_WAKER), Some(RecordKind::Waker));
        assert_eq!(
            RecordKind::of(KIND_PEER_SAMPLE),
            Some(RecordKind::PeerSample)
        );
        assert_eq!(
            RecordKind::of(KIND_NEW_PROCESS),
            Some(RecordKind::NewProcess)
        );
        assert_eq!(RecordKind::of(KIND_WAIT), Some(RecordKind::Wait));
        assert_eq!(RecordKind::of(KIND_WAIT + 1), None);
        let e = Event {
            ts_ns: 1,
            tid: 2,
            word: Event::pack(KIND_EXIT, 12345),
            sp: 0,
        };
        assert_eq!(e.kind(), KIND_EXIT);
        assert_eq!(e.func(), 12345);
        let e = Event {
            ts_ns: 1,
            tid: 2,
            word: Event::pack(KIND_ENTRY, FUNC_MASK),
            sp: 0,
        };
        assert_eq!(e.kind(), KIND_ENTRY);
        assert_eq!(e.func(), FUNC_MASK);
    }
}

/// CPython frames in user stacks: where the interpreter keeps them
/// ([`python::PyProc`], written by the agent per process) and how a frame
/// is carried in a stack's `u64` slots ([`python::encode`]).
///
/// The kernel walks the thread's `_PyInterpreterFrame` chain and appends
/// one tagged slot per Python frame after the native frames; the agent
/// names each from its code object and splices them in under the native
/// `_PyEval_EvalFrameDefault` frame that runs them.
pub mod python {
    /// Hash of tgid -> [`PyProc`].
    pub const PY_PROCS_MAP: &str = "PY_PROCS";
    /// Capacity of [`PY_PROCS_MAP`].
    pub const PY_PROCS_CAPACITY: u32 = 4096;
    /// Most Python frames a stack keeps (the innermost ones).
    pub const MAX_PY_FRAMES: u32 = 32;
    /// Ring of [`PyCodeNotice`]s: code objects met for the first time in
    /// a stored stack, for the agent to read while their process runs.
    pub const PY_NEWS_MAP: &str = "PY_NEWS";
    /// Size of [`PY_NEWS_MAP`] in bytes (4,096 notices).
    pub const PY_NEWS_BYTES: u32 = 64 << 10;
    /// Code objects already told of, per process (an LRU: one evicted is
    /// told of again, harmlessly).
    pub const PY_CODES_CAPACITY: u32 = 32768;

    /// A code object of process `pid` that a stored stack holds for the
    /// first time.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PyCodeNotice {
        pub pid: u32,
        /// Zero.
        pub pad: u32,
        pub code: u64,
    }
    /// A field the version does not have.
    pub const NONE: u32 = u32::MAX;
    /// `_PyInterpreterFrame.owner` of the shim frame each C call of the
    /// evaluator pushes (3.12 and later): not a Python function.
    pub const OWNED_BY_CSTACK: u8 = 3;

    /// Tag in the top bits of a Python frame's slot (user addresses stay
    /// below 2^47, kernel ones start at 0xffff…).
    pub const TAG: u64 = 0xa << 60;
    const TAG_MASK: u64 = 0xf << 60;
    /// Set on the outermost Python frame that one C call of the evaluator
    /// runs: the frames up to it belong under one native
    /// `_PyEval_EvalFrameDefault` frame.
    pub const ENTRY: u64 = 1 << 59;
    const CODE_SHIFT: u32 = 15;
    const CODE_BITS: u64 = (1 << 44) - 1;
    /// Largest instruction index kept (code units); larger ones read as it.
    pub const INSTR_MAX: u64 = (1 << CODE_SHIFT) - 1;

    /// Where one CPython process keeps its frames: absolute addresses and
    /// the offsets of the fields the kernel reads, for its version.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PyProc {
        /// Address of `_PyRuntime.interpreters.head`.
        pub interp_head: u64,
        /// `PyInterpreterState.threads.head`.
        pub interp_threads: u32,
        /// `PyThreadState.next`.
        pub tstate_next: u32,
        /// `PyThreadState.native_thread_id` (the kernel's thread id).
        pub tstate_native_tid: u32,
        /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
        pub tstate_frame: u32,
        /// `_PyCFrame.current_frame`, or [`NONE`] when `tstate_frame` is
        /// the frame itself.
        pub cframe_frame: u32,
        /// `_PyInterpreterFrame.f_code` (`f_executable` in 3.13).
        pub frame_code: u32,
        /// `_PyInterpreterFrame.previous`.
        pub frame_previous: u32,
        /// `_PyInterpreterFrame.prev_instr` (`instr_ptr` in 3.13).
        pub frame_instr: u32,
        /// `_PyInterpreterFrame.owner`.
        pub frame_owner: u32,
        /// `_PyInterpreterFrame.is_entry` (3.11), or [`NONE`].
        pub frame_is_entry: u32,
        /// `PyCodeObject.co_code_adaptive`: where the bytecode starts.
        pub code_adaptive: u32,
        /// Zero.
        pub pad: u32,
    }

    /// A Python frame's slot: code object `code`, instruction index
    /// `instr` (code units from the start of its bytecode), and whether it
    /// is the outermost frame of its evaluator call.
    pub const fn encode(code: u64, instr: u64, entry: bool) -> u64 {
        let instr = if instr > INSTR_MAX { INSTR_MAX } else { instr };
        TAG | if entry { ENTRY } else { 0 } | ((code >> 3) & CODE_BITS) << CODE_SHIFT | instr
    }

    /// True for a slot written by [`encode`].
    pub const fn is_frame(slot: u64) -> bool {
        slot & TAG_MASK == TAG
    }

    /// `(code object address, instruction index, entry)` of a slot.
    pub const fn decode(slot: u64) -> (u64, u64, bool) {
        (
            ((slot >> CODE_SHIFT) & CODE_BITS) << 3,
            slot & INSTR_MAX,
            slot & ENTRY != 0,
        )
    }
}

/// V8 (node) frames in user stacks: how the kernel tells a JavaScript
/// frame from the frame pointers it walks ([`v8::V8Proc`], written by the
/// agent per process from the binary's postmortem `v8dbg_*` metadata), and
/// how such a frame is carried in a stack's `u64` slots ([`v8::encode`]).
///
/// Where the walk follows a frame pointer through code without unwind
/// tables (JIT code, or the interpreter's builtins) in a process running
/// V8, the kernel reads the frame's function slot. When it holds a
/// `JSFunction`, the frame's slot holds that function's
/// `SharedFunctionInfo` instead of the pc; the agent names it.
pub mod v8 {
    /// Hash of tgid -> [`V8Proc`].
    pub const V8_PROCS_MAP: &str = "V8_PROCS";
    /// Capacity of [`V8_PROCS_MAP`].
    pub const V8_PROCS_CAPACITY: u32 = 1024;

    /// Tag in the top bits of a JavaScript frame's slot (Python's is
    /// `0xa`; user addresses stay below 2^47).
    pub const TAG: u64 = 0xb << 60;
    const TAG_MASK: u64 = 0xf << 60;
    const ADDR_MASK: u64 = (1 << 56) - 1;

    /// Where one V8 process keeps what the kernel reads: offsets from a
    /// frame pointer (below it, in bytes) and in heap objects, and the
    /// instance types that mark a function.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct V8Proc {
        /// `-v8dbg_off_fp_context_or_frame_type`: a context (a heap
        /// object) in JavaScript frames, a frame-type marker (a small
        /// integer) in the others.
        pub fp_marker: u32,
        /// `-v8dbg_off_fp_function`: the frame's `JSFunction`.
        pub fp_function: u32,
        /// `HeapObject::map`.
        pub heap_map: u32,
        /// `Map::instance_type` (a `u16`).
        pub map_instance_type: u32,
        /// `JSFunction::shared`.
        pub function_shared: u32,
        /// Instance types of functions: `[first, last]`.
        pub function_first: u32,
        pub function_last: u32,
        /// Instance type of a `SharedFunctionInfo`.
        pub shared_type: u32,
    }

    /// Set in the slot of a typed frame in JIT memory (regular
    /// expression code, stubs): the slot holds its frame type.
    pub const MARKER: u64 = 1 << 55;
    /// Largest frame type taken for a marker.
    pub const MAX_FRAME_TYPE: u64 = 63;

    /// A JavaScript frame's slot: the (untagged) address of its function's
    /// `SharedFunctionInfo`.
    pub const fn encode(shared: u64) -> u64 {
        TAG | (shared & ADDR_MASK & !MARKER)
    }

    /// The slot of a typed frame of type `frame_type` (V8's
    /// `StackFrame::Type`, the `v8dbg_frametype_*` values).
    pub const fn encode_marker(frame_type: u64) -> u64 {
        TAG | MARKER | (frame_type & MAX_FRAME_TYPE)
    }

    /// The frame type of a typed frame's slot, None for a function's.
    pub const fn marker(slot: u64) -> Option<u64> {
        if slot & MARKER != 0 {
            Some(slot & MAX_FRAME_TYPE)
        } else {
            None
        }
    }

    /// True for a slot written by [`encode`].
    pub const fn is_frame(slot: u64) -> bool {
        slot & TAG_MASK == TAG
    }

    /// The `SharedFunctionInfo` address of a slot.
    pub const fn decode(slot: u64) -> u64 {
        slot & ADDR_MASK
    }
}

/// True for a slot that holds an interpreter's or JIT's frame (Python,
/// JavaScript) rather than a code address.
pub const fn is_runtime_frame(slot: u64) -> bool {
    python::is_frame(slot) || v8::is_frame(slot)
}

/// Where the kernel keeps a task's pending return uprobes (see the agent's
/// `attach/task_btf.rs`): indices into the [`uret::GLOBAL`] array of byte
/// offsets, all 0 when unknown. The table unwinder puts back the return
/// address a return uprobe replaced with its trampoline.
pub mod uret {
    /// Global (`.rodata`): `[u32; COUNT]` of byte offsets.
    pub const GLOBAL: &str = "URETPROBE_OFFSETS";
    /// `task_struct.utask`.
    pub const TASK_UTASK: usize = 0;
    /// `uprobe_task.return_instances`.
    pub const UTASK_RETURN_INSTANCES: usize = 1;
    /// `return_instance.orig_ret_vaddr`.
    pub const RI_ORIG_RET_VADDR: usize = 2;
    /// `return_instance.chained`.
    pub const RI_CHAINED: usize = 3;
    /// `return_instance.next`.
    pub const RI_NEXT: usize = 4;
    /// `task_struct.mm`.
    pub const TASK_MM: usize = 5;
    /// `mm_struct.uprobes_state.xol_area`.
    pub const MM_XOL_AREA: usize = 6;
    /// `xol_area.vaddr`.
    pub const XOL_VADDR: usize = 7;
    /// `uprobe_task.vaddr`: the probed instruction being stepped out of
    /// line.
    pub const UTASK_VADDR: usize = 8;
    /// Entries.
    pub const COUNT: usize = 9;
    /// Bytes of one out-of-line slot in the area (x86); the first holds
    /// the return trampoline.
    pub const XOL_SLOT_BYTES: u64 = 128;
}
