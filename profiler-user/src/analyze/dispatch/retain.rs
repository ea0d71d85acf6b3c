//! What is kept of slow dispatches, in memory bounded for any session
//! length. Every slow dispatch updates its group's exact count, total and
//! maximum, and its durations: exact up to [`EXACT_DURATIONS`] per group,
//! then a histogram (2 significant digits) for the p95. In detail (tree,
//! verdict, stacks, wakers) are kept the [`KEEP_WORST`] longest of each
//! group and the [`KEEP_RECENT`] most recent; the others are counted
//! (`slow_dropped`) and handed to the timeline as they are let go, so
//! `trace.json` still has every one. Groups beyond [`MAX_GROUPS`] keys share
//! [`OTHER_GROUP`], counted in `groups_merged`.
use std::collections::VecDeque;

use hdrhistogram::Histogram;

use super::{
    explain, stats::quantile_of, tree::FlatNode, wakers, Dispatcher, Notice, Slow, Streamed,
};

/// Longest slow dispatches kept in detail per group.
pub const KEEP_WORST: usize = 10;
/// Most recent slow dispatches kept in detail, whatever their group.
pub const KEEP_RECENT: usize = 100;
/// Most groups; later keys are counted in [`OTHER_GROUP`].
pub const MAX_GROUPS: usize = 1000;
/// The group of the keys beyond [`MAX_GROUPS`].
pub const OTHER_GROUP: &str = "(other keys, beyond the first 1000 groups)";
/// Durations kept exactly per group; beyond, a histogram.
const EXACT_DURATIONS: usize = 1024;

/// A group's durations: exact count, total and maximum; the values
/// themselves exactly up to [`EXACT_DURATIONS`], then in a histogram.
#[derive(Debug, Clone, Default)]
pub struct Durations {
    count: u64,
    total_ns: u64,
    max_ns: u64,
    exact: Vec<u64>,
    hist: Option<Box<Histogram<u64>>>,
}

impl Durations {
    /// Adds one duration.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        if let Some(h) = &mut self.hist {
            h.saturating_record(ns.max(1));
            return;
        }
        self.exact.push(ns);
        if self.exact.len() > EXACT_DURATIONS {
            let mut h = Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds");
            for &v in &self.exact {
                h.saturating_record(v.max(1));
            }
            self.exact = Vec::new();
            self.hist = Some(Box::new(h));
        }
    }
    /// How many.
    pub fn count(&self) -> u64 {
        self.count
    }
    /// Their sum.
    pub fn total_ns(&self) -> u64 {
        self.total_ns
    }
    /// The longest.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }
    /// The 95th percentile: exact (nearest rank) while the values are
    /// kept, else from the histogram (within 1%, never above the maximum).
    pub fn p95_ns(&self) -> u64 {
        self.quantile_ns(0.95)
    }
    /// The `q` quantile (0 to 1), as [`Self::p95_ns`] is the 0.95th.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        match &self.hist {
            Some(h) => h.value_at_quantile(q).min(self.max_ns),
            None => quantile_of(&self.exact, q),
        }
    }
    /// Whether [`Self::p95_ns`] is exact.
    pub fn p95_exact(&self) -> bool {
        self.hist.is_none()
    }
}

/// Slow dispatches sharing a key.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// The key.
    pub key: String,
    /// Durations of its dispatches.
    pub durations: Durations,
    /// The longest kept in detail: (duration, index), longest first.
    worst: Vec<(u64, u64)>,
    /// Verdict of the worst instance.
    pub verdict: String,
    /// Trimmed tree of the worst instance.
    pub worst_tree: Vec<FlatNode>,
    /// Folded stacks of the worst instance (for its flame graph).
    pub worst_folded: Vec<String>,
    /// Who woke the worst instance.
    pub worst_wakers: Vec<wakers::Waker>,
    /// Who woke the loop out of its wait before the worst instance.
    pub worst_source: Option<wakers::Waker>,
}

impl Group {
    /// An empty group for `key`.
    pub fn new(key: String) -> Self {
        Group {
            key,
            ..Group::default()
        }
    }
    /// Dispatches in the group.
    pub fn count(&self) -> u64 {
        self.durations.count()
    }
    /// Summed duration.
    pub fn total_ns(&self) -> u64 {
        self.durations.total_ns()
    }
    /// Longest duration.
    pub fn max_ns(&self) -> u64 {
        self.durations.max_ns()
    }

