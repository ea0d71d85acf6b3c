//! Merges the records of several rings (one per CPU) into one stream in
//! timestamp order, up to a watermark.
//!
//! Pairing needs each thread's records in the order the thread made them.
//! Within one ring that is ring order: a thread submits a record before it
//! can make its next one, and it cannot leave the CPU in between (the
//! programs run with migration disabled). Across rings the timestamps
//! decide: a thread that migrates from CPU 0 to CPU 1 made its last record
//! on CPU 0 before it took the timestamp of its first on CPU 1. So the
//! merge keeps each ring's order and always hands out the ring head with
//! the smallest timestamp. A ring's order can hold small inversions
//! (another program, or an interrupt, took its timestamp first and reserved
//! later); they stay behind the record ahead of them, which is correct for
//! the threads involved: whatever is ahead of a thread's record in its ring
//! took its timestamp before that thread's next record did.
//!
//! The rings are read one after another, so a record of CPU 0 not read yet
//! may be older than one read from CPU 1. Only records up to a watermark are
//! handed out: the time the read began, minus the longest a program takes
//! between its timestamp and its submit ([`SLACK_NS`]). The rest wait for
//! the next read. A record that arrives older than a watermark already
//! passed is handed out at once and counted as late. The ring read last
//! needs no copy: every other ring's records up to the watermark are held
//! by then, so its records go out as they are read, after the held ones
//! older than each ([`Merge::push_or_hand_out`]).
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
};

/// How far behind the read the watermark stays: a program that took its
/// timestamp before the read began may not have submitted yet (programs run
/// for microseconds; a uprobe program can be preempted).
pub const SLACK_NS: u64 = 5_000_000;

/// Records held for one ring, in ring order.
#[derive(Default)]
struct Queue {
    buf: Vec<u8>,
    /// (timestamp, start in `buf`, length).
    recs: VecDeque<(u64, usize, usize)>,
}

impl Queue {
    /// Drops the bytes of records already handed out, once they are most
    /// of the buffer.
    fn compact(&mut self) {
        let Some(&(_, first, _)) = self.recs.front() else {
            self.buf.clear();
            // After a stall (a full ring read at once), give the memory back.
            self.buf.shrink_to(1 << 20);
            return;
        };
        if first >= 1 << 16 && first * 2 >= self.buf.len() {
            self.buf.drain(..first);
            for r in &mut self.recs {
                r.1 -= first;
            }
        }
    }
}

/// The merge of several rings' records.
pub struct Merge {
    queues: Vec<Queue>,
    /// The head of every non-empty queue: (timestamp, queue).
    heads: BinaryHeap<Reverse<(u64, usize)>>,
    /// Every record up to this time has been handed out.
    done_to: u64,
    late: u64,
    held: usize,
}

/// A record's timestamp: its first 8 bytes (every record's header starts
/// with it); 0 for a record too short to have one (handed out at once, and
/// counted as invalid by the sinks).
pub fn ts_of(rec: &[u8]) -> u64 {
    rec.get(..8)
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
}

impl Merge {
    /// A merge of `rings` rings.
    pub fn new(rings: usize) -> Self {
        Merge {
            queues: (0..rings).map(|_| Queue::default()).collect(),
            heads: BinaryHeap::with_capacity(rings),
            done_to: 0,
            late: 0,
            held: 0,
        }
    }

    /// Holds a copy of `rec`, read from ring `ring`.
    pub fn push(&mut self, ring: usize, rec: &[u8]) {
        let ts = ts_of(rec);
        if ts < self.done_to {
            self.late += 1;
        }
        let q = &mut self.queues[ring];
        if q.recs.is_empty() {
            self.heads.push(Reverse((ts, ring)));
        }
        q.recs.push_back((ts, q.buf.len(), rec.len()));
        q.buf.extend_from_slice(rec);
        self.held += 1;
    }

