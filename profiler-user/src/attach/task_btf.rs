//! Where the kernel keeps a task's `pid`, `tgid` and `exit_code` (byte
//! offsets in `struct task_struct`), and its pending return uprobes, read
//! from the running kernel's BTF (`/sys/kernel/btf/vmlinux`) with `btf-rs`.
//! The process tracepoints (`sched_process_fork`, `sched_process_exit`)
//! and the table unwinder read those fields with them, since the eBPF
//! programs have no CO-RE relocations.
use btf_rs::{Backend, Btf, Type};

use crate::{Error, Result};

/// The running kernel's BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Opens [`VMLINUX`], mapped and read on demand (parsing all of it up front
/// takes about a second, which every `record` would pay).
fn vmlinux() -> std::result::Result<Btf, String> {
    Btf::from_file_with_backend(VMLINUX, Backend::Mmap)
        .or_else(|_| Btf::from_file(VMLINUX))
        .map_err(|e| e.to_string())
}

/// Byte offsets in `task_struct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `pid_t pid` (the thread id).
    pub pid: u32,
    /// `pid_t tgid` (the process id).
    pub tgid: u32,
    /// `int exit_code` (a wait status, set before `sched_process_exit`).
    pub exit_code: u32,
}

/// Reads the offsets from the kernel's BTF.
pub fn task_offsets() -> Result<TaskOffsets> {
    let fail = |why: String| {
        Error::Load(format!(
            "reading task_struct from /sys/kernel/btf/vmlinux: {why}; --follow, several --pid and --pid-of need a kernel with BTF (CONFIG_DEBUG_INFO_BTF)"
        ))
    };
    let btf = vmlinux().map_err(fail)?;
    let types = btf
        .resolve_types_by_name("task_struct")
        .map_err(|e| fail(e.to_string()))?;
    let st = types
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
        .ok_or_else(|| fail("no struct task_struct".into()))?;
    let offset = |name: &str| {
        st.members
            .iter()
            .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == name))
            .map(|m| m.bit_offset() / 8)
            .ok_or_else(|| fail(format!("no member {name}")))
    };
    Ok(TaskOffsets {
        pid: offset("pid")?,
        tgid: offset("tgid")?,
        exit_code: offset("exit_code")?,
    })
}

