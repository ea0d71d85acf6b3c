//! The running kernel: its release, the oldest one the programs load on,
//! and what a user sees when the kernel refuses a program: one line with
//! the verifier's reason, then its log's last lines.
//!
//! What the profiler uses, and the release that added it (KERNELS.md has
//! the table and what each missing one costs): the BPF ring buffer (5.8),
//! `bpf_get_attach_cookie` for uprobes (5.15), `bpf_loop` (5.17),
//! uprobe_multi links (6.6, their PID filter fixed in 6.10), the uretprobe
//! syscall (6.11) and 5-byte-nop uprobes turned into calls (6.18). The
//! last three only change costs, which the calibration measures.
use std::path::Path;

use crate::{Error, Result};

/// The oldest kernel the programs load on: `bpf_loop` came in 5.17.
pub const OLDEST: (u32, u32) = (5, 17);

/// uprobe_multi links appeared in 6.6, but filtered by thread ID until 6.10
/// (a process's other threads' hits were dropped).
pub const UPROBE_MULTI: (u32, u32) = (6, 10);

pub use crate::linux::{at_least, release, version_of};

/// Whether probes are attached by uprobe_multi links: this kernel has
/// them ([`UPROBE_MULTI`]), and `PROFILER_PER_PROBE=1` does not ask for the
/// older kernels' path (one perf event a probe), to compare the two.
pub fn uprobe_multi() -> bool {
    at_least(UPROBE_MULTI) && std::env::var_os("PROFILER_PER_PROBE").is_none_or(|v| v != "1")
}

/// Fails with one line when the programs cannot load on this kernel at
/// all: no BTF, or older than [`OLDEST`].
pub fn require() -> Result<()> {
    require_of(&release(), Path::new("/sys/kernel/btf/vmlinux").exists())
}

/// [`require`] for kernel `rel`, with or without BTF.
fn require_of(rel: &str, btf: bool) -> Result<()> {
    if !btf {
        return Err(Error::Kernel(format!(
            "this kernel (Linux {rel}) has no BTF (/sys/kernel/btf/vmlinux): the profiler needs a kernel built with CONFIG_DEBUG_INFO_BTF, as Debian's, Ubuntu's, Fedora's and RHEL's are"
        )));
    }
    if let Some(v) = version_of(rel).filter(|v| *v < OLDEST) {
        return Err(Error::Kernel(format!(
            "this kernel is Linux {}.{} ({rel}): the profiler needs Linux {}.{} or later (its programs use bpf_loop); `profiler check` lists what this kernel has",
            v.0, v.1, OLDEST.0, OLDEST.1
        )));
    }
    Ok(())
}

/// Set to `full`, a refused program's error carries the verifier's whole
/// log instead of its last [`LOG_TAIL`] lines.
pub const VERIFIER_LOG_ENV: &str = "PROFILER_VERIFIER_LOG";

/// Lines of the verifier's log a refusal shows by default.
pub const LOG_TAIL: usize = 20;

/// The error for program `name` refused by the verifier (`why`: the
/// system call's error; `log`: the verifier's log): a first line naming
/// the program and the verifier's reason, then the log's last
/// [`LOG_TAIL`] lines (all of it with `PROFILER_VERIFIER_LOG=full`), each
/// indented under `verifier:`.
pub fn refused(name: &str, why: &str, log: &str) -> Error {
    let full = std::env::var(VERIFIER_LOG_ENV).is_ok_and(|v| v == "full");
    Error::Kernel(refusal_text(&release(), name, why, log, full))
}

/// The refusal's text ([`refused`]), for kernel release `rel`.
fn refusal_text(rel: &str, name: &str, why: &str, log: &str, full: bool) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    let reason = verifier_reason(&lines);
    let why = match reason {
        Some(r) => format!("{why}: {r}"),
        None => why.to_string(),
    };
    let mut text = format!(
        "this kernel (Linux {rel}) refused the eBPF program {name} ({why}): a profiler defect on this kernel; "
    );
    let skip = if full {
        0
    } else {
        lines.len().saturating_sub(LOG_TAIL)
    };
    if lines.is_empty() {
        text.push_str("the verifier gave no log; `profiler check --verbose` tries again");
        return text;
    }
    if skip == 0 {
        text.push_str("the verifier's log follows, to report it with");
    } else {
        text.push_str(&format!(
            "the last {} of the verifier's {} log lines follow (all of them with {VERIFIER_LOG_ENV}=full, or `profiler check --verbose`), to report it with",
            lines.len() - skip,
            lines.len()
        ));
    }
    for l in &lines[skip..] {
        text.push_str("\n  verifier: ");
        text.push_str(l);
    }
    text
}

