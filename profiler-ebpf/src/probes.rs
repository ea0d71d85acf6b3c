//! The function probes: `prof_entry`, `prof_ret` (a uprobe on a return
//! instruction) and `prof_exit` (a return uprobe), the Go variants that
//! carry the goroutine, which processes count (`TRACED`), and new threads
//! announced.

use crate::*;

#[map(name = "SEEN_THREADS")]
pub(crate) static SEEN_THREADS: LruHashMap<u32, u32> =
    LruHashMap::with_max_entries(SEEN_THREADS_CAPACITY, 0);

/// The thread this CPU last announced or found announced: most hits come
/// from the thread that hit the last probe on the same CPU, and an array
/// slot costs less than the hash lookup in `SEEN_THREADS`.
#[map(name = "LAST_SEEN")]
pub(crate) static LAST_SEEN: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Traced tgid -> parent tgid (0: a target the agent named). Used when
/// `TRACK` is not `track::ONE`.
#[map(name = "TRACED")]
pub(crate) static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(TRACED_CAPACITY, 0);

/// True when process `tgid` is traced.
#[inline(always)]
pub(crate) fn is_traced(tgid: u32) -> bool {
    if TRACK.load() == track::ONE {
        tgid == TARGET_TGID.load()
    } else {
        // SAFETY: the entry is only tested or copied at once; the reference does not outlive this run of the program.
        unsafe { TRACED.get(tgid) }.is_some()
    }
}

/// Announces a thread the first time it hits a probe, with its name and
/// its process (the header's function field).
#[inline(always)]
pub(crate) fn announce_thread(tid: u32, tgid: u32, ts_ns: u64) {
    let last = LAST_SEEN.get_ptr_mut(0);
    if let Some(last) = last {
        // SAFETY: this CPU's slot; these programs do not nest on one CPU.
        if unsafe { *last } == tid {
            return;
        }
        // SAFETY: as above. Set before the lookup: the thread is
        // announced below if it is not already.
        unsafe { *last = tid };
    }
    // SAFETY: the entry is only tested or copied at once; the reference does not outlive this run of the program.
    if unsafe { SEEN_THREADS.get(tid) }.is_some() {
        return;
    }
    let _ = SEEN_THREADS.insert(tid, 0, 0);
    match reserve::<CommEvent>() {
        Some((mut slot, wake)) => {
            slot.write(CommEvent {
                event: Event {
                    ts_ns,
                    tid,
                    word: Event::pack(KIND_COMM, tgid),
                    sp: 0,
                },
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            });
            let _ = wake;
            slot.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => bump(COUNTER_LOST_COMM),
    }
}

/// Keeps the watched thread's dispatch depth and task pointer current.
#[inline(always)]
pub(crate) fn track_watched(kind: u32, cookie: u64) {
    if let Some(task) = watch_ptr(WATCH_TASK) {
        // SAFETY: a BPF helper with no arguments; the task address is only stored or read through BPF helpers.
        let current = unsafe { bpf_get_current_task() };
        // Stored only when it changed: a store on every hit would take the
        // cache line from the CPUs whose samplers and scheduler hooks read
        // it, a cost the calibration (whose thread is not watched) does not
        // see.
        // SAFETY: `watch_ptr` returned a pointer into the `WATCH` array's slot, valid as long as the map.
        unsafe {
            if *task != current {
                *task = current;
            }
        }
    }
    if cookie & COOKIE_DISPATCH == 0 {
        return;
    }
    if let Some(depth) = watch_ptr(WATCH_DEPTH) {
        // SAFETY: `watch_ptr` returned a pointer into the `WATCH` array's slot, valid as long as the map.
        unsafe {
            if kind == KIND_ENTRY {
                *depth += 1;
            } else if *depth > 0 {
                *depth -= 1;
            }
        }
    }
}

/// Writes a Go function's entry or exit, keyed by goroutine (`g`, in r14
/// under Go's register ABI) with the depth below the goroutine stack's top
/// (`g.stack.hi`, at offset 8 of `runtime.g`). Returns false when `g`
/// cannot be read; the caller then writes a plain event.
#[inline(always)]
pub(crate) fn emit_go(ts_ns: u64, tid: u32, kind: u32, func: u32, sp: u64, g: u64) -> bool {
    if g == 0 {
        return false;
    }
    // SAFETY: bpf_probe_read_user copes with any address; failure is an Err.
    let Ok(hi) = (unsafe { bpf_probe_read_user((g + 8) as *const u64) }) else {
        return false;
    };
    if hi < sp || hi - sp >= GO_STACK_BASE {
        return false;
    }
    let kind = if kind == KIND_ENTRY {
        KIND_GO_ENTRY
    } else {
        KIND_GO_EXIT
    };
    match reserve::<GoEvent>() {
        Some((mut slot, wake)) => {
            slot.write(GoEvent {
                event: Event {
                    ts_ns,
                    tid,
                    word: Event::pack(kind, func),
                    sp: sp - hi + GO_STACK_BASE,
                },
                goroutine: g,
            });
            slot.submit(wake);
        }
        None => bump(COUNTER_LOST),
    }
    true
}

/// Handles one probe hit. Does nothing for other processes (the probes are
/// scoped to the PID already; this is a second guard). `g` is register r14
/// (Go's current goroutine, for Go functions).
#[inline(always)]
pub(crate) fn on_probe<C: EbpfContext>(ctx: &C, kind: u32, sp: u64, g: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_traced(tgid) {
        bump(COUNTER_FOREIGN);
        return;
    }
    let tid = pid_tgid as u32;
    // SAFETY: the program's own context pointer, as the helper expects.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if tid == WATCH_TID.load() {
        track_watched(kind, cookie);
    }
    announce_thread(tid, tgid, ts_ns);
    if cookie & COOKIE_GO != 0 && emit_go(ts_ns, tid, kind, cookie as u32, sp, g) {
        return;
    }
    emit_event(ts_ns, tid, kind, cookie as u32, sp, COUNTER_LOST);
}

#[uprobe]
pub fn prof_entry(ctx: ProbeContext) -> u32 {
    // SAFETY: `ctx.regs` is the probed task's `pt_regs`, which the kernel passes to every uprobe program.
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_ENTRY, sp, g);
    0
}

#[uretprobe]
pub fn prof_exit(ctx: RetProbeContext) -> u32 {
    // SAFETY: `ctx.regs` is the probed task's `pt_regs`, which the kernel passes to every uprobe program.
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_EXIT, sp, g);
    0
}

/// Return-site probe: a plain uprobe on one of a function's `ret`
/// instructions (or a tail-call `jmp`), which leaves the return address on
/// the stack alone, unlike a uretprobe. The frame is torn down there, so
/// the stack pointer points at the return address, as at entry; adding 8
/// gives what a uretprobe would report after the return, and the agent
/// pairs both the same way.
#[uprobe]
pub fn prof_ret(ctx: ProbeContext) -> u32 {
    // SAFETY: `ctx.regs` is the probed task's `pt_regs`, which the kernel passes to every uprobe program.
    let (sp, g) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).r14) };
    on_probe(&ctx, KIND_EXIT, sp.wrapping_add(8), g);
    0
}

/// Refused by the verifier on every kernel (it reads far past its
/// context: `invalid bpf_context access`); loaded only by the test of
/// what a user sees then (`PROFILER_TEST_REFUSED`, RELIABILITY.md row 15).
#[uprobe]
pub fn prof_test_refused(ctx: ProbeContext) -> u32 {
    // SAFETY: never run: the verifier refuses the program at load.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u32>().add(1 << 12)) }
}
