//! The flight recorder of `profiler watch`: the watched thread's most
//! recent samples (time and user stack), kept for `--keep`, so that when a
//! stall is reported, what the thread did in the seconds before it is
//! already there. The in-dispatch sampler feeds it: it samples the thread
//! only while an iteration of its loop runs, so an idle thread costs
//! nothing here. Bounded in time and in count.
use std::collections::VecDeque;

/// Most frames kept of one sample's stack (the innermost).
const MAX_FRAMES: usize = 64;

/// The watched thread's recent samples.
#[derive(Debug)]
pub struct FlightRecorder {
    keep_ns: u64,
    max: usize,
    samples: VecDeque<(u64, Box<[u64]>)>,
}

impl FlightRecorder {
    /// Keeps the samples of the last `keep_ns`, at most `max` of them.
    pub fn new(keep_ns: u64, max: usize) -> Self {
        FlightRecorder {
            keep_ns,
            max: max.max(1),
            samples: VecDeque::new(),
        }
    }

    /// A sample at `ts_ns` (CLOCK_MONOTONIC) with its user stack,
    /// innermost first.
    pub fn record(&mut self, ts_ns: u64, user: &[u64]) {
        let horizon = ts_ns.saturating_sub(self.keep_ns);
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| *t < horizon || self.samples.len() >= self.max)
        {
            self.samples.pop_front();
        }
        self.samples
            .push_back((ts_ns, user[..user.len().min(MAX_FRAMES)].into()));
    }

    /// The samples taken in `[from_ns, to_ns)`, oldest first.
    pub fn between(&self, from_ns: u64, to_ns: u64) -> impl Iterator<Item = &(u64, Box<[u64]>)> {
        self.samples
            .iter()
            .filter(move |(t, _)| *t >= from_ns && *t < to_ns)
    }

    /// How long samples are kept, in ns.
    pub fn keep_ns(&self) -> u64 {
        self.keep_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_is_recent_and_no_more_than_its_cap() {
        let mut f = FlightRecorder::new(1_000, 3);
        for t in [0, 400, 800, 1_200] {
            f.record(t, &[t, 1, 2]);
        }
        // 0 is older than 1,200 - 1,000.
        let kept: Vec<u64> = f.between(0, u64::MAX).map(|(t, _)| *t).collect();
        assert_eq!(kept, [400, 800, 1_200]);
        f.record(1_300, &[9]);
        assert_eq!(f.between(0, u64::MAX).count(), 3, "the cap holds");
        let window: Vec<u64> = f.between(800, 1_300).map(|(t, _)| *t).collect();
        assert_eq!(window, [800, 1_200]);
        let long = vec![7u64; 200];
        f.record(1_400, &long);
        assert_eq!(f.between(1_400, 1_401).next().unwrap().1.len(), MAX_FRAMES);
    }
}
