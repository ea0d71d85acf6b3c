//! The kernel-to-agent rings (`EVENTS`, an array of ring buffers: one per
//! CPU, or one shared) and the records' writer, the `COUNTERS` array, and
//! the watched thread's state (`WATCH`).

use crate::*;

/// A ring of `EVENTS`. Its size here only shapes the template the kernel
/// checks inner maps against (ring sizes may differ); the agent creates
/// the rings, `--ring-size` bytes each.
pub(crate) type Ring = RingBuf<u64, 4096>;

/// The rings, one per CPU (or one shared, in slot 0), filled in by the
/// agent after load; its slot count is set to the possible CPUs.
#[btf_map(name = "EVENTS")]
pub(crate) static EVENTS: ArrayOfMaps<Ring, { EVENTS_SLOTS as usize }> = ArrayOfMaps::new();

/// The ring this program writes to: the current CPU's, or the shared one.
/// Records of one thread in one ring keep its order; the agent merges the
/// rings by timestamp.
#[inline(always)]
pub(crate) fn ring() -> Option<&'static Ring> {
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
pub(crate) fn reserve<T: 'static>() -> Option<(RingBufEntry<T>, u64)> {
    let ring = ring()?;
    let slot = ring.reserve_untyped::<T>(0)?;
    // What the reservation took: the record rounded up to 8 bytes, and
    // the ring's 8-byte header.
    let taken = (core::mem::size_of::<T>() as u64).div_ceil(8) * 8 + 8;
    Some((slot, wakeup_flags(ring, taken)))
}

#[map(name = "COUNTERS")]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

#[map(name = "WATCH")]
pub(crate) static WATCH: Array<u64> = Array::with_max_entries(WATCH_SLOTS, 0);

#[inline(always)]
pub(crate) fn bump(counter: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter) {
        // Per-CPU slot; tracing programs do not nest on one CPU for these
        // hooks, so a plain increment is exact.
        // SAFETY: a pointer into this CPU's value of the map entry; no other CPU writes it, and these programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
pub(crate) fn watch_get(slot: u32) -> u64 {
    WATCH.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
pub(crate) fn watch_set(slot: u32, value: u64) {
    if let Some(p) = WATCH.get_ptr_mut(slot) {
        // SAFETY: a u64 slot of an array map; a racing writer on another
        // CPU writes the same kind of value.
        unsafe { *p = value };
    }
}

/// True while the watched thread is inside a dispatch: a dispatch
/// function's frame is open, or an iteration of its event loop runs.
#[inline(always)]
pub(crate) fn in_dispatch() -> bool {
    watch_get(WATCH_DEPTH) > 0 || watch_get(WATCH_ITER) != 0
}

#[inline(always)]
pub(crate) fn watch_ptr(slot: u32) -> Option<*mut u64> {
    WATCH.get_ptr_mut(slot)
}

/// Flags for submitting a record to `ring` that took `taken` bytes of it
/// (just reserved): wake the agent only when enough is pending in it, once,
/// by the record that crossed the threshold. A wake-up on every record
/// past it (while the agent is behind, or stopped) made each probe hit
/// about 4× dearer here (an irq_work each); the agent also drains every
/// 10 ms, and keeps draining while its ring has more, so a crossing missed
/// (the agent read in between, another CPU wrote a shared ring) costs at
/// most that.
#[inline(always)]
pub(crate) fn wakeup_flags(ring: &Ring, taken: u64) -> u64 {
    let map = core::ptr::from_ref(ring).cast_mut().cast();
    // SAFETY: `ring` is a ring-buffer map the kernel handed out.
    let pending = unsafe { bpf_ringbuf_query(map, BPF_RB_AVAIL_DATA as u64) };
    let threshold = WAKEUP_BYTES.load();
    if pending >= threshold && pending < threshold.saturating_add(taken) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Writes a 24-byte event, counting a failed reservation in `lost_counter`.
/// (`bpf_ringbuf_output`, one helper call where this takes two, measured
/// the same: 88 ns a probe hit here.)
#[inline(always)]
pub(crate) fn emit_event(ts_ns: u64, tid: u32, kind: u32, func: u32, sp: u64, lost_counter: u32) {
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
