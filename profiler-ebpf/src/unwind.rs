//! The table unwinder: walks the current task's user stack with the unwind
//! tables the agent compiled from each binary's `.eh_frame`
//! ([`UnwindRow`]s in `UNWIND_ROWS`, one contiguous range per binary) and
//! each process's executable mappings (`UNWIND_PROCS`), without copying
//! the stack. Where a pc has no table (JIT code, anonymous memory, a
//! binary without CFI) it follows frame pointers.
//!
//! One frame per `bpf_loop` iteration, so the verifier checks the step once;
//! inside it, two bounded binary searches (the mapping, then the row); the
//! mapping of the previous frame is tried first, and a process without
//! tables goes straight to frame pointers.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    helpers::{
        bpf_get_current_task_btf, bpf_probe_read_user,
        generated::{bpf_loop, bpf_probe_read_kernel, bpf_task_pt_regs},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use profiler_common::{
    cfa, rbp, unwind_end, ProcMaps, UnwindRow, UserStack, CPU_STACKS_CAPACITY, MAX_MAPPINGS,
    MAX_UNWIND_FRAMES, UNWIND_PROCS_CAPACITY,
};

/// Every compiled table; its size is set by the agent.
#[map(name = "UNWIND_ROWS")]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Executable mappings by tgid.
#[map(name = "UNWIND_PROCS")]
static UNWIND_PROCS: HashMap<u32, ProcMaps> =
    HashMap::with_max_entries(UNWIND_PROCS_CAPACITY, BPF_F_NO_PREALLOC);

/// Walked stacks by key, for the aggregated profiles.
#[map(name = "USER_STACKS")]
pub static USER_STACKS: HashMap<u64, UserStack> =
    HashMap::with_max_entries(CPU_STACKS_CAPACITY, BPF_F_NO_PREALLOC);

/// Where the current walk is written (a stack is too big for the BPF stack).
#[map]
static UNWIND_SCRATCH: PerCpuArray<UserStack> = PerCpuArray::with_max_entries(1, 0);

/// The bounds of a binary search in progress. Kept in a map rather than in
/// registers so that the verifier sees unknown values at every step: both
/// branches of a comparison then reach the same state and are pruned,
/// instead of doubling the paths to explore at every step.
#[map]
static SEARCH: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Binary-search steps over a process's mappings (2^9 > MAX_MAPPINGS).
const MAPPING_STEPS: usize = 9;
/// Binary-search steps over one table (tables up to 2^24 rows).
const ROW_STEPS: usize = 24;

/// The state of the walk in progress (per CPU). Like [`SEARCH`], it lives in
/// a map so that the verifier sees the same state at every iteration of
/// the loop and checks the step once, not once per frame.
#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// The state of one walk.
#[repr(C)]
struct Walk {
    pc: u64,
    sp: u64,
    bp: u64,
    hash: u64,
    pid: u32,
    n: u32,
    /// Most native frames this walk keeps.
    cap: u32,
    end: u32,
    /// 1 when the process has no tables at all.
    no_tables: u32,
    /// The mapping the last frame was found in (`[map_start, map_end)`,
    /// its bias and table): most callers are in the same binary as their
    /// callee, so the next frame usually needs neither the process's hash
    /// lookup nor the search over its mappings.
    map_start: u64,
    map_end: u64,
    map_bias: u64,
    table_start: u32,
    table_len: u32,
    /// 1 when a frame was in none of the process's known file mappings.
    outside: u32,
    /// [`unwind_end::FP_NO_TABLE`] once a frame was stepped by frame
    /// pointers because its binary (or the process) had no table.
    fp_no_table: u32,
    /// The uprobe trampoline of the process (0: none), and the task's next
    /// pending return uprobe, whose original return address replaces the
    /// trampoline's where the walk meets it.
    tramp: u64,
    ri: u64,
    /// 1 when the process runs V8 (`v8p` says where its frames keep
    /// their function).
    v8: u32,
    v8p: profiler_common::v8::V8Proc,
    /// 1 when the process runs HotSpot (`hsp`: its code heaps and the
    /// offsets of its frames).
    hs: u32,
    hsp: profiler_common::hotspot::HsProc,
    /// The Java step's reads land here (`hotspot::frame`).
    hsbuf: crate::hotspot::Buf,
}

