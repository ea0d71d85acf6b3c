//! Tables for what runs: the binaries samples land in ([`Tables::note_samples`])
//! get tables first, and room is made for those the budget left without
//! one ([`Tables::rebalance`]); what the reports say of it
//! ([`Tables::starved_note`], [`Tables::placement`]).
use std::collections::{HashMap, HashSet};

use super::{CacheKey, Tables};

impl Tables {
    /// True the first time a stack hash is seen: its samples are to be
    /// told of ([`Tables::note_samples`]).
    pub fn first_time(&mut self, hash: u64) -> bool {
        self.stacks_seen.insert(hash)
    }

    /// Notes where samples of `pid` landed (`pcs`: a stack, innermost
    /// first): their binaries get tables first from now on. Returns true
    /// when one of them is a binary the budget left without a table
    /// (then [`Tables::rebalance`] may make room for it).
    pub fn note_samples(&mut self, pid: u32, pcs: &[u64]) -> bool {
        let Some(e) = self.per_pid.get(&pid) else {
            return false;
        };
        let mut starved = false;
        for (i, &pc) in pcs.iter().enumerate() {
            if profiler_common::python::is_frame(pc) {
                continue;
            }
            let pc = if i == 0 { pc } else { pc.wrapping_sub(1) };
            let at = e.maps.partition_point(|m| m.0 <= pc);
            let Some((_, end, key, _)) = at.checked_sub(1).and_then(|i| e.maps.get(i)) else {
                continue;
            };
            if pc >= *end || self.hot.contains(key) {
                continue;
            }
            self.hot.insert(key.clone());
            self.dropped.remove(key);
            starved |= self.starved.contains_key(key);
        }
        starved
    }

    /// Makes room for the binaries samples landed in that the budget left
    /// without a table: drops the tables of binaries no sample touched,
    /// largest first, as far as needed, and rewrites every process's
    /// entry. Does nothing when even that would not fit them. Returns
    /// whether it changed anything.
    pub fn rebalance(&mut self) -> bool {
        let mut want: Vec<(CacheKey, u64)> = self
            .starved
            .iter()
            .filter(|(k, _)| self.hot.contains(*k))
            .map(|(k, (_, rows))| (k.clone(), *rows))
            .collect();
        if want.is_empty() {
            return false;
        }
        want.sort_by_key(|w| w.1);
        let mut cold: Vec<(CacheKey, u64)> = self
            .loaded
            .iter()
            .filter(|(k, l)| !self.hot.contains(*k) && l.refs > 0)
            .map(|(k, l)| (k.clone(), u64::from(l.len)))
            .collect();
        cold.sort_by_key(|c| std::cmp::Reverse(c.1));
        let mut room = self.obtainable();
        let mut drop = Vec::new();
        let mut fits = HashSet::new();
        for (key, rows) in want {
            while room < rows {
                let Some((k, n)) = cold.first().cloned() else {
                    break;
                };
                cold.remove(0);
                room += n;
                drop.push(k);
            }
            if room < rows {
                break;
            }
            room -= rows;
            fits.insert(key);
        }
        if fits.is_empty() {
            return false;
        }
        let paths: HashMap<CacheKey, String> = self
            .per_pid
            .values()
            .flat_map(|e| e.maps.iter().map(|m| (m.2.clone(), m.3.clone())))
            .collect();
        for k in &drop {
            self.dropped.insert(k.clone());
            let rows = self.loaded.get(k).map_or(0, |l| u64::from(l.len));
            if let Some(p) = paths.get(k) {
                // Starved now: samples landing in it later bring it back.
                self.starved.insert(k.clone(), (p.clone(), rows));
                self.stats.starved_rows.insert(p.clone(), rows);
                self.method(
                    p,
                    &format!(
                        "{}; dropped: no samples in it)",
                        crate::unwind::budget::MEMORY_FULL
                    ),
                );
            }
        }
        self.stats.dropped += drop.len() as u64;
        self.stats.rebalances += 1;
        // First without the dropped tables (which become idle, so their
        // rows can be had), then with the binaries that now fit.
        let pids: Vec<u32> = self.per_pid.keys().copied().collect();
        for pass in [fits.clone(), HashSet::new()] {
            for &pid in &pids {
                if let Some(exec) = self.per_pid.get(&pid).map(|e| e.exec.clone()) {
                    self.apply(pid, exec, &pass);
                }
            }
        }
        true
    }

    /// A line naming the binaries samples landed in that the budget left
    /// to frame pointers at the end, and the option to raise; None when
    /// there are none.
    pub fn starved_note(&self) -> Option<String> {
        use crate::unwind::budget::{fmt_bytes, suggest, ROW_BYTES};
        let mut hot: Vec<(&String, u64)> = self
            .starved
            .iter()
            .filter(|(k, _)| self.hot.contains(*k))
            .map(|(_, (p, rows))| (p, *rows))
            .collect();
        if hot.is_empty() {
            return None;
        }
        hot.sort();
        let need: u64 = hot.iter().map(|h| h.1).sum();
        let names: Vec<String> = hot
            .iter()
            .map(|(p, rows)| {
                format!(
                    "{p} (its table needs about {})",
                    fmt_bytes(rows * ROW_BYTES)
                )
            })
            .collect();
        let budget = u64::from(self.capacity) * ROW_BYTES;
        Some(format!(
            "unwind table memory ({}) full: samples landed in {}, walked by frame pointers; raise it with --unwind-memory (e.g. --unwind-memory {})",
            fmt_bytes(budget),
            names.join(", "),
            fmt_bytes(suggest(self.stats.rows + need).max(budget * 2))
        ))
    }

    /// Where each process's binaries are and whether they had tables, as
    /// the reports name them ([`crate::unwind::budget::Placement`]).
    pub fn placement(&self) -> crate::unwind::budget::Placement {
        use crate::unwind::budget::{status_of, Placement, Status};
        let mut p = Placement::default();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (&pid, e) in &self.per_pid {
            let mut v = Vec::new();
            for (start, end, _, path) in &e.maps {
                let i = *index.entry(path.as_str()).or_insert_with(|| {
                    let status = self
                        .stats
                        .methods
                        .get(path)
                        .map_or(Status::Other, |m| status_of(m));
                    p.bins.push((path.clone(), status));
                    p.bins.len() - 1
                });
                v.push((*start, *end, i));
            }
            p.procs.insert(pid, v);
        }
        p
    }
}
