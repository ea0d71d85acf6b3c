//! CPython frames (3.8 and later): for a process the agent found running
//! CPython (`PY_PROCS`, with the offsets of its version), finds the
//! current thread's `PyThreadState` (by its `native_thread_id`; before
//! 3.11, by its `thread_id`, the thread's `pthread_self()`, which is its
//! fs base: from the interpreter's thread list, cached per thread) and
//! walks its frame chain, innermost first, keeping each frame's code
//! object and instruction index ([`python::encode`]): the
//! `_PyInterpreterFrame` chain from 3.11, the `PyFrameObject` chain
//! (`f_back`, `f_lasti`) before, where each frame is the outermost of its
//! evaluator call. The agent names them.
//!
//! One frame per `bpf_loop` iteration, state in per-CPU maps, as in the
//! table unwinder. A process without an entry costs one hash lookup.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_loop,
    },
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    python::{
        self, PyCodeNotice, PyProc, MAX_PY_FRAMES, NONE, OWNED_BY_CSTACK, PY_CODES_CAPACITY,
        PY_NEWS_BYTES, PY_PROCS_CAPACITY, STYLE_INTERP, STYLE_LASTI_BYTES,
    },
    COUNTER_PY_NOTICES_LOST,
};

/// Processes running CPython, by tgid (written by the agent).
#[map(name = "PY_PROCS")]
static PY_PROCS: HashMap<u32, PyProc> =
    HashMap::with_max_entries(PY_PROCS_CAPACITY, BPF_F_NO_PREALLOC);

/// Code objects the agent was told of, per process.
#[map]
static PY_CODES: LruHashMap<PyCodeNotice, u8> = LruHashMap::with_max_entries(PY_CODES_CAPACITY, 0);

/// Code objects met for the first time, for the agent to read while their
/// process runs (one that exits or execs takes its code objects along).
#[map(name = "PY_NEWS")]
static PY_NEWS: RingBuf = RingBuf::with_byte_size(PY_NEWS_BYTES, 0);

/// A thread's `PyThreadState`, or 0 when it had none when last looked for.
#[repr(C)]
#[derive(Clone, Copy)]
struct ThreadState {
    tstate: u64,
    /// When a thread without one was last looked for.
    checked_ns: u64,
}

/// Threads' states, by tid.
#[map]
static PY_THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(8192, 0);

/// A thread with no `PyThreadState` is looked for again after this long
/// (it may call into Python later).
const RECHECK_NS: u64 = 1_000_000_000;
/// Threads of one interpreter searched for the current one.
const MAX_THREADS: u32 = 256;

/// The walk in progress (per CPU).
#[repr(C)]
struct PyWalk {
    frames: [u64; MAX_PY_FRAMES as usize],
    n: u32,
    cap: u32,
    tid: u32,
    found: u32,
    /// What the thread state's `native_thread_id` (or `thread_id`) holds
    /// for the current thread.
    want: u64,
    /// The frame to read next; the thread state being checked, in the
    /// thread search.
    at: u64,
    proc: PyProc,
}

#[map]
static PY_WALK: PerCpuArray<PyWalk> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user copes with any address.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(addr as *const u32) }.ok()
}

#[inline(always)]
fn read_u8(addr: u64) -> Option<u8> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(addr as *const u8) }.ok()
}

/// One thread state of the interpreter's list: stops at the current
/// thread's.
#[inline(never)]
extern "C" fn thread_step(_index: u32, _ctx: *mut c_void) -> i64 {
    let Some(w) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU scratch, written by `walk` before the loop.
    let w = unsafe { &mut *w };
    if w.at == 0 {
        return 1;
    }
    let tid = read_u64(w.at.wrapping_add(u64::from(w.proc.tstate_native_tid)));
    if tid == Some(w.want) {
        w.found = 1;
        return 1;
    }
    match read_u64(w.at.wrapping_add(u64::from(w.proc.tstate_next))) {
        Some(next) => w.at = next,
        None => return 1,
    }
    0
}

