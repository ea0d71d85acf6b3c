//! The watched thread's wait syscalls: the function field of a
//! [`KIND_WAIT`](crate::KIND_WAIT) event packs the syscall number, the direction, whether it
//! is the loop's own wait, and its first argument (the epoll or io_uring
//! descriptor, clipped).

/// x86-64 `poll`.
pub const NR_POLL: u32 = 7;
/// x86-64 `select`.
pub const NR_SELECT: u32 = 23;
/// x86-64 `epoll_wait`.
pub const NR_EPOLL_WAIT: u32 = 232;
/// x86-64 `pselect6`.
pub const NR_PSELECT6: u32 = 270;
/// x86-64 `ppoll`.
pub const NR_PPOLL: u32 = 271;
/// x86-64 `epoll_pwait`.
pub const NR_EPOLL_PWAIT: u32 = 281;
/// x86-64 `io_uring_enter` (a wait only with `IORING_ENTER_GETEVENTS`).
pub const NR_IO_URING_ENTER: u32 = 426;
/// x86-64 `epoll_pwait2`.
pub const NR_EPOLL_PWAIT2: u32 = 441;
/// `IORING_ENTER_GETEVENTS`.
pub const IORING_ENTER_GETEVENTS: u64 = 1;
/// Bits of the syscall number.
pub const NR_MASK: u32 = 0x3ff;
/// Set on the return of the wait; clear on its entry.
pub const EXIT: u32 = 1 << 10;
/// Set when the kernel judged it the loop's own wait ([`super::WATCH_LOOP_SP`]).
pub const LOOP: u32 = 1 << 11;
/// Shift of the first argument (descriptor), clipped to [`FD_MAX`].
pub const FD_SHIFT: u32 = 12;
/// Largest descriptor kept; larger ones read as this.
pub const FD_MAX: u64 = 0x7fff;

/// True for the syscalls an event loop waits in.
#[inline(always)]
pub const fn is_wait(nr: u64) -> bool {
    nr <= NR_MASK as u64
        && matches!(
            nr as u32,
            NR_POLL
                | NR_SELECT
                | NR_EPOLL_WAIT
                | NR_PSELECT6
                | NR_PPOLL
                | NR_EPOLL_PWAIT
                | NR_IO_URING_ENTER
                | NR_EPOLL_PWAIT2
        )
}

/// The function field of a wait event.
#[inline(always)]
pub const fn word(nr: u64, fd: u64, exit: bool, is_loop: bool) -> u32 {
    let fd = if fd > FD_MAX { FD_MAX } else { fd };
    (nr as u32 & NR_MASK)
        | if exit { EXIT } else { 0 }
        | if is_loop { LOOP } else { 0 }
        | ((fd as u32) << FD_SHIFT)
}

/// The syscall's name.
pub const fn name(nr: u32) -> &'static str {
    match nr {
        NR_POLL => "poll",
        NR_SELECT => "select",
        NR_EPOLL_WAIT => "epoll_wait",
        NR_PSELECT6 => "pselect6",
        NR_PPOLL => "ppoll",
        NR_EPOLL_PWAIT => "epoll_pwait",
        NR_IO_URING_ENTER => "io_uring_enter",
        NR_EPOLL_PWAIT2 => "epoll_pwait2",
        _ => "wait",
    }
}
