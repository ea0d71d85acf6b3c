//! Settings: the kernel object's globals (`.rodata`, set by the agent at
//! load), by name, and the values `TRACK` takes.

#[allow(unused_imports)]
use crate::*;

/// Global (`.rodata`): 1 to write to the ring of the current CPU, 0 to
/// write every event to the shared ring in slot 0 of [`EVENTS_MAP`].
pub const PER_CPU_RINGS_GLOBAL: &str = "PER_CPU_RINGS";

/// Global (`.rodata`) holding the traced process's tgid.
pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";

/// Global (`.rodata`) holding the watched thread's tid (0: none), whose
/// dispatches are timed, sampled and explained.
pub const WATCH_TID_GLOBAL: &str = "WATCH_TID";

/// Global: 1 to record who wakes the watched thread inside a dispatch
/// (`WakerEvent`s and the waker sampler), 0 for `record --no-wakers`.
pub const WAKERS_GLOBAL: &str = "WAKERS";

/// Global (`.rodata`, u32): the in-dispatch sampler takes one tick in this
/// many while an iteration of the loop is younger than
/// [`SAMPLE_FULL_AFTER_NS_GLOBAL`] (1: every tick; `watch`'s flight rate).
pub const SAMPLE_EARLY_EVERY_GLOBAL: &str = "SAMPLE_EARLY_EVERY";

/// Global (`.rodata`, u64): how old an iteration is, in ns, before the
/// in-dispatch sampler takes every tick (0: from its start).
pub const SAMPLE_FULL_AFTER_NS_GLOBAL: &str = "SAMPLE_FULL_AFTER_NS";

/// Global (`.rodata`): 1 to bound the watched thread's dispatches by its
/// event loop's wait syscalls (`prof_sys_enter`/`prof_sys_exit` attached),
/// 0 otherwise.
pub const WAIT_LOOP_GLOBAL: &str = "WAIT_LOOP";

/// Global (`.rodata`) holding the wake-up threshold in bytes: an event
/// submitted while less than this much is pending does not wake the agent.
pub const WAKEUP_BYTES_GLOBAL: &str = "WAKEUP_BYTES";

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

/// Global (`.rodata`): byte offsets of `signal` in `task_struct` and of
/// `live` in `signal_struct`: where `sched_process_exit` has no
/// `group_dead` argument (Debian 12's Linux 6.1), the last thread's exit
/// finds `live` at 0 ([`super::PROG_PROC_EXIT_OLD`]).
pub const TASK_SIGNAL_LIVE_OFFSETS_GLOBAL: &str = "TASK_SIGNAL_LIVE_OFFSETS";

/// Global (`.rodata`): sample every process (1) or only `TARGET_TGID` (0).
pub const SAMPLE_ALL_GLOBAL: &str = "SAMPLE_ALL";

/// Global (`.rodata`): with `sample --all --cgroup`, the id of the cgroup
/// (v2) whose subtree alone is sampled; 0 for no filter.
pub const CGROUP_ID_GLOBAL: &str = "CGROUP_ID";

/// Global (`.rodata`): that cgroup's level (the root is 0).
pub const CGROUP_LEVEL_GLOBAL: &str = "CGROUP_LEVEL";

/// Global (`.rodata`): copy user stacks for DWARF unwinding (1) or not (0).
pub const DWARF_MODE_GLOBAL: &str = "DWARF_MODE";