    /// Takes `(duration, index)` among the longest if it is one; returns
    /// the instance it pushed out, if any.
    fn rank(&mut self, duration_ns: u64, index: u64) -> Option<u64> {
        let at = self.worst.partition_point(|&(d, _)| d >= duration_ns);
        if at >= KEEP_WORST {
            return Some(index);
        }
        self.worst.insert(at, (duration_ns, index));
        (self.worst.len() > KEEP_WORST).then(|| self.worst.pop().expect("non-empty").1)
    }

    fn is_worst(&self, index: u64) -> bool {
        self.worst.iter().any(|&(_, i)| i == index)
    }
}

/// The bookkeeping of what is kept in detail.
#[derive(Debug, Default)]
pub struct Kept {
    /// Indices of the most recent slow dispatches, oldest first.
    recent: VecDeque<u64>,
    /// Let go since the timeline last took them.
    evicted: Vec<Slow>,
}

impl Dispatcher {
    /// Counts a slow dispatch in its group, queues its notice, and keeps it
    /// in detail while it is among its group's longest or the most recent.
    pub(super) fn add_slow(&mut self, slow: explain::Explained) {
        let explain::Explained { slow, folded } = slow;
        if let Some(stream) = &mut self.streamed {
            stream.push(Streamed {
                slow: slow.clone(),
                folded: folded.clone(),
            });
        }
        // The wall time the user felt, as the threshold judged it; the
        // verdict says how much of it the probes took.
        self.notices.push(Notice::Slow {
            duration_ns: slow.duration_ns + slow.probe_ns,
            key: slow.key.clone(),
            verdict: slow.verdict.clone(),
        });
        let key = if self.groups.contains_key(&slow.key) || self.groups.len() < MAX_GROUPS {
            slow.key.clone()
        } else {
            self.groups_merged += 1;
            OTHER_GROUP.to_string()
        };
        let g = self
            .groups
            .entry(key.clone())
            .or_insert_with(|| Group::new(key));
        if slow.duration_ns >= g.max_ns() {
            g.verdict = slow.verdict.clone();
            g.worst_tree = slow.tree.clone();
            g.worst_folded = folded;
            g.worst_wakers = slow.wakers.clone();
            g.worst_source = slow.source.clone();
        }
        g.durations.add(slow.duration_ns);
        let pushed_out = g.rank(slow.duration_ns, slow.index);
        self.kept.recent.push_back(slow.index);
        let aged = (self.kept.recent.len() > KEEP_RECENT)
            .then(|| self.kept.recent.pop_front())
            .flatten();
        self.slow.push(slow);
        for index in [pushed_out, aged].into_iter().flatten() {
            self.let_go(index);
        }
    }

    /// Drops slow dispatch `index` from detail unless its group's longest
    /// or the most recent still hold it.
    fn let_go(&mut self, index: u64) {
        let Ok(at) = self.slow.binary_search_by_key(&index, |s| s.index) else {
            return;
        };
        let key = &self.slow[at].key;
        let group = self
            .groups
            .get(key)
            .or_else(|| self.groups.get(OTHER_GROUP));
        if group.is_some_and(|g| g.is_worst(index)) || self.kept.recent.contains(&index) {
            return;
        }
        let s = self.slow.remove(at);
        self.slow_dropped += 1;
        self.kept.evicted.push(s);
    }

