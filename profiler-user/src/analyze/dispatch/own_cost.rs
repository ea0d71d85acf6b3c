//! The probes' cost that the calibration cannot foresee, measured in a
//! dispatch itself: the time its thread spent in the kernel's uprobe
//! handling, from its samples' and blocked intervals' kernel stacks.
//!
//! A calibrated probe hit costs a few microseconds. While the overhead
//! governor (or the end of a session) detaches functions, the kernel
//! rewrites the target's code under its memory-map lock, and every hit
//! meanwhile takes the slow path: it waits for that lock
//! (`find_active_uprobe_rcu` → `down_read`), on a CPU or blocked. A GC
//! that hits a probe 10,000 times then ran 190 ms instead of a few: the
//! profiler made the dispatch slow by itself. What the samples and blocked
//! stacks show inside uprobe handling is the probes' cost, whatever the
//! calibration said; [`Dispatcher`](super::Dispatcher) takes out the larger
//! of the two before it judges a dispatch slow.

use super::Rec;
use crate::symbolize::Symbolizer;

/// What a dispatch's records show of the probes' own cost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// On-CPU time in uprobe handling that its samples there prove
    /// ([`proven_ns`]).
    pub on_cpu_ns: u64,
    /// Time blocked inside uprobe handling (waiting for a lock the
    /// kernel's probe registration holds).
    pub blocked_ns: u64,
}

/// A kernel frame of the kernel's uprobe handling: the breakpoint's trap
/// (`exc_int3`), the handler run on the way back to user mode, the trap
/// that ends the single-step of an instruction out of line (`exc_debug`),
/// the return probe's trampoline (a syscall from 6.11). A traced thread
/// takes neither trap but for a probe: a debugger's breakpoint or
/// single-step would stop it instead.
pub fn is_uprobe_frame(name: &str) -> bool {
    let name = name.strip_suffix("_[k]").unwrap_or(name);
    [
        "uprobe",
        "uretprobe",
        "handle_swbp",
        "exc_int3",
        "exc_debug",
    ]
    .iter()
    .any(|part| name.contains(part))
}

/// The kernel stack (innermost first) passes through uprobe handling: a
/// sample there is the probes' time, not the code's.
pub fn in_uprobe(symbolizer: &mut Symbolizer, kernel: &[u64]) -> bool {
    !kernel.is_empty()
        && symbolizer
            .kernel_stack(kernel)
            .iter()
            .any(|n| is_uprobe_frame(n))
}

/// The on-CPU time that `samples` samples in uprobe handling prove, one
/// standing for `period_ns`: two standard deviations below their count
/// (`n - 2√n` periods, none for up to 4). Hits of a few microseconds each
/// are caught by a sample now and then: one sample in a 100-ms dispatch
/// says only that a probe was hit about then, not that it took a whole
/// period, and taking a period out would make a dispatch shorter than the
/// code it ran. Many samples (the slow path while probes are detached)
/// are nearly all taken out.
pub fn proven_ns(samples: u64, period_ns: u64) -> u64 {
    let n = samples as f64;
    let proven = (n - 2.0 * n.sqrt()).max(0.0);
    (proven * period_ns as f64) as u64
}

/// Measures `recs`, one sample standing for `period_ns` (0: sampling off,
/// so no on-CPU figure). Names still being read leave the symbolizer's
/// `missed` flag set, as for any explanation.
pub fn measure(recs: &[Rec], symbolizer: &mut Symbolizer, period_ns: u64) -> Measured {
    let mut m = Measured::default();
    let mut samples = 0;
    let mut blocked_since = None;
    for r in recs {
        match r {
            Rec::Sample(_, _, kernel) if period_ns > 0 && in_uprobe(symbolizer, kernel) => {
                samples += 1;
            }
            Rec::Block(ts, _, kernel) => {
                blocked_since = in_uprobe(symbolizer, kernel).then_some(*ts);
            }
            Rec::Resume(ts) => {
                if let Some(since) = blocked_since.take() {
                    m.blocked_ns += ts.saturating_sub(since);
                }
            }
            _ => {}
        }
    }
    m.on_cpu_ns = proven_ns(samples, period_ns);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uprobe_handling_frames_are_told_from_others() {
        for n in [
            "uprobe_notify_resume_[k]",
            "find_active_uprobe_rcu_[k]",
            "handle_swbp_[k]",
            "asm_exc_int3_[k]",
            "exc_debug_user_[k]",
            "__x64_sys_uretprobe_[k]",
        ] {
            assert!(is_uprobe_frame(n), "{n}");
        }
        for n in [
            "down_read_[k]",
            "do_syscall_64_[k]",
            "ep_poll_[k]",
            "exc_page_fault_[k]",
        ] {
            assert!(!is_uprobe_frame(n), "{n}");
        }
    }

    #[test]
    fn a_few_samples_prove_nothing_and_many_nearly_all() {
        let ms = 1_000_000;
        assert_eq!(proven_ns(0, ms), 0);
        // One sample in a probe hit of a few µs: no millisecond taken out.
        assert_eq!(proven_ns(1, ms), 0);
        assert_eq!(proven_ns(4, ms), 0);
        assert_eq!(proven_ns(9, ms), 3 * ms);
        assert_eq!(proven_ns(100, ms), 80 * ms);
    }
}
