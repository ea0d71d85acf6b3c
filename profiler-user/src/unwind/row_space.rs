//! Which rows of the kernel's unwind-row array are free: first-fit
//! allocation of ranges, and freed ranges merged with their neighbours (and
//! given back to the never-used tail), so that tables coming and going
//! (processes starting and exiting under `--all`) do not fragment the array
//! into pieces too small for the next binary.
use std::collections::BTreeMap;

/// Free ranges of `[0, capacity)`.
#[derive(Debug)]
pub struct RowSpace {
    /// Free ranges below `next`: start → length, never adjacent.
    free: BTreeMap<u32, u32>,
    /// First row never handed out (or given back at the tail).
    next: u32,
    capacity: u32,
}

impl RowSpace {
    /// All of `[0, capacity)` free.
    pub fn new(capacity: u32) -> Self {
        RowSpace {
            free: BTreeMap::new(),
            next: 0,
            capacity,
        }
    }

    /// A range of `len` rows: the first free range that fits, else the
    /// tail; `None` when neither has room.
    pub fn alloc(&mut self, len: u32) -> Option<u32> {
        if let Some((&start, &l)) = self.free.iter().find(|&(_, &l)| l >= len) {
            self.free.remove(&start);
            if l > len {
                self.free.insert(start + len, l - len);
            }
            return Some(start);
        }
        let start = self.next;
        (u64::from(start) + u64::from(len) <= u64::from(self.capacity)).then(|| {
            self.next += len;
            start
        })
    }

    /// Gives back `[start, start + len)`, merged with free neighbours.
    pub fn free(&mut self, mut start: u32, mut len: u32) {
        if len == 0 {
            return;
        }
        if let Some((&before, &blen)) = self.free.range(..start).next_back() {
            if before + blen == start {
                self.free.remove(&before);
                start = before;
                len += blen;
            }
        }
        if let Some(alen) = self.free.remove(&(start + len)) {
            len += alen;
        }
        if start + len == self.next {
            self.next = start;
        } else {
            self.free.insert(start, len);
        }
    }

    /// Rows free in all (possibly in pieces).
    pub fn free_rows(&self) -> u64 {
        u64::from(self.capacity - self.next)
            + self.free.values().map(|&l| u64::from(l)).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_neighbours_merge_and_return_to_the_tail() {
        let mut s = RowSpace::new(100);
        let a = s.alloc(30).unwrap();
        let b = s.alloc(30).unwrap();
        let c = s.alloc(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(s.alloc(20), None);
        s.free(a, 30);
        s.free(b, 30);
        // One piece of 60: a 50-row table fits where two 30s were.
        assert_eq!(s.alloc(50), Some(0));
        s.free(0, 50);
        s.free(c, 30);
        assert_eq!(s.free_rows(), 100);
        assert_eq!(s.alloc(100), Some(0));
    }

    #[test]
    fn first_fit_splits_a_larger_range() {
        let mut s = RowSpace::new(100);
        let a = s.alloc(40).unwrap();
        let _b = s.alloc(10).unwrap();
        s.free(a, 40);
        assert_eq!(s.alloc(15), Some(0));
        assert_eq!(s.alloc(25), Some(15));
        assert_eq!(s.alloc(51), None);
        assert_eq!(s.alloc(50), Some(50));
        assert_eq!(s.free_rows(), 0);
    }
}