/// Where the kernel keeps a task's pending return uprobes and its
/// process's uprobe trampoline: byte offsets from the kernel's BTF, for the
/// table unwinder, which puts each return address a return uprobe replaced
/// (the trampoline's) back to the caller's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UretprobeOffsets {
    /// `task_struct.utask`.
    pub task_utask: u32,
    /// `uprobe_task.return_instances`.
    pub utask_return_instances: u32,
    /// `return_instance.orig_ret_vaddr`.
    pub ri_orig_ret_vaddr: u32,
    /// `return_instance.chained`.
    pub ri_chained: u32,
    /// `return_instance.next`.
    pub ri_next: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.uprobes_state.xol_area`.
    pub mm_xol_area: u32,
    /// `xol_area.vaddr`: the trampoline.
    pub xol_vaddr: u32,
    /// `uprobe_task.vaddr`: the probed instruction stepped out of line.
    pub utask_vaddr: u32,
}

/// `task_struct.signal` and `signal_struct.live`, for the process-exit
/// tracepoint of kernels whose tracepoint has no `group_dead` argument
/// (`PROG_PROC_EXIT_OLD`); None without BTF.
pub fn signal_live_offsets() -> Option<[u32; 2]> {
    let btf = vmlinux().ok()?;
    let task = struct_named(&btf, "task_struct")?;
    let signal = struct_named(&btf, "signal_struct")?;
    Some([
        member(&btf, &task, "signal")?.0,
        member(&btf, &signal, "live")?.0,
    ])
}

/// The struct `name` of `btf`.
fn struct_named(btf: &Btf, name: &str) -> Option<btf_rs::Struct> {
    btf.resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
}

/// The byte offset of member `name` of `st`, looking inside anonymous
/// structs and unions (`mm_struct` keeps its fields in one), and the
/// member's type.
fn member(btf: &Btf, st: &btf_rs::Struct, name: &str) -> Option<(u32, Type)> {
    for m in &st.members {
        let here = m.bit_offset() / 8;
        let mname = btf.resolve_name(m).unwrap_or_default();
        if mname == name {
            return Some((here, btf.resolve_chained_type(m).ok()?));
        }
        if mname.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m) {
                if let Some((off, t)) = member(btf, &inner, name) {
                    return Some((here + off, t));
                }
            }
        }
    }
    None
}

/// `task_struct.thread.fsbase`: a user thread's fs base, which glibc on
/// x86-64 makes its `pthread_self()` (CPython before 3.11 knows its
/// threads by it); None without BTF.
pub fn fsbase_offset() -> Option<u32> {
    let btf = vmlinux().ok()?;
    let task = struct_named(&btf, "task_struct")?;
    let (thread_at, thread) = member(&btf, &task, "thread")?;
    let Type::Struct(thread) = thread else {
        return None;
    };
    Some(thread_at + member(&btf, &thread, "fsbase")?.0)
}

/// Reads [`UretprobeOffsets`] from the kernel's BTF.
pub fn uretprobe_offsets() -> Result<UretprobeOffsets> {
    let fail = |why: &str| {
        Error::Load(format!(
            "reading the uprobe structures from {VMLINUX}: {why}"
        ))
    };
    let btf = vmlinux().map_err(|e| fail(&e))?;
    let st =
        |name: &str| struct_named(&btf, name).ok_or_else(|| fail(&format!("no struct {name}")));
    let off = |s: &btf_rs::Struct, name: &str| {
        member(&btf, s, name)
            .map(|(o, _)| o)
            .ok_or_else(|| fail(&format!("no member {name}")))
    };
    let (task, utask, ri, mm, xol) = (
        st("task_struct")?,
        st("uprobe_task")?,
        st("return_instance")?,
        st("mm_struct")?,
        st("xol_area")?,
    );
    let (state_at, state) =
        member(&btf, &mm, "uprobes_state").ok_or_else(|| fail("no member uprobes_state"))?;
    let Type::Struct(state) = state else {
        return Err(fail("uprobes_state is not a struct"));
    };
    Ok(UretprobeOffsets {
        task_utask: off(&task, "utask")?,
        utask_return_instances: off(&utask, "return_instances")?,
        ri_orig_ret_vaddr: off(&ri, "orig_ret_vaddr")?,
        ri_chained: off(&ri, "chained")?,
        ri_next: off(&ri, "next")?,
        task_mm: off(&task, "mm")?,
        mm_xol_area: state_at + off(&state, "xol_area")?,
        xol_vaddr: off(&xol, "vaddr")?,
        utask_vaddr: off(&utask, "vaddr")?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn offsets_of_this_kernel_are_distinct_and_ordered() {
        // Only where the kernel has BTF (every CI machine does).
        let Ok(o) = super::task_offsets() else {
            eprintln!("skipped: this kernel has no BTF");
            return;
        };
        assert_eq!(o.tgid, o.pid + 4, "pid and tgid are adjacent pid_t");
        assert!(o.exit_code > 0);
    }

    #[test]
    fn uretprobe_offsets_of_this_kernel_are_found() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skipped: this kernel has no BTF");
            return;
        }
        let o = super::uretprobe_offsets().expect("the uprobe structures in the kernel's BTF");
        assert!(
            o.task_utask > 0 && o.task_mm > 0 && o.mm_xol_area > 0,
            "{o:?}"
        );
        assert_ne!(o.ri_next, o.ri_orig_ret_vaddr);
    }

    #[test]
    fn fsbase_offset_of_this_kernel_is_inside_task_struct() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skipped: this kernel has no BTF");
            return;
        }
        let fs = super::fsbase_offset().expect("task_struct.thread.fsbase");
        let o = super::task_offsets().expect("task_struct");
        // `thread` is the last member but one of task_struct, far past pid.
        assert!(fs > o.pid && fs.is_multiple_of(8), "{fs} {o:?}");
    }

    #[test]
    fn signal_live_offsets_of_this_kernel_are_found() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skipped: this kernel has no BTF");
            return;
        }
        let [signal, live] =
            super::signal_live_offsets().expect("task_struct.signal, signal_struct.live");
        assert!(signal > 0 && live > 0, "{signal} {live}");
    }
}