/// The user registers of the current task: live in a user-mode sample, or
/// saved at its last entry into the kernel. None for kernel threads.
#[inline(always)]
pub(crate) fn user_regs() -> Option<(u64, u64, u64)> {
    // SAFETY: the helpers take any pointer; a failed read is an error code.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        let read = |field: *const u64| -> Option<u64> {
            let mut v = 0u64;
            (bpf_probe_read_kernel((&mut v as *mut u64).cast(), 8, field.cast()) == 0).then_some(v)
        };
        let cs = read(core::ptr::addr_of!((*regs).cs))?;
        if cs & 3 != 3 {
            return None;
        }
        Some((
            read(core::ptr::addr_of!((*regs).rip))?,
            read(core::ptr::addr_of!((*regs).rsp))?,
            read(core::ptr::addr_of!((*regs).rbp))?,
        ))
    }
}

/// Reads a u64 of kernel memory (0 when unreadable).
#[inline(always)]
fn read_kernel(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_kernel copes with any address.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// What a walk needs of the task's uprobes, or zeros (the task never hit
/// one, or the offsets are unknown): the process's out-of-line area (its
/// first slot is the return trampoline), the task's innermost pending
/// return uprobe, and the probed instruction it is stepping out of line.
#[inline(always)]
fn uprobe_state() -> (u64, u64, u64) {
    use profiler_common::uret;
    let o = crate::URETPROBE_OFFSETS.load();
    if o[uret::TASK_UTASK] == 0 {
        return (0, 0, 0);
    }
    // SAFETY: the current task, only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task_btf() } as u64;
    let utask = read_kernel(task + u64::from(o[uret::TASK_UTASK]));
    if utask == 0 {
        return (0, 0, 0);
    }
    let ri = read_kernel(utask + u64::from(o[uret::UTASK_RETURN_INSTANCES]));
    let stepping = read_kernel(utask + u64::from(o[uret::UTASK_VADDR]));
    let mm = read_kernel(task + u64::from(o[uret::TASK_MM]));
    let xol = match mm {
        0 => 0,
        mm => read_kernel(mm + u64::from(o[uret::MM_XOL_AREA])),
    };
    let area = match xol {
        0 => 0,
        xol => read_kernel(xol + u64::from(o[uret::XOL_VADDR])),
    };
    (area, ri, stepping)
}

/// Where a return uprobe replaced `w.pc` with its trampoline, the
/// original return address, from the task's pending return instances
/// (innermost first; a chained one shares its slot with the next).
#[inline(always)]
fn put_back_return(w: &mut Walk) {
    use profiler_common::uret;
    if w.tramp == 0 || w.pc != w.tramp || w.ri == 0 {
        return;
    }
    let o = crate::URETPROBE_OFFSETS.load();
    w.pc = read_kernel(w.ri + u64::from(o[uret::RI_ORIG_RET_VADDR]));
    w.ri = past_chain(w.ri);
}

/// The return instance after `ri` and those chained to it (which share
/// its slot on the stack).
#[inline(always)]
fn past_chain(mut ri: u64) -> u64 {
    use profiler_common::uret;
    let o = crate::URETPROBE_OFFSETS.load();
    for _ in 0..4 {
        // SAFETY: as in read_kernel.
        let chained = unsafe {
            aya_ebpf::helpers::bpf_probe_read_kernel(
                (ri + u64::from(o[uret::RI_CHAINED])) as *const u8,
            )
        }
        .unwrap_or(0);
        ri = read_kernel(ri + u64::from(o[uret::RI_NEXT]));
        if chained == 0 || ri == 0 {
            break;
        }
    }
    ri
}

/// True when the current task has user-mode state (not a kernel thread,
/// nor the idle task).
#[inline(always)]
pub fn has_user_regs() -> bool {
    user_regs().is_some()
}

/// Reads a u64 of user memory.
#[inline(always)]
fn read_user(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user copes with any address.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The mapping of `pid` holding `pc`: (start, end, bias, first row, rows),
/// or None when the process has no tables or `pc` is in no known file
/// mapping.
#[inline(always)]
fn find_mapping(pid: u32, pc: u64) -> Option<(u64, u64, u64, u32, u32)> {
    // SAFETY: the value is only read.
    let procs = unsafe { UNWIND_PROCS.get(pid) }?;
    let bounds = SEARCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU scratch; every index is masked into range.
    let lo = unsafe {
        (*bounds)[0] = 0;
        (*bounds)[1] = u64::from(procs.len.min(MAX_MAPPINGS as u32));
        for _ in 0..MAPPING_STEPS {
            let (lo, hi) = ((*bounds)[0], (*bounds)[1]);
            if lo >= hi {
                break;
            }
            let mid = (lo + hi) / 2;
            if procs.maps[mid as usize & (MAX_MAPPINGS - 1)].start <= pc {
                (*bounds)[0] = mid + 1;
            } else {
                (*bounds)[1] = mid;
            }
        }
        (*bounds)[0]
    };
    if lo == 0 {
        return None;
    }
    let m = &procs.maps[(lo - 1) as usize & (MAX_MAPPINGS - 1)];
    (pc < m.end).then_some((m.start, m.end, m.bias, m.table_start, m.table_len))
}

/// The last row of the table at `start` (`len` rows) whose pc is at or
/// before `key` (an address minus the mapping's bias).
#[inline(always)]
fn find_row(start: u32, len: u32, key: u32) -> Option<UnwindRow> {
    let bounds = SEARCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU scratch.
    let lo = unsafe {
        (*bounds)[0] = 0;
        (*bounds)[1] = u64::from(len);
        for _ in 0..ROW_STEPS {
            let (lo, hi) = ((*bounds)[0], (*bounds)[1]);
            if lo >= hi {
                break;
            }
            let mid = (lo + hi) / 2;
            let row = UNWIND_ROWS.get(start.wrapping_add(mid as u32))?;
            if row.pc <= key {
                (*bounds)[0] = mid + 1;
            } else {
                (*bounds)[1] = mid;
            }
        }
        (*bounds)[0] as u32
    };
    if lo == 0 {
        return None;
    }
    UNWIND_ROWS.get(start.wrapping_add(lo - 1)).copied()
}

/// One frame by frame pointer: the caller's pc and rbp are saved at rbp.
#[inline(always)]
fn fp_step(w: &mut Walk) -> i64 {
    if w.bp == 0 || w.bp < w.sp {
        w.end = if w.no_tables != 0 {
            unwind_end::NO_TABLES
        } else {
            unwind_end::FP_END
        };
        return 1;
    }
    let (Some(ra), Some(bp)) = (read_user(w.bp + 8), read_user(w.bp)) else {
        w.end = unwind_end::READ_FAULT;
        return 1;
    };
    w.sp = w.bp + 16;
    w.bp = bp;
    w.pc = ra;
    0
}

/// Above every user address ([`step`]).
const USER_ADDR_LIMIT: u64 = 1 << 56;

/// In a V8 process, frame `n` (walked by its frame pointer) of a
/// JavaScript function: its slot becomes the function's (`v8.rs`), and the
/// stack's hash follows (`before`: the hash without the frame).
#[inline(always)]
fn js_frame(w: &mut Walk, stack: *mut UserStack, n: usize, before: u64) {
    if w.v8 == 0 || w.bp == 0 || w.bp < w.sp {
        return;
    }
    // In no file mapping: JIT code.
    let jit = w.no_tables == 0 && w.map_end == 0;
    if let Some(slot) = crate::v8::frame(&w.v8p, w.bp, jit) {
        // SAFETY: per-CPU scratch, index masked into range.
        unsafe { (*stack).frames[n & (MAX_UNWIND_FRAMES - 1)] = slot };
        w.hash = (before ^ slot).wrapping_mul(FNV_PRIME);
    }
}

/// In a JVM, frame `n` when its pc is in the code cache: its slot becomes
/// the Java frame's (`hotspot.rs`) and the walk steps to its caller.
/// None when the pc is not in a blob the JVM's frames describe.
#[inline(always)]
fn java_frame(w: &mut Walk, stack: *mut UserStack, n: usize, before: u64) -> Option<i64> {
    if w.hs == 0 {
        return None;
    }
    let buf = core::ptr::addr_of_mut!(w.hsbuf);
    let s = crate::hotspot::frame(&w.hsp, buf, w.pc, w.sp, w.bp, n == 0)?;
    // SAFETY: per-CPU scratch, index masked into range.
    unsafe { (*stack).frames[n & (MAX_UNWIND_FRAMES - 1)] = s.slot };
    w.hash = (before ^ s.slot).wrapping_mul(FNV_PRIME);
    if s.sp <= w.sp {
        w.end = unwind_end::BAD_FRAME;
        return Some(1);
    }
    w.pc = s.pc;
    w.sp = s.sp;
    w.bp = s.bp;
    Some(0)
}

/// One frame: records the pc, then finds the caller's pc, sp and rbp.
/// Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn step(_index: u32, _ctx: *mut c_void) -> i64 {
    let (Some(w), Some(stack)) = (WALK.get_ptr_mut(0), UNWIND_SCRATCH.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: per-CPU scratch, written by `walk` before the loop.
    let w = unsafe { &mut *w };
    let n = w.n as usize;
    put_back_return(w);
    if n >= MAX_UNWIND_FRAMES || n >= w.cap as usize {
        w.end = unwind_end::DEPTH;
        return 1;
    }
    // No user address is this high (2^56: five-level page tables), and
    // the slots of interpreted frames are tagged above it: a return
    // address read from garbage (a frame pointer into data) must not pass
    // for a Python or JavaScript frame.
    if w.pc >= USER_ADDR_LIMIT {
        w.end = unwind_end::BAD_FRAME;
        return 1;
    }
    // SAFETY: per-CPU scratch, index masked into range.
    unsafe { (*stack).frames[n & (MAX_UNWIND_FRAMES - 1)] = w.pc };
    w.n += 1;
    let before = w.hash;
    w.hash = (w.hash ^ w.pc).wrapping_mul(FNV_PRIME);
    if w.pc == 0 {
        w.end = unwind_end::FP_END;
        return 1;
    }
    // A return address points after the call: look up the call itself.
    let lookup = if n == 0 { w.pc } else { w.pc - 1 };
    if w.no_tables != 0 {
        w.fp_no_table = unwind_end::FP_NO_TABLE;
        if let Some(r) = java_frame(w, stack, n, before) {
            return r;
        }
        js_frame(w, stack, n, before);
        return fp_step(w);
    }
    if lookup < w.map_start || lookup >= w.map_end {
        match find_mapping(w.pid, lookup) {
            Some((start, end, bias, table_start, table_len)) => {
                w.map_start = start;
                w.map_end = end;
                w.map_bias = bias;
                w.table_start = table_start;
                w.table_len = table_len;
            }
            None => {
                // Volatile: LLVM would merge the two stores into a call
                // of `memset`, a subprogram whose frame Linux 6.1 adds
                // to the step's and the program's stacks.
                // SAFETY: plain stores into the per-CPU walk state.
                unsafe {
                    core::ptr::write_volatile(&mut w.map_start, 0);
                    core::ptr::write_volatile(&mut w.map_end, 0);
                }
                w.table_len = 0;
                w.outside = 1;
            }
        }
    }
    let row = match w.table_len {
        0 => {
            if w.map_end != 0 {
                w.fp_no_table = unwind_end::FP_NO_TABLE;
            }
            None
        }
        // Below the table's base, or 4 GiB past it: no row.
        len => match u32::try_from(lookup.wrapping_sub(w.map_bias)) {
            Ok(key) => find_row(w.table_start, len, key),
            Err(_) => None,
        },
    };
    let Some(row) = row else {
        if w.map_end == 0 {
            if let Some(r) = java_frame(w, stack, n, before) {
                return r;
            }
        }
        js_frame(w, stack, n, before);
        return fp_step(w);
    };
    let cfa = match row.cfa_kind() {
        cfa::RSP => w.sp.wrapping_add(row.cfa_offset as i64 as u64),
        cfa::RBP => w.bp.wrapping_add(row.cfa_offset as i64 as u64),
        cfa::PLT => {
            let pushed = (w.pc & 15) >= row.cfa_offset as u64;
            w.sp + 8 + if pushed { 8 } else { 0 }
        }
        cfa::END => {
            w.end = unwind_end::ROOT;
            return 1;
        }
        // No CFI at this pc (a gap between functions' tables).
        cfa::UNSUPPORTED if row.cfa_offset == 0 => {
            js_frame(w, stack, n, before);
            return fp_step(w);
        }
        _ => {
            w.end = unwind_end::UNSUPPORTED;
            return 1;
        }
    };
    if cfa <= w.sp {
        w.end = unwind_end::BAD_FRAME;
        return 1;
    }
    let Some(ra) = read_user(cfa - 8) else {
        w.end = unwind_end::READ_FAULT;
        return 1;
    };
    w.bp = match row.rbp_kind() {
        rbp::SAME => w.bp,
        rbp::AT_CFA => read_user(cfa.wrapping_add(row.rbp_offset() as i64 as u64)).unwrap_or(0),
        _ => 0,
    };
    w.sp = cfa;
    w.pc = ra;
    0
}

/// Walks the current task's user stack into the per-CPU scratch stack, at
/// most `cap` frames: the native frames, innermost first, then the Python
/// frames of a CPython thread (`python.rs`; at most half of `cap`).
/// Returns it (valid until the next walk on this CPU) and its key (0:
/// no user stack, e.g. a kernel thread).
#[inline(always)]
pub fn walk(pid: u32, cap: u32) -> Option<(*mut UserStack, u64)> {
    let (mut pc, mut sp, bp) = user_regs()?;
    let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
    let (py, py_n) = crate::python::walk(pid, tid, cap / 2).unwrap_or((core::ptr::null(), 0));
    let (tramp, ri, stepping) = uprobe_state();
    // Sampled while the kernel steps a probed instruction out of line: the
    // pc is in the area's slot; the walk starts from the instruction's
    // own address.
    let slots = tramp + profiler_common::uret::XOL_SLOT_BYTES;
    if tramp != 0 && stepping != 0 && pc >= slots && pc < tramp + 4096 {
        pc = stepping;
    }
    // Sampled while the kernel handles a return uprobe (its trap, or the
    // uretprobe syscall): the `ret` returned into the trampoline, so the
    // walk starts there, as from a return address, with the stack as the
    // `ret` left it; `put_back_return` names the real return address.
    let o = crate::URETPROBE_OFFSETS.load();
    if tramp != 0 && pc > tramp && pc < slots {
        use profiler_common::uret;
        match o[uret::TRAMP] {
            uret::TRAMP_INT3 if pc == tramp + 1 => pc = tramp,
            uret::TRAMP_SYSCALL if pc == tramp + uret::TRAMP_SYSCALL_PC => {
                pc = tramp;
                sp += 24;
            }
            _ => {}
        }
    }
    // Sampled while the kernel runs a return uprobe's handlers: it set the
    // pc to the original return address before them, and takes their
    // return instance off the task's list only after (before Linux 6.11
    // at least). That instance is spent: the frames further out own the
    // next ones.
    let mut ri = ri;
    if ri != 0
        && pc != tramp
        && read_kernel(ri + u64::from(o[profiler_common::uret::RI_ORIG_RET_VADDR])) == pc
    {
        ri = past_chain(ri);
    }
    let stack = UNWIND_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: the value is only checked for presence.
    let no_tables = u32::from(unsafe { UNWIND_PROCS.get(pid) }.is_none());
    let w = WALK.get_ptr_mut(0)?;
    // Written field by field into the per-CPU value, the language
    // walkers' entries copied from their maps' values: a `Walk` built on
    // the BPF stack first took 248 bytes of it (prof_sched_switch: 472
    // bytes, now 224), and Linux 6.1's verifier counts the step
    // callback's stack (64) on top of the program's, 512 in all.
    // SAFETY: per-CPU scratch; `step` has the callback signature bpf_loop
    // expects.
    let w = unsafe {
        (*w).pc = pc;
        (*w).sp = sp;
        (*w).bp = bp;
        (*w).hash = FNV_OFFSET;
        (*w).pid = pid;
        (*w).n = 0;
        (*w).cap = cap - py_n;
        (*w).end = 0;
        (*w).no_tables = no_tables;
        (*w).map_start = 0;
        (*w).map_end = 0;
        (*w).map_bias = 0;
        (*w).table_start = 0;
        (*w).table_len = 0;
        (*w).outside = 0;
        (*w).fp_no_table = 0;
        (*w).tramp = tramp;
        (*w).ri = ri;
        (*w).v8 = 0;
        if let Some(v8p) = crate::v8::proc_ptr(pid) {
            (*w).v8 = 1;
            core::ptr::copy_nonoverlapping(v8p, &mut (*w).v8p, 1);
        }
        (*w).hs = 0;
        if let Some(hsp) = crate::hotspot::proc_ptr(pid) {
            (*w).hs = 1;
            core::ptr::copy_nonoverlapping(hsp, &mut (*w).hsp, 1);
        }
        bpf_loop(
            MAX_UNWIND_FRAMES as u32,
            step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        &mut *w
    };
    if w.end == 0 {
        w.end = unwind_end::DEPTH;
    }
    w.end |= w.fp_no_table;
    for i in 0..profiler_common::python::MAX_PY_FRAMES {
        if i >= py_n {
            break;
        }
        let n = w.n as usize;
        if n >= MAX_UNWIND_FRAMES {
            break;
        }
        // SAFETY: `py` holds `py_n` frames; indices masked into range.
        let slot =
            unsafe { *py.add(i as usize & (profiler_common::python::MAX_PY_FRAMES as usize - 1)) };
        // SAFETY: `stack` is the per-CPU scratch `UserStack` the walk writes; the index is masked into range.
        unsafe { (*stack).frames[n & (MAX_UNWIND_FRAMES - 1)] = slot };
        w.n += 1;
        w.hash = (w.hash ^ slot).wrapping_mul(FNV_PRIME);
    }
    // SAFETY: per-CPU scratch.
    unsafe {
        (*stack).len = w.n;
        (*stack).end = w.end;
    }
    let key = (w.hash ^ u64::from(w.end)).wrapping_mul(FNV_PRIME) | 1;
    Some((stack, key))
}

/// Whether this CPU's last walk met a frame in none of the process's known
/// file mappings (JIT code, or a mapping that came after the agent read
/// them).
#[inline(always)]
pub fn left_known_mappings() -> bool {
    // SAFETY: per-CPU scratch, written by the last `walk` on this CPU.
    WALK.get_ptr_mut(0)
        .is_some_and(|w| unsafe { (*w).outside } != 0)
}

/// Walks the user stack and stores it in `USER_STACKS`. Returns its key,
/// or 0 when there is none or the map is full (counted in `full`).
#[inline(always)]
pub fn store(pid: u32, full: impl Fn()) -> u64 {
    let Some((stack, key)) = walk(pid, MAX_UNWIND_FRAMES as u32) else {
        return 0;
    };
    // SAFETY: the value is only checked for presence.
    if unsafe { USER_STACKS.get(key) }.is_some() {
        return key;
    }
    // SAFETY: `stack` points at the per-CPU scratch value. Passed by
    // reference: a 1 KiB copy would not fit the BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = USER_STACKS.insert(key, unsafe { &*stack }, 0);
    if inserted.is_err() {
        full();
        return 0;
    }
    note_codes(pid);
    key
}

/// Tells the agent of the language frames of the stack this CPU's last
/// `walk` wrote (for a Python or node process), whatever keeps that stack:
/// the agent names a frame's code while the target still runs, not only
/// when a dispatch that holds it is reported.
#[inline(always)]
pub fn note_codes(pid: u32) {
    if crate::python::runs(pid)
        || crate::v8::proc(pid).is_some()
        || crate::hotspot::proc(pid).is_some()
    {
        // SAFETY: `note_step` has the callback signature bpf_loop expects.
        unsafe {
            bpf_loop(
                MAX_UNWIND_FRAMES as u32,
                note_step as *mut c_void,
                core::ptr::null_mut(),
                0,
            );
        }
    }
}

/// One frame of the stack just walked: a Python frame's code object, or
/// a JavaScript frame's function, is told of (`python::note_code`) if it
/// is new.
#[inline(never)]
extern "C" fn note_step(index: u32, _ctx: *mut c_void) -> i64 {
    let (Some(stack), Some(w)) = (UNWIND_SCRATCH.get_ptr_mut(0), WALK.get_ptr_mut(0)) else {
        return 1;
    };
    // SAFETY: per-CPU scratch, written by the walk just made.
    let (len, pid) = unsafe { ((*stack).len, (*w).pid) };
    if index >= len {
        return 1;
    }
    // SAFETY: as above; the index is masked into range.
    let slot = unsafe { (*stack).frames[index as usize & (MAX_UNWIND_FRAMES - 1)] };
    if profiler_common::python::is_frame(slot) {
        crate::python::note_code(pid, profiler_common::python::decode(slot).0);
    } else if profiler_common::v8::is_frame(slot) && profiler_common::v8::marker(slot).is_none() {
        crate::python::note_code(pid, slot);
    } else if profiler_common::hotspot::is_frame(slot) {
        crate::python::note_code(pid, profiler_common::hotspot::object(slot));
    }
    0
}
