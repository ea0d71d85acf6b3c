//! Records the kernel writes to the rings (`Event`, `GoEvent`, `CommEvent`,
//! `ProcEvent`, `StackEvent`, `WakerEvent`, `DwarfSample`) and the keys of
//! the samplers' maps, their kinds, and their one decoder ([`decode`],
//! [`read`]).

#[allow(unused_imports)]
use crate::*;

/// Kind of an [`Event`], stored in the top bits of [`Event::word`].
pub const KIND_ENTRY: u32 = 0;

/// A function returned.
pub const KIND_EXIT: u32 = 1;

/// A thread seen for the first time: a [`CommEvent`] with its name.
pub const KIND_COMM: u32 = 2;

/// The watched thread left the CPU; the function field is a `SCHED_*`
/// state. While a dispatch is open and the thread blocked, the record is a
/// [`StackEvent`] with the user and kernel stacks where it blocked.
pub const KIND_SCHED_OUT: u32 = 3;

/// The watched thread got the CPU back.
pub const KIND_SCHED_IN: u32 = 4;

/// The watched thread was woken (it is runnable from now on).
pub const KIND_WAKEUP: u32 = 5;

/// A `cpu-clock` sample of the watched thread during a dispatch: a [`StackEvent`].
pub const KIND_SAMPLE: u32 = 6;

/// Left the CPU while still runnable (preempted or yielded).
pub const SCHED_RUNNABLE: u32 = 0;

/// Left the CPU to sleep (I/O, a lock, a timer, …).
pub const SCHED_BLOCKED: u32 = 1;

/// A user-mode CPU sample with a copy of the user stack, for `.eh_frame`
/// unwinding in the agent (`sample --dwarf`): a [`DwarfSample`].
pub const KIND_DWARF: u32 = 7;

/// Bytes of user stack a [`DwarfSample`] copies (from the stack pointer up).
pub const DWARF_STACK_BYTES: usize = 16384;

/// Deepest user stack a [`StackEvent`] holds.
pub const MAX_USER_FRAMES: usize = 64;

/// Deepest kernel stack a [`StackEvent`] holds.
pub const MAX_KERNEL_FRAMES: usize = 32;

/// A Go function was entered: a [`GoEvent`].
pub const KIND_GO_ENTRY: u32 = 8;

/// A Go function returned: a [`GoEvent`].
pub const KIND_GO_EXIT: u32 = 9;

/// A traced process forked, exec'd or exited: a [`ProcEvent`]; the
/// function field is a `PROC_*` constant.
pub const KIND_PROC: u32 = 10;

/// Functions the agent started probing after an exec: written by the
/// agent into `profile.data` (never by the kernel), an [`Event`] header
/// (`tid`: the process, function field: how many) then JSON.
pub const KIND_PROBED: u32 = 11;

/// [`ProcEvent`]: a traced process made a child (`event.tid`), which is
/// traced from its first instruction (`--follow`).
pub const PROC_FORK: u32 = 0;

/// [`ProcEvent`]: the process (`event.tid`) exec'd; `comm` is the new name.
pub const PROC_EXEC: u32 = 1;

/// [`ProcEvent`]: the process's last thread exited; `code` is the wait
/// status (`exit_code` of the task: exit status << 8, or the signal).
pub const PROC_EXIT: u32 = 2;

/// Who woke the watched thread while it was blocked inside a dispatch: a
/// [`WakerEvent`], written before the [`KIND_WAKEUP`] event of that wake-up.
pub const KIND_WAKER: u32 = 12;

/// A `cpu-clock` sample of another thread of the target, taken while the
/// watched thread was blocked inside a dispatch: a [`StackEvent`] whose
/// `tid` is the sampled thread.
pub const KIND_PEER_SAMPLE: u32 = 13;

/// `sample --all`: a process was sampled for the first time (an [`Event`]
/// whose `tid` is the process), so the agent reads its mappings while it
/// runs rather than at its next scan.
pub const KIND_NEW_PROCESS: u32 = 14;

