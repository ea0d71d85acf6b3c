//! Dispatches that ended: fast ones counted, slow ones judged and
//! explained once their frames are named: a binary's symbols read for the
//! first time may take seconds, and the thread that reads the rings does
//! not wait for them while recording. Which iterations are decided, and
//! which of them are slow, for `watch --profile-every`'s labels.
use super::*;
use crate::text::fmt_ns;

/// Slow dispatches kept waiting for names at most: past this, the oldest
/// is explained waiting (memory stays bounded if the symbolizer stalls).
const MAX_DEFERRED: usize = 64;

/// A slow dispatch that ended, to be explained.
pub(super) struct Deferred {
    open: Open,
    recs: Vec<Rec>,
    start_ns: u64,
    duration_ns: u64,
    probe_ns: u64,
    split: sched::Split,
    /// Other processes that woke it: their mappings are forgotten once
    /// it is explained.
    wakers: Vec<u32>,
    /// What its records show of the probes' cost is taken out, and it is
    /// counted ([`Dispatcher::judge`]).
    judged: bool,
    /// Under the threshold once the probes' estimated cost is out: slow
    /// mainly because of them ([`Slow::probes_mainly`]).
    probes_mainly: bool,
}

impl Dispatcher {
    pub(super) fn end(&mut self, end_ns: u64) {
        self.end_with(end_ns, None);
    }

