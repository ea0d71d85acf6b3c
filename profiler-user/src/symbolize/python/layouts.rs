//! Where each CPython version keeps what the kernel walks and the namer
//! reads: a [`Layout`] per minor version ([`LAYOUTS`]), each checked
//! against that version's own headers (`offsets.c`, compiled by the test
//! `layouts_match_each_installed_cpythons_headers`).
//!
//! Before 3.11 ([`Layout::frame_objects`]) the fields hold their older
//! counterparts: the thread state's `thread_id` (`pthread_self()`) for
//! `native_thread_id`, `PyThreadState.frame` and `PyFrameObject`'s
//! `f_code`, `f_back`, `f_lasti` for the frame's fields, `co_name` for
//! `co_qualname` (there is none), and `co_lnotab` (3.8, 3.9) or 3.10's
//! own `co_linetable` for the line table.
use profiler_common::python::{PyProc, NONE, STYLE_INTERP, STYLE_LASTI_BYTES, STYLE_LASTI_UNITS};

/// Where one minor version keeps what the kernel and the namer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub minor: u32,
    pub runtime_interpreters_head: u32,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    /// `thread_id` before 3.11.
    pub tstate_native_thread_id: u32,
    /// `cframe` (3.11, 3.12), `current_frame` (3.13), or `frame`.
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`, or [`NONE`].
    pub cframe_current_frame: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instr: u32,
    /// [`NONE`] before 3.11.
    pub frame_owner: u32,
    /// [`NONE`] but in 3.11.
    pub frame_is_entry: u32,
    /// [`NONE`] before 3.11.
    pub code_adaptive: u32,
    pub code_filename: u32,
    /// `co_name` before 3.11.
    pub code_qualname: u32,
    /// `co_lnotab` before 3.10.
    pub code_linetable: u32,
    pub code_firstlineno: u32,
    /// `sizeof(PyASCIIObject)`: where an ASCII string's characters start.
    pub ascii_size: u32,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' start.
    pub compact_size: u32,
}

/// `PyASCIIObject.length`, `.state`, `PyVarObject.ob_size`, `PyObject.ob_type`
/// and `PyBytesObject.ob_sval`: the same in every version supported.
pub(super) const STR_LENGTH: u64 = 16;
pub(super) const STR_STATE: u64 = 32;
pub(super) const VAR_SIZE: u64 = 16;
pub(super) const OB_TYPE: u64 = 8;
pub(super) const BYTES_DATA: u64 = 32;

/// The versions whose frames are walked, checked against their headers.
pub const LAYOUTS: [Layout; 6] = [
    Layout {
        minor: 8,
        runtime_interpreters_head: 32,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: 176,
        tstate_frame: 24,
        cframe_current_frame: NONE,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: NONE,
        frame_is_entry: NONE,
        code_adaptive: NONE,
        code_filename: 104,
        code_qualname: 112,
        code_linetable: 120,
        code_firstlineno: 40,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        minor: 9,
        runtime_interpreters_head: 32,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: 176,
        tstate_frame: 24,
        cframe_current_frame: NONE,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: NONE,
        frame_is_entry: NONE,
        code_adaptive: NONE,
        code_filename: 104,
        code_qualname: 112,
        code_linetable: 120,
        code_firstlineno: 40,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        minor: 10,
        runtime_interpreters_head: 32,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: 176,
        tstate_frame: 24,
        cframe_current_frame: NONE,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 96,
        frame_owner: NONE,
        frame_is_entry: NONE,
        code_adaptive: NONE,
        code_filename: 104,
        code_qualname: 112,
        code_linetable: 120,
        code_firstlineno: 40,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        minor: 11,
        runtime_interpreters_head: 40,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_native_thread_id: 160,
        tstate_frame: 56,
        cframe_current_frame: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: 69,
        frame_is_entry: 68,
        code_adaptive: 184,
        code_filename: 112,
        code_qualname: 128,
        code_linetable: 136,
        code_firstlineno: 72,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        minor: 12,
        runtime_interpreters_head: 40,
        interp_threads_head: 72,
        tstate_next: 8,
        tstate_native_thread_id: 144,
        tstate_frame: 56,
        cframe_current_frame: 0,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: 70,
        frame_is_entry: NONE,
        code_adaptive: 192,
        code_filename: 112,
        code_qualname: 128,
        code_linetable: 136,
        code_firstlineno: 68,
        ascii_size: 40,
        compact_size: 56,
    },
    Layout {
        minor: 13,
        runtime_interpreters_head: 632,
        interp_threads_head: 7344,
        tstate_next: 8,
        tstate_native_thread_id: 160,
        tstate_frame: 72,
        cframe_current_frame: NONE,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: 70,
        frame_is_entry: NONE,
        code_adaptive: 200,
        code_filename: 112,
        code_qualname: 128,
        code_linetable: 136,
        code_firstlineno: 68,
        ascii_size: 40,
        compact_size: 56,
    },
];

/// The versions [`LAYOUTS`] covers, for messages.
pub const SUPPORTED: &str = "3.8 to 3.13";

/// The layout of CPython 3.`minor`.
pub fn layout(minor: u32) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.minor == minor)
}

impl Layout {
    /// True before 3.11: frames are `PyFrameObject`s, one to an
    /// evaluator call, and a thread state is found by `pthread_self()`.
    pub fn frame_objects(&self) -> bool {
        self.minor < 11
    }

    /// How the kernel walks this version's frames (`PyProc::style`).
    pub fn style(&self) -> u32 {
        match self.minor {
            ..=9 => STYLE_LASTI_BYTES,
            10 => STYLE_LASTI_UNITS,
            _ => STYLE_INTERP,
        }
    }
}

/// What the kernel needs for a process of `layout` whose `_PyRuntime` is at
/// `runtime`, on a kernel whose `task_struct.thread.fsbase` is at
/// `task_fsbase` ([`NONE`]: unknown).
pub fn proc_entry(layout: &Layout, runtime: u64, task_fsbase: u32) -> PyProc {
    PyProc {
        interp_head: runtime + u64::from(layout.runtime_interpreters_head),
        interp_threads: layout.interp_threads_head,
        tstate_next: layout.tstate_next,
        tstate_native_tid: layout.tstate_native_thread_id,
        tstate_frame: layout.tstate_frame,
        cframe_frame: layout.cframe_current_frame,
        frame_code: layout.frame_code,
        frame_previous: layout.frame_previous,
        frame_instr: layout.frame_instr,
        frame_owner: layout.frame_owner,
        frame_is_entry: layout.frame_is_entry,
        code_adaptive: layout.code_adaptive,
        style: layout.style(),
        task_fsbase,
        pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The include directories of the CPythons on this machine (Debian's,
    /// pyenv's) whose frames are walked.
    fn installed_headers() -> Vec<std::path::PathBuf> {
        let mut dirs: Vec<std::path::PathBuf> = (8..=13)
            .map(|m| format!("/usr/include/python3.{m}").into())
            .collect();
        let pyenv = std::env::var_os("PYENV_ROOT")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pyenv")));
        if let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
            for v in versions.flatten() {
                for m in 8..=13 {
                    dirs.push(v.path().join(format!("include/python3.{m}")));
                }
            }
        }
        dirs.retain(|d| d.join("internal/pycore_pystate.h").exists());
        dirs
    }

    /// Every offset of [`LAYOUTS`] (and the constants shared by all
    /// versions) against `offsetof` in each installed CPython's headers.
    #[test]
    fn layouts_match_each_installed_cpythons_headers() {
        let dirs = installed_headers();
        if dirs.is_empty() {
            eprintln!("SKIP layouts_match_each_installed_cpythons_headers: no CPython 3.8+ headers (apt-get install python3.11-dev)");
            return;
        }
        let tmp = std::env::temp_dir().join(format!("pyoffsets-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let src = tmp.join("offsets.c");
        std::fs::write(&src, include_str!("offsets.c")).unwrap();
        for dir in dirs {
            let exe = tmp.join("offsets");
            let cc = std::process::Command::new("gcc")
                .arg(format!("-I{}", dir.display()))
                .arg("-o")
                .arg(&exe)
                .arg(&src)
                .output()
                .expect("gcc");
            assert!(
                cc.status.success(),
                "{}: {}",
                dir.display(),
                String::from_utf8_lossy(&cc.stderr)
            );
            let out = std::process::Command::new(&exe)
                .output()
                .expect("run offsets");
            let got: HashMap<String, u32> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect();
            let l =
                layout(got["minor"]).unwrap_or_else(|| panic!("no layout for {}", dir.display()));
            let frame = got
                .get("tstate_cframe")
                .or(got.get("tstate_current_frame"))
                .or(got.get("tstate_frame"));
            let want = [
                (
                    "runtime_interpreters_head",
                    Some(l.runtime_interpreters_head),
                ),
                ("interp_threads_head", Some(l.interp_threads_head)),
                ("tstate_next", Some(l.tstate_next)),
                ("tstate_native_thread_id", Some(l.tstate_native_thread_id)),
                (
                    "cframe_current_frame",
                    (l.cframe_current_frame != NONE).then_some(l.cframe_current_frame),
                ),
                ("frame_code", Some(l.frame_code)),
                ("frame_previous", Some(l.frame_previous)),
                ("frame_instr", Some(l.frame_instr)),
                (
                    "frame_owner",
                    (l.frame_owner != NONE).then_some(l.frame_owner),
                ),
                (
                    "frame_is_entry",
                    (l.frame_is_entry != NONE).then_some(l.frame_is_entry),
                ),
                (
                    "code_adaptive",
                    (l.code_adaptive != NONE).then_some(l.code_adaptive),
                ),
                ("code_filename", Some(l.code_filename)),
                ("code_qualname", Some(l.code_qualname)),
                ("code_linetable", Some(l.code_linetable)),
                ("code_firstlineno", Some(l.code_firstlineno)),
                ("ascii_size", Some(l.ascii_size)),
                ("compact_size", Some(l.compact_size)),
                ("OB_TYPE", Some(OB_TYPE as u32)),
                ("STR_LENGTH", Some(STR_LENGTH as u32)),
                ("STR_STATE", Some(STR_STATE as u32)),
                ("BYTES_DATA", Some(BYTES_DATA as u32)),
                ("VAR_SIZE", Some(VAR_SIZE as u32)),
            ];
            assert_eq!(
                frame,
                Some(&l.tstate_frame),
                "{}: tstate_frame",
                dir.display()
            );
            for (name, value) in want {
                assert_eq!(got.get(name).copied(), value, "{}: {name}", dir.display());
            }
            eprintln!(
                "{}: 3.{} layout matches its headers",
                dir.display(),
                l.minor
            );
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