    /// The slow dispatches explained since the last call, oldest first,
    /// with their folded trees ([`Self::stream`] turns this on).
    pub fn take_streamed(&mut self) -> Vec<Streamed> {
        self.streamed
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The slow dispatches let go from detail since the last call, for the
    /// timeline to write now (it writes the kept ones at the end).
    pub fn take_evicted(&mut self) -> Vec<Slow> {
        std::mem::take(&mut self.kept.evicted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::dispatch::{sched::Split, Config};

    fn dispatcher() -> Dispatcher {
        let cfg = Config {
            tid: 1,
            thread_name: "main".into(),
            rule: "r".into(),
            threshold_ns: 1,
            hang_ns: u64::MAX,
            frame_interval_ns: 16,
            full_tree: false,
            sample_period_ns: 0,
            wakers: true,
            wait_loop: false,
            preset: false,
        };
        Dispatcher::new(cfg, 0, vec!["run".into()], vec![true], 0)
    }

    fn slow(index: u64, key: &str, duration_ns: u64) -> explain::Explained {
        explain::Explained {
            slow: Slow {
                index,
                start_ns: index * 1000,
                duration_ns,
                split: Split::default(),
                dropped_frames: 0,
                key: key.into(),
                verdict: format!("v{index}"),
                samples: 0,
                tree: Vec::new(),
                blocking_stacks: Vec::new(),
                truncated: false,
                wakers: Vec::new(),
                source: None,
                detached_frames: 0,
                probe_ns: 0,
                probes_mainly: false,
            },
            folded: Vec::new(),
        }
    }

    /// 300,000 slow dispatches in 3 groups: detail stays at the longest
    /// of each group plus the most recent, every other one is counted and
    /// handed to the timeline, and counts, totals, maxima and p95 stay
    /// right.
    #[test]
    fn detail_and_durations_stay_bounded() {
        let mut d = dispatcher();
        let n = 300_000u64;
        let mut evicted = 0u64;
        let mut total = [0u64; 3];
        for i in 0..n {
            let g = (i % 3) as usize;
            // Durations 1..=1000 µs, cycling; the longest of group 0 is
            // its first 1000 µs.
            let dur = 1_000 * (1 + (i * 7919) % 1000);
            total[g] += dur;
            d.add_slow(slow(i, ["a", "b", "c"][g], dur));
            evicted += d.take_evicted().len() as u64;
            assert!(d.slow.len() <= 3 * KEEP_WORST + KEEP_RECENT);
        }
        assert_eq!(evicted, d.slow_dropped);
        assert_eq!(d.slow.len() as u64 + d.slow_dropped, n);
        assert!(d.slow.windows(2).all(|w| w[0].index < w[1].index));
        // The most recent are all kept.
        let last: Vec<u64> = d
            .slow
            .iter()
            .rev()
            .take(KEEP_RECENT)
            .map(|s| s.index)
            .collect();
        assert_eq!(last, (n - KEEP_RECENT as u64..n).rev().collect::<Vec<_>>());
        for (g, key) in ["a", "b", "c"].into_iter().enumerate() {
            let grp = &d.groups[key];
            assert_eq!(grp.count(), n / 3 + u64::from((g as u64) < n % 3));
            assert_eq!(grp.total_ns(), total[g]);
            assert_eq!(grp.max_ns(), 1_000_000);
            assert!(!grp.durations.p95_exact());
            let p95 = grp.durations.p95_ns() as f64;
            assert!((p95 - 950_000.0).abs() <= 0.01 * 950_000.0, "{p95}");
            // Its 10 longest are kept in detail.
            let kept = d
                .slow
                .iter()
                .filter(|s| s.key == key && s.duration_ns == 1_000_000)
                .count();
            assert_eq!(kept, KEEP_WORST);
            assert!(grp.durations.exact.is_empty());
        }
    }

    /// Under the limits nothing is dropped and the p95 is exact.
    #[test]
    fn small_sessions_keep_everything() {
        let mut d = dispatcher();
        for i in 0..50 {
            d.add_slow(slow(i, "a", 1_000 + i));
        }
        assert_eq!(d.slow.len(), 50);
        assert_eq!(d.slow_dropped, 0);
        assert!(d.take_evicted().is_empty());
        let g = &d.groups["a"];
        assert!(g.durations.p95_exact());
        assert_eq!(g.durations.p95_ns(), 1_047);
    }

    /// Keys beyond the limit share one group, counted.
    #[test]
    fn groups_are_bounded() {
        let mut d = dispatcher();
        for i in 0..(MAX_GROUPS as u64 + 5) {
            d.add_slow(slow(i, &format!("k{i}"), 1_000));
        }
        assert_eq!(d.groups.len(), MAX_GROUPS + 1);
        assert_eq!(d.groups_merged, 5);
        assert_eq!(d.groups[OTHER_GROUP].count(), 5);
    }
}
