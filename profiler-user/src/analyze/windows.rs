//! `watch --profile-every`: the watched thread's samples gathered into
//! windows of wall-clock time, one pprof each, every sample labelled with
//! whether it was taken inside a stall.
//!
//! Whether it was is known only once its iteration ends, so a sample is
//! held, keyed by its iteration, until the session decides that iteration
//! ([`Windows::decide`]: the iterations before the open one are decided,
//! the slow ones among them are stalls). A window is given out once its
//! time is over (and a grace for samples still in the rings) and none of
//! its samples waits for a decision, or, while one long iteration keeps
//! it waiting, after `hold` (then that iteration's samples are labelled as
//! the caller says: it has run past the threshold, so it will be a stall).
//!
//! Memory is bounded: a window keeps at most [`MAX_ENTRIES`] distinct
//! (stack, label) entries (the samples past it are counted under an empty
//! stack, which the writer names), and at most [`MAX_HELD`] windows wait.
use std::collections::{BTreeSet, HashMap, VecDeque};

/// Distinct entries a window keeps at most.
pub const MAX_ENTRIES: usize = 4_096;
/// Windows kept waiting at most: past it, the oldest is given out.
pub const MAX_HELD: usize = 8;

/// A stack's samples and the CPU time they stand for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Values {
    /// Samples taken.
    pub samples: u64,
    /// CPU time, ns: each sample weighs the sampler's periods it stands
    /// for.
    pub cpu_ns: u64,
}

impl Values {
    fn add(&mut self, v: Values) {
        self.samples += v.samples;
        self.cpu_ns = self.cpu_ns.saturating_add(v.cpu_ns);
    }
}

/// One window's samples.
#[derive(Debug, Default)]
pub struct Window {
    /// Its start and end, CLOCK_MONOTONIC.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Decided: (user stack innermost first, in a stall) to values. An
    /// empty stack holds the samples past [`MAX_ENTRIES`] (and samples
    /// without a user stack).
    pub decided: HashMap<(Box<[u64]>, bool), Values>,
    /// Waiting for their iteration's fate: (iteration, stack).
    pending: HashMap<(u64, Box<[u64]>), Values>,
    /// Samples counted under the empty stack because the window was full.
    pub overflow: u64,
}

impl Window {
    fn entries(&self) -> usize {
        self.decided.len() + self.pending.len()
    }

    /// Settles the pending entries of iterations `fate` knows.
    fn settle(&mut self, fate: impl Fn(u64) -> Option<bool>) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        for ((index, stack), v) in pending {
            match fate(index) {
                Some(stalled) => self.decided.entry((stack, stalled)).or_default().add(v),
                None => {
                    self.pending.insert((index, stack), v);
                }
            }
        }
    }

    /// Total samples and CPU time, stalled or not (`None`: both).
    #[cfg(test)]
    pub fn total(&self, stalled: Option<bool>) -> Values {
        let mut t = Values::default();
        for ((_, s), v) in &self.decided {
            if stalled.is_none_or(|x| x == *s) {
                t.add(*v);
            }
        }
        t
    }
}

/// The windows of one watched process.
#[derive(Debug)]
pub struct Windows {
    every_ns: u64,
    period_ns: u64,
    /// CLOCK_MONOTONIC's offset into a window aligned on the wall clock
    /// (a window starts where Unix time is a multiple of `every_ns`).
    phase_ns: u64,
    /// Nothing before this (the watch's start; then each given-out
    /// window's end).
    from_ns: u64,
    /// Oldest first; only windows with samples.
    windows: VecDeque<Window>,
    /// Iterations at or past `decided_below` known to be stalls.
    stalls: BTreeSet<u64>,
    decided_below: u64,
}

impl Windows {
    /// Windows of `every_ns` from `start_ns` (CLOCK_MONOTONIC), aligned on
    /// the wall clock by `unix_minus_mono_ns`; a sample weighs
    /// `period_ns` per period it stands for.
    pub fn new(every_ns: u64, period_ns: u64, start_ns: u64, unix_minus_mono_ns: u64) -> Self {
        let every_ns = every_ns.max(1);
        Windows {
            every_ns,
            period_ns,
            phase_ns: unix_minus_mono_ns % every_ns,
            from_ns: start_ns,
            windows: VecDeque::new(),
            stalls: BTreeSet::new(),
            decided_below: 0,
        }
    }

    /// The window holding `ts_ns`: its [start, end), cut at `from_ns`.
    fn bounds(&self, ts_ns: u64) -> (u64, u64) {
        let aligned = ts_ns + self.phase_ns;
        let start = (aligned - aligned % self.every_ns).saturating_sub(self.phase_ns);
        (start.max(self.from_ns), start + self.every_ns)
    }

