//! Drops the second copy of a probe hit reported by two generations of
//! uprobe_multi links at once.
//!
//! When the overhead governor detaches a function, its binary's links are
//! rebuilt without it: the new links are created before the old ones are
//! dropped, so no call of any other function goes unseen, and a hit that
//! lands in between runs both programs. Both events come from the same hit
//! on the same thread, one right after the other in that thread's order,
//! and differ only in the [`LINK_GEN`] bit (and the timestamp). An event is
//! dropped when the previous function event of its thread is the same
//! entry or exit (function, stack pointer) from the other generation: two
//! real hits of one probe on one thread are never adjacent with different
//! generations, since only one set of links exists outside the overlap.
use std::collections::HashMap;

use profiler_common::{Event, LINK_GEN};

/// The last function event of each thread: its word and stack pointer.
#[derive(Debug, Default)]
pub struct LinkDedup {
    last: HashMap<u32, (u32, u64)>,
    /// Events dropped as the other generation's copy.
    pub dropped: u64,
}

impl LinkDedup {
    /// True when `ev` (a function entry or exit header) repeats the
    /// previous event of its thread from the other link generation.
    #[inline]
    pub fn is_copy(&mut self, ev: &Event) -> bool {
        let prev = self.last.insert(ev.tid, (ev.word, ev.sp));
        if prev.is_some_and(|(word, sp)| word ^ ev.word == LINK_GEN && sp == ev.sp) {
            // A third copy cannot exist; forget, so the next real hit counts.
            self.last.remove(&ev.tid);
            self.dropped += 1;
            return true;
        }
        false
    }

    /// Forgets the threads `gone` (reaped).
    pub fn forget(&mut self, gone: &[u32]) {
        for tid in gone {
            self.last.remove(tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{KIND_ENTRY, KIND_EXIT};

    fn ev(tid: u32, kind: u32, func: u32, gen: bool, sp: u64) -> Event {
        Event {
            ts_ns: 0,
            tid,
            word: Event::pack(kind, func | if gen { LINK_GEN } else { 0 }),
            sp,
        }
    }

    #[test]
    fn copies_from_the_other_generation_are_dropped() {
        let mut d = LinkDedup::default();
        // Before any rebuild: repeated entries of an entry-only function
        // from one frame are real calls.
        assert!(!d.is_copy(&ev(1, KIND_ENTRY, 3, false, 100)));
        assert!(!d.is_copy(&ev(1, KIND_ENTRY, 3, false, 100)));
        // Overlap: old then new copy of one hit, and new then old.
        assert!(!d.is_copy(&ev(1, KIND_ENTRY, 4, false, 200)));
        assert!(d.is_copy(&ev(1, KIND_ENTRY, 4, true, 200)));
        assert!(!d.is_copy(&ev(1, KIND_EXIT, 4, true, 208)));
        assert!(d.is_copy(&ev(1, KIND_EXIT, 4, false, 208)));
        // Another thread in between does not hide a copy.
        assert!(!d.is_copy(&ev(1, KIND_ENTRY, 5, false, 300)));
        assert!(!d.is_copy(&ev(2, KIND_ENTRY, 5, false, 300)));
        assert!(d.is_copy(&ev(1, KIND_ENTRY, 5, true, 300)));
        // Different function, kind or frame: not a copy.
        assert!(!d.is_copy(&ev(1, KIND_ENTRY, 6, false, 300)));
        assert!(!d.is_copy(&ev(1, KIND_EXIT, 6, true, 300)));
        assert!(!d.is_copy(&ev(1, KIND_EXIT, 6, false, 400)));
        assert_eq!(d.dropped, 3);
    }
}
