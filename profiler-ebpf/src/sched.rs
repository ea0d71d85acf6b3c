//! The watched thread's scheduler transitions: `prof_sched_switch` and
//! `prof_sched_wakeup` (on `sched_waking`), a wake-up while it is blocked
//! in a dispatch naming the waker with its stacks.

use crate::*;

/// The arguments of the `sched_switch` raw tracepoint:
/// `(bool preempt, task *prev, task *next, unsigned prev_state)`. It runs
/// in `prev`'s context.
pub(crate) struct SchedSwitch {
    pub(crate) prev: u64,
    pub(crate) next: u64,
    /// `prev` left the CPU to sleep (not preempted, and not runnable).
    pub(crate) blocked: bool,
}

impl SchedSwitch {
    #[inline(always)]
    pub(crate) fn of(ctx: &RawTracePointContext) -> Self {
        let preempt: u64 = ctx.arg(0);
        let prev_state: u64 = ctx.arg(3);
        SchedSwitch {
            prev: ctx.arg(1),
            next: ctx.arg(2),
            blocked: preempt & 0xff == 0 && prev_state as u32 != 0,
        }
    }
}

/// Writes who is waking the watched thread (the current task, in
/// `sched_waking`), with its stacks; `flags` holds [`WAKER_LOOP`] when the
/// thread was idle in its loop's wait.
#[inline(always)]
pub(crate) fn emit_waker(ctx: &RawTracePointContext, ts_ns: u64, tid: u32, flags: u32) {
    let Some((mut slot, wake)) = reserve::<WakerEvent>() else {
        bump(COUNTER_LOST_SCHED);
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points to the ring-buffer entry reserved above, written field by field before it is submitted.
    unsafe {
        (*ev).event = Event {
            ts_ns,
            tid,
            word: Event::pack(KIND_WAKER, 0),
            sp: 0,
        };
        (*ev).waker_tid = pid_tgid as u32;
        (*ev).waker_pid = (pid_tgid >> 32) as u32;
        (*ev).pad = 0;
        (*ev).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        // The loop's wakers come once an iteration: another process's
        // user stack (an interrupt's victim, most often) is not walked.
        let walk = flags & WAKER_LOOP == 0 || (pid_tgid >> 32) as u32 == TARGET_TGID.load();
        (*ev).user_len = 0;
        if !unwind::has_user_regs() {
            (*ev).flags = flags | WAKER_KERNEL_THREAD;
        } else {
            (*ev).flags = flags;
            if walk {
                (*ev).user_len = fill_user(ctx, (*ev).user.as_mut_ptr()).0;
            }
        }
        (*ev).kernel_len = fill_kernel(ctx, (*ev).kernel.as_mut_ptr());
    }
    slot.submit(wake);
}

/// `sched_switch(bool preempt, task *prev, task *next, unsigned prev_state)`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn prof_sched_switch(ctx: RawTracePointContext) -> i32 {
    let task = watch_get(WATCH_TASK);
    if task == 0 {
        return 0;
    }
    let SchedSwitch {
        prev,
        next,
        blocked,
    } = SchedSwitch::of(&ctx);
    if wait::idle_in_loop() {
        return 0;
    }
    let tid = WATCH_TID.load();
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if prev == task {
        if blocked && in_dispatch() {
            // Set first: a waker on another CPU may run before this
            // switch has finished.
            if WAKERS.load() != 0 {
                watch_set(WATCH_BLOCKED, 1);
            }
            // Runs in the context of `prev`: these are its stacks.
            emit_stacks(&ctx, ts_ns, tid, KIND_SCHED_OUT, SCHED_BLOCKED);
        } else {
            let state = if blocked {
                SCHED_BLOCKED
            } else {
                SCHED_RUNNABLE
            };
            emit_event(ts_ns, tid, KIND_SCHED_OUT, state, 0, COUNTER_LOST_SCHED);
        }
    }
    if next == task {
        if WAKERS.load() != 0 {
            watch_set(WATCH_BLOCKED, 0);
        }
        emit_event(ts_ns, tid, KIND_SCHED_IN, 0, 0, COUNTER_LOST_SCHED);
    }
    0
}

/// `sched_waking(task *p)`, in the waker's context. Every wake-up in the
/// system runs it: anything but the watched thread costs one map read and
/// a compare. A wake-up of the watched thread while it is blocked inside a
/// dispatch first writes who woke it ([`WakerEvent`]); one while it is
/// idle in its loop's wait writes who woke the loop (flagged
/// [`WAKER_LOOP`]: the source of the next iteration), and nothing else.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn prof_sched_wakeup(ctx: RawTracePointContext) -> i32 {
    let task = watch_get(WATCH_TASK);
    let p: u64 = ctx.arg(0);
    if task == 0 || p != task {
        return 0;
    }
    let idle = wait::idle_in_loop();
    let wakers = WAKERS.load() != 0;
    // One call site of the (inlined) waker writer.
    let flags = if idle {
        wakers.then_some(WAKER_LOOP)
    } else if watch_get(WATCH_BLOCKED) != 0 {
        watch_set(WATCH_BLOCKED, 0);
        Some(0)
    } else {
        None
    };
    if !idle || flags.is_some() {
        // SAFETY: a BPF helper with no arguments and no preconditions.
        let ts_ns = unsafe { bpf_ktime_get_ns() };
        let tid = WATCH_TID.load();
        if let Some(flags) = flags {
            emit_waker(&ctx, ts_ns, tid, flags);
        }
        if !idle {
            emit_event(ts_ns, tid, KIND_WAKEUP, 0, 0, COUNTER_LOST_SCHED);
        }
    }
    0
}
