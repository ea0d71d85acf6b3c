//! The table unwinder's shared types: `UnwindRow` (the rows the agent
//! compiles from CFI), the per-process mappings, the walked stacks, why a
//! walk ended, and where return uprobes hide return addresses.

#[allow(unused_imports)]
use crate::*;

/// How user stacks are walked in the kernel ([`UNWIND_MODE_GLOBAL`]).
pub mod unwind_mode {
    /// Frame pointers only (the kernel's own walk).
    pub const FP: u32 = 0;
    /// Compiled unwind tables, frame pointers where a mapping has none.
    pub const TABLES: u32 = 1;
}

/// Global (`.rodata`): an [`unwind_mode`] constant.
pub const UNWIND_MODE_GLOBAL: &str = "UNWIND_MODE";

/// Deepest user stack the table unwinder walks.
pub const MAX_UNWIND_FRAMES: usize = 128;

/// Most executable mappings of one process the table unwinder knows.
pub const MAX_MAPPINGS: usize = 256;

/// Array of [`UnwindRow`]s: every compiled table, each a contiguous range.
pub const UNWIND_ROWS_MAP: &str = "UNWIND_ROWS";

/// Hash of tgid -> [`ProcMaps`].
pub const UNWIND_PROCS_MAP: &str = "UNWIND_PROCS";

/// Hash of stack key -> [`UserStack`] (the table unwinder's stacks).
pub const USER_STACKS_MAP: &str = "USER_STACKS";

/// Capacity of [`UNWIND_PROCS_MAP`].
pub const UNWIND_PROCS_CAPACITY: u32 = 8192;

/// Why the table unwinder stopped ([`UserStack::end`]).
pub mod unwind_end {
    /// The outermost frame: its return address is undefined by the CFI.
    pub const ROOT: u32 = 1;
    /// A frame-pointer walk reached a null frame pointer or return address.
    pub const FP_END: u32 = 2;
    /// Reading the stack failed (unmapped, or paged out in the sampler).
    pub const READ_FAULT: u32 = 3;
    /// [`super::MAX_UNWIND_FRAMES`] frames.
    pub const DEPTH: u32 = 4;
    /// A CFI rule the unwinder does not follow.
    pub const UNSUPPORTED: u32 = 5;
    /// The process has no tables (yet): the kernel's frame-pointer walk.
    pub const NO_TABLES: u32 = 6;
    /// The walk went nowhere (the stack pointer did not move up).
    pub const BAD_FRAME: u32 = 7;
    /// Bits of `end` that hold the reason.
    pub const REASON: u32 = 0xff;
    /// Flag beside the reason: some frame was stepped by frame pointers
    /// because its binary had no table (yet, or not within the budget), or
    /// the process had none.
    pub const FP_NO_TABLE: u32 = 0x100;

    /// The reason alone, without the flags.
    pub const fn reason(end: u32) -> u32 {
        end & REASON
    }
}

/// A user stack walked with the unwind tables.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UserStack {
    /// Frames used.
    pub len: u32,
    /// Why the walk stopped: an [`unwind_end`] constant.
    pub end: u32,
    /// Return addresses, innermost first (the first is the sampled pc).
    pub frames: [u64; MAX_UNWIND_FRAMES],
}

/// One executable file mapping of a process, for the table unwinder.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMapping {
    /// First address.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// Subtracted from an address to give its key in the table: the ELF
    /// virtual address minus the table's base ([`UnwindRow::pc`]).
    pub bias: u64,
    /// First row of its table in [`UNWIND_ROWS_MAP`].
    pub table_start: u32,
    /// Rows in its table; 0: no table, walk frame pointers.
    pub table_len: u32,
}

/// A process's executable mappings, sorted by `start`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcMaps {
    /// Entries used in `maps`.
    pub len: u32,
    /// Zero.
    pub pad: u32,
    /// The mappings.
    pub maps: [ExecMapping; MAX_MAPPINGS],
}

/// How to find the canonical frame address (CFA: the stack pointer just
/// before the call that made this frame) in an [`UnwindRow`].
pub mod cfa {
    /// `rsp + offset`.
    pub const RSP: u8 = 1;
    /// `rbp + offset`.
    pub const RBP: u8 = 2;
    /// A lazy-binding PLT stub (`.plt`): `rsp + 8`, plus 8 more once the
    /// stub has pushed its index, i.e. when `(rip & 15) >= cfa_offset`
    /// (11 in classic PLTs, 10 in some linkers' output), as the standard
    /// `DW_CFA_def_cfa_expression` of x86-64 PLTs computes.
    pub const PLT: u8 = 3;
    /// The return address is undefined: the outermost frame (`_start`,
    /// `clone`, a thread's start). The stack is complete.
    pub const END: u8 = 4;
    /// A rule the unwinder cannot follow (another DWARF expression, or a
    /// return address not at `CFA - 8`): unwinding stops, counted.
    pub const UNSUPPORTED: u8 = 5;
}

/// Where the caller's `rbp` is, in an [`UnwindRow`].
pub mod rbp {
    /// Unchanged (not saved by this frame).
    pub const SAME: u8 = 0;
    /// Saved at `CFA + offset`.
    pub const AT_CFA: u8 = 1;
    /// A rule the unwinder cannot follow: `rbp` becomes unknown.
    pub const UNSUPPORTED: u8 = 2;
}