/// The current thread's `PyThreadState`, from the cache when it still
/// names this thread, else from the interpreter's list. `w` is the per-CPU
/// walk state, which the loop's callback writes: it is read back through
/// the raw pointer after the loop, never through a reference held across it.
#[inline(always)]
fn thread_state(w: *mut PyWalk) -> Option<u64> {
    // SAFETY: `w` points at this CPU's scratch value.
    let (tid, want, proc) = unsafe { ((*w).tid, (*w).want, (*w).proc) };
    // SAFETY: the value is copied out.
    if let Some(cached) = unsafe { PY_THREADS.get(tid) }.copied() {
        if cached.tstate != 0 {
            let native = read_u64(cached.tstate + u64::from(proc.tstate_native_tid));
            if native == Some(want) {
                return Some(cached.tstate);
            }
        // SAFETY: a BPF helper with no arguments and no preconditions.
        } else if unsafe { bpf_ktime_get_ns() }.wrapping_sub(cached.checked_ns) < RECHECK_NS {
            return None;
        }
    }
    let interp = read_u64(proc.interp_head)?;
    let first = read_u64(interp.wrapping_add(u64::from(proc.interp_threads)))?;
    // SAFETY: as above; `thread_step` has the callback signature bpf_loop
    // expects.
    let (found, at) = unsafe {
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*w).at), first);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*w).found), 0);
        bpf_loop(
            MAX_THREADS,
            thread_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        (
            core::ptr::read_volatile(core::ptr::addr_of!((*w).found)),
            core::ptr::read_volatile(core::ptr::addr_of!((*w).at)),
        )
    };
    let tstate = if found != 0 { at } else { 0 };
    let entry = ThreadState {
        tstate,
        // SAFETY: a BPF helper with no arguments and no preconditions.
        checked_ns: unsafe { bpf_ktime_get_ns() },
    };
    let _ = PY_THREADS.insert(tid, entry, 0);
    (tstate != 0).then_some(tstate)
}

/// One Python frame: records it, then moves to its caller.
#[inline(never)]
extern "C" fn frame_step(_index: u32, _ctx: *mut c_void) -> i64 {
    let Some(w) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU scratch, written by `walk` before the loop.
    let w = unsafe { &mut *w };
    let frame = w.at;
    let n = w.n;
    if frame == 0 || n >= w.cap || n >= MAX_PY_FRAMES {
        return 1;
    }
    let p = &w.proc;
    if p.style != STYLE_INTERP {
        // A `PyFrameObject`: its own evaluator call's outermost frame.
        let (Some(code), Some(lasti), Some(back)) = (
            read_u64(frame.wrapping_add(u64::from(p.frame_code))),
            read_u32(frame.wrapping_add(u64::from(p.frame_instr))),
            read_u64(frame.wrapping_add(u64::from(p.frame_previous))),
        ) else {
            return 1;
        };
        w.at = back;
        // -1 before its first instruction.
        let lasti = match lasti as i32 {
            ..0 => 0,
            l => l as u64,
        };
        let index = if p.style == STYLE_LASTI_BYTES {
            lasti / 2
        } else {
            lasti
        };
        w.frames[n as usize & (MAX_PY_FRAMES as usize - 1)] = python::encode(code, index, true);
        w.n = n + 1;
        return 0;
    }
    let (Some(owner), Some(previous)) = (
        read_u8(frame.wrapping_add(u64::from(p.frame_owner))),
        read_u64(frame.wrapping_add(u64::from(p.frame_previous))),
    ) else {
        return 1;
    };
    w.at = previous;
    if owner == OWNED_BY_CSTACK {
        // The shim frame of an evaluator call: the frame before it was
        // that call's outermost.
        if n > 0 {
            // Read again, so the compiler cannot fold the `- 1` into the
            // access's offset with `n`'s known range: Linux 6.1's verifier
            // does not learn `n >= 1` from the test above and refuses a
            // negative offset.
            // SAFETY: a field of the per-CPU scratch borrowed above.
            let m = unsafe { core::ptr::read_volatile(&w.n) };
            w.frames[m.wrapping_sub(1) as usize & (MAX_PY_FRAMES as usize - 1)] |= python::ENTRY;
        }
        return 0;
    }
    let (Some(code), Some(instr)) = (
        read_u64(frame.wrapping_add(u64::from(p.frame_code))),
        read_u64(frame.wrapping_add(u64::from(p.frame_instr))),
    ) else {
        return 1;
    };
    let entry = p.frame_is_entry != NONE
        && read_u8(frame.wrapping_add(u64::from(p.frame_is_entry))).unwrap_or(0) != 0;
    let start = code.wrapping_add(u64::from(p.code_adaptive));
    let index = if instr > start {
        (instr - start) / 2
    } else {
        0
    };
    w.frames[n as usize & (MAX_PY_FRAMES as usize - 1)] = python::encode(code, index, entry);
    w.n = n + 1;
    0
}

