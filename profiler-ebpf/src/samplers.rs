//! The samplers: `prof_sample` (the watched thread, in a dispatch),
//! `prof_peer_sample` (the target's other threads while it is blocked),
//! `prof_cpu_sample` (the CPU profile, aggregated in the kernel; `--dwarf`
//! stacks copied), `prof_offcpu` (blocked time by stack), and `sample
//! --all`'s notices of new processes.

use crate::*;

/// True when no cgroup filter is set, or the current task is in the
/// filter's subtree: its cgroup's ancestor at the filter's level is it.
#[inline(always)]
pub(crate) fn in_cgroup() -> bool {
    let id = CGROUP_ID.load();
    // SAFETY: a helper call with a plain integer argument.
    id == 0 || unsafe { bpf_get_current_ancestor_cgroup_id(CGROUP_LEVEL.load() as i32) } == id
}

#[map(name = "CPU_STACKS")]
pub(crate) static CPU_STACKS: StackTrace = StackTrace::with_max_entries(CPU_STACKS_CAPACITY, 0);

#[map(name = "CPU_COUNTS")]
pub(crate) static CPU_COUNTS: PerCpuHashMap<SampleKey, u64> =
    PerCpuHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "OFFCPU_START")]
pub(crate) static OFFCPU_START: HashMap<u64, OffCpuStart> =
    HashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "OFFCPU_NS")]
pub(crate) static OFFCPU_NS: PerCpuHashMap<SampleKey, u64> =
    PerCpuHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

#[map(name = "CPU_COMMS")]
pub(crate) static CPU_COMMS: LruHashMap<u32, [u8; 16]> =
    LruHashMap::with_max_entries(CPU_COUNTS_CAPACITY, 0);

/// Processes the agent was told of ([`notice_new_process`]): how many
/// times it was told again, and [`NOTICE_PENDING`] until it read the
/// process's mappings.
#[map(name = "NOTICED")]
pub(crate) static NOTICED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(NOTICED_CAPACITY, 0);

/// Nonzero while the agent reads notices on a timer, every few
/// milliseconds, as it does while they keep coming: a notice then wakes no
/// one (a wake-up costs the agent more than reading the ring).
#[map(name = "NOTICE_QUIET")]
pub(crate) static NOTICE_QUIET: Array<u64> = Array::with_max_entries(1, 0);

/// How many times one process is told of again because a stack left the
/// mappings the agent knows of: JIT code is in none of them, so this stops.
pub(crate) const RENOTICES: u8 = 4;

/// `sample --all`: tells the agent of a process sampled for the first time
/// (a [`KIND_NEW_PROCESS`] record), so that it reads the process's mappings
/// (names, unwind tables) within a tick, while a short-lived process still
/// runs, not at its next scan. Told again, a few times, when a new stack
/// has a frame outside the mappings it read (`outside`): a first sample in
/// the dynamic loader, before libc was mapped, or a `dlopen`. A notice the
/// ring had no room for is counted and forgotten, so the process's next new
/// stack tells the agent again.
#[inline(always)]
pub(crate) fn notice_new_process(pid: u32, outside: bool) {
    if SAMPLE_ALL.load() == 0 {
        return;
    }
    if NOTICED
        .insert(pid, NOTICE_PENDING, BPF_NOEXIST as u64)
        .is_err()
    {
        if !outside {
            return;
        }
        let Some(told) = NOTICED.get_ptr_mut(pid) else {
            return;
        };
        // SAFETY: a value of the map; two CPUs racing here at worst tell
        // the agent once more. While a notice is pending (the agent has
        // not read the mappings since), stacks outside them are expected
        // and use none of the process's few notices: the program's start
        // in the dynamic loader would spend them all before its `dlopen`.
        unsafe {
            if *told & NOTICE_PENDING != 0 || *told >= RENOTICES {
                return;
            }
            *told = (*told + 1) | NOTICE_PENDING;
        }
    }
    let Some((mut slot, _)) = reserve::<Event>() else {
        // Told at its next new stack instead.
        let _ = NOTICED.remove(pid);
        bump(COUNTER_NOTICES_LOST);
        return;
    };
    // SAFETY: a reserved slot of the right size, written whole.
    unsafe {
        slot.as_mut_ptr().write(Event {
            ts_ns: bpf_ktime_get_ns(),
            tid: pid,
            word: Event::pack(KIND_NEW_PROCESS, 0),
            sp: 0,
        });
    }
    // Wakes the agent if it waits for notices (not while it polls them).
    let quiet = NOTICE_QUIET.get(0).is_some_and(|q| *q != 0);
    slot.submit(if quiet { BPF_RB_NO_WAKEUP as u64 } else { 0 });
}

