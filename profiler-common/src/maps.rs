//! Map names (each defined once, here), their capacities, and the slots
//! of the `WATCH` array.

#[allow(unused_imports)]
use crate::*;

/// Array of ring buffers that carry [`Event`]s from the kernel to the
/// agent (`BPF_MAP_TYPE_ARRAY_OF_MAPS` of `BPF_MAP_TYPE_RINGBUF`): one ring
/// per CPU, selected by the CPU a program runs on, or with
/// [`PER_CPU_RINGS_GLOBAL`] 0 one shared ring in slot 0. The agent creates
/// the rings and puts them in.
pub const EVENTS_MAP: &str = "EVENTS";

/// Slots of [`EVENTS_MAP`] in the object (the agent sets the number of
/// possible CPUs at load).
pub const EVENTS_SLOTS: u32 = 1024;

/// Per-CPU `u64` counters, indexed by the `COUNTER_*` constants.
pub const COUNTERS_MAP: &str = "COUNTERS";

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

/// [`WATCH_MAP`] slot: while the watched thread runs an iteration of its
/// event loop (from the return of the loop's wait to its next entry), with
/// [`WAIT_LOOP_GLOBAL`] set, the time the iteration began
/// (`bpf_ktime_get_ns`); 0 otherwise. Like [`WATCH_DEPTH`], it opens the
/// samplers.
pub const WATCH_ITER: u32 = 3;

/// [`WATCH_MAP`] slot, written by the agent: the user stack pointer of the
/// loop's own wait. A wait at this stack pointer or above (shallower) is
/// the loop's; a deeper one is a wait inside an iteration. 0: not learnt
/// yet, every wait counts as the loop's.
pub const WATCH_LOOP_SP: u32 = 4;

/// [`WATCH_MAP`] slot: the [`wait`] word of the wait the watched thread is
/// in (plus one, so 0 means none), from its entry to its return.
pub const WATCH_IN_WAIT: u32 = 5;

/// [`WATCH_MAP`] slot, armed by the agent: the watched thread was inside
/// a wait syscall at attach, which the trampolines or kretprobes (seeing
/// only calls entered after them) will not see return. 0: not armed (the
/// `sys_exit` tracepoint sees every return); [`CATCH_UP_ARMED`]: the
/// `sys_exit` program reports the next wait return; [`CATCH_UP_DONE`]: a
/// wait was seen entered or returning, so the trampolines see all from
/// here (the `sys_exit` program does nothing, and the agent detaches it).
pub const WATCH_CATCH_UP: u32 = 6;
/// [`WATCH_CATCH_UP`]: the `sys_exit` program reports the next wait return.
pub const CATCH_UP_ARMED: u64 = 1;
/// [`WATCH_CATCH_UP`]: done.
pub const CATCH_UP_DONE: u64 = 2;

/// [`WATCH_MAP`] slot, written by the agent with [`WATCH_LOOP_SP`]: the
/// loop's wait's family and object ([`crate::wait::key`]). A wait at the
/// loop's stack level or above is the loop's only when it matches; 0
/// matches every wait.
pub const WATCH_LOOP_KEY: u32 = 7;

/// [`WATCH_MAP`] slot: the in-dispatch sampler's ticks while an iteration
/// is younger than `SAMPLE_FULL_AFTER_NS` (`watch`'s lower early rate:
/// one in `SAMPLE_EARLY_EVERY` is taken).
pub const WATCH_EARLY_TICKS: u32 = 8;

/// Number of slots in [`WATCH_MAP`].
pub const WATCH_SLOTS: u32 = 9;

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

/// Hash of traced tgid -> parent tgid (0 for a session's own targets):
/// the processes whose probe hits count when [`TRACK_GLOBAL`] is set.
pub const TRACED_MAP: &str = "TRACED";

/// Capacity of [`TRACED_MAP`].
pub const TRACED_CAPACITY: u32 = 16384;

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

/// Hash of task pointer -> [`OffCpuStart`]: threads currently blocked.
pub const OFFCPU_START_MAP: &str = "OFFCPU_START";

/// Per-CPU hash of [`SampleKey`] -> nanoseconds blocked.
pub const OFFCPU_NS_MAP: &str = "OFFCPU_NS";
