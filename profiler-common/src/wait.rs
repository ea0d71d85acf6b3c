//! The watched thread's wait syscalls: the function field of a
//! [`KIND_WAIT`](crate::KIND_WAIT) event packs the syscall number, the direction, whether it
//! is the loop's own wait, and what it waits on: its first argument (the
//! epoll or io_uring descriptor, clipped), or for a futex a 15-bit fold
//! of the futex word's address ([`object`]).
//!
//! The loop's wait is told to the kernel as a stack pointer
//! ([`super::WATCH_LOOP_SP`]) and a [`key`] ([`super::WATCH_LOOP_KEY`]):
//! its family of syscalls (epoll, poll, select, io_uring, futex) and,
//! where it always waits on the same one, its object; a wait of another
//! family or object is inside an iteration, whatever its stack level.

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
/// x86-64 `futex` (a wait only with `FUTEX_WAIT` or `FUTEX_WAIT_BITSET`,
/// on a private futex: [`waits`]).
pub const NR_FUTEX: u32 = 202;
/// x86-64 `futex_waitv`.
pub const NR_FUTEX_WAITV: u32 = 449;
/// `FUTEX_WAIT`.
pub const FUTEX_WAIT: u64 = 0;
/// `FUTEX_WAIT_BITSET`.
pub const FUTEX_WAIT_BITSET: u64 = 9;
/// `FUTEX_PRIVATE_FLAG`: the futex word is the process's own (a lock, a
/// condition variable, a semaphore or a queue its threads share).
pub const FUTEX_PRIVATE_FLAG: u64 = 128;
/// `futex` operation bits that are the command (without
/// `FUTEX_PRIVATE_FLAG` and `FUTEX_CLOCK_REALTIME`).
pub const FUTEX_CMD_MASK: u64 = 0x7f;
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

/// True for the syscalls an event loop waits in (some of them only with
/// certain arguments: [`waits`]).
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
                | NR_FUTEX
                | NR_FUTEX_WAITV
        )
}

/// True when syscall `nr` with arguments `args` (the first four) waits:
/// `io_uring_enter` only getting events, `futex` only with `FUTEX_WAIT`
/// or `FUTEX_WAIT_BITSET` (not a wake, a requeue or a PI lock) on a
/// private futex ([`FUTEX_PRIVATE_FLAG`]).
///
/// A shared futex wait is no event loop's: glibc's `pthread_join` waits
/// on the joined thread's TID word, shared because the kernel clears and
/// wakes it at that thread's exit, and every loop that waits on a futex
/// (a condition variable, a semaphore, a queue, Go's and Java's parking)
/// waits on a private one. Told as a wait, a thread joining workers one
/// after another would be taken for an event loop (three joins at one
/// stack level are a recurring wait), and what it does between joins,
/// reading its input included, for iterations.
#[inline(always)]
pub const fn waits(nr: u64, args: [u64; 4]) -> bool {
    if !is_wait(nr) {
        return false;
    }
    match nr as u32 {
        NR_IO_URING_ENTER => args[3] & IORING_ENTER_GETEVENTS != 0 && args[2] as u32 != 0,
        NR_FUTEX => {
            matches!(args[1] & FUTEX_CMD_MASK, FUTEX_WAIT | FUTEX_WAIT_BITSET)
                && args[1] & FUTEX_PRIVATE_FLAG != 0
        }
        _ => true,
    }
}

/// The family of a wait syscall, as the loop's wait is matched: the
/// variants of one call (`poll`/`ppoll`, `epoll_wait`/`epoll_pwait`, …)
/// are one family.
#[inline(always)]
pub const fn family(nr: u32) -> u32 {
    match nr {
        NR_EPOLL_WAIT | NR_EPOLL_PWAIT | NR_EPOLL_PWAIT2 => 1,
        NR_POLL | NR_PPOLL => 2,
        NR_SELECT | NR_PSELECT6 => 3,
        NR_IO_URING_ENTER => 4,
        NR_FUTEX | NR_FUTEX_WAITV => 5,
        _ => 0,
    }
}

/// True for the futex family.
#[inline(always)]
pub const fn is_futex(nr: u32) -> bool {
    family(nr) == 5
}

/// What a wait waits on, as an event carries it (at most [`FD_MAX`]): the
/// first argument (a descriptor; `poll`'s array and `select`'s count
/// clipped), or for `futex` the futex word's address folded to 15 bits,
/// by its 8-byte word (a glibc condition variable's two group futexes,
/// `__g_signals[0]` and `[1]`, share one: a condition wait is one object
/// whichever group it waits in).
#[inline(always)]
pub const fn object(nr: u64, arg0: u64) -> u64 {
    if nr as u32 == NR_FUTEX {
        let w = arg0 >> 3;
        (w ^ (w >> 15) ^ (w >> 30) ^ (w >> 45)) & FD_MAX
    } else if arg0 > FD_MAX {
        FD_MAX
    } else {
        arg0
    }
}

/// Set in a [`key`] that holds a family.
const KEY_SET: u64 = 1 << 40;
/// Set in a [`key`] whose object must match too.
const KEY_OBJECT: u64 = 1 << 32;

/// The loop's wait as the kernel matches it ([`super::WATCH_LOOP_KEY`]):
/// syscall `nr`'s family and, when `exact`, its object (as [`object`]
/// folds it). 0 matches every wait.
#[inline(always)]
pub const fn key(nr: u32, obj: u32, exact: bool) -> u64 {
    KEY_SET
        | ((family(nr) as u64) << 16)
        | if exact {
            KEY_OBJECT | (obj as u64 & FD_MAX)
        } else {
            0
        }
}

/// True when a wait of syscall `nr` on object `obj` (folded) is of the
/// loop's [`key`].
#[inline(always)]
pub const fn key_matches(key: u64, nr: u32, obj: u64) -> bool {
    if key & KEY_SET == 0 {
        return true;
    }
    (key >> 16) & 0xff == family(nr) as u64
        && (key & KEY_OBJECT == 0 || key & FD_MAX == obj & FD_MAX)
}

/// The function field of a wait event; `fd` is its [`object`].
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
        NR_FUTEX => "futex",
        NR_FUTEX_WAITV => "futex_waitv",
        _ => "wait",
    }
}