    /// Hands `rec`, read from ring `ring`, straight to `f` when the merge
    /// allows it, without holding a copy; otherwise holds it, as
    /// [`Merge::push`]. The caller reads `ring` last in its round, after
    /// every other ring: their records up to `watermark` are then all held
    /// already, so a record of `ring` no newer than the watermark, with
    /// nothing of its own ring held ahead of it, goes out once the held
    /// records older than it have. With one busy ring (one writing thread,
    /// or most of the load on one CPU) that is nearly every record.
    pub fn push_or_hand_out(
        &mut self,
        ring: usize,
        rec: &[u8],
        watermark: u64,
        f: &mut impl FnMut(&[u8]),
    ) {
        let ts = ts_of(rec);
        if ts > watermark || !self.queues[ring].recs.is_empty() {
            self.push(ring, rec);
            return;
        }
        if self
            .heads
            .peek()
            .is_some_and(|Reverse((head, _))| *head <= ts)
        {
            self.hand_out(ts, f);
        }
        if ts < self.done_to {
            self.late += 1;
        }
        f(rec);
    }

    /// Hands every held record with a timestamp up to `watermark` to `f`,
    /// in merged order (each ring's order kept, the oldest head first).
    pub fn pop_to(&mut self, watermark: u64, mut f: impl FnMut(&[u8])) {
        self.hand_out(watermark, &mut f);
        self.done_to = self.done_to.max(watermark);
        for q in &mut self.queues {
            q.compact();
        }
    }

    /// The held records up to `bound`, in merged order.
    fn hand_out(&mut self, bound: u64, f: &mut impl FnMut(&[u8])) {
        while let Some(Reverse((ts, ring))) = self.heads.pop() {
            if ts > bound {
                self.heads.push(Reverse((ts, ring)));
                break;
            }
            // This ring's records go out while they are no newer than the
            // next ring's head (and the bound): one heap operation per
            // run, not per record.
            let run_to = self
                .heads
                .peek()
                .map_or(bound, |Reverse((next, _))| (*next).min(bound));
            let q = &mut self.queues[ring];
            let mut first = true;
            while let Some(&(ts, start, len)) = q.recs.front() {
                if !first && ts > run_to {
                    break;
                }
                first = false;
                q.recs.pop_front();
                self.held -= 1;
                f(&q.buf[start..start + len]);
            }
            if let Some(&(next, _, _)) = q.recs.front() {
                self.heads.push(Reverse((next, ring)));
            }
        }
    }

    /// Records that arrived older than a watermark already passed.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Records held, waiting for the watermark.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16-byte record: timestamp, then a tag.
    fn rec(ts: u64, tag: u64) -> Vec<u8> {
        let mut v = ts.to_ne_bytes().to_vec();
        v.extend_from_slice(&tag.to_ne_bytes());
        v
    }

    fn tag(r: &[u8]) -> u64 {
        u64::from_ne_bytes(r[8..16].try_into().unwrap())
    }

    fn pop(m: &mut Merge, w: u64) -> Vec<u64> {
        let mut out = Vec::new();
        m.pop_to(w, |r| out.push(tag(r)));
        out
    }

    /// The ring read last hands its records out at once, after the held
    /// records older than each; past the watermark, or behind a held record
    /// of its own ring, it holds them.
    #[test]
    fn last_ring_hands_out_in_order_without_holding() {
        let mut m = Merge::new(2);
        for (ts, t) in [(10, 1), (30, 3), (50, 5)] {
            m.push(0, &rec(ts, t));
        }
        let mut out = Vec::new();
        let mut f = |r: &[u8]| out.push(tag(r));
        for (ts, t) in [(20, 2), (40, 4), (45, 45), (60, 6), (42, 42)] {
            m.push_or_hand_out(1, &rec(ts, t), 55, &mut f);
        }
        // 60 is past the watermark: held, and 42 (ring order) behind it.
        assert_eq!(out, [1, 2, 3, 4, 45]);
        assert_eq!(m.held(), 3);
        assert_eq!(pop(&mut m, u64::MAX), [5, 6, 42]);
        assert_eq!(m.late(), 0);
        // Older than a watermark already passed: out at once, counted late.
        let mut out = Vec::new();
        m.push_or_hand_out(0, &rec(7, 7), 100, &mut |r: &[u8]| out.push(tag(r)));
        assert_eq!((out, m.late()), (vec![7], 1));
    }

