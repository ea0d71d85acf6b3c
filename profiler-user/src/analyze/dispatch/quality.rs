//! How good the in-dispatch sampler's stacks are: the share that reached
//! the outermost frame, and why the others' walks ended. The same figures
//! as cpu.txt's, for the samples taken while a dispatch was open.
use std::collections::BTreeMap;

use crate::analyze::cpu_profile::{end_reason, is_complete};

/// Counts over every in-dispatch sample (slow dispatches or not).
#[derive(Debug, Clone, Default)]
pub struct SampleQuality {
    /// Samples of the watched thread taken inside a dispatch.
    pub samples: u64,
    /// Of those, stacks that reached the outermost frame.
    pub complete: u64,
    /// Of those, samples without any user frame.
    pub no_user_stack: u64,
    /// Why the table walks ended, in words, with their counts.
    pub ends: BTreeMap<&'static str, u64>,
    /// Of those, samples that carry Python frames.
    pub python: u64,
    /// Of those, samples that carry JavaScript frames (V8's, by name).
    pub javascript: u64,
}

impl SampleQuality {
    /// Counts one sample: `end` is the walk's `unwind_end` reason (0 for a
    /// frame-pointer walk) and `outermost` the name of its outermost frame.
    pub fn add(&mut self, frames: usize, end: u32, outermost: Option<&str>) {
        self.samples += 1;
        if end != 0 {
            *self.ends.entry(end_reason(end)).or_default() += 1;
        }
        if frames == 0 {
            self.no_user_stack += 1;
        } else if is_complete(end, outermost) {
            self.complete += 1;
        }
    }

    /// Share (0..=1) of samples with complete stacks.
    pub fn complete_share(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.complete as f64 / self.samples as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::unwind_end;

    #[test]
    fn complete_by_cfi_or_by_a_known_root() {
        let mut q = SampleQuality::default();
        q.add(5, unwind_end::ROOT, Some("Py_RunMain"));
        q.add(5, unwind_end::DEPTH, Some("deep"));
        q.add(3, 0, Some("_start"));
        q.add(0, unwind_end::READ_FAULT, None);
        assert_eq!((q.samples, q.complete, q.no_user_stack), (4, 2, 1));
        assert_eq!(q.ends["depth limit (128 frames)"], 1);
        assert!((q.complete_share() - 0.5).abs() < 1e-9);
    }
}
