//! The watched thread's event-loop waits (`WAIT_LOOP`): per wait syscall, a
//! fentry/fexit pair, else a kprobe/kretprobe pair, else the `sys_enter`
//! and `sys_exit` raw tracepoints; for the watched thread alone they report
//! each wait syscall (epoll, poll, select, io_uring with GETEVENTS, private futex
//! waits) and
//! keep `WATCH_ITER` set while an iteration of its loop runs, from the
//! return of the loop's own wait to the next entry into it.
//!
//! Which wait is the loop's is learnt by the agent (the stack pointer of
//! the outermost recurring wait, `WATCH_LOOP_SP`, and its family and
//! object, `WATCH_LOOP_KEY`): a wait of that family and object at that
//! stack pointer or shallower is the loop's; a deeper one, inside a
//! handler (a blocking `poll()`, a nested loop), or another (a `poll()` on
//! another descriptor in a handler inlined into the loop, a lock taken in
//! a handler), is blocked time inside the iteration. Every other syscall,
//! and every other thread, costs one compare.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{fentry, fexit, kprobe, kretprobe, raw_tracepoint, tracepoint},
    programs::{
        FEntryContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext,
        TracePointContext,
    },
};
use profiler_common::{
    wait, CATCH_UP_ARMED, CATCH_UP_DONE, COUNTER_LOST_SCHED, KIND_WAIT, WATCH_CATCH_UP,
    WATCH_IN_WAIT, WATCH_ITER, WATCH_LOOP_KEY, WATCH_LOOP_SP, WATCH_TASK,
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

/// True while the watched thread is idle in its loop's own wait: its
/// scheduler transitions then matter to nobody (an iteration starts on the
/// CPU), so the scheduler programs write nothing.
#[inline(always)]
pub(crate) fn idle_in_loop() -> bool {
    let w = watch_get(WATCH_IN_WAIT);
    WAIT_LOOP.load() != 0 && w != 0 && (w - 1) as u32 & wait::LOOP != 0
}

/// The syscall's user stack pointer and what it waits on
/// ([`wait::object`]), when it waits at all (io_uring_enter only with
/// GETEVENTS, futex only to wait on a private futex: [`wait::waits`]).
#[inline(always)]
fn wait_args(regs: *const pt_regs, nr: u64) -> Option<(u64, u64)> {
    if !wait::is_wait(nr) {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel copes with any address; a failed read
    // is an Err, and the syscall is then not reported.
    let (sp, arg0) = unsafe {
        (
            bpf_probe_read_kernel(&raw const (*regs).rsp).ok()?,
            bpf_probe_read_kernel(&raw const (*regs).rdi).ok()?,
        )
    };
    let mut args = [arg0, 0, 0, 0];
    match nr as u32 {
        // io_uring_enter(fd, to_submit, min_complete, flags, …).
        // SAFETY: as above.
        wait::NR_IO_URING_ENTER => unsafe {
            args[2] = bpf_probe_read_kernel(&raw const (*regs).rdx).ok()?;
            args[3] = bpf_probe_read_kernel(&raw const (*regs).r10).ok()?;
        },
        // futex(uaddr, op, …).
        // SAFETY: as above.
        wait::NR_FUTEX => unsafe {
            args[1] = bpf_probe_read_kernel(&raw const (*regs).rsi).ok()?;
        },
        _ => {}
    }
    if !wait::waits(nr, args) {
        return None;
    }
    Some((sp, wait::object(nr, arg0)))
}

/// Whether a wait at `sp` of syscall `nr` on `obj` is the loop's own, by
/// what the agent learnt: at the loop wait's stack level or shallower,
/// and of its family and object ([`wait::key_matches`]). Before anything
/// is learnt, every wait is.
#[inline(always)]
fn judge(sp: u64, nr: u64, obj: u64) -> bool {
    let loop_sp = watch_get(WATCH_LOOP_SP);
    loop_sp == 0 || (sp >= loop_sp && wait::key_matches(watch_get(WATCH_LOOP_KEY), nr as u32, obj))
}

/// A wait of the watched thread was seen: an armed catch-up
/// ([`WATCH_CATCH_UP`]) is over.
#[inline(always)]
fn caught_up() {
    if watch_get(WATCH_CATCH_UP) == CATCH_UP_ARMED {
        watch_set(WATCH_CATCH_UP, CATCH_UP_DONE);
    }
}

/// The watched thread entered wait syscall `nr` (its user registers at
/// `regs`).
#[inline(always)]
fn on_enter(tid: u32, regs: *const pt_regs, nr: u64) {
    let Some((sp, fd)) = wait_args(regs, nr) else {
        return;
    };
    // SAFETY: a BPF helper with no arguments; the task address is only stored or read through BPF helpers.
    watch_set(WATCH_TASK, unsafe { bpf_get_current_task() });
    caught_up();
    let is_loop = judge(sp, nr, fd);
    let word = wait::word(nr, fd, false, is_loop);
    watch_set(WATCH_IN_WAIT, u64::from(word) + 1);
    if is_loop {
        watch_set(WATCH_ITER, 0);
    }
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    emit_event(ts_ns, tid, KIND_WAIT, word, sp, COUNTER_LOST_SCHED);
}

/// The watched thread returns from wait syscall `nr`.
#[inline(always)]
fn on_exit(tid: u32, regs: *const pt_regs, nr: u64) {
    let Some((sp, fd)) = wait_args(regs, nr) else {
        return;
    };
    // SAFETY: a BPF helper with no arguments; the task address is only stored or read through BPF helpers.
    watch_set(WATCH_TASK, unsafe { bpf_get_current_task() });
    caught_up();
    // Judged at its entry when that was seen (the agent may have moved
    // the loop's stack pointer since); else now, by the same rule.
    let entered = watch_get(WATCH_IN_WAIT);
    watch_set(WATCH_IN_WAIT, 0);
    let is_loop = if entered != 0 {
        (entered - 1) as u32 & wait::LOOP != 0
    } else {
        judge(sp, nr, fd)
    };
    // SAFETY: a BPF helper with no arguments and no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if is_loop {
        // When it began: the sampler's early rate counts from here.
        watch_set(WATCH_ITER, ts_ns.max(1));
    }
    emit_event(
        ts_ns,
        tid,
        KIND_WAIT,
        wait::word(nr, fd, true, is_loop),
        sp,
        COUNTER_LOST_SCHED,
    );
}

/// `sys_enter(struct pt_regs *regs, long id)`: the fallback where the
/// per-syscall trampolines below cannot attach. Every syscall of every task
/// then takes the kernel's tracepoint path (about 250 ns more each here).
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn prof_sys_enter(ctx: RawTracePointContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), ctx.arg(1));
    }
    0
}

