//! The watched thread's event-loop waits (`WAIT_LOOP`): `sys_enter` and
//! `sys_exit` raw tracepoints that, for the watched thread alone, report
//! each wait syscall (epoll, poll, select, io_uring with GETEVENTS) and
//! keep `WATCH_ITER` set while an iteration of its loop runs, from the
//! return of the loop's own wait to the next entry into it.
//!
//! Which wait is the loop's is learnt by the agent (the stack pointer of
//! the outermost recurring wait, `WATCH_LOOP_SP`): a wait at that stack
//! pointer or shallower is the loop's; a deeper one, inside a handler
//! (a blocking `poll()`, a nested loop), is blocked time inside the
//! iteration. Every other syscall, and every other thread, costs one
//! compare.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::{
    wait, COUNTER_LOST_SCHED, KIND_WAIT, WATCH_IN_WAIT, WATCH_ITER, WATCH_LOOP_SP, WATCH_TASK,
};

use crate::{emit_event, watch_get, watch_set, Setting, WATCH_TID};

/// Set by the agent at load time: bound the watched thread's dispatches by
/// its loop's waits (1) or not (0).
#[unsafe(no_mangle)]
static WAIT_LOOP: Setting<u32> = Setting::new(0);

/// The watched thread's id when the current task is it and waits are
/// tracked; None otherwise (the common case: one compare).
#[inline(always)]
fn watched() -> Option<u32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    if tid == 0 || tid != WATCH_TID.load() || WAIT_LOOP.load() == 0 {
        return None;
    }
    Some(tid)
}

/// The syscall's user stack pointer and first argument, and whether it
/// waits at all (io_uring_enter only with GETEVENTS).
#[inline(always)]
fn wait_args(regs: *const pt_regs, nr: u64) -> Option<(u64, u64)> {
    if !wait::is_wait(nr) {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel copes with any address; a failed read
    // is an Err, and the syscall is then not reported.
    let (sp, fd) = unsafe {
        (
            bpf_probe_read_kernel(&raw const (*regs).rsp).ok()?,
            bpf_probe_read_kernel(&raw const (*regs).rdi).ok()?,
        )
    };
    if nr as u32 == wait::NR_IO_URING_ENTER {
        // io_uring_enter(fd, to_submit, min_complete, flags, …).
        let (min, flags) = unsafe {
            (
                bpf_probe_read_kernel(&raw const (*regs).rdx).ok()?,
                bpf_probe_read_kernel(&raw const (*regs).r10).ok()?,
            )
        };
        if flags & wait::IORING_ENTER_GETEVENTS == 0 || min as u32 == 0 {
            return None;
        }
    }
    Some((sp, fd))
}

/// `sys_enter(struct pt_regs *regs, long id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn prof_sys_enter(ctx: RawTracePointContext) -> i32 {
    let Some(tid) = watched() else { return 0 };
    let regs: *const pt_regs = ctx.arg(0);
    let nr: u64 = ctx.arg(1);
    let Some((sp, fd)) = wait_args(regs, nr) else {
        return 0;
    };
    watch_set(WATCH_TASK, unsafe { bpf_get_current_task() });
    let loop_sp = watch_get(WATCH_LOOP_SP);
    let is_loop = loop_sp == 0 || sp >= loop_sp;
    let word = wait::word(nr, fd, false, is_loop);
    watch_set(WATCH_IN_WAIT, u64::from(word) + 1);
    if is_loop {
        watch_set(WATCH_ITER, 0);
    }
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    emit_event(ts_ns, tid, KIND_WAIT, word, sp, COUNTER_LOST_SCHED);
    0
}

/// `sys_exit(struct pt_regs *regs, long ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn prof_sys_exit(ctx: RawTracePointContext) -> i32 {
    let Some(tid) = watched() else { return 0 };
    let regs: *const pt_regs = ctx.arg(0);
    // SAFETY: as in wait_args.
    let Ok(nr) = (unsafe { bpf_probe_read_kernel(&raw const (*regs).orig_rax) }) else {
        return 0;
    };
    let Some((sp, fd)) = wait_args(regs, nr) else {
        return 0;
    };
    watch_set(WATCH_TASK, unsafe { bpf_get_current_task() });
    // Judged at its entry when that was seen (the agent may have moved
    // the loop's stack pointer since); else now, by the same rule.
    let entered = watch_get(WATCH_IN_WAIT);
    watch_set(WATCH_IN_WAIT, 0);
    let is_loop = if entered != 0 {
        (entered - 1) as u32 & wait::LOOP != 0
    } else {
        let loop_sp = watch_get(WATCH_LOOP_SP);
        loop_sp == 0 || sp >= loop_sp
    };
    if is_loop {
        watch_set(WATCH_ITER, 1);
    }
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    emit_event(
        ts_ns,
        tid,
        KIND_WAIT,
        wait::word(nr, fd, true, is_loop),
        sp,
        COUNTER_LOST_SCHED,
    );
    0
}
