//! HotSpot (JVM) frames in user stacks: where a JVM keeps its code cache
//! and frames ([`HsProc`], written by the agent per process from
//! libjvm.so's own `gHotSpotVMStructs` tables), and how a Java frame is
//! carried in a stack's `u64` slots ([`encode_interpreted`],
//! [`encode_compiled`]).
//!
//! Where the table unwinder meets a pc in the code cache of a process
//! running HotSpot, the kernel finds the pc's `CodeBlob` through the code
//! heap's segment map: an interpreted frame is stepped by its frame
//! pointer and its slot holds the frame's `Method*` and bytecode index;
//! any other blob's frame is stepped by the blob's frame size and its
//! slot holds the blob (an `nmethod`'s names its method). The agent names
//! both.

/// Hash of tgid -> [`HsProc`].
pub const HS_PROCS_MAP: &str = "HS_PROCS";
/// Capacity of [`HS_PROCS_MAP`].
pub const HS_PROCS_CAPACITY: u32 = 1024;
/// Most code heaps a JVM has (non-nmethods, profiled, non-profiled).
pub const MAX_HEAPS: usize = 3;
/// Segment-map hops the kernel follows to a blob's start (each hop
/// covers up to 254 segments).
pub const SEGMAP_HOPS: usize = 16;

/// Tag in the top bits of a Java frame's slot (Python's is `0xa`, V8's
/// `0xb`).
pub const TAG: u64 = 0xc << 60;
const TAG_MASK: u64 = 0xf << 60;
/// Set on a compiled frame's slot (its blob), clear on an interpreted
/// one's (its method).
pub const COMPILED: u64 = 1 << 59;
const ADDR_SHIFT: u32 = 15;
const ADDR_BITS: u64 = (1 << 44) - 1;
/// Largest bytecode index kept; larger ones read as it. The low bits of
/// a compiled frame's slot: [`LEAF`] and its pc offset.
pub const LOW_MAX: u64 = (1 << ADDR_SHIFT) - 1;
/// Set on a compiled frame's slot when it is the sampled frame: its pc
/// is where it was interrupted, not a return address.
pub const LEAF: u64 = 1 << (ADDR_SHIFT - 1);
/// Largest pc offset a compiled frame's slot keeps; larger ones read as
/// it.
pub const OFFSET_MAX: u64 = LEAF - 1;

/// Bytes the kernel reads at once from an interpreted frame, from
/// [`FP_WINDOW`] below its frame pointer: the slots below it (the
/// bytecode pointer the lowest of them), the saved `rbp` and the return
/// address.
pub const FP_WINDOW: u32 = 64;
pub const FP_WINDOW_WORDS: usize = (FP_WINDOW as usize + 16) / 8;
/// Bytes the kernel reads at once from a `CodeBlob`, from
/// `HsProc::blob_window`: its frame size, frame-complete offset and code
/// start.
pub const BLOB_WINDOW: u32 = 32;
/// Set in `HsProc::blob_code_begin` when the code start lies outside that
/// window: the rest is its offset in the blob, read apart.
pub const CODE_APART: u32 = 1 << 31;

/// Where one JVM keeps what the kernel reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HsProc {
    /// Each code heap's reserved range `[lo, hi)` and segment map.
    pub heap_lo: [u64; MAX_HEAPS],
    pub heap_hi: [u64; MAX_HEAPS],
    pub segmap: [u64; MAX_HEAPS],
    /// The interpreter's code (`AbstractInterpreter::_code`'s stub
    /// buffer), `[lo, hi)`: a pc there is an interpreted frame's, with no
    /// segment map to search.
    pub interp_lo: u64,
    pub interp_hi: u64,
    /// `log2` of each heap's segment size.
    pub seg_shift: [u32; MAX_HEAPS],
    /// `sizeof(HeapBlock)`: a blob starts that far into its block.
    pub heap_block: u32,
    /// Where in a `CodeBlob` the kernel's one read of [`BLOB_WINDOW`]
    /// bytes starts, and where in that window `_frame_size` (words),
    /// `_frame_complete_offset` and `_code_begin` are (bytes; the last
    /// with [`CODE_APART`] when it is read apart, at that offset in the
    /// blob).
    pub blob_window: u32,
    pub blob_frame_size: u32,
    pub blob_frame_complete: u32,
    pub blob_code_begin: u32,
    /// `Method::_constMethod`, and `sizeof(ConstMethod)` (the bytecodes
    /// follow it).
    pub method_const: u32,
    pub const_method_size: u32,
    /// Below an interpreted frame's frame pointer (bytes, at most
    /// [`FP_WINDOW`]): the sender's stack pointer, the `Method*`, the
    /// saved bytecode pointer.
    pub fp_sender_sp: u32,
    pub fp_method: u32,
    pub fp_bcp: u32,
    /// Zero.
    pub pad: u32,
}

/// An interpreted frame's slot: its `Method*` and bytecode index.
pub const fn encode_interpreted(method: u64, bci: u64) -> u64 {
    let bci = if bci > LOW_MAX { LOW_MAX } else { bci };
    TAG | ((method >> 3) & ADDR_BITS) << ADDR_SHIFT | bci
}

/// A compiled frame's slot: its `CodeBlob*`, the pc's offset from the
/// blob's code (a return address's, unless `leaf`).
pub const fn encode_compiled(blob: u64, pc_offset: u64, leaf: bool) -> u64 {
    let off = if pc_offset > OFFSET_MAX {
        OFFSET_MAX
    } else {
        pc_offset
    };
    TAG | COMPILED | ((blob >> 3) & ADDR_BITS) << ADDR_SHIFT | if leaf { LEAF } else { 0 } | off
}

/// True for a slot written by [`encode_interpreted`] or
/// [`encode_compiled`].
pub const fn is_frame(slot: u64) -> bool {
    slot & TAG_MASK == TAG
}

/// `(address, low bits, compiled)` of a slot: a method and bytecode
/// index, or a blob and pc offset.
pub const fn decode(slot: u64) -> (u64, u64, bool) {
    (
        ((slot >> ADDR_SHIFT) & ADDR_BITS) << 3,
        slot & LOW_MAX,
        slot & COMPILED != 0,
    )
}

/// The slot without its low bits: what the agent reads once (a method,
/// or a blob), whatever the bytecode index or pc.
pub const fn object(slot: u64) -> u64 {
    slot & !LOW_MAX
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for HsProc {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_slots_round_trip_and_never_look_like_others() {
        let m = 0x7f12_3456_78a8;
        let s = encode_interpreted(m, 42);
        assert!(is_frame(s) && !crate::python::is_frame(s) && !crate::v8::is_frame(s));
        assert_eq!(decode(s), (m, 42, false));
        assert_eq!(decode(encode_interpreted(m, 1 << 20)), (m, LOW_MAX, false));
        let c = encode_compiled(m, 0x123, false);
        assert_eq!(decode(c), (m, 0x123, true));
        assert_eq!(
            decode(encode_compiled(m, 0x123, true)),
            (m, LEAF | 0x123, true)
        );
        assert_eq!(
            decode(encode_compiled(m, 1 << 20, false)),
            (m, OFFSET_MAX, true)
        );
        assert_eq!(object(c), object(encode_compiled(m, 7, true)));
        assert!(!is_frame(0x7fff_ffff_f000) && !is_frame(0xffff_ffff_8100_0000));
        assert_eq!(core::mem::size_of::<HsProc>(), 144);
    }
}
