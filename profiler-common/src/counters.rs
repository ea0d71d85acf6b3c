//! Indices of the per-CPU `COUNTERS` array: what the kernel programs
//! count (lost records, samples, full maps).

#[allow(unused_imports)]
use crate::*;

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