/// One row of a compiled unwind table: how to unwind one frame whose
/// program counter is at or after `pc` and before the next row's. `pc` is
/// an ELF virtual address of its binary minus the table's base (its first
/// row's address, folded into each mapping's [`ExecMapping::bias`]), so
/// one table spans at most 4 GiB. The return address is always at
/// `CFA - 8` on x86-64. 8 bytes: the kinds and the saved `rbp`'s offset
/// share `rule` ([`UnwindRow::new`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address the row covers, from the table's base.
    pub pc: u32,
    /// Offset of the CFA from its base register (for [`cfa::PLT`], the
    /// threshold; for [`cfa::UNSUPPORTED`], why).
    pub cfa_offset: i16,
    /// Bits 0-2: how to compute the CFA (a [`cfa`] constant); bits 3-4:
    /// where the caller's `rbp` is (a [`rbp`] constant); bits 5-15: the
    /// saved `rbp`'s offset from the CFA, in 8-byte words, signed (for
    /// [`rbp::AT_CFA`]).
    pub rule: u16,
}

impl UnwindRow {
    /// The row for these rules, or None when `rbp_offset` cannot be held
    /// (not a multiple of 8, or beyond -8192..=8184): the caller then says
    /// [`rbp::UNSUPPORTED`].
    pub const fn new(
        pc: u32,
        cfa_kind: u8,
        cfa_offset: i16,
        rbp_kind: u8,
        rbp_offset: i16,
    ) -> Option<Self> {
        if rbp_offset % 8 != 0 || rbp_offset < -8192 || rbp_offset > 8184 {
            return None;
        }
        let words = ((rbp_offset / 8) as u16) & 0x7ff;
        Some(UnwindRow {
            pc,
            cfa_offset,
            rule: (cfa_kind as u16 & 7) | ((rbp_kind as u16 & 3) << 3) | (words << 5),
        })
    }

    /// How to compute the CFA: a [`cfa`] constant.
    #[inline(always)]
    pub const fn cfa_kind(&self) -> u8 {
        (self.rule & 7) as u8
    }

    /// Where the caller's `rbp` is: a [`rbp`] constant.
    #[inline(always)]
    pub const fn rbp_kind(&self) -> u8 {
        ((self.rule >> 3) & 3) as u8
    }

    /// Offset of the saved `rbp` from the CFA (for [`rbp::AT_CFA`]).
    #[inline(always)]
    pub const fn rbp_offset(&self) -> i16 {
        ((self.rule as i16) >> 5) * 8
    }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for UnwindRow {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for UserStack {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for ExecMapping {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] integers (and arrays of them) with no implicit padding:
// every bit pattern is a valid value, and the bytes are all initialized.
unsafe impl aya::Pod for ProcMaps {}

/// True for a slot that holds an interpreter's or JIT's frame (Python,
/// JavaScript, Java) rather than a code address.
pub const fn is_runtime_frame(slot: u64) -> bool {
    python::is_frame(slot) || v8::is_frame(slot) || hotspot::is_frame(slot)
}

/// Where the kernel keeps a task's pending return uprobes (see the agent's
/// `attach/task_btf.rs`): indices into the [`uret::GLOBAL`] array of byte
/// offsets, all 0 when unknown. The table unwinder puts back the return
/// address a return uprobe replaced with its trampoline.
pub mod uret {
    /// Global (`.rodata`): `[u32; COUNT]` of byte offsets.
    pub const GLOBAL: &str = "URETPROBE_OFFSETS";
    /// `task_struct.utask`.
    pub const TASK_UTASK: usize = 0;
    /// `uprobe_task.return_instances`.
    pub const UTASK_RETURN_INSTANCES: usize = 1;
    /// `return_instance.orig_ret_vaddr`.
    pub const RI_ORIG_RET_VADDR: usize = 2;
    /// `return_instance.chained`.
    pub const RI_CHAINED: usize = 3;
    /// `return_instance.next`.
    pub const RI_NEXT: usize = 4;
    /// `task_struct.mm`.
    pub const TASK_MM: usize = 5;
    /// `mm_struct.uprobes_state.xol_area`.
    pub const MM_XOL_AREA: usize = 6;
    /// `xol_area.vaddr`.
    pub const XOL_VADDR: usize = 7;
    /// `uprobe_task.vaddr`: the probed instruction being stepped out of
    /// line.
    pub const UTASK_VADDR: usize = 8;
    /// The return trampoline's kind ([`TRAMP_INT3`], [`TRAMP_SYSCALL`];
    /// 0: unknown), not an offset.
    pub const TRAMP: usize = 9;
    /// Entries.
    pub const COUNT: usize = 10;
    /// Before Linux 6.11 (x86_64): the trampoline is one `int3`; a task
    /// in its trap has its pc one past it, its stack as the `ret` left it.
    pub const TRAMP_INT3: u32 = 1;
    /// From Linux 6.11: `push rax; push rcx; push r11; mov $NR, rax;
    /// syscall` (the uretprobe syscall); a task in that syscall has its
    /// pc [`TRAMP_SYSCALL_PC`] bytes in, three words pushed.
    pub const TRAMP_SYSCALL: u32 = 2;
    /// The pc of a task inside the uretprobe syscall, from the trampoline.
    pub const TRAMP_SYSCALL_PC: u64 = 13;
    /// Bytes of one out-of-line slot in the area (x86); the first holds
    /// the return trampoline.
    pub const XOL_SLOT_BYTES: u64 = 128;
}