/// Copies the top of the user stack and the registers of a user-mode
/// sample into the ring. Tries shorter copies when the stack's mapping ends
/// sooner (a read that crosses unmapped memory fails whole).
#[inline(always)]
pub(crate) fn emit_dwarf(
    ctx: &PerfEventContext,
    pid: u32,
    tid: u32,
    (ip, sp, bp): (u64, u64, u64),
    kernel_stack: i32,
) {
    let Some((mut slot, wake)) = reserve::<DwarfSample>() else {
        bump(COUNTER_DWARF_LOST);
        return;
    };
    let _ = ctx;
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points to the ring-buffer entry reserved above, written field by field before it is submitted.
    unsafe {
        (*ev).event = Event {
            ts_ns: bpf_ktime_get_ns(),
            tid,
            word: Event::pack(KIND_DWARF, 0),
            sp,
        };
        (*ev).pid = pid;
        (*ev).kernel_stack = kernel_stack;
        (*ev)._pad = 0;
        (*ev).ip = ip;
        (*ev).bp = bp;
        let dst = (*ev).stack.as_mut_ptr();
        let src = sp as *const core::ffi::c_void;
        let mut len = 0u32;
        for size in [DWARF_STACK_BYTES, 8192, 4096, 2048, 1024, 512] {
            if bpf_probe_read_user_raw(dst.cast(), size as u32, src) == 0 {
                len = size as u32;
                break;
            }
        }
        (*ev).len = len;
    }
    slot.submit(wake);
}

/// `cpu-clock` tick on some CPU (the waker sampler): while the watched
/// thread is blocked inside a dispatch, samples the other threads of the
/// target, so the agent can tell what the thread that woke it was doing
/// meanwhile. Otherwise one map read.
#[perf_event]
pub fn prof_peer_sample(ctx: PerfEventContext) -> u32 {
    if watch_get(WATCH_BLOCKED) == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if (pid_tgid >> 32) as u32 != TARGET_TGID.load() || tid == WATCH_TID.load() {
        return 0;
    }
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    emit_stacks(&ctx, ts_ns, tid, KIND_PEER_SAMPLE, 0);
    0
}

/// `cpu-clock` sample of the watched thread.
#[perf_event]
pub fn prof_sample(ctx: PerfEventContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if tid == WATCH_TID.load() && tid != 0 && in_dispatch() {
        // SAFETY: a BPF helper with no arguments and no preconditions.
        let ts_ns = unsafe { bpf_ktime_get_ns() };
        if early_skip(ts_ns) {
            return 0;
        }
        emit_stacks(&ctx, ts_ns, tid, KIND_SAMPLE, 0);
    }
    0
}

/// True when this tick is not taken: an iteration of the loop younger
/// than `SAMPLE_FULL_AFTER_NS` is sampled at one tick in
/// `SAMPLE_EARLY_EVERY` (`watch`); a dispatch function's frame, and an
/// older iteration, at every tick.
#[inline(always)]
fn early_skip(ts_ns: u64) -> bool {
    let every = u64::from(SAMPLE_EARLY_EVERY.load());
    if every <= 1 || watch_get(WATCH_DEPTH) > 0 {
        return false;
    }
    let began = watch_get(WATCH_ITER);
    if began == 0 || ts_ns.saturating_sub(began) >= SAMPLE_FULL_AFTER_NS.load() {
        return false;
    }
    let ticks = watch_get(WATCH_EARLY_TICKS).wrapping_add(1);
    watch_set(WATCH_EARLY_TICKS, ticks);
    !ticks.is_multiple_of(every)
}

