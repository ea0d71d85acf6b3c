//! V8 (node) frames in user stacks: how the kernel tells a JavaScript
//! frame from the frame pointers it walks ([`V8Proc`], written by the
//! agent per process from the binary's postmortem `v8dbg_*` metadata), and
//! how such a frame is carried in a stack's `u64` slots ([`encode`]).
//!
//! Where the walk follows a frame pointer through code without unwind
//! tables (JIT code, or the interpreter's builtins) in a process running
//! V8, the kernel reads the frame's function slot. When it holds a
//! `JSFunction`, the frame's slot holds that function's
//! `SharedFunctionInfo` instead of the pc; the agent names it.

/// Hash of tgid -> [`V8Proc`].
pub const V8_PROCS_MAP: &str = "V8_PROCS";
/// Capacity of [`V8_PROCS_MAP`].
pub const V8_PROCS_CAPACITY: u32 = 1024;

/// Tag in the top bits of a JavaScript frame's slot (Python's is
/// `0xa`; user addresses stay below 2^47).
pub const TAG: u64 = 0xb << 60;
const TAG_MASK: u64 = 0xf << 60;
const ADDR_MASK: u64 = (1 << 56) - 1;

/// Where one V8 process keeps what the kernel reads: offsets from a
/// frame pointer (below it, in bytes) and in heap objects, and the
/// instance types that mark a function.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct V8Proc {
    /// `-v8dbg_off_fp_context_or_frame_type`: a context (a heap
    /// object) in JavaScript frames, a frame-type marker (a small
    /// integer) in the others.
    pub fp_marker: u32,
    /// `-v8dbg_off_fp_function`: the frame's `JSFunction`.
    pub fp_function: u32,
    /// `HeapObject::map`.
    pub heap_map: u32,
    /// `Map::instance_type` (a `u16`).
    pub map_instance_type: u32,
    /// `JSFunction::shared`.
    pub function_shared: u32,
    /// Instance types of functions: `[first, last]`.
    pub function_first: u32,
    pub function_last: u32,
    /// Instance type of a `SharedFunctionInfo`.
    pub shared_type: u32,
}

/// Set in the slot of a typed frame in JIT memory (regular
/// expression code, stubs): the slot holds its frame type.
pub const MARKER: u64 = 1 << 55;
/// Largest frame type taken for a marker.
pub const MAX_FRAME_TYPE: u64 = 63;

/// A JavaScript frame's slot: the (untagged) address of its function's
/// `SharedFunctionInfo`.
pub const fn encode(shared: u64) -> u64 {
    TAG | (shared & ADDR_MASK & !MARKER)
}

/// The slot of a typed frame of type `frame_type` (V8's
/// `StackFrame::Type`, the `v8dbg_frametype_*` values).
pub const fn encode_marker(frame_type: u64) -> u64 {
    TAG | MARKER | (frame_type & MAX_FRAME_TYPE)
}

/// The frame type of a typed frame's slot, None for a function's.
pub const fn marker(slot: u64) -> Option<u64> {
    if slot & MARKER != 0 {
        Some(slot & MAX_FRAME_TYPE)
    } else {
        None
    }
}

/// True for a slot written by [`encode`].
pub const fn is_frame(slot: u64) -> bool {
    slot & TAG_MASK == TAG
}

/// The `SharedFunctionInfo` address of a slot.
pub const fn decode(slot: u64) -> u64 {
    slot & ADDR_MASK
}