/// A program that did not load: a verifier refusal is [`refused`], with
/// its log's tail; any other failure one line.
pub fn load_error(name: &str, e: aya::programs::ProgramError) -> Error {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => refused(name, &io_error.to_string(), &verifier_log.to_string()),
        other => Error::Load(format!("{name}: {}", crate::error::chain(&other))),
    }
}

/// The verifier's own reason in its log: the last line before the
/// statistics it ends with.
fn verifier_reason<'a>(lines: &[&'a str]) -> Option<&'a str> {
    lines.iter().rev().copied().find(|l| {
        !(l.starts_with("processed ")
            || l.starts_with("verification time ")
            || l.starts_with("stack depth ")
            || l.starts_with("-- "))
    })
}

/// `/sys/kernel/rcu_expedited`: 1 makes the kernel's RCU grace periods
/// expedited ones (microseconds instead of milliseconds), system-wide.
const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

/// Where a profiler that set [`RCU_EXPEDITED`] to 1 writes its pid, until it
/// sets it back.
const RCU_MARK: &str = "/run/profiler-rcu-expedited";

/// Expedited RCU grace periods while it lives, where they were not
/// already (`/sys/kernel/rcu_expedited` set to 1, then back to 0).
///
/// Closing a uprobe attached as its own perf event (kernels without
/// uprobe_multi links, before 6.10 here) waits for an RCU grace period
/// under the kernel's `event_mutex` (`perf_trace_event_unreg`), one probe
/// after the other. Expedited, a grace period takes microseconds instead
/// of milliseconds on hardware; under emulation stopping 640 probes in
/// the 6.1 VM went from 61.8 s to 27.3 s. (On 6.18 something this does
/// not expedite dominates, an RCU-tasks-trace grace period as far as we
/// can tell: 67 ms a probe, with `PROFILER_PER_PROBE=1`; uprobe_multi
/// links are used there.) The price is an interrupt to each busy CPU per
/// grace period, while the detach lasts. The setting is restored when the
/// guard drops, also on Ctrl-C and SIGTERM. A profiler killed by SIGKILL
/// meanwhile leaves it 1, and its pid in [`RCU_MARK`]: the next
/// `profiler record` sets it back ([`restore_left_expedited`]).
pub struct ExpeditedRcu {
    /// The setting was changed, so it is restored.
    set: bool,
}

impl ExpeditedRcu {
    /// Detaching at least this many per-probe links asks for the guard.
    pub const FROM_LINKS: usize = 16;

    /// Expedites grace periods if they are not already (unreadable or
    /// read-only: nothing changes, and the detach is only slower).
    pub fn begin() -> Self {
        let set = std::fs::read_to_string(RCU_EXPEDITED).is_ok_and(|v| v.trim() == "0")
            && std::fs::write(RCU_EXPEDITED, "1").is_ok();
        if set {
            let _ = std::fs::write(RCU_MARK, format!("{}\n", std::process::id()));
        }
        ExpeditedRcu { set }
    }
}

impl Drop for ExpeditedRcu {
    fn drop(&mut self) {
        if self.set {
            let _ = std::fs::write(RCU_EXPEDITED, "0");
            let _ = std::fs::remove_file(RCU_MARK);
        }
    }
}

/// Sets [`RCU_EXPEDITED`] back to 0 if a profiler killed while it detached
/// probes left it 1, and says so in one line on stderr.
pub fn restore_left_expedited() {
    let own = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let alive =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == own);
    if let Some(line) = restore_left(Path::new(RCU_EXPEDITED), Path::new(RCU_MARK), alive) {
        eprintln!("profiler: {line}");
    }
}

