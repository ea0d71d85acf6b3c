//! Statistics over every dispatch, in constant memory: frame buckets
//! (Matrix's FrameTracer), a latency histogram for percentiles, and the ten
//! worst dispatches.
use std::{cmp::Reverse, collections::BinaryHeap};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Dispatches per jank bucket, by dropped frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Frames {
    /// Fewer than 3 dropped frames.
    pub best: u64,
    /// 3 or more.
    pub normal: u64,
    /// 9 or more.
    pub middle: u64,
    /// 24 or more.
    pub high: u64,
    /// 42 or more.
    pub frozen: u64,
}

impl Frames {
    /// Counts one dispatch that dropped `dropped` frames.
    pub fn add(&mut self, dropped: u64) {
        match dropped {
            42.. => self.frozen += 1,
            24.. => self.high += 1,
            9.. => self.middle += 1,
            3.. => self.normal += 1,
            _ => self.best += 1,
        }
    }
}

/// One of the worst dispatches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Worst {
    /// Duration (first, so the heap orders by it).
    pub duration_ns: u64,
    /// Ordinal among all dispatches.
    pub index: u64,
    /// Start, since the session began.
    pub start_ns: u64,
}

/// Running statistics over all dispatches.
#[derive(Debug)]
pub struct Stats {
    /// How many dispatches completed.
    pub count: u64,
    /// Jank buckets.
    pub frames: Frames,
    hist: Histogram<u64>,
    worst: BinaryHeap<Reverse<Worst>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            count: 0,
            frames: Frames::default(),
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
            worst: BinaryHeap::new(),
        }
    }
}

impl Stats {
    /// Records one completed dispatch.
    pub fn add(&mut self, w: Worst, frame_interval_ns: u64) {
        self.count += 1;
        self.frames.add(w.duration_ns / frame_interval_ns.max(1));
        self.hist.saturating_record(w.duration_ns.max(1));
        self.worst.push(Reverse(w));
        if self.worst.len() > 10 {
            self.worst.pop();
        }
    }

    /// The `q` quantile (0..=1) of dispatch durations.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.hist.value_at_quantile(q)
        }
    }

    /// The ten worst dispatches, longest first.
    pub fn worst(&self) -> Vec<Worst> {
        let mut v: Vec<Worst> = self.worst.iter().map(|r| r.0.clone()).collect();
        v.sort_by(|a, b| b.cmp(a));
        v
    }
}

/// The `q` quantile of a small sample, by nearest rank.
pub fn quantile_of(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_matrix() {
        let mut f = Frames::default();
        for d in [0, 2, 3, 8, 9, 23, 24, 41, 42, 100] {
            f.add(d);
        }
        assert_eq!(
            f,
            Frames {
                best: 2,
                normal: 2,
                middle: 2,
                high: 2,
                frozen: 2
            }
        );
    }

    #[test]
    fn percentiles_and_worst() {
        let mut s = Stats::default();
        for i in 1..=1000u64 {
            s.add(
                Worst {
                    duration_ns: i * 1000,
                    index: i,
                    start_ns: 0,
                },
                16_666_667,
            );
        }
        let p50 = s.quantile(0.5);
        assert!((499_000..=501_000).contains(&p50), "{p50}");
        let worst = s.worst();
        assert_eq!(worst.len(), 10);
        assert_eq!(worst[0].index, 1000);
        assert_eq!(worst[9].index, 991);
        assert_eq!(quantile_of(&[5, 1, 3, 2, 4], 0.95), 5);
        assert_eq!(quantile_of(&[5, 1, 3, 2, 4], 0.5), 3);
    }
}
