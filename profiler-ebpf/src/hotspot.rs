//! HotSpot frames: in a process the agent found running a JVM
//! (`HS_PROCS`, with the code heaps and the offsets libjvm.so's own
//! `gHotSpotVMStructs` give), a pc the table unwinder meets in the code
//! cache is looked up in its code heap's segment map (a few hops back to
//! the start of its `CodeBlob`). The interpreter's frames are stepped by
//! their frame pointer, and their slot holds the frame's `Method*` and
//! bytecode index ([`hotspot::encode_interpreted`]); other blobs' frames
//! (compiled methods, stubs) by the frame size their blob gives, and their
//! slot holds the blob ([`hotspot::encode_compiled`]). The agent names
//! both.
//!
//! A process without an entry costs one hash lookup per walk.
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_NO_PREALLOC},
    helpers::{bpf_get_current_task_btf, bpf_probe_read_user, generated::bpf_task_pt_regs},
    macros::map,
    maps::HashMap,
};
use profiler_common::hotspot::{
    self, HsProc, HS_PROCS_CAPACITY, LOW_MAX, MAX_HEAPS, NAME_INTERPRETER, SEGMAP_HOPS,
};

/// Processes running HotSpot, by tgid (written by the agent).
#[map(name = "HS_PROCS")]
static HS_PROCS: HashMap<u32, HsProc> =
    HashMap::with_max_entries(HS_PROCS_CAPACITY, BPF_F_NO_PREALLOC);

/// Largest frame taken from a blob (words); larger ones end the walk.
const MAX_FRAME_WORDS: u64 = 1 << 14;

#[inline(always)]
fn read<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user copes with any address.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// This process's entry, if it runs HotSpot.
#[inline(always)]
pub fn proc(pid: u32) -> Option<HsProc> {
    // SAFETY: the value is copied out.
    unsafe { HS_PROCS.get(pid) }.copied()
}

/// This process's entry in its map, if it runs HotSpot, to copy from.
#[inline(always)]
pub fn proc_ptr(pid: u32) -> Option<*const HsProc> {
    // SAFETY: only the pointer is taken.
    unsafe { HS_PROCS.get(pid) }.map(|p| p as *const HsProc)
}

/// The code heap holding `pc`: its start, segment map and segment shift.
#[inline(always)]
fn heap(p: &HsProc, pc: u64) -> Option<(u64, u64, u64)> {
    for i in 0..MAX_HEAPS {
        if pc >= p.heap_lo[i] && pc < p.heap_hi[i] {
            return Some((p.heap_lo[i], p.segmap[i], u64::from(p.seg_shift[i] & 31)));
        }
    }
    None
}

/// The `CodeBlob` holding `pc`, through its heap's segment map: a
/// segment's byte is 0 at a block's first segment, else how many
/// segments to step back (0xff: free).
#[inline(always)]
fn blob(p: &HsProc, pc: u64) -> Option<u64> {
    let (lo, segmap, shift) = heap(p, pc)?;
    let mut seg = (pc - lo) >> shift;
    for _ in 0..SEGMAP_HOPS {
        let tag: u8 = read(segmap.wrapping_add(seg))?;
        match tag {
            0 => return Some(lo + (seg << shift) + u64::from(p.heap_block)),
            0xff => return None,
            t => seg = seg.wrapping_sub(u64::from(t)),
        }
    }
    None
}

/// The sampled task's r13: the interpreter keeps the bytecode pointer
/// there while it runs a method.
#[inline(always)]
fn user_r13() -> Option<u64> {
    // SAFETY: the helpers take any pointer; a failed read is an error code.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        aya_ebpf::helpers::bpf_probe_read_kernel(core::ptr::addr_of!((*regs).r13)).ok()
    }
}

/// A Java frame: its slot, and its caller's pc, sp and rbp.
pub struct Step {
    pub slot: u64,
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The Java frame at `pc` (with `sp`, `bp`), or None when `pc` is in no
/// blob the walk can step (not the code cache; a stub without a frame
/// size). `leaf`: the sampled frame, whose pc is not a return address.
#[inline(always)]
pub fn frame(p: &HsProc, pc: u64, sp: u64, bp: u64, leaf: bool) -> Option<Step> {
    let lookup = if leaf { pc } else { pc - 1 };
    let blob = blob(p, lookup)?;
    let name: u64 = read(blob + u64::from(p.blob_name))?;
    let first: u32 = read(name)?;
    if first == NAME_INTERPRETER {
        if bp <= sp {
            return None;
        }
        let method: u64 = read(bp - u64::from(p.fp_method))?;
        let cm: u64 = read(method + u64::from(p.method_const))?;
        let code = cm + u64::from(p.const_method_size);
        let saved: u64 = read(bp - u64::from(p.fp_bcp))?;
        // The leaf's bytecode pointer is in r13 (the frame's slot is
        // written only at calls); any other value there is not taken.
        let live = if leaf { user_r13().unwrap_or(0) } else { 0 };
        let bcp = if live >= code && live - code < LOW_MAX {
            live
        } else {
            saved
        };
        let bci = if bcp >= code { bcp - code } else { LOW_MAX };
        return Some(Step {
            slot: hotspot::encode_interpreted(method, bci),
            pc: read(bp + 8)?,
            sp: read(bp - u64::from(p.fp_sender_sp))?,
            bp: read(bp)?,
        });
    }
    let size: i32 = read(blob + u64::from(p.blob_frame_size))?;
    let complete: i32 = read(blob + u64::from(p.blob_frame_complete))?;
    let code: u64 = read(blob + u64::from(p.blob_code_begin))?;
    let size = size as i64 as u64;
    if size > MAX_FRAME_WORDS {
        return None;
    }
    let slot = hotspot::encode_compiled(blob, pc.wrapping_sub(code), leaf);
    // A stub without a frame size (the call stub into Java): by its frame
    // pointer.
    if size == 0 {
        if bp <= sp {
            return None;
        }
        return Some(Step {
            slot,
            pc: read(bp + 8)?,
            sp: bp + 16,
            bp: read(bp)?,
        });
    }
    // In the prologue of the sampled frame: only the return address is
    // known to be on the stack.
    if leaf && complete > 0 && pc < code + complete as u64 {
        return Some(Step {
            slot,
            pc: read(sp)?,
            sp: sp + 8,
            bp,
        });
    }
    let cfa = sp + size * 8;
    Some(Step {
        slot,
        pc: read(cfa - 8)?,
        sp: cfa,
        bp: read(cfa - 16)?,
    })
}
