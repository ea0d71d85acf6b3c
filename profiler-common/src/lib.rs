//! Types shared by the kernel programs (`profiler-ebpf`) and the agent
//! (`profiler-user`). Everything here is `#[repr(C)]`, made of `u32`/`u64`
//! fields only, with no implicit padding, so both sides agree on the layout.
#![no_std]

/// Ring buffer that carries [`Event`]s from the kernel to the agent.
pub const EVENTS_MAP: &str = "EVENTS";
/// Per-CPU `u64` counters, indexed by the `COUNTER_*` constants.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Global (`.rodata`) holding the traced process's tgid.
pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";
/// Global (`.rodata`) holding the wake-up threshold in bytes: an event
/// submitted while less than this much is pending does not wake the agent.
pub const WAKEUP_BYTES_GLOBAL: &str = "WAKEUP_BYTES";

/// LRU hash of thread ids already announced with a [`CommEvent`].
pub const SEEN_THREADS_MAP: &str = "SEEN_THREADS";
/// Capacity of [`SEEN_THREADS_MAP`].
pub const SEEN_THREADS_CAPACITY: u32 = 16384;

/// Entry/exit events that could not be reserved in the ring buffer (it was full).
pub const COUNTER_LOST: u32 = 0;
/// Probe hits that were filtered out because they came from another process.
pub const COUNTER_FOREIGN: u32 = 1;
/// Thread-name events that could not be reserved (the ring was full).
pub const COUNTER_LOST_COMM: u32 = 2;
/// Number of counters in [`COUNTERS_MAP`].
pub const COUNTER_COUNT: u32 = 3;

/// Name of the entry uprobe program.
pub const PROG_ENTRY: &str = "prof_entry";
/// Name of the return uprobe program.
pub const PROG_EXIT: &str = "prof_exit";

/// Kind of an [`Event`], stored in the top bits of [`Event::word`].
pub const KIND_ENTRY: u32 = 0;
/// A function returned.
pub const KIND_EXIT: u32 = 1;
/// A thread seen for the first time: a [`CommEvent`] with its name.
pub const KIND_COMM: u32 = 2;
/// Bits of [`Event::word`] that hold the function index.
pub const FUNC_BITS: u32 = 28;
/// Mask of the function index in [`Event::word`].
pub const FUNC_MASK: u32 = (1 << FUNC_BITS) - 1;
/// Largest number of functions a session can probe.
pub const MAX_FUNCS: u32 = FUNC_MASK + 1;

/// One function entry or exit: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the probe.
    pub ts_ns: u64,
    /// Thread id (the kernel's pid) of the thread that hit the probe.
    pub tid: u32,
    /// `kind << FUNC_BITS | function index`.
    pub word: u32,
}

impl Event {
    /// Packs a kind and a function index into an event word.
    #[inline(always)]
    pub const fn pack(kind: u32, func: u32) -> u32 {
        (kind << FUNC_BITS) | (func & FUNC_MASK)
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
}

/// A thread's first appearance, with its name: 32 bytes. Sent once per
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

#[cfg(feature = "user")]
unsafe impl aya::Pod for Event {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for CommEvent {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_is_16_bytes_and_packs() {
        assert_eq!(core::mem::size_of::<Event>(), 16);
        assert_eq!(core::mem::size_of::<CommEvent>(), 32);
        let e = Event {
            ts_ns: 1,
            tid: 2,
            word: Event::pack(KIND_EXIT, 12345),
        };
        assert_eq!(e.kind(), KIND_EXIT);
        assert_eq!(e.func(), 12345);
        let e = Event {
            ts_ns: 1,
            tid: 2,
            word: Event::pack(KIND_ENTRY, FUNC_MASK),
        };
        assert_eq!(e.kind(), KIND_ENTRY);
        assert_eq!(e.func(), FUNC_MASK);
    }
}