/// CPU profile: one `cpu-clock` tick on some CPU. Counts the (process,
/// thread, user stack, kernel stack) that was running, in the kernel, so the
/// ring buffer carries nothing per sample.
#[perf_event]
pub fn prof_cpu_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 || (SAMPLE_ALL.load() == 0 && pid != TARGET_TGID.load()) || !in_cgroup() {
        return 0;
    }
    bump(COUNTER_CPU_SAMPLES);
    if DWARF_MODE.load() != 0 {
        // SAFETY: the kernel passes a `bpf_perf_event_data` whose `regs` are the sampled task's.
        let regs = unsafe { &(*ctx.ctx).regs };
        if regs.cs & 3 == 3 {
            emit_dwarf(&ctx, pid, tid, (regs.rip, regs.rsp, regs.rbp), -1);
            return 0;
        }
        // In the kernel (a syscall, an interrupt): the user registers saved
        // at its entry, and its kernel stack by id. A kernel thread has
        // none, and is counted below.
        if let Some(user) = crate::unwind::user_regs() {
            let kernel = ctx.get_stackid(&CPU_STACKS, 0).map_or(-1, |id| id as i32);
            emit_dwarf(&ctx, pid, tid, user, kernel);
            return 0;
        }
    }
    let (user_stack, user_hash) = user_stack_key(&ctx, pid);
    let kernel_stack = match ctx.get_stackid(&CPU_STACKS, 0) {
        Ok(id) => id as i32,
        // No kernel stack: the sample was taken in user mode.
        Err(_) => -1,
    };
    let key = SampleKey {
        pid,
        tid,
        user_stack,
        kernel_stack,
        user_hash,
    };
    match CPU_COUNTS.get_ptr_mut(key) {
        // Per-CPU values: no other CPU writes this slot.
        // SAFETY: a pointer into this CPU's value of the map entry; no other CPU writes it, and these programs do not nest on one CPU.
        Some(count) => unsafe { *count += 1 },
        None => {
            if CPU_COUNTS.insert(key, 1, 0).is_err() {
                bump(COUNTER_CPU_COUNTS_FULL);
            }
            notice_new_process(pid, tables() && unwind::left_known_mappings());
            // A new key: the thread's current name (it changes at exec,
            // and the stacks of the new program are new keys).
            let _ = CPU_COMMS.insert(tid, bpf_get_current_comm().unwrap_or([0; 16]), 0);
        }
    }
    0
}

/// Off-CPU time: when a target thread blocks (leaves the CPU not runnable),
/// remember when and where (stack ids, read in its own context); when that
/// task gets a CPU again, add the time in between to its (thread, stacks)
/// count. `sched_switch(bool preempt, task *prev, task *next, unsigned prev_state)`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn prof_offcpu(ctx: RawTracePointContext) -> i32 {
    let SchedSwitch {
        prev,
        next,
        blocked,
    } = SchedSwitch::of(&ctx);
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    // The switch runs in `prev`'s context: current is prev.
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let wanted = tid != 0 && (SAMPLE_ALL.load() != 0 || pid == TARGET_TGID.load()) && in_cgroup();
    if wanted && blocked {
        let (user_stack, user_hash) = user_stack_key(&ctx, pid);
        let kernel_stack = ctx.get_stackid(&CPU_STACKS, 0).map_or(-1, |id| id as i32);
        let key = SampleKey {
            pid,
            tid,
            user_stack,
            kernel_stack,
            user_hash,
        };
        let _ = OFFCPU_START.insert(prev, OffCpuStart { ts_ns, key }, 0);
        // SAFETY: the entry is only tested or copied at once; the reference does not outlive this run of the program.
        if unsafe { CPU_COMMS.get(tid) }.is_none() {
            let _ = CPU_COMMS.insert(tid, bpf_get_current_comm().unwrap_or([0; 16]), 0);
        }
    }
    // SAFETY: the entry is only tested or copied at once; the reference does not outlive this run of the program.
    if let Some(start) = unsafe { OFFCPU_START.get(next) } {
        let start = *start;
        let blocked = ts_ns.saturating_sub(start.ts_ns);
        match OFFCPU_NS.get_ptr_mut(start.key) {
            // Per-CPU values: no other CPU writes this slot.
            // SAFETY: a pointer into this CPU's value of the map entry; no other CPU writes it, and these programs do not nest on one CPU.
            Some(ns) => unsafe { *ns += blocked },
            None => {
                if OFFCPU_NS.insert(start.key, blocked, 0).is_err() {
                    bump(COUNTER_CPU_COUNTS_FULL);
                }
            }
        }
        let _ = OFFCPU_START.remove(next);
    }
    0
}
