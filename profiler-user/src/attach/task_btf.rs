//! Where the kernel keeps a task's `pid`, `tgid` and `exit_code`: byte
//! offsets in `struct task_struct`, read from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`) with `btf-rs`. The process tracepoints
//! (`sched_process_fork`, `sched_process_exit`) read those fields with
//! them, since the eBPF programs have no CO-RE relocations.
use btf_rs::{Backend, Btf, Type};

use crate::{Error, Result};

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
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    // Mapped and read on demand: parsing all of it up front takes about a
    // second, which every `record` would pay.
    let btf = Btf::from_file_with_backend(VMLINUX, Backend::Mmap)
        .or_else(|_| Btf::from_file(VMLINUX))
        .map_err(|e| fail(e.to_string()))?;
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
}
