//! Kernel programs of the profiler: one entry uprobe and one return uprobe,
//! attached once per traced function, with the function's index as the probe
//! cookie. Each hit writes a 16-byte [`Event`] to the `EVENTS` ring buffer.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext, Global,
};
use profiler_common::{
    CommEvent, Event, COUNTER_COUNT, COUNTER_FOREIGN, COUNTER_LOST, COUNTER_LOST_COMM, KIND_COMM,
    KIND_ENTRY, KIND_EXIT, SEEN_THREADS_CAPACITY,
};

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

#[map(name = "SEEN_THREADS")]
static SEEN_THREADS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(SEEN_THREADS_CAPACITY, 0);

/// Announces a thread the first time it hits a probe, with its name.
#[inline(always)]
fn announce_thread(tid: u32, ts_ns: u64) {
    if unsafe { SEEN_THREADS.get(&tid) }.is_some() {
        return;
    }
    let _ = SEEN_THREADS.insert(&tid, &0, 0);
    match EVENTS.reserve::<CommEvent>(0) {
        Some(mut slot) => {
            slot.write(CommEvent {
                event: Event {
                    ts_ns,
                    tid,
                    word: Event::pack(KIND_COMM, 0),
                },
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            });
            slot.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => bump(COUNTER_LOST_COMM),
    }
}

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
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    let tid = pid_tgid as u32;
    announce_thread(tid, ts_ns);
    match EVENTS.reserve::<Event>(0) {
        Some(mut slot) => {
            slot.write(Event {
                ts_ns,
                tid,
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
