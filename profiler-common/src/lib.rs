//! Types shared by the kernel programs (`profiler-ebpf`) and the agent
//! (`profiler-user`). Everything here is `#[repr(C)]`, made of `u32`/`u64`
//! fields only, with no implicit padding, so both sides agree on the layout.
//!
//! - [`maps`]: map names and capacities, the `WATCH` slots;
//! - [`settings`]: the globals set at load, by name;
//! - [`programs`]: program names, cookie flags, an event's function field;
//! - [`counters`]: indices of the `COUNTERS` array;
//! - [`records`]: the ring records, their kinds and their decoder;
//! - [`unwind`]: the table unwinder's rows, mappings and stacks;
//! - [`wait`], [`python`], [`v8`]: the wait syscalls the loop unwinder
//!   knows, and the interpreters' frames.
//!
//! Everything is re-exported at the crate root, so `profiler_common::X`
//! names any item.
#![no_std]

pub mod counters;
pub mod hotspot;
pub mod maps;
pub mod programs;
pub mod python;
pub mod records;
pub mod settings;
pub mod unwind;
pub mod v8;
pub mod wait;

pub use counters::*;
pub use maps::*;
pub use programs::*;
pub use records::*;
pub use settings::*;
pub use unwind::*;

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
    fn only_private_futex_waits_are_waits() {
        let futex = u64::from(wait::NR_FUTEX);
        // pthread_cond_wait, sem_wait, a contended lock: private waits.
        for op in [
            wait::FUTEX_WAIT,
            wait::FUTEX_WAIT_BITSET,
            wait::FUTEX_WAIT_BITSET | 256,
        ] {
            assert!(wait::waits(
                futex,
                [0x1000, op | wait::FUTEX_PRIVATE_FLAG, 0, 0]
            ));
        }
        // pthread_join: FUTEX_WAIT_BITSET on the joined thread's TID word,
        // shared.
        assert!(!wait::waits(futex, [0x1000, wait::FUTEX_WAIT_BITSET, 7, 0]));
        assert!(!wait::waits(futex, [0x1000, wait::FUTEX_WAIT, 7, 0]));
        // FUTEX_WAKE, private.
        assert!(!wait::waits(
            futex,
            [0x1000, 1 | wait::FUTEX_PRIVATE_FLAG, 1, 0]
        ));
        assert!(wait::waits(u64::from(wait::NR_EPOLL_WAIT), [3, 0, 0, 0]));
    }

    #[test]
    fn layouts_and_packing() {
        assert_eq!(core::mem::size_of::<Event>(), 24);
        assert_eq!(core::mem::size_of::<CommEvent>(), 40);
        assert_eq!(core::mem::size_of::<GoEvent>(), 32);
        assert_eq!(core::mem::size_of::<ProcEvent>(), 48);
        assert_eq!(core::mem::size_of::<UnwindRow>(), 8);
        for (kind, rbp_kind, off) in [(1, 1, -16), (5, 2, 0), (3, 0, -8192), (2, 1, 8184)] {
            let r = UnwindRow::new(7, kind, -3, rbp_kind, off).unwrap();
            assert_eq!((r.pc, r.cfa_offset), (7, -3));
            assert_eq!(
                (r.cfa_kind(), r.rbp_kind(), r.rbp_offset()),
                (kind, rbp_kind, off)
            );
        }
        for off in [-8200, 8192, 4, -12] {
            assert_eq!(UnwindRow::new(0, 1, 0, 1, off), None, "{off}");
        }
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