    /// A sample at `ts_ns` with its user stack (innermost first), of
    /// iteration `.0` and standing for `.1` of the sampler's periods; no
    /// iteration: taken outside one, never in a stall.
    pub fn sample(&mut self, ts_ns: u64, user: &[u64], iteration: Option<(u64, u64)>) {
        // A sample read after its window was given out goes to the next.
        let ts_ns = ts_ns.max(self.from_ns);
        if self.windows.back().is_none_or(|w| w.end_ns <= ts_ns) {
            // (No window for the time between: an idle thread's.)
            let (start_ns, end_ns) = self.bounds(ts_ns);
            self.windows.push_back(Window {
                start_ns,
                end_ns,
                ..Window::default()
            });
        }
        let w = self
            .windows
            .iter_mut()
            .find(|w| w.end_ns > ts_ns)
            .expect("the last window ends after ts_ns");
        let periods = iteration.map_or(1, |(_, p)| p.max(1));
        let v = Values {
            samples: 1,
            cpu_ns: periods * self.period_ns,
        };
        let fate = match iteration {
            Some((index, _)) if index >= self.decided_below => Err(index),
            Some((index, _)) => Ok(self.stalls.contains(&index)),
            None => Ok(false),
        };
        let known = match fate {
            Ok(stalled) => w.decided.contains_key(&(Box::from(user), stalled)),
            Err(index) => w.pending.contains_key(&(index, Box::from(user))),
        };
        // A full window counts new stacks under the empty one.
        let full = !known && w.entries() >= MAX_ENTRIES;
        w.overflow += u64::from(full);
        let stack: Box<[u64]> = match full {
            true => Box::default(),
            false => user.into(),
        };
        match fate {
            Ok(stalled) => w.decided.entry((stack, stalled)).or_default().add(v),
            Err(index) => w.pending.entry((index, stack)).or_default().add(v),
        }
    }

    /// The iterations before `below` are decided; `stalls` are the ones
    /// known to be stalls (they may be at or past `below`: slow, ended,
    /// still being explained).
    pub fn decide(&mut self, stalls: impl IntoIterator<Item = u64>, below: u64) {
        self.stalls.extend(stalls);
        self.decided_below = self.decided_below.max(below);
        let (stalls, below) = (&self.stalls, self.decided_below);
        for w in &mut self.windows {
            w.settle(|i| (i < below || stalls.contains(&i)).then(|| stalls.contains(&i)));
        }
        // No sample of an earlier iteration is pending any more, and none
        // can come.
        self.stalls = self.stalls.split_off(&self.decided_below);
    }

    /// The windows over by `now_ns` (and `grace_ns` for samples still in
    /// the rings) whose samples are all decided, oldest first; a window
    /// waiting since `hold_ns` past its end, or past [`MAX_HELD`] waiting,
    /// is given out anyway with the still-open iteration's samples labelled
    /// `open_stalled`.
    pub fn ready(
        &mut self,
        now_ns: u64,
        grace_ns: u64,
        hold_ns: u64,
        open_stalled: bool,
    ) -> Vec<Window> {
        let mut out = Vec::new();
        let mut held = self.windows.len();
        while let Some(w) = self.windows.front_mut() {
            if now_ns < w.end_ns + grace_ns {
                break;
            }
            let forced = now_ns >= w.end_ns.saturating_add(hold_ns) || held > MAX_HELD;
            held -= 1;
            if !w.pending.is_empty() && !forced {
                break;
            }
            w.settle(|_| Some(open_stalled));
            let w = self.windows.pop_front().expect("front exists");
            self.from_ns = w.end_ns;
            out.push(w);
        }
        out
    }

    /// Every window left, the last cut at `now_ns` (the watch ends): the
    /// open iteration's samples labelled `open_stalled`. Empty windows are
    /// left out.
    pub fn drain(&mut self, now_ns: u64, open_stalled: bool) -> Vec<Window> {
        let mut out: Vec<Window> = self.windows.drain(..).collect();
        for w in &mut out {
            w.settle(|_| Some(open_stalled));
            w.end_ns = w.end_ns.min(now_ns.max(w.start_ns + 1));
        }
        self.from_ns = now_ns;
        out.retain(|w| !w.decided.is_empty());
        out
    }

