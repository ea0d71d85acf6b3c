//! User and kernel stacks for the records that carry them: the table
//! unwinder where it has tables, else the kernel's frame-pointer walk.

use crate::*;

/// True when user stacks are walked with the compiled tables.
#[inline(always)]
pub(crate) fn tables() -> bool {
    UNWIND_MODE.load() == unwind_mode::TABLES
}

/// The current user stack's id in `CPU_STACKS` (frame pointers) or key in
/// `USER_STACKS` (tables): `(user_stack, user_hash)`.
#[inline(always)]
pub(crate) fn user_stack_key<C: EbpfContext + StackIdContext>(ctx: &C, pid: u32) -> (i32, u64) {
    if tables() {
        return (-1, unwind::store(pid, || bump(COUNTER_USER_STACKS_FULL)));
    }
    match ctx.get_stackid(&CPU_STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => (id as i32, 0),
        Err(_) => {
            bump(COUNTER_CPU_USER_STACK_LOST);
            (-1, 0)
        }
    }
}

/// Fills `user` (MAX_USER_FRAMES slots) with the current user stack,
/// innermost first; returns the frames used and why the table unwinder's
/// walk ended (0 for the kernel's frame-pointer walk).
#[inline(always)]
pub(crate) unsafe fn fill_user<C: EbpfContext>(ctx: &C, user: *mut u64) -> (u32, u32) {
    if tables() {
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let Some((stack, _)) = unwind::walk(pid, MAX_USER_FRAMES as u32) else {
            bump(COUNTER_STACK_ERRORS);
            return (0, 0);
        };
        let len = ((*stack).len as usize).min(MAX_USER_FRAMES);
        for i in 0..MAX_USER_FRAMES {
            if i >= len {
                break;
            }
            *user.add(i) = (*stack).frames[i];
        }
        let end = (*stack).end;
        unwind::note_codes(pid);
        return (len as u32, end);
    }
    let n = bpf_get_stack(
        ctx.as_ptr(),
        user.cast(),
        (MAX_USER_FRAMES * 8) as u32,
        BPF_F_USER_STACK as u64,
    );
    if n < 0 {
        bump(COUNTER_STACK_ERRORS);
    }
    if n > 0 {
        ((n / 8) as u32, 0)
    } else {
        (0, 0)
    }
}

/// Fills `kernel` (MAX_KERNEL_FRAMES slots) with the current kernel stack,
/// innermost first; returns the frames used.
#[inline(always)]
pub(crate) unsafe fn fill_kernel<C: EbpfContext>(ctx: &C, kernel: *mut u64) -> u32 {
    let n = bpf_get_stack(
        ctx.as_ptr(),
        kernel.cast(),
        (MAX_KERNEL_FRAMES * 8) as u32,
        0,
    );
    if n > 0 {
        (n / 8) as u32
    } else {
        0
    }
}

/// Writes an event with the current user and kernel stacks.
#[inline(always)]
pub(crate) fn emit_stacks<C: EbpfContext>(ctx: &C, ts_ns: u64, tid: u32, kind: u32, state: u32) {
    let Some((mut slot, wake)) = reserve::<StackEvent>() else {
        bump(COUNTER_LOST_SCHED);
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points to the ring-buffer entry reserved above, written field by field before it is submitted.
    unsafe {
        (*ev).event = Event {
            ts_ns,
            tid,
            word: Event::pack(kind, state),
            sp: 0,
        };
        let (len, end) = fill_user(ctx, (*ev).user.as_mut_ptr());
        (*ev).user_len = len;
        // Why the walk ended, for the sampler's quality figures.
        (*ev).event.sp = u64::from(end);
        (*ev).kernel_len = fill_kernel(ctx, (*ev).kernel.as_mut_ptr());
    }
    slot.submit(wake);
}