/// The watched thread entered or returned from a wait syscall (with
/// [`WAIT_LOOP_GLOBAL`]): an [`Event`] whose function field is a
/// [`wait::word`] and whose `sp` is the user stack pointer at the syscall.
pub const KIND_WAIT: u32 = 15;

/// [`WakerEvent::flags`] bit: the waker has no user-mode state (a kernel
/// thread, or the idle task an interrupt arrived on).
pub const WAKER_KERNEL_THREAD: u32 = 1;

/// [`WakerEvent::flags`] bit: the wake-up ended the watched thread's wait
/// in its loop's own wait, so the waker is the source of the iteration
/// that follows (the notifier thread, a producer, a timer, a socket's
/// interrupt).
pub const WAKER_LOOP: u32 = 2;

/// One function entry or exit: 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the probe.
    pub ts_ns: u64,
    /// Thread id (the kernel's pid) of the thread that hit the probe.
    pub tid: u32,
    /// `kind << FUNC_BITS | function index`.
    pub word: u32,
    /// Stack pointer at the probe (0 when not a function probe). At entry
    /// it points at the return address; at return it is 8 bytes higher. The
    /// agent pairs an exit with its entry by it, which stays exact when the
    /// kernel skips returns (the 64-deep uretprobe nesting limit), or when
    /// `longjmp` or an exception unwinds probed frames.
    pub sp: u64,
}

impl Event {
    /// Packs a kind and a function index into an event word.
    #[inline(always)]
    pub const fn pack(kind: u32, func: u32) -> u32 {
        (kind << FUNC_BITS) | (func & (FUNC_MASK | LINK_GEN | TAIL_CALL))
    }
    /// The event's kind (`KIND_*`).
    #[inline(always)]
    pub const fn kind(&self) -> u32 {
        self.word >> FUNC_BITS
    }
    /// The function index (the probe cookie).
    #[inline(always)]
    pub const fn func(&self) -> u32 {
        self.word & FUNC_MASK
    }
    /// The tail-call bit ([`TAIL_CALL`]) of a function exit.
    #[inline(always)]
    pub const fn tail_call(&self) -> bool {
        self.word & TAIL_CALL != 0
    }
    /// The link generation bit ([`LINK_GEN`]) of a function event.
    #[inline(always)]
    pub const fn link_gen(&self) -> bool {
        self.word & LINK_GEN != 0
    }
}

/// An entry or exit of a Go function: 32 bytes. Goroutines move between
/// threads and their stacks move when they grow, so calls pair by
/// goroutine and by depth from the stack's top, not by thread and raw
/// stack pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoEvent {
    /// Header: [`KIND_GO_ENTRY`] or [`KIND_GO_EXIT`]; `tid` is the thread
    /// the goroutine ran on, `sp` is `sp - g.stack.hi + GO_STACK_BASE`.
    pub event: Event,
    /// The goroutine's `g` (register r14 under Go's register ABI).
    pub goroutine: u64,
}

/// A thread's first appearance, with its name and process: 40 bytes
/// (the header's function field is the thread's tgid). Sent once per
/// thread (per [`SEEN_THREADS_MAP`] eviction), so that threads which exit
/// before the agent can read `/proc` still have names.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommEvent {
    /// Header; its kind is [`KIND_COMM`] and its function index is 0.
    pub event: Event,
    /// `bpf_get_current_comm()`, NUL-padded.
    pub comm: [u8; 16],
}

/// A traced process's fork, exec or exit: 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEvent {
    /// Header: [`KIND_PROC`]; `tid` is the process (its tgid); the function
    /// field is `PROC_FORK`, `PROC_EXEC` or `PROC_EXIT`.
    pub event: Event,
    /// Fork: the parent's tgid; otherwise 0.
    pub parent: u32,
    /// Exit: the task's `exit_code` (a wait status); otherwise 0.
    pub code: u32,
    /// The process's name (the parent's at fork, the new one at exec).
    pub comm: [u8; 16],
}