/// Walks the current thread's Python frames (at most `cap`), when process
/// `pid` runs CPython. Returns them (valid until the next walk on this
/// CPU) and how many there are.
#[inline(always)]
pub fn walk(pid: u32, tid: u32, cap: u32) -> Option<(*const u64, u32)> {
    // SAFETY: the value is copied out.
    let proc = *unsafe { PY_PROCS.get(pid) }?;
    let w = PY_WALK.get_ptr_mut(0)?;
    let want = if proc.style == STYLE_INTERP {
        u64::from(tid)
    } else {
        // SAFETY: a BPF helper with no arguments; the task is only read
        // through bpf_probe_read_kernel, which copes with any address.
        let task = unsafe { bpf_get_current_task() };
        // SAFETY: as said.
        unsafe {
            bpf_probe_read_kernel(task.wrapping_add(u64::from(proc.task_fsbase)) as *const u64)
        }
        .ok()?
    };
    // SAFETY: per-CPU scratch, only through the raw pointer (see
    // `thread_state`).
    unsafe {
        (*w).proc = proc;
        (*w).tid = tid;
        (*w).want = want;
        (*w).n = 0;
        (*w).cap = cap;
    }
    let tstate = thread_state(w)?;
    let mut frame = read_u64(tstate.wrapping_add(u64::from(proc.tstate_frame)))?;
    if proc.cframe_frame != NONE {
        frame = read_u64(frame.wrapping_add(u64::from(proc.cframe_frame)))?;
    }
    // SAFETY: as above; `frame_step` has the callback signature bpf_loop
    // expects.
    let n = unsafe {
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*w).at), frame);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*w).n), 0);
        bpf_loop(
            MAX_PY_FRAMES,
            frame_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        core::ptr::read_volatile(core::ptr::addr_of!((*w).n))
    };
    // SAFETY: the frames live in the per-CPU map value.
    Some((unsafe { core::ptr::addr_of!((*w).frames) }.cast::<u64>(), n))
}

/// True when the agent found CPython in process `pid`.
#[inline(always)]
pub fn runs(pid: u32) -> bool {
    // SAFETY: the value is only checked for presence.
    unsafe { PY_PROCS.get(pid) }.is_some()
}

/// Tells the agent of `code` of `pid` (a Python frame's code object, or a
/// JavaScript frame's whole slot), the first time a walked stack holds it.
/// A notice the ring has no room for is counted and forgotten, so the next
/// new stack with it tells again.
#[inline(always)]
pub fn note_code(pid: u32, code: u64) {
    let key = PyCodeNotice { pid, pad: 0, code };
    // SAFETY: the value is only checked for presence.
    if unsafe { PY_CODES.get(key) }.is_some()
        || PY_CODES.insert(key, 0, BPF_NOEXIST as u64).is_err()
    {
        return;
    }
    match PY_NEWS.reserve::<PyCodeNotice>(0) {
        Some(mut slot) => {
            slot.write(key);
            // The agent reads the ring on its ticks.
            slot.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => {
            let _ = PY_CODES.remove(key);
            crate::bump(COUNTER_PY_NOTICES_LOST);
        }
    }
}
