//! Nesting and overlap, derived from the intervals observed in each run.
//!
//! A stage's parent in a run is the smallest interval that contains it (of
//! equal intervals, the one opened first); across runs, the most frequent
//! parent. Two intervals that cross (one starts inside the other and ends
//! after it) are counted as an overlap.
use std::collections::{BTreeMap, HashMap};

use super::{
    run::{ActiveRun, Occ},
    Interval, Overlap, ResolvedStage, StageResult, StagesResult,
};

/// A stage instance: (stage index, occurrence within the run).
type Key = (usize, u32);

/// Fills `res.stages` and `res.overlaps` from the complete `runs` of the
/// scenario rooted at `stages[root]`.
pub(super) fn derive(
    stages: &[ResolvedStage],
    root: usize,
    runs: &[ActiveRun],
    res: &mut StagesResult,
) {
    // Instances: (stage, occurrence) seen in any run; the root first.
    let mut keys: Vec<(usize, u32)> = runs
        .iter()
        .flat_map(|r| r.occs.iter().map(|o| (o.stage, o.occ)))
        .collect();
    keys.sort_unstable_by_key(|&(s, o)| (s != root, s, o));
    keys.dedup();
    let index: HashMap<(usize, u32), usize> =
        keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let mut per_run = vec![vec![None; runs.len()]; keys.len()];
    let mut votes: Vec<BTreeMap<usize, u64>> = vec![BTreeMap::new(); keys.len()];
    let mut overlaps: BTreeMap<(Key, Key), u64> = BTreeMap::new();
    for (r, run) in runs.iter().enumerate() {
        for x in &run.occs {
            per_run[index[&(x.stage, x.occ)]][r] = Some(x.iv);
            if x.stage == root {
                continue;
            }
            // Smallest containing interval; of equal ones, the earlier opened.
            let contains = |c: &&Occ| {
                c.seq != x.seq
                    && c.iv.start_ns <= x.iv.start_ns
                    && x.iv.end_ns <= c.iv.end_ns
                    && (c.iv != x.iv || c.seq < x.seq)
            };
            // The root (index 0) unless timestamps ran backwards.
            let parent = run
                .occs
                .iter()
                .filter(contains)
                .min_by_key(|c| (c.iv.duration_ns(), u32::MAX - c.seq))
                .map_or(0, |p| index[&(p.stage, p.occ)]);
            *votes[index[&(x.stage, x.occ)]].entry(parent).or_default() += 1;
            for y in &run.occs {
                let (a, b) = (y.iv, x.iv);
                if a.start_ns < b.start_ns && b.start_ns < a.end_ns && a.end_ns < b.end_ns {
                    *overlaps
                        .entry(((x.stage, x.occ), (y.stage, y.occ)))
                        .or_default() += 1;
                }
            }
        }
        for &k in &run.abandoned {
            *overlaps.entry((k, (root, 0))).or_default() += 1;
        }
    }
    if keys.is_empty() {
        return;
    }
    // Most frequent parent (ties: the first in instance order); break
    // any cycle that inconsistent runs could vote in by using the root.
    let mut parent: Vec<Option<usize>> = votes
        .iter()
        .map(|v| {
            v.iter()
                .max_by_key(|(&p, &n)| (n, usize::MAX - p))
                .map(|(&p, _)| p)
        })
        .collect();
    for i in 1..keys.len() {
        let (mut p, mut steps) = (parent[i], 0);
        while let Some(q) = p {
            steps += 1;
            if q == i || steps > keys.len() {
                parent[i] = Some(0);
                break;
            }
            p = parent[q];
        }
    }
    // Names: `Stage #k` when a stage ran more than once in some run.
    let mut most: HashMap<usize, u32> = HashMap::new();
    for run in runs {
        for (s, &c) in run.counts.iter().enumerate() {
            let m = most.entry(s).or_default();
            *m = (*m).max(c);
        }
    }
    let name = |(s, o): (usize, u32)| {
        let base = &stages[s].name;
        if most.get(&s).copied().unwrap_or(0) > 1 {
            format!("{base} #{}", o + 1)
        } else {
            base.clone()
        }
    };
    // Depth-first from the root, children by mean start, longer first.
    let mean = |v: &[Option<Interval>], f: fn(&Interval) -> u64| {
        let xs: Vec<u64> = v.iter().flatten().map(f).collect();
        xs.iter().map(|&x| x as u128).sum::<u128>() / xs.len().max(1) as u128
    };
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); keys.len()];
    for i in 1..keys.len() {
        children[parent[i].unwrap_or(0)].push(i);
    }
    for c in &mut children {
        c.sort_by_key(|&i| {
            let e = mean(&per_run[i], |iv| iv.end_ns);
            (mean(&per_run[i], |iv| iv.start_ns), u128::MAX - e, i)
        });
    }
    let mut stack = vec![(0usize, 0usize, None::<usize>)];
    while let Some((i, depth, par)) = stack.pop() {
        let pos = res.stages.len();
        res.stages.push(StageResult {
            name: name(keys[i]),
            stage: stages[keys[i].0].name.clone(),
            occurrence: keys[i].1 + 1,
            parent: par,
            depth,
            per_run: std::mem::take(&mut per_run[i]),
        });
        for &c in children[i].iter().rev() {
            stack.push((c, depth + 1, Some(pos)));
        }
    }
    res.overlaps = overlaps
        .into_iter()
        .map(|((x, y), count)| Overlap {
            stage: name(x),
            starts_inside: name(y),
            count,
        })
        .collect();
}