/// `sys_exit(struct pt_regs *regs, long ret)`. Also attached for a while
/// beside the trampolines or kretprobes when the watched thread was in a
/// wait at attach ([`WATCH_CATCH_UP`]): it then reports that wait's return
/// only (they run first, and end the catch-up at any wait they see).
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn prof_sys_exit(ctx: RawTracePointContext) -> i32 {
    let Some(tid) = watched() else { return 0 };
    if watch_get(WATCH_CATCH_UP) == CATCH_UP_DONE {
        return 0;
    }
    let regs: *const pt_regs = ctx.arg(0);
    // SAFETY: as in wait_args.
    if let Ok(nr) = unsafe { bpf_probe_read_kernel(&raw const (*regs).orig_rax) } {
        on_exit(tid, regs, nr);
    }
    0
}

/// The syscall number in a `syscalls:sys_enter_NAME` or `sys_exit_NAME`
/// tracepoint's record (`__syscall_nr`, after the 8-byte common fields).
const SYSCALL_NR_OFFSET: usize = 8;

/// `syscalls:sys_enter_NAME`, attached to each wait syscall's own
/// tracepoint where the trampolines and kprobes cannot attach: the kernel
/// then takes its tracing path on every syscall, but runs this program
/// for the wait syscalls only (with `sys_enter` it runs for all).
#[tracepoint]
pub fn prof_syscall_enter(ctx: TracePointContext) -> u32 {
    if let Some(tid) = watched() {
        // SAFETY: every syscall tracepoint's record has the number there.
        if let Ok(nr) = unsafe { ctx.read_at::<i32>(SYSCALL_NR_OFFSET) } {
            on_enter(tid, user_regs(), nr as u64);
        }
    }
    0
}

/// `syscalls:sys_exit_NAME`, beside [`prof_syscall_enter`]. A wait the
/// thread was in at attach returns through it too (the kernel marks every
/// task when a syscall tracepoint is enabled), so no catch-up is needed.
#[tracepoint]
pub fn prof_syscall_exit(ctx: TracePointContext) -> u32 {
    if let Some(tid) = watched() {
        // SAFETY: as above.
        if let Ok(nr) = unsafe { ctx.read_at::<i32>(SYSCALL_NR_OFFSET) } {
            on_exit(tid, user_regs(), nr as u64);
        }
    }
    0
}

// One fentry/fexit pair per wait syscall (`__x64_sys_NAME(const struct
// pt_regs *regs)`, BPF trampolines): nothing runs for any other syscall.

#[fentry(function = "__x64_sys_epoll_wait")]
pub fn prof_enter_epoll_wait(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_WAIT));
    }
    0
}

#[fexit(function = "__x64_sys_epoll_wait")]
pub fn prof_exit_epoll_wait(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_WAIT));
    }
    0
}

#[fentry(function = "__x64_sys_epoll_pwait")]
pub fn prof_enter_epoll_pwait(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_PWAIT));
    }
    0
}

#[fexit(function = "__x64_sys_epoll_pwait")]
pub fn prof_exit_epoll_pwait(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_PWAIT));
    }
    0
}

#[fentry(function = "__x64_sys_epoll_pwait2")]
pub fn prof_enter_epoll_pwait2(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_PWAIT2));
    }
    0
}