    /// The sampler's period, ns.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn stalled_cpu(w: &Window) -> u64 {
        w.total(Some(true)).cpu_ns
    }

    #[test]
    fn windows_align_on_the_wall_clock_and_start_at_the_watch() {
        // Unix = mono + 10.5 s: a 2-s window starts at mono 1.5 s, 3.5 s…
        let mut w = Windows::new(2 * S, MS, 2 * S, 10 * S + S / 2);
        w.sample(2 * S + 100 * MS, &[1], None);
        w.sample(3 * S + 600 * MS, &[1], None);
        let out = w.ready(6 * S, 200 * MS, 10 * S, false);
        let bounds: Vec<(u64, u64)> = out.iter().map(|x| (x.start_ns, x.end_ns)).collect();
        // The first cut at the watch's start (2 s), not at 1.5 s.
        assert_eq!(
            bounds,
            [(2 * S, 3 * S + S / 2), (3 * S + S / 2, 5 * S + S / 2)]
        );
        assert_eq!(out[0].total(None).samples, 1);
        assert_eq!(out[1].total(None).samples, 1);
    }

    #[test]
    fn a_window_waits_for_its_iterations_and_labels_the_stalls() {
        let mut w = Windows::new(S, MS, 0, 0);
        // Iteration 3: early samples weigh 10 periods, later ones 1.
        w.sample(100 * MS, &[7, 8], Some((3, 10)));
        w.sample(900 * MS, &[7, 8], Some((3, 1)));
        // Iteration 4 spans the window's end.
        w.sample(950 * MS, &[9], Some((4, 1)));
        w.sample(1_100 * MS, &[9], Some((4, 1)));
        // The window is over, but iteration 3 is open.
        assert!(w.ready(1_300 * MS, 200 * MS, 10 * S, false).is_empty());
        // 3 ended fast; 4 is open: still waiting.
        w.decide([], 4);
        assert!(w.ready(1_300 * MS, 200 * MS, 10 * S, false).is_empty());
        // 4 was a stall (known while explained, before the next opens).
        w.decide([4], 4);
        let out = w.ready(1_300 * MS, 200 * MS, 10 * S, false);
        assert_eq!(out.len(), 1);
        let first = &out[0];
        assert_eq!(
            first.total(Some(false)),
            Values {
                samples: 2,
                cpu_ns: 11 * MS
            }
        );
        assert_eq!(
            first.total(Some(true)),
            Values {
                samples: 1,
                cpu_ns: MS
            }
        );
        assert_eq!(
            first.decided[&(Box::from([7u64, 8].as_slice()), false)].samples,
            2
        );
        // The second window holds 4's later sample, decided already.
        w.decide([], 5);
        let out = w.ready(2_300 * MS, 200 * MS, 10 * S, false);
        assert_eq!(stalled_cpu(&out[0]), MS);
    }

    #[test]
    fn a_long_iteration_is_given_out_after_hold_and_the_rest_at_the_end() {
        let mut w = Windows::new(S, MS, 0, 0);
        for t in 0..30 {
            w.sample(t * 100 * MS, &[1], Some((0, 1)));
        }
        // Held while the iteration runs, until 2 s past the end.
        assert!(w.ready(2_900 * MS, 200 * MS, 2 * S, true).is_empty());
        let out = w.ready(3_000 * MS, 200 * MS, 2 * S, true);
        assert_eq!(out.len(), 1);
        assert_eq!(stalled_cpu(&out[0]), 10 * MS);
        // The watch ends with it still open: the rest, cut at the end.
        let out = w.drain(2_950 * MS, false);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].end_ns, 2_950 * MS);
        assert_eq!(
            out.iter()
                .map(|x| x.total(Some(false)).samples)
                .sum::<u64>(),
            20
        );
        assert!(w.drain(3 * S, false).is_empty());
    }

    #[test]
    fn a_late_sample_goes_to_the_next_window_and_memory_is_capped() {
        let mut w = Windows::new(S, MS, 0, 0);
        w.sample(500 * MS, &[1], None);
        assert_eq!(w.ready(1_300 * MS, 200 * MS, S, false).len(), 1);
        w.sample(900 * MS, &[2], None);
        let out = w.drain(1_500 * MS, false);
        assert_eq!((out[0].start_ns, out[0].total(None).samples), (S, 1));

        let mut w = Windows::new(S, MS, 0, 0);
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            w.sample(MS, &[i], Some((0, 1)));
        }
        w.decide([0], 1);
        let out = w.drain(S, false);
        assert_eq!(out[0].entries(), MAX_ENTRIES + 1);
        assert_eq!(out[0].overflow, 10);
        assert_eq!(out[0].decided[&(Box::default(), true)].samples, 10);
        assert_eq!(out[0].total(Some(true)).samples, MAX_ENTRIES as u64 + 10);
    }

    #[test]
    fn too_many_waiting_windows_are_given_out() {
        let mut w = Windows::new(S, MS, 0, 0);
        for t in 0..(MAX_HELD as u64 + 3) {
            w.sample(t * S + 1, &[1], Some((0, 1)));
        }
        let out = w.ready((MAX_HELD as u64 + 3) * S, 0, u64::MAX / 2, true);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|x| x.total(Some(true)).samples == 1));
    }
}
