//! V8 frames: in a process the agent found running V8 (`V8_PROCS`, with
//! the offsets its binary's postmortem metadata gives), a frame that the
//! table unwinder walks by its frame pointer is checked for a JavaScript
//! function: the slot below the frame pointer that holds a context in
//! JavaScript frames (a frame-type marker, a small integer, in the
//! others), and the one that holds the `JSFunction`. Each object is
//! checked by its map's instance type before its `SharedFunctionInfo` is
//! kept ([`v8::encode`]); the agent names it.
//!
//! A process without an entry costs one hash lookup per walk.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC, helpers::bpf_probe_read_user, macros::map, maps::HashMap,
};
use profiler_common::v8::{self, V8Proc, V8_PROCS_CAPACITY};

/// Processes running V8, by tgid (written by the agent).
#[map(name = "V8_PROCS")]
static V8_PROCS: HashMap<u32, V8Proc> =
    HashMap::with_max_entries(V8_PROCS_CAPACITY, BPF_F_NO_PREALLOC);

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user copes with any address.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The address of the heap object a tagged word points at.
#[inline(always)]
fn heap_object(word: u64) -> Option<u64> {
    (word & 3 == 1).then_some(word & !3)
}

/// The instance type of the heap object at `obj` (from its map).
#[inline(always)]
fn instance_type(p: &V8Proc, obj: u64) -> Option<u32> {
    let map = heap_object(read_u64(obj + u64::from(p.heap_map))?)?;
    // SAFETY: as in read_u64.
    let t = unsafe { bpf_probe_read_user((map + u64::from(p.map_instance_type)) as *const u16) };
    t.ok().map(u32::from)
}

/// This process's entry, if it runs V8.
#[inline(always)]
pub fn proc(pid: u32) -> Option<V8Proc> {
    // SAFETY: the value is copied out.
    unsafe { V8_PROCS.get(pid) }.copied()
}

/// This process's entry in its map, if it runs V8, to copy from.
#[inline(always)]
pub fn proc_ptr(pid: u32) -> Option<*const V8Proc> {
    // SAFETY: only the pointer is taken.
    unsafe { V8_PROCS.get(pid) }.map(|p| p as *const V8Proc)
}

/// The slot of the JavaScript frame whose frame pointer is `bp`, or None
/// when that frame is not one (native code, or a typed frame: a stub, an
/// exit or entry frame). `jit`: the pc is in no file mapping, so that a
/// typed frame's marker is V8's (regular expression code, stubs) and is
/// kept too.
#[inline(always)]
pub fn frame(p: &V8Proc, bp: u64, jit: bool) -> Option<u64> {
    if bp < u64::from(p.fp_marker.max(p.fp_function)) {
        return None;
    }
    let marker = read_u64(bp - u64::from(p.fp_marker))?;
    // A small integer (tag bit 0): the frame-type marker of a typed frame,
    // the type shifted left by one.
    if marker & 1 == 0 {
        let t = marker >> 1;
        return (jit && t > 0 && t <= v8::MAX_FRAME_TYPE).then_some(v8::encode_marker(t));
    }
    heap_object(marker)?;
    let function = heap_object(read_u64(bp - u64::from(p.fp_function))?)?;
    let t = instance_type(p, function)?;
    if t < p.function_first || t > p.function_last {
        return None;
    }
    let shared = heap_object(read_u64(function + u64::from(p.function_shared))?)?;
    (instance_type(p, shared)? == p.shared_type).then_some(v8::encode(shared))
}