#[fexit(function = "__x64_sys_epoll_pwait2")]
pub fn prof_exit_epoll_pwait2(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_EPOLL_PWAIT2));
    }
    0
}

#[fentry(function = "__x64_sys_poll")]
pub fn prof_enter_poll(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_POLL));
    }
    0
}

#[fexit(function = "__x64_sys_poll")]
pub fn prof_exit_poll(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_POLL));
    }
    0
}

#[fentry(function = "__x64_sys_ppoll")]
pub fn prof_enter_ppoll(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_PPOLL));
    }
    0
}

#[fexit(function = "__x64_sys_ppoll")]
pub fn prof_exit_ppoll(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_PPOLL));
    }
    0
}

#[fentry(function = "__x64_sys_select")]
pub fn prof_enter_select(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_SELECT));
    }
    0
}

#[fexit(function = "__x64_sys_select")]
pub fn prof_exit_select(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_SELECT));
    }
    0
}

#[fentry(function = "__x64_sys_pselect6")]
pub fn prof_enter_pselect6(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_PSELECT6));
    }
    0
}

#[fexit(function = "__x64_sys_pselect6")]
pub fn prof_exit_pselect6(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_PSELECT6));
    }
    0
}

#[fentry(function = "__x64_sys_io_uring_enter")]
pub fn prof_enter_io_uring_enter(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_IO_URING_ENTER));
    }
    0
}

#[fexit(function = "__x64_sys_io_uring_enter")]
pub fn prof_exit_io_uring_enter(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_IO_URING_ENTER));
    }
    0
}

#[fentry(function = "__x64_sys_futex")]
pub fn prof_enter_futex(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_FUTEX));
    }
    0
}

#[fexit(function = "__x64_sys_futex")]
pub fn prof_exit_futex(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_FUTEX));
    }
    0
}

#[fentry(function = "__x64_sys_futex_waitv")]
pub fn prof_enter_futex_waitv(ctx: FEntryContext) -> i32 {
    if let Some(tid) = watched() {
        on_enter(tid, ctx.arg(0), u64::from(wait::NR_FUTEX_WAITV));
    }
    0
}

#[fexit(function = "__x64_sys_futex_waitv")]
pub fn prof_exit_futex_waitv(ctx: FExitContext) -> i32 {
    if let Some(tid) = watched() {
        on_exit(tid, ctx.arg(0), u64::from(wait::NR_FUTEX_WAITV));
    }
    0
}

/// The current task's user registers (the `pt_regs` a syscall's
/// `__x64_sys_NAME` receives).
#[inline(always)]
fn user_regs() -> *const pt_regs {
    // SAFETY: the helpers take the current task; the result is only read
    // through bpf_probe_read_kernel.
    unsafe {
        aya_ebpf::helpers::generated::bpf_task_pt_regs(aya_ebpf::helpers::bpf_get_current_task_btf())
            as *const pt_regs
    }
}

// The second choice where the kernel refuses trampolines: a kprobe and a
// kretprobe on each wait syscall's `__x64_sys_NAME`. Like the trampolines,
// nothing runs for any other syscall.
macro_rules! wait_kprobes {
    ($($enter:ident, $exit:ident, $func:literal, $nr:expr;)*) => {$(
        #[kprobe(function = $func)]
        pub fn $enter(_ctx: ProbeContext) -> u32 {
            if let Some(tid) = watched() {
                on_enter(tid, user_regs(), u64::from($nr));
            }
            0
        }

        #[kretprobe(function = $func)]
        pub fn $exit(_ctx: RetProbeContext) -> u32 {
            if let Some(tid) = watched() {
                on_exit(tid, user_regs(), u64::from($nr));
            }
            0
        }
    )*};
}

wait_kprobes! {
    prof_kenter_epoll_wait, prof_kexit_epoll_wait, "__x64_sys_epoll_wait", wait::NR_EPOLL_WAIT;
    prof_kenter_epoll_pwait, prof_kexit_epoll_pwait, "__x64_sys_epoll_pwait", wait::NR_EPOLL_PWAIT;
    prof_kenter_epoll_pwait2, prof_kexit_epoll_pwait2, "__x64_sys_epoll_pwait2", wait::NR_EPOLL_PWAIT2;
    prof_kenter_poll, prof_kexit_poll, "__x64_sys_poll", wait::NR_POLL;
    prof_kenter_ppoll, prof_kexit_ppoll, "__x64_sys_ppoll", wait::NR_PPOLL;
    prof_kenter_select, prof_kexit_select, "__x64_sys_select", wait::NR_SELECT;
    prof_kenter_pselect6, prof_kexit_pselect6, "__x64_sys_pselect6", wait::NR_PSELECT6;
    prof_kenter_io_uring_enter, prof_kexit_io_uring_enter, "__x64_sys_io_uring_enter", wait::NR_IO_URING_ENTER;
    prof_kenter_futex, prof_kexit_futex, "__x64_sys_futex", wait::NR_FUTEX;
    prof_kenter_futex_waitv, prof_kexit_futex_waitv, "__x64_sys_futex_waitv", wait::NR_FUTEX_WAITV;
}
