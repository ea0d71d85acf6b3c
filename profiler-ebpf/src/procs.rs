//! Process lifecycle: `prof_proc_fork`, `prof_proc_exec` and
//! `prof_proc_exit` (raw tracepoints `sched_process_*`), a traced
//! process's children added to `TRACED` before they first run.

use crate::*;

/// Writes a process event about `tgid`.
#[inline(always)]
pub(crate) fn emit_proc(tgid: u32, what: u32, parent: u32, code: u32) {
    match reserve::<ProcEvent>() {
        Some((mut slot, wake)) => {
            slot.write(ProcEvent {
                event: Event {
                    // SAFETY: a BPF helper with no arguments and no preconditions.
                    ts_ns: unsafe { bpf_ktime_get_ns() },
                    tid: tgid,
                    word: Event::pack(KIND_PROC, what),
                    sp: 0,
                },
                parent,
                code,
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            });
            let _ = wake;
            slot.submit(BPF_RB_FORCE_WAKEUP as u64);
        }
        None => bump(COUNTER_LOST_PROC),
    }
}

/// Reads a `u32` at `offset` in a kernel `task_struct`.
#[inline(always)]
pub(crate) fn task_u32(task: u64, offset: u32) -> Option<u32> {
    // SAFETY: bpf_probe_read_kernel copes with any address.
    unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u32) }.ok()
}

/// `sched_process_fork(task *parent, task *child)`, in the parent's
/// context, before the child first runs. A new process (not a thread) of a
/// traced one is added to `TRACED` under `--follow`, so its first
/// instruction is already traced; otherwise it is only counted.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn prof_proc_fork(ctx: RawTracePointContext) -> i32 {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_traced(parent) {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let (Some(pid), Some(tgid)) = (
        task_u32(child, TASK_PID_OFFSET.load()),
        task_u32(child, TASK_TGID_OFFSET.load()),
    ) else {
        return 0;
    };
    if pid != tgid {
        // A thread of the same process.
        return 0;
    }
    if TRACK.load() != track::FOLLOW {
        bump(COUNTER_UNTRACED_CHILDREN);
        return 0;
    }
    if TRACED.insert(tgid, parent, 0).is_err() {
        bump(COUNTER_TRACED_FULL);
        return 0;
    }
    emit_proc(tgid, PROC_FORK, parent, 0);
    0
}

/// `sched_process_exec(task *p, pid_t old_pid, linux_binprm *bprm)`, in the
/// process's context once the new image is in place.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn prof_proc_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if SAMPLE_ALL.load() != 0 {
        // A new image, new mappings: its next sample tells the agent again
        // (a process first sampled between fork and exec was read as its
        // parent's image).
        let _ = NOTICED.remove(tgid);
    }
    if is_traced(tgid) {
        emit_proc(tgid, PROC_EXEC, 0, 0);
    }
    0
}

/// `sched_process_exit(task *p, bool group_dead)`, in the exiting thread's
/// context; the process is gone when `group_dead`.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn prof_proc_exit(ctx: RawTracePointContext) -> i32 {
    let group_dead: u64 = ctx.arg(1);
    if group_dead & 0xff == 0 {
        return 0;
    }
    on_process_exit()
}

/// `sched_process_exit(task *p)`, where the tracepoint has no `group_dead`
/// (Linux 6.1): `do_exit` has already counted the thread out of
/// `signal->live`, so the process is gone when that reads 0.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn prof_proc_exit1(_ctx: RawTracePointContext) -> i32 {
    let [signal_at, live_at] = TASK_SIGNAL_LIVE_OFFSETS.load();
    if signal_at == 0 || live_at == 0 {
        return 0;
    }
    // SAFETY: a BPF helper with no arguments; the task address is only read through BPF helpers.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: bpf_probe_read_kernel copes with any address.
    let Ok(signal) =
        (unsafe { bpf_probe_read_kernel((task + u64::from(signal_at)) as *const u64) })
    else {
        return 0;
    };
    if task_u32(signal, live_at) != Some(0) {
        return 0;
    }
    on_process_exit()
}

/// A traced process (the current task's) has exited: its exit code, and
/// it leaves the traced set.
#[inline(always)]
fn on_process_exit() -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if SAMPLE_ALL.load() != 0 {
        // A process given this PID later is told of too.
        let _ = NOTICED.remove(tgid);
    }
    if !is_traced(tgid) {
        return 0;
    }
    // SAFETY: a BPF helper with no arguments; the task address is only stored or read through BPF helpers.
    let task = unsafe { bpf_get_current_task() };
    let code = task_u32(task, TASK_EXIT_CODE_OFFSET.load()).unwrap_or(0);
    emit_proc(tgid, PROC_EXIT, 0, code);
    if TRACK.load() != track::ONE {
        let _ = TRACED.remove(tgid);
    }
    0
}
