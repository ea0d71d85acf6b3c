//! HotSpot frames: in a process the agent found running a JVM
//! (`HS_PROCS`, with the code heaps and the offsets libjvm.so's own
//! `gHotSpotVMStructs` give), a pc the table unwinder meets in the code
//! cache is either the interpreter's (its code's range is in the entry)
//! or looked up in its code heap's segment map (a few hops back to the
//! start of its `CodeBlob`). The interpreter's frames are stepped by
//! their frame pointer, and their slot holds the frame's `Method*` and
//! bytecode index ([`hotspot::encode_interpreted`]); other blobs' frames
//! (compiled methods, stubs) by the frame size their blob gives, and their
//! slot holds the blob ([`hotspot::encode_compiled`]). The agent names
//! both.
//!
//! Each frame's words are read in as few reads as the layout allows,
//! into the walk's per-CPU buffer (a read costs more than the rest of a
//! step): an interpreted frame is one read of its slots, saved `rbp` and
//! return address plus one of its `Method`; a compiled one is the segment
//! map's hops, one read of its blob's header and one of its frame's end.
//!
//! A process without an entry costs one hash lookup per walk.
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_NO_PREALLOC},
    helpers::{bpf_get_current_task_btf, bpf_probe_read_user, generated::bpf_task_pt_regs},
    macros::map,
    maps::HashMap,
};
use profiler_common::hotspot::{
    self, HsProc, BLOB_WINDOW, CODE_APART, FP_WINDOW, FP_WINDOW_WORDS, HS_PROCS_CAPACITY, LOW_MAX,
    MAX_HEAPS, SEGMAP_HOPS,
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

/// The walk's buffer for a frame's reads: [`FP_WINDOW_WORDS`] words.
pub type Buf = [u64; FP_WINDOW_WORDS];

/// Reads `len` bytes at `addr` into `buf` (at most its size).
#[inline(always)]
fn read_into(buf: *mut Buf, len: u32, addr: u64) -> Option<()> {
    // SAFETY: the buffer holds `len` bytes (callers pass constants no
    // larger); bpf_probe_read_user copes with any source address.
    let r = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            buf.cast(),
            len,
            addr as *const core::ffi::c_void,
        )
    };
    (r == 0).then_some(())
}

/// The `T` at byte `off` of the buffer (masked into its first 64 bytes:
/// the agent checked the offsets).
#[inline(always)]
fn at<T: Copy>(buf: *const Buf, off: u32) -> T {
    // SAFETY: 64 + size_of::<T>() (at most 8) bytes fit in the buffer.
    unsafe { core::ptr::read_unaligned(buf.cast::<u8>().add((off & 63) as usize).cast::<T>()) }
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
/// `buf`: the walk's scratch for the frame's reads.
#[inline(always)]
pub fn frame(p: &HsProc, buf: *mut Buf, pc: u64, sp: u64, bp: u64, leaf: bool) -> Option<Step> {
    let lookup = if leaf { pc } else { pc - 1 };
    if lookup >= p.interp_lo && lookup < p.interp_hi {
        if bp <= sp || bp < u64::from(FP_WINDOW) {
            return None;
        }
        // The slots below the frame pointer, the saved rbp, the return
        // address: one read.
        read_into(buf, FP_WINDOW + 16, bp - u64::from(FP_WINDOW))?;
        let below = |off: u32| -> u64 { at(buf, FP_WINDOW.wrapping_sub(off)) };
        let method = below(p.fp_method);
        let saved = below(p.fp_bcp);
        let sender_sp = below(p.fp_sender_sp);
        // SAFETY: the buffer holds FP_WINDOW_WORDS words.
        let (saved_bp, ret) = unsafe { ((*buf)[FP_WINDOW_WORDS - 2], (*buf)[FP_WINDOW_WORDS - 1]) };
        let cm: u64 = read(method + u64::from(p.method_const))?;
        let code = cm + u64::from(p.const_method_size);
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
            pc: ret,
            sp: sender_sp,
            bp: saved_bp,
        });
    }
    let blob = blob(p, lookup)?;
    // Its frame size, frame-complete offset and code start: one read.
    read_into(buf, BLOB_WINDOW, blob + u64::from(p.blob_window))?;
    let size: i32 = at(buf, p.blob_frame_size);
    let complete: i32 = at(buf, p.blob_frame_complete);
    let code: u64 = if p.blob_code_begin & CODE_APART == 0 {
        at(buf, p.blob_code_begin)
    } else {
        read(blob + u64::from(p.blob_code_begin & !CODE_APART))?
    };
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
        read_into(buf, 16, bp)?;
        // SAFETY: the buffer holds FP_WINDOW_WORDS words.
        let (saved_bp, ret) = unsafe { ((*buf)[0], (*buf)[1]) };
        return Some(Step {
            slot,
            pc: ret,
            sp: bp + 16,
            bp: saved_bp,
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
    read_into(buf, 16, cfa - 16)?;
    // SAFETY: the buffer holds FP_WINDOW_WORDS words.
    let (saved_bp, ret) = unsafe { ((*buf)[0], (*buf)[1]) };
    Some(Step {
        slot,
        pc: ret,
        sp: cfa,
        bp: saved_bp,
    })
}