    /// Ends the open dispatch at `end_ns`; with `split`, that is its split
    /// (the tracker's, which may have run on past `end_ns`, is dropped).
    pub(super) fn end_with(&mut self, end_ns: u64, split: Option<sched::Split>) {
        let Some(open) = self.open.take() else { return };
        let measured = end_ns.saturating_sub(open.start_ns);
        // The probes' cost out: of the wall time, and of the time on a CPU
        // (where probe hits run).
        let probe_ns = open.probe_ns.min(measured);
        let duration_ns = measured - probe_ns;
        self.probe_ns += probe_ns;
        let tracked = self.sched.close(end_ns);
        let mut split = split.unwrap_or(tracked);
        split.on_cpu_ns = split.on_cpu_ns.saturating_sub(probe_ns);
        let start_ns = open.start_ns.saturating_sub(self.session_start_ns);
        if let Some(reason) = open.not_the_programs {
            // Held by something else (stopped, suspended): neither slow
            // nor counted.
            match self.excluded.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => self.excluded.push((reason.clone(), 1)),
            }
            self.notices.push(Notice::Excluded {
                start_ns,
                duration_ns,
                reason,
            });
            self.recs.clear();
            let wakers = std::mem::take(&mut self.waker_pids);
            self.symbolizer.forget_mappings(&wakers);
            return;
        }
        // Other processes that woke it: named (or not needed) once it is
        // explained; their mappings would otherwise pile up, one set per
        // waker process.
        let wakers = std::mem::take(&mut self.waker_pids);
        // Slow is the wall time the user felt, from its start to its end
        // (an event loop's: between its waits), probes included: a loop
        // that runs to a deadline lasts as long with probes or without, and
        // their estimated cost is no proof that it would have been fast.
        // What they cost is stated with it, and it is flagged when they
        // made most of it ([`Self::judge`]).
        if measured >= self.cfg.threshold_ns {
            let recs = std::mem::take(&mut self.recs);
            self.deferred.push_back(Deferred {
                open,
                recs,
                start_ns,
                duration_ns,
                probe_ns,
                split,
                wakers,
                judged: false,
                probes_mainly: false,
            });
            self.explain_deferred();
        } else {
            self.counted(&open, start_ns, duration_ns);
            self.recs.clear();
            if self.recs.capacity() > 1 << 16 {
                self.recs = Vec::new();
            }
            self.symbolizer.forget_mappings(&wakers);
        }
    }

    /// The open iteration's index and the sampler's periods a sample at
    /// `ts_ns` of it stands for (`watch`'s early rate), if one is open.
    pub fn sampled_iteration(&self, ts_ns: u64) -> Option<(u64, u64)> {
        let open = self.open.as_ref()?;
        Some((open.index, self.sample_periods(open.start_ns, ts_ns)))
    }

    /// Iterations before this one have ended, and their fate is known:
    /// the slow ones among them are [`Self::slow_waiting`] or were streamed.
    pub fn decided_below(&self) -> u64 {
        self.open.as_ref().map_or(self.next_index, |o| o.index)
    }

    /// The iterations that ended slow and still wait to be explained:
    /// they will be streamed.
    pub fn slow_waiting(&self) -> impl Iterator<Item = u64> + '_ {
        self.deferred.iter().map(|x| x.open.index)
    }

    /// How long the open iteration has run by `now_ns`, if one is open.
    pub fn open_running_ns(&self, now_ns: u64) -> Option<u64> {
        self.open
            .as_ref()
            .map(|o| now_ns.saturating_sub(o.start_ns))
    }

    /// Explains what still waits for names, waiting for them: at the end
    /// of a recording, before the outputs and the symbols' journal.
    pub fn finish(&mut self) {
        self.symbolizer.set_patience(None);
        self.explain_deferred();
    }

    /// Explains the slow dispatches that waited for names, if they are
    /// read now (on each tick while recording).
    pub fn explain_waiting(&mut self) {
        self.explain_deferred();
    }

    /// Explains the slow dispatches (and names the samples' outermost
    /// frames) that wait for names, in order, until one is still not
    /// named.
    pub(super) fn explain_deferred(&mut self) {
        while !self.quality_deferred.is_empty() || !self.deferred.is_empty() {
            if self.symbolizer.is_busy() {
                return;
            }
            if let Some((len, end, pc)) = self.quality_deferred.pop() {
                let _ = self.symbolizer.take_missed();
                let name = self.symbolizer.user_stack(&[pc]).pop();
                if self.symbolizer.take_missed() {
                    self.quality_deferred.push((len, end, pc));
                    return;
                }
                self.quality.add(len, end, name.as_deref());
                continue;
            }
            let Some(mut x) = self.deferred.pop_front() else {
                return;
            };
            if !x.judged {
                let _ = self.symbolizer.take_missed();
                let mut own =
                    own_cost::measure(&x.recs, &mut self.symbolizer, self.cfg.sample_period_ns);
                if self.symbolizer.take_missed() {
                    if self.deferred.len() < MAX_DEFERRED {
                        self.deferred.push_front(x);
                        return;
                    }
                    let patience = self.symbolizer.patience();
                    self.symbolizer.set_patience(None);
                    own =
                        own_cost::measure(&x.recs, &mut self.symbolizer, self.cfg.sample_period_ns);
                    self.symbolizer.set_patience(patience);
                }
                self.judge(&mut x, own);
            }
            let _ = self.symbolizer.take_missed();
            let slow = self.explain_one(&x);
            let slow = match self.symbolizer.take_missed() {
                false => slow,
                true if self.deferred.len() < MAX_DEFERRED => {
                    self.deferred.push_front(x);
                    return;
                }
                // Too many waiting: this one waits for its names.
                true => {
                    let patience = self.symbolizer.patience();
                    self.symbolizer.set_patience(None);
                    let slow = self.explain_one(&x);
                    self.symbolizer.set_patience(patience);
                    slow
                }
            };
            self.add_slow(slow);
            self.symbolizer.forget_mappings(&x.wakers);
        }
    }

    /// Takes out of `x` what its records show of the probes' cost beyond
    /// the calibrated hits ([`own_cost`]), and counts it. It stays slow
    /// (its wall time was over the threshold), flagged when it is under
    /// the threshold without the probes' estimated cost.
    fn judge(&mut self, x: &mut Deferred, own: own_cost::Measured) {
        x.judged = true;
        if self.costs.is_empty() {
            // Durations as measured (`--raw-durations`, or no calibration).
            self.counted(&x.open, x.start_ns, x.duration_ns);
            return;
        }
        // The hits' calibrated cost is on a CPU, inside what the samples
        // see: the larger of the two, so nothing is taken out twice.
        let on_cpu = own
            .on_cpu_ns
            .saturating_sub(x.probe_ns)
            .min(x.split.on_cpu_ns);
        let blocked = own.blocked_ns.min(x.split.blocked_ns);
        let extra = (on_cpu + blocked).min(x.duration_ns);
        x.duration_ns -= extra;
        x.probe_ns += extra;
        x.split.on_cpu_ns -= on_cpu;
        x.split.blocked_ns -= blocked;
        self.probe_ns += extra;
        self.counted(&x.open, x.start_ns, x.duration_ns);
        x.probes_mainly = x.duration_ns < self.cfg.threshold_ns;
        self.slow_only_with_probes += u64::from(x.probes_mainly);
    }

    /// Counts a dispatch that ended, as lasting `duration_ns`.
    pub(super) fn counted(&mut self, open: &Open, start_ns: u64, duration_ns: u64) {
        self.stats.add(
            Worst {
                duration_ns,
                index: open.index,
                start_ns,
            },
            self.cfg.frame_interval_ns,
        );
        if let Some(h) = open.hang {
            self.hangs[h].duration_ns = Some(duration_ns);
        }
    }

    fn explain_one(&mut self, x: &Deferred) -> explain::Explained {
        let mut e = explain::explain(
            self,
            &x.open,
            &x.recs,
            x.start_ns,
            x.duration_ns,
            x.probe_ns,
            x.split,
        );
        e.slow.probes_mainly = x.probes_mainly;
        e.slow
            .verdict
            .push_str(&probes_share(x.duration_ns, x.probe_ns, x.probes_mainly));
        e
    }
}

/// What a slow dispatch's verdict says of the probes' estimated share of
/// its wall time (`duration_ns + probe_ns`): nothing when there was none.
pub(super) fn probes_share(duration_ns: u64, probe_ns: u64, mainly: bool) -> String {
    if probe_ns == 0 {
        return String::new();
    }
    let lasted = fmt_ns(duration_ns + probe_ns);
    let share = fmt_ns(probe_ns);
    match mainly {
        false => format!(" (lasted {lasted}, of which ~{share} in the profiler's probes)"),
        true => format!(
            " (lasted {lasted}, of which ~{share} in the profiler's probes: slow mainly because \
             of them, under the threshold without their estimated cost; a loop that runs to a \
             deadline lasts as long without them)"
        ),
    }
}