    #[test]
    fn merges_by_timestamp_up_to_the_watermark() {
        let mut m = Merge::new(2);
        for (ts, t) in [(10, 1), (30, 3), (50, 5)] {
            m.push(0, &rec(ts, t));
        }
        for (ts, t) in [(20, 2), (40, 4), (60, 6)] {
            m.push(1, &rec(ts, t));
        }
        assert_eq!(pop(&mut m, 45), [1, 2, 3, 4]);
        assert_eq!(m.held(), 2);
        assert_eq!(pop(&mut m, u64::MAX), [5, 6]);
        assert_eq!(m.held(), 0);
        assert_eq!(m.late(), 0);
    }

    /// A thread migrates: its exit, on CPU 1, is read before its entry on
    /// CPU 0 is (CPU 1's ring is read first, or CPU 0's record was not
    /// submitted yet). The entry still comes first.
    #[test]
    fn migration_exit_read_before_entry_comes_after_it() {
        let mut m = Merge::new(2);
        m.push(1, &rec(200, 2)); // exit on CPU 1
                                 // The watermark trails the read: the entry, not yet read, is newer.
        assert_eq!(pop(&mut m, 50), Vec::<u64>::new());
        m.push(0, &rec(100, 1)); // entry on CPU 0, read in the next round
        assert_eq!(pop(&mut m, 250), [1, 2]);
        assert_eq!(m.late(), 0);
    }

    /// An inversion inside one ring (an interrupt took its timestamp first,
    /// reserved second) keeps ring order: the record behind it waits.
    #[test]
    fn ring_order_is_kept_through_an_inversion() {
        let mut m = Merge::new(2);
        m.push(0, &rec(30, 1));
        m.push(0, &rec(10, 2));
        m.push(1, &rec(20, 3));
        assert_eq!(pop(&mut m, u64::MAX), [3, 1, 2]);
    }

    #[test]
    fn a_record_older_than_a_passed_watermark_is_late_and_still_handed_out() {
        let mut m = Merge::new(2);
        m.push(0, &rec(100, 1));
        assert_eq!(pop(&mut m, 150), [1]);
        m.push(1, &rec(120, 2));
        assert_eq!(m.late(), 1);
        assert_eq!(pop(&mut m, 150), [2]);
    }

    #[test]
    fn compaction_keeps_held_records_intact() {
        let mut m = Merge::new(1);
        for i in 0..20_000u64 {
            m.push(0, &rec(i, i));
        }
        let first = pop(&mut m, 14_999);
        assert_eq!(first.len(), 15_000);
        for i in 20_000..20_010u64 {
            m.push(0, &rec(i, i));
        }
        let rest = pop(&mut m, u64::MAX);
        assert_eq!(rest, (15_000..20_010).collect::<Vec<u64>>());
    }

    /// Runs of one ring go out together, and interleave with the other
    /// ring's records exactly by timestamp.
    #[test]
    fn runs_interleave_by_timestamp() {
        let mut m = Merge::new(3);
        for ts in [1, 2, 3, 7, 8, 20] {
            m.push(0, &rec(ts, ts));
        }
        for ts in [4, 5, 6, 9, 30] {
            m.push(1, &rec(ts, ts));
        }
        m.push(2, &rec(10, 10));
        assert_eq!(pop(&mut m, 25), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20]);
        assert_eq!(pop(&mut m, u64::MAX), [30]);
    }

    #[test]
    fn short_records_pass_at_once() {
        let mut m = Merge::new(2);
        m.push(1, &[1, 2, 3]);
        let mut n = 0;
        m.pop_to(0, |r| {
            assert_eq!(r, [1, 2, 3]);
            n += 1;
        });
        assert_eq!(n, 1);
    }
}