/// An event with the current thread's user and kernel stacks (innermost
/// frame first): samples, and switches out to a blocked state.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackEvent {
    /// Header: [`KIND_SAMPLE`] or [`KIND_SCHED_OUT`]. Its `sp` carries why
    /// the table unwinder's walk of `user` ended (see [`StackEvent::user_end`]).
    pub event: Event,
    /// Frames used in `user`.
    pub user_len: u32,
    /// Frames used in `kernel`.
    pub kernel_len: u32,
    /// User return addresses, innermost first.
    pub user: [u64; MAX_USER_FRAMES],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// Who woke the watched thread, read in the waker's context at
/// `sched_waking`: the running task (in an interrupt, whatever task it
/// interrupted; the kernel stack tells which), its name, and its user and
/// kernel stacks, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakerEvent {
    /// Header: [`KIND_WAKER`]; `tid` is the watched (woken) thread.
    pub event: Event,
    /// The waking task's thread id (0: the idle task).
    pub waker_tid: u32,
    /// Its process id.
    pub waker_pid: u32,
    /// `WAKER_*` bits.
    pub flags: u32,
    /// Zero.
    pub pad: u32,
    /// `bpf_get_current_comm()`, NUL-padded.
    pub comm: [u8; 16],
    /// Frames used in `user`.
    pub user_len: u32,
    /// Frames used in `kernel`.
    pub kernel_len: u32,
    /// User return addresses, innermost first.
    pub user: [u64; MAX_USER_FRAMES],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; MAX_KERNEL_FRAMES],
}

/// Key of a CPU-profile count: who was running, and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// User stack id in [`CPU_STACKS_MAP`] (frame-pointer walk), or -1.
    pub user_stack: i32,
    /// Kernel stack id in [`CPU_STACKS_MAP`], or -1.
    pub kernel_stack: i32,
    /// Key of the user stack in [`USER_STACKS_MAP`] (table unwinder), or 0.
    pub user_hash: u64,
}

/// Where and since when a thread has been off the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuStart {
    /// When it left the CPU.
    pub ts_ns: u64,
    /// Who and where.
    pub key: SampleKey,
}

/// A sample's user registers and a copy of the top of the user stack
/// (taken in user mode, or in the kernel: then the registers are those
/// saved at its entry, and `kernel_stack` holds its kernel stack).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DwarfSample {
    /// Header: [`KIND_DWARF`]; `sp` is the stack pointer.
    pub event: Event,
    /// Process id.
    pub pid: u32,
    /// Bytes of `stack` that are valid (0 if none could be read).
    pub len: u32,
    /// The kernel stack's id in `CPU_STACKS` (-1: taken in user mode, or
    /// its kernel stack was not stored).
    pub kernel_stack: i32,
    /// Padding.
    pub _pad: u32,
    /// Instruction pointer.
    pub ip: u64,
    /// Frame pointer register.
    pub bp: u64,
    /// `len` bytes of user stack from `event.sp` up.
    pub stack: [u8; DWARF_STACK_BYTES],
}

