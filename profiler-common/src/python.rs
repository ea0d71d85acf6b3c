//! CPython frames in user stacks: where the interpreter keeps them
//! ([`PyProc`], written by the agent per process) and how a frame
//! is carried in a stack's `u64` slots ([`encode`]).
//!
//! The kernel walks the thread's frame chain (`_PyInterpreterFrame`s from
//! 3.11, `PyFrameObject`s before: [`PyProc::style`]) and appends one
//! tagged slot per Python frame after the native frames; the agent names
//! each from its code object and splices them in under the native
//! `_PyEval_EvalFrameDefault` frame that runs them.

/// Hash of tgid -> [`PyProc`].
pub const PY_PROCS_MAP: &str = "PY_PROCS";
/// Capacity of [`PY_PROCS_MAP`].
pub const PY_PROCS_CAPACITY: u32 = 4096;
/// Most Python frames a stack keeps (the innermost ones).
pub const MAX_PY_FRAMES: u32 = 32;
/// Ring of [`PyCodeNotice`]s: code objects met for the first time in
/// a stored stack, for the agent to read while their process runs.
pub const PY_NEWS_MAP: &str = "PY_NEWS";
/// Size of [`PY_NEWS_MAP`] in bytes (4,096 notices).
pub const PY_NEWS_BYTES: u32 = 64 << 10;
/// Code objects already told of, per process (an LRU: one evicted is
/// told of again, harmlessly).
pub const PY_CODES_CAPACITY: u32 = 32768;

/// A code object of process `pid` that a stored stack holds for the
/// first time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyCodeNotice {
    pub pid: u32,
    /// Zero.
    pub pad: u32,
    pub code: u64,
}
/// A field the version does not have.
pub const NONE: u32 = u32::MAX;
/// `_PyInterpreterFrame.owner` of the shim frame each C call of the
/// evaluator pushes (3.12 and later): not a Python function.
pub const OWNED_BY_CSTACK: u8 = 3;

/// [`PyProc::style`] of 3.11 and later: `_PyInterpreterFrame`s, several
/// to an evaluator call, the instruction a pointer into the code object.
pub const STYLE_INTERP: u32 = 0;
/// [`PyProc::style`] of 3.10: `PyFrameObject`s, one to an evaluator call
/// (each is the outermost of its call), `f_lasti` an `int` counting code
/// units; the thread state's `thread_id` is its `pthread_self()`.
pub const STYLE_LASTI_UNITS: u32 = 1;
/// [`PyProc::style`] of 3.8 and 3.9: as [`STYLE_LASTI_UNITS`], with
/// `f_lasti` counting bytes.
pub const STYLE_LASTI_BYTES: u32 = 2;

/// Tag in the top bits of a Python frame's slot (user addresses stay
/// below 2^47, kernel ones start at 0xffff…).
pub const TAG: u64 = 0xa << 60;
const TAG_MASK: u64 = 0xf << 60;
/// Set on the outermost Python frame that one C call of the evaluator
/// runs: the frames up to it belong under one native
/// `_PyEval_EvalFrameDefault` frame.
pub const ENTRY: u64 = 1 << 59;
const CODE_SHIFT: u32 = 15;
const CODE_BITS: u64 = (1 << 44) - 1;
/// Largest instruction index kept (code units); larger ones read as it.
pub const INSTR_MAX: u64 = (1 << CODE_SHIFT) - 1;

/// Where one CPython process keeps its frames: absolute addresses and
/// the offsets of the fields the kernel reads, for its version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// Address of `_PyRuntime.interpreters.head`.
    pub interp_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.native_thread_id` (the kernel's thread id), or
    /// `.thread_id` before 3.11 (`pthread_self()`: the thread's fs base,
    /// `task_struct` at [`PyProc::task_fsbase`]).
    pub tstate_native_tid: u32,
    /// `PyThreadState.cframe` (3.11, 3.12), `.current_frame` (3.13), or
    /// `.frame` (before 3.11).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`, or [`NONE`] when `tstate_frame` is
    /// the frame itself.
    pub cframe_frame: u32,
    /// `_PyInterpreterFrame.f_code` (`f_executable` in 3.13), or
    /// `PyFrameObject.f_code`.
    pub frame_code: u32,
    /// `_PyInterpreterFrame.previous`, or `PyFrameObject.f_back`.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame.prev_instr` (`instr_ptr` in 3.13), or
    /// `PyFrameObject.f_lasti`.
    pub frame_instr: u32,
    /// `_PyInterpreterFrame.owner`, or [`NONE`].
    pub frame_owner: u32,
    /// `_PyInterpreterFrame.is_entry` (3.11), or [`NONE`].
    pub frame_is_entry: u32,
    /// `PyCodeObject.co_code_adaptive`: where the bytecode starts (3.11
    /// and later).
    pub code_adaptive: u32,
    /// How the frames are kept: [`STYLE_INTERP`], [`STYLE_LASTI_UNITS`]
    /// or [`STYLE_LASTI_BYTES`].
    pub style: u32,
    /// `task_struct.thread.fsbase` in the running kernel, for the styles
    /// that find a thread's state by its `pthread_self()` ([`NONE`]:
    /// unknown).
    pub task_fsbase: u32,
    /// Zero.
    pub pad: u32,
}

/// A Python frame's slot: code object `code`, instruction index
/// `instr` (code units from the start of its bytecode), and whether it
/// is the outermost frame of its evaluator call.
pub const fn encode(code: u64, instr: u64, entry: bool) -> u64 {
    let instr = if instr > INSTR_MAX { INSTR_MAX } else { instr };
    TAG | if entry { ENTRY } else { 0 } | ((code >> 3) & CODE_BITS) << CODE_SHIFT | instr
}

/// True for a slot written by [`encode`].
pub const fn is_frame(slot: u64) -> bool {
    slot & TAG_MASK == TAG
}

/// `(code object address, instruction index, entry)` of a slot.
pub const fn decode(slot: u64) -> (u64, u64, bool) {
    (
        ((slot >> CODE_SHIFT) & CODE_BITS) << 3,
        slot & INSTR_MAX,
        slot & ENTRY != 0,
    )
}
