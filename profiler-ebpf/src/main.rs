//! Kernel programs of the profiler: one entry uprobe and one return uprobe,
//! attached once per traced function, with the function's index as the probe
//! cookie. Each hit writes a 16-byte [`Event`] to the `EVENTS` ring buffer.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext, Global,
};
use profiler_common::{Event, COUNTER_COUNT, COUNTER_FOREIGN, COUNTER_LOST, KIND_ENTRY, KIND_EXIT};

/// Set by the agent at load time: the traced process's tgid.
#[unsafe(no_mangle)]
static TARGET_TGID: Global<u32> = Global::new(0);

/// Set by the agent at load time: wake the agent only once this many bytes
/// are pending, so a busy target does not pay for a wake-up per event. The
/// agent also drains the ring on a short timer, so quiet periods are not
/// delayed by more than that tick.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: Global<u64> = Global::new(0);

/// Size is overridden by the agent (`--ring-size`).
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

#[inline(always)]
fn bump(counter: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter) {
        // Per-CPU slot, and BPF programs are not preempted by each other on
        // one CPU for uprobes, so a plain increment is exact.
        unsafe { *slot += 1 };
    }
}

/// Writes one event. Returns without writing for other processes (the
/// probes are scoped to the PID already; this is a second guard).
#[inline(always)]
fn emit<C: EbpfContext>(ctx: &C, kind: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid != TARGET_TGID.load() {
        bump(COUNTER_FOREIGN);
        return;
    }
    let func = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    match EVENTS.reserve::<Event>(0) {
        Some(mut slot) => {
            slot.write(Event {
                ts_ns: unsafe { bpf_ktime_get_ns() },
                tid: pid_tgid as u32,
                word: Event::pack(kind, func),
            });
            let pending = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
            let flags = if pending >= WAKEUP_BYTES.load() {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            };
            slot.submit(flags as u64);
        }
        None => bump(COUNTER_LOST),
    }
}

#[uprobe]
pub fn prof_entry(ctx: ProbeContext) -> u32 {
    emit(&ctx, KIND_ENTRY);
    0
}

#[uretprobe]
pub fn prof_exit(ctx: RetProbeContext) -> u32 {
    emit(&ctx, KIND_EXIT);
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
