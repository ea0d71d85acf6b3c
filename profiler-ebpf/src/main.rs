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

mod hotspot;
mod probes;
mod procs;
mod python;
mod rings;
mod samplers;
mod sched;
mod settings;
mod stacks;
mod unwind;
mod v8;
mod wait;

// The package's library (a stub for aya-build) is linked into every bin
// target; this one does not use it.
use profiler_ebpf as _;

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
    WAKER_KERNEL_THREAD, WAKER_LOOP, WATCH_BLOCKED, WATCH_DEPTH, WATCH_EARLY_TICKS, WATCH_ITER,
    WATCH_SLOTS, WATCH_TASK,
};

use probes::*;
use rings::*;
use samplers::*;
use sched::*;
use settings::*;
use stacks::*;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
