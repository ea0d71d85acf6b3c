//! Settings: values the agent sets at load (`.rodata`, by name through
//! `EbpfLoader::override_global`), read with a volatile load.

/// A value the agent sets at load time (`.rodata`, through
/// `EbpfLoader::override_global`), read with a volatile load so the
/// compiler cannot fold the placeholder. Unlike aya's `Global`, it holds no
/// `MaybeUninit`: the kernel refuses that union's BTF, and without BTF a
/// program cannot use a `bpf_loop` callback (the table unwinder does).
#[repr(transparent)]
pub(crate) struct Setting<T>(T);

impl<T: Copy> Setting<T> {
    pub(crate) const fn new(value: T) -> Self {
        Setting(value)
    }

    #[inline(always)]
    pub(crate) fn load(&self) -> T {
        // SAFETY: a plain read of a static.
        unsafe { core::ptr::read_volatile(&self.0) }
    }
}

/// Set by the agent at load time: the traced process's tgid.
#[unsafe(no_mangle)]
pub(crate) static TARGET_TGID: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: how traced processes are told apart (a
/// `track` constant: `TARGET_TGID` alone, or the `TRACED` map, followed
/// through forks or not).
#[unsafe(no_mangle)]
pub(crate) static TRACK: Setting<u32> = Setting::new(0);

/// Set by the agent at load time, from the kernel's BTF: byte offsets of
/// `pid`, `tgid` and `exit_code` in `task_struct`.
#[unsafe(no_mangle)]
pub(crate) static TASK_PID_OFFSET: Setting<u32> = Setting::new(0);

#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFFSET: Setting<u32> = Setting::new(0);

#[unsafe(no_mangle)]
pub(crate) static TASK_EXIT_CODE_OFFSET: Setting<u32> = Setting::new(0);

/// `task_struct.signal` and `signal_struct.live` (zeros: unknown).
#[unsafe(no_mangle)]
pub(crate) static TASK_SIGNAL_LIVE_OFFSETS: Setting<[u32; 2]> = Setting::new([0; 2]);

/// Set by the agent at load time, from the kernel's BTF: where a task's
/// pending return uprobes are (`profiler_common::uret`; zeros: unknown).
#[unsafe(no_mangle)]
pub(crate) static URETPROBE_OFFSETS: Setting<[u32; profiler_common::uret::COUNT]> =
    Setting::new([0; profiler_common::uret::COUNT]);

/// Set by the agent at load time: while an iteration of the loop is
/// younger than `SAMPLE_FULL_AFTER_NS`, the in-dispatch sampler takes one
/// tick in this many (`watch`: a low rate until a stall may be starting).
#[unsafe(no_mangle)]
pub(crate) static SAMPLE_EARLY_EVERY: Setting<u32> = Setting::new(1);

#[unsafe(no_mangle)]
pub(crate) static SAMPLE_FULL_AFTER_NS: Setting<u64> = Setting::new(0);

/// Set by the agent at load time: the watched thread (0: none).
#[unsafe(no_mangle)]
pub(crate) static WATCH_TID: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: name who wakes the watched thread while
/// it is blocked in a dispatch (1), or not (0, `record --no-wakers`): then
/// `WATCH_BLOCKED` is never set, so no waker record is written and the
/// waker sampler (not attached either) would have nothing to do.
#[unsafe(no_mangle)]
pub(crate) static WAKERS: Setting<u32> = Setting::new(1);

/// Set by the agent at load time: wake the agent only once this many bytes
/// are pending, so a busy target does not pay for a wake-up per event. The
/// agent also drains the ring on a short timer, so quiet periods are not
/// delayed by more than that tick.
#[unsafe(no_mangle)]
pub(crate) static WAKEUP_BYTES: Setting<u64> = Setting::new(0);

/// Set by the agent at load time: copy user stacks of user-mode samples
/// for DWARF unwinding instead of walking frame pointers.
#[unsafe(no_mangle)]
pub(crate) static DWARF_MODE: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: how user stacks are walked (an
/// `unwind_mode` constant: frame pointers, or the compiled tables).
#[unsafe(no_mangle)]
pub(crate) static UNWIND_MODE: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: sample every process (1) or only the target.
#[unsafe(no_mangle)]
pub(crate) static SAMPLE_ALL: Setting<u32> = Setting::new(0);

/// Set by the agent at load time (`sample --all --cgroup`): sample only
/// tasks in the subtree of the cgroup v2 with this id (0: every task).
#[unsafe(no_mangle)]
pub(crate) static CGROUP_ID: Setting<u64> = Setting::new(0);

/// Set by the agent at load time: the level of that cgroup (root: 0).
#[unsafe(no_mangle)]
pub(crate) static CGROUP_LEVEL: Setting<u32> = Setting::new(0);

/// Set by the agent at load time: 1 to write to the current CPU's ring,
/// 0 to write everything to the shared ring in slot 0 of `EVENTS`.
#[unsafe(no_mangle)]
pub(crate) static PER_CPU_RINGS: Setting<u32> = Setting::new(0);