/// The mark at `mark` names a profiler that set `setting` to 1: if that
/// one is gone (`alive` says whether a pid is a running profiler), the
/// setting is set back to 0 and the mark removed. What was done, in words.
fn restore_left(setting: &Path, mark: &Path, alive: impl Fn(u32) -> bool) -> Option<String> {
    let pid: u32 = std::fs::read_to_string(mark).ok()?.trim().parse().ok()?;
    if alive(pid) {
        return None;
    }
    let _ = std::fs::remove_file(mark);
    if std::fs::read_to_string(setting).ok()?.trim() != "1" {
        return None;
    }
    match std::fs::write(setting, "0") {
        Ok(()) => Some(format!(
            "a profiler (pid {pid}) was killed while it detached probes and left {} at 1 (expedited RCU grace periods, an interrupt to each busy CPU per grace period): set back to 0",
            setting.display()
        )),
        Err(e) => Some(format!(
            "a profiler (pid {pid}) was killed while it detached probes and left {} at 1; setting it back failed ({e}): `echo 0 > {}` does",
            setting.display(),
            setting.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "func#0 @0\n0: R1=ctx() R10=fp0\n0: (61) r0 = *(u32 *)(r1 +16384)\ninvalid bpf_context access off=16384 size=4\nprocessed 1 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0\n";

    #[test]
    fn a_refusal_names_the_verifiers_reason_and_shows_its_log() {
        let t = refusal_text(
            "6.1.0-57-amd64",
            "prof_x",
            "Permission denied (os error 13)",
            LOG,
            false,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("this kernel (Linux 6.1.0-57-amd64) refused the eBPF program prof_x (Permission denied (os error 13): invalid bpf_context access off=16384 size=4): "),
            "{t}"
        );
        assert!(
            lines[0].ends_with("the verifier's log follows, to report it with"),
            "{t}"
        );
        assert_eq!(lines.len(), 6, "{t}");
        assert_eq!(
            lines[4],
            "  verifier: invalid bpf_context access off=16384 size=4"
        );
    }

    #[test]
    fn a_long_log_shows_its_tail_unless_asked_for_all() {
        let log: String = (0..100).map(|i| format!("{i}: insn\n")).collect::<String>()
            + "R1 invalid mem access 'scalar'\nverification time 12 usec\nstack depth 8\nprocessed 100 insns\n";
        let t = refusal_text("6.1", "p", "Permission denied", &log, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1 + LOG_TAIL, "{t}");
        assert!(
            lines[0].contains("(Permission denied: R1 invalid mem access 'scalar')"),
            "{t}"
        );
        assert!(lines[0].contains("the last 20 of the verifier's 104 log lines follow (all of them with PROFILER_VERIFIER_LOG=full"), "{t}");
        assert_eq!(lines[LOG_TAIL], "  verifier: processed 100 insns");
        let all = refusal_text("6.1", "p", "Permission denied", &log, true);
        assert_eq!(all.lines().count(), 1 + 104, "{all}");
    }

    #[test]
    fn a_refusal_without_a_log_says_so() {
        let t = refusal_text("6.1", "p", "Permission denied", "", false);
        assert_eq!(t.lines().count(), 1, "{t}");
        assert!(
            t.ends_with("the verifier gave no log; `profiler check --verbose` tries again"),
            "{t}"
        );
    }

    #[test]
    fn a_setting_left_by_a_killed_profiler_is_set_back_once() {
        let dir = std::env::temp_dir().join(format!("rcu-mark-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (setting, mark) = (dir.join("rcu_expedited"), dir.join("mark"));
        // No mark: left alone (another tool, or the administrator, set it).
        std::fs::write(&setting, "1\n").unwrap();
        assert_eq!(restore_left(&setting, &mark, |_| false), None);
        assert_eq!(std::fs::read_to_string(&setting).unwrap(), "1\n");
        // The marking profiler still runs: left alone, mark kept.
        std::fs::write(&mark, "4242\n").unwrap();
        assert_eq!(restore_left(&setting, &mark, |p| p == 4242), None);
        assert!(mark.exists());
        // It is gone: set back, said once, mark removed.
        let line = restore_left(&setting, &mark, |_| false).unwrap();
        assert!(
            line.contains("pid 4242") && line.contains("set back to 0"),
            "{line}"
        );
        assert_eq!(std::fs::read_to_string(&setting).unwrap(), "0");
        assert!(!mark.exists());
        assert_eq!(restore_left(&setting, &mark, |_| false), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn versions_of_distribution_releases() {
        assert_eq!(version_of("6.1.0-50-amd64"), Some((6, 1)));
        assert_eq!(version_of("6.12.117+deb12-amd64"), Some((6, 12)));
        assert_eq!(version_of("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(version_of("5.14.0-427.13.1.el9_4.x86_64"), Some((5, 14)));
        assert_eq!(version_of("6.18"), Some((6, 18)));
        assert_eq!(version_of("weird"), None);
        assert!((5, 15) < OLDEST && (5, 17) >= OLDEST && (6, 1) >= OLDEST);
        assert!((6, 8) < UPROBE_MULTI && (6, 12) >= UPROBE_MULTI);
    }

    #[test]
    fn old_kernels_and_kernels_without_btf_get_one_line() {
        assert!(require_of("6.1.0-50-amd64", true).is_ok());
        assert!(require_of("5.17.0", true).is_ok());
        let old = require_of("5.15.0-91-generic", true)
            .unwrap_err()
            .to_string();
        assert_eq!(
            old,
            "this kernel is Linux 5.15 (5.15.0-91-generic): the profiler needs Linux 5.17 or later (its programs use bpf_loop); `profiler check` lists what this kernel has"
        );
        let no_btf = require_of("6.1.0-50-amd64", false).unwrap_err().to_string();
        assert!(
            no_btf.contains("has no BTF") && !no_btf.contains('\n'),
            "{no_btf}"
        );
    }
}
