//! Program names, the attach cookie's flags, and the function field of
//! an event (`FUNC_BITS`, `LINK_GEN`).

#[allow(unused_imports)]
use crate::*;

/// Name of the `sys_enter` raw tracepoint program (the watched thread's
/// wait syscalls).
pub const PROG_SYS_ENTER: &str = "prof_sys_enter";

/// Name of the `sys_exit` raw tracepoint program.
pub const PROG_SYS_EXIT: &str = "prof_sys_exit";

/// Name of the program for each wait syscall's `syscalls:sys_enter_NAME`
/// tracepoint (where trampolines and kprobes cannot attach).
pub const PROG_SYSCALL_ENTER: &str = "prof_syscall_enter";

/// Name of the program for each `syscalls:sys_exit_NAME` tracepoint.
pub const PROG_SYSCALL_EXIT: &str = "prof_syscall_exit";

/// The wait syscalls' kernel functions, each with an fentry program
/// `prof_enter_NAME` and an fexit program `prof_exit_NAME` (preferred to
/// the `sys_enter`/`sys_exit` tracepoints, which slow every syscall).
pub const WAIT_SYSCALLS: [&str; 10] = [
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "io_uring_enter",
    "futex",
    "futex_waitv",
];

/// Bit of a probe cookie that marks a dispatch function.
pub const COOKIE_DISPATCH: u64 = 1 << 32;

/// Bit of a probe cookie that marks a Go function: its events are
/// [`GoEvent`]s, keyed by goroutine rather than by thread.
pub const COOKIE_GO: u64 = 1 << 33;

/// Offset added to a Go event's stack depth so that it reads like a stack
/// pointer: `sp - g.stack.hi + GO_STACK_BASE`. It is the same for a frame
/// before and after Go copies the goroutine's stack to grow it, and, as
/// with a real stack pointer, deeper frames have lower values.
pub const GO_STACK_BASE: u64 = 1 << 46;

/// Name of the `sched_process_fork` raw tracepoint program.
pub const PROG_PROC_FORK: &str = "prof_proc_fork";

/// Name of the `sched_process_exec` raw tracepoint program.
pub const PROG_PROC_EXEC: &str = "prof_proc_exec";

/// Name of the `sched_process_exit` raw tracepoint program.
pub const PROG_PROC_EXIT: &str = "prof_proc_exit";

/// Name of the `sched_process_exit` program for kernels whose tracepoint
/// has only the task argument (the kernel refuses [`PROG_PROC_EXIT`]
/// there, as it reads a second argument).
pub const PROG_PROC_EXIT_OLD: &str = "prof_proc_exit1";

/// Name of the `sched_switch` raw tracepoint program.
pub const PROG_SCHED_SWITCH: &str = "prof_sched_switch";

/// Name of the wake-up raw tracepoint program (attached to `sched_waking`,
/// which runs in the waker's context).
pub const PROG_SCHED_WAKEUP: &str = "prof_sched_wakeup";

/// Name of the waker sampler: a `cpu-clock` perf event on every CPU that
/// samples the target's other threads while the watched thread is blocked
/// inside a dispatch ([`WATCH_BLOCKED`]).
pub const PROG_PEER_SAMPLE: &str = "prof_peer_sample";

/// Name of the CPU-profile sampling program (kernel-aggregated stacks).
pub const PROG_CPU_SAMPLE: &str = "prof_cpu_sample";

/// Name of the off-CPU program (`sched_switch`, every target thread).
pub const PROG_OFFCPU: &str = "prof_offcpu";

/// Name of the perf-event sampling program.
pub const PROG_SAMPLE: &str = "prof_sample";

/// Name of the entry uprobe program.
pub const PROG_ENTRY: &str = "prof_entry";

/// Name of the return uprobe program (a uretprobe).
pub const PROG_EXIT: &str = "prof_exit";

/// Name of the return-site program: a plain uprobe on a `ret` instruction
/// (or a tail-call `jmp`), which reports the stack pointer plus 8, as a
/// return uprobe would after the return.
pub const PROG_RET: &str = "prof_ret";

/// Name of a program the verifier refuses on every kernel (it reads past
/// its context), loaded only when `PROFILER_TEST_REFUSED` is set: the test
/// of what a user sees when the kernel refuses a program (RELIABILITY.md
/// row 15).
pub const PROG_TEST_REFUSED: &str = "prof_test_refused";

/// The environment variable that makes `record`, `sample` and `check`
/// load [`PROG_TEST_REFUSED`] too.
pub const TEST_REFUSED_ENV: &str = "PROFILER_TEST_REFUSED";

/// Bits of [`Event::word`] below the kind: the function index, the
/// tail-call bit and the link generation bit.
pub const FUNC_BITS: u32 = 28;

/// Mask of the function index in [`Event::word`].
pub const FUNC_MASK: u32 = (1 << (FUNC_BITS - 2)) - 1;

/// Bit of [`Event::word`] (and of a probe cookie): the exit was a
/// tail-call `jmp` to the start of another probed function, whose entry
/// comes next. The agent keeps the frame open until that callee returns
/// (`analyze/tail_calls.rs`). The kernel passes it through untouched.
pub const TAIL_CALL: u32 = 1 << (FUNC_BITS - 2);

/// Bit of [`Event::word`] (and of the low 32 bits of a probe cookie) that
/// tells which generation of a binary's uprobe_multi links fired. When the
/// overhead governor rebuilds a binary's links without its hottest
/// functions, the new links are created before the old ones are dropped, so
/// for a moment one hit runs both; the two events differ only in this bit,
/// and the agent keeps one (`analyze/dedup.rs`).
pub const LINK_GEN: u32 = 1 << (FUNC_BITS - 1);

/// Largest number of functions a session can probe.
pub const MAX_FUNCS: u32 = FUNC_MASK + 1;