/// What a ring record is, from its header's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A function entry: an [`Event`].
    Entry,
    /// A function exit: an [`Event`].
    Exit,
    /// A thread's first appearance: a [`CommEvent`].
    Comm,
    /// The watched thread left the CPU: an [`Event`], or a [`StackEvent`]
    /// when it blocked inside a dispatch.
    SchedOut,
    /// The watched thread got the CPU back: an [`Event`].
    SchedIn,
    /// The watched thread was woken: an [`Event`].
    Wakeup,
    /// An in-dispatch sample: a [`StackEvent`].
    Sample,
    /// A user-mode sample with a stack copy: a [`DwarfSample`].
    Dwarf,
    /// A Go function's entry: a [`GoEvent`].
    GoEntry,
    /// A Go function's exit: a [`GoEvent`].
    GoExit,
    /// A traced process forked, exec'd or exited: a [`ProcEvent`].
    Proc,
    /// Functions probed after an exec (an agent record): an [`Event`]
    /// header followed by JSON.
    Probed,
    /// Who woke the watched thread inside a dispatch: a [`WakerEvent`].
    Waker,
    /// A sample of another thread while the watched one was blocked in a
    /// dispatch: a [`StackEvent`].
    PeerSample,
    /// A process sampled for the first time (`sample --all`): an [`Event`].
    NewProcess,
    /// The watched thread entered or left a wait syscall: an [`Event`].
    Wait,
}

impl RecordKind {
    /// The kind of an [`Event::kind`] value, if it is one.
    pub const fn of(kind: u32) -> Option<RecordKind> {
        Some(match kind {
            KIND_ENTRY => RecordKind::Entry,
            KIND_EXIT => RecordKind::Exit,
            KIND_COMM => RecordKind::Comm,
            KIND_SCHED_OUT => RecordKind::SchedOut,
            KIND_SCHED_IN => RecordKind::SchedIn,
            KIND_WAKEUP => RecordKind::Wakeup,
            KIND_SAMPLE => RecordKind::Sample,
            KIND_DWARF => RecordKind::Dwarf,
            KIND_GO_ENTRY => RecordKind::GoEntry,
            KIND_GO_EXIT => RecordKind::GoExit,
            KIND_PROC => RecordKind::Proc,
            KIND_PROBED => RecordKind::Probed,
            KIND_WAKER => RecordKind::Waker,
            KIND_PEER_SAMPLE => RecordKind::PeerSample,
            KIND_NEW_PROCESS => RecordKind::NewProcess,
            KIND_WAIT => RecordKind::Wait,
            _ => return None,
        })
    }
}

/// A type the kernel writes into the ring as a whole record, starting with
/// an [`Event`] header.
///
/// # Safety
/// Implementors are `#[repr(C)]`, made of integers and arrays of them, so
/// any bytes are a valid value.
pub unsafe trait Record: Copy {}

// SAFETY: each is #[repr(C)] plain integers (see the type's layout test).
unsafe impl Record for Event {}

// SAFETY: as above.
unsafe impl Record for CommEvent {}

// SAFETY: as above.
unsafe impl Record for GoEvent {}

// SAFETY: as above.
unsafe impl Record for StackEvent {}

impl StackEvent {
    /// Why the table unwinder stopped walking `user`: an [`unwind_end`]
    /// constant, or 0 when the stack came from the kernel's frame-pointer
    /// walk (`--unwind fp`, or a recording made before this field was set).
    pub fn user_end(&self) -> u32 {
        self.event.sp as u32
    }
}

// SAFETY: as above.
unsafe impl Record for ProcEvent {}

// SAFETY: as above.
unsafe impl Record for DwarfSample {}

// SAFETY: as above.
unsafe impl Record for WakerEvent {}

// SAFETY: as above.
unsafe impl Record for python::PyCodeNotice {}

/// The one decoder of ring records: the record's kind, and its header.
/// None for a record too short for a header, or of an unknown kind.
pub fn decode(bytes: &[u8]) -> Option<(RecordKind, Event)> {
    let ev: Event = read(bytes)?;
    Some((RecordKind::of(ev.kind())?, ev))
}

/// Reads a whole record of type `T` from its bytes (any alignment), or
/// None when there are too few.
pub fn read<T: Record>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < core::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: enough bytes, `T: Record` accepts any bit pattern, and
    // `read_unaligned` copes with any alignment.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for python::PyProc {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for v8::V8Proc {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for DwarfSample {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for SampleKey {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for OffCpuStart {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for Event {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for StackEvent {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for CommEvent {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for GoEvent {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for ProcEvent {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for WakerEvent {}
