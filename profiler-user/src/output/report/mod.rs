//! Everything the session produced, in one place, and the renderers that
//! turn it into files: `text` (report.txt), `json` (functions.json) and
//! `flame` (trace.folded, flamegraph.svg).
pub mod flame;
pub mod json;
pub mod text;

use std::collections::HashMap;

use crate::{
    analyze::processes::Processes,
    analyze::stacks::{FuncStats, Stacks},
    tracee::select::{Binary, Func},
};

/// Facts about the session as a whole.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// Target PID.
    pub pid: u32,
    /// Target executable.
    pub exe: String,
    /// Wall time recorded.
    pub duration_ns: u64,
    /// Why recording stopped.
    pub stop_reason: String,
    /// Functions with live probes.
    pub functions_probed: usize,
    /// Events dropped in the kernel because the ring was full.
    pub lost_events: u64,
    /// Functions matched but not probed (`--max-funcs`).
    pub capped: usize,
    /// Functions whose probes could not be attached.
    pub failed_probes: usize,
    /// Unix time at the start (pprof's time_nanos).
    pub start_unix_ns: i64,
    /// How returns were observed, in words.
    pub exit_rule: String,
    /// One line per `--lib` never mapped during the session.
    pub never_mapped: Vec<String>,
    /// A replayed recording that was cut short or damaged: what is missing
    /// (the figures cover only the part before).
    pub damage: Option<String>,
    /// Processes the targets made that were not traced (no `--follow`).
    pub untraced_children: u64,
    /// `--follow`.
    pub follow: bool,
    /// What the overhead governor did (None: it was off).
    pub governor: Option<crate::analyze::overhead::GovernorReport>,
    /// Durations leave out the probes' cost, calibrated with this spread
    /// from round to round, in % (None: durations as measured).
    pub cost_spread_pct: Option<f64>,
    /// How much more (< 0: less) the traced calls' hits cost when
    /// calibrated again at the end, in % (None: not calibrated again).
    pub cost_drift_pct: Option<f64>,
}

impl Session {
    /// How far the probes' cost taken out may be off, in % of it: the
    /// larger of the calibration's spread and its move over the session
    /// (None: durations as measured).
    pub fn cost_error_pct(&self) -> Option<f64> {
        let spread = self.cost_spread_pct?;
        Some(spread.max(self.cost_drift_pct.map_or(0.0, f64::abs)))
    }
}

/// The finished recording, ready to render.
pub struct Report<'a> {
    /// Session facts.
    pub session: Session,
    /// Probed functions, by index.
    pub funcs: &'a [Func],
    /// Binaries, by index.
    pub binaries: &'a [Binary],
    /// Rebuilt stacks and aggregates.
    pub stacks: &'a Stacks,
    /// Thread names by tid.
    pub thread_names: HashMap<u32, String>,
    /// One section per process, when several were traced.
    pub processes: Option<&'a Processes>,
}

impl Report<'_> {
    /// The name to show for a thread: an aggregate of exited threads keeps
    /// its own (its tid may have been reused since).
    pub fn name_of(&self, t: &crate::analyze::stacks::ThreadState) -> String {
        match (&t.name, t.exited_threads) {
            (Some(n), 1..) => n.clone(),
            _ => self.thread_name(t.tid),
        }
    }

    /// A thread's name, or `tid-N` when it exited before we could read it.
    pub fn thread_name(&self, tid: u32) -> String {
        self.thread_names
            .get(&tid)
            .cloned()
            .unwrap_or_else(|| format!("tid-{tid}"))
    }

    /// When the overhead governor detached function `i`, in ns after the
    /// session's start.
    pub fn detached_at(&self, i: usize) -> Option<u64> {
        let g = self.session.governor.as_ref()?;
        g.detached
            .iter()
            .find(|d| d.func as usize == i)
            .map(|d| d.at_ns)
    }

    /// Function indices with at least one call or unfinished frame, with
    /// their stats.
    pub fn active_funcs(&self) -> Vec<(usize, &FuncStats)> {
        active_funcs(self.stacks)
    }
}

/// How far the probes' cost in a session may be from the attach's
/// calibration beyond what it saw of itself, in % of that cost: this
/// project's VM runs each vCPU at one of two speeds 15-35% apart and
/// flips between them within minutes, so hits cost 5-46% more in sessions
/// than in the calibration a moment before (BENCHMARKS.md, part o). A
/// band that leaves that bias out held the untraced time in 6 of 9 runs.
pub const HOST_SPEED_PCT: f64 = 30.0;

/// The share of a call's measured time that the probes disturb beyond
/// their own cost, in %: interruptions (2% of an idle vCPU's time in gaps
/// over 1 µs, and the in-dispatch sampler's), taken as often as the call
/// is long traced, and the caches and branch predictors a probe's trap
/// leaves cold for the code after it (a 2-µs function read 7-24% over its
/// untraced time once corrected).
pub const DISTURBED_PCT: f64 = 10.0;

/// A function whose probes cost more than this many times its corrected
/// mean is too cheap to time this way: its mean is a bound, not a figure.
pub const TOO_CHEAP: u64 = 10;

/// How far a function's mean duration may be off, given how far the
/// probes' cost may be (`error_pct`, [`Session::cost_error_pct`]; None:
/// nothing was taken out): the probes' cost taken out of a mean call, times
/// that and the host's speed ([`HOST_SPEED_PCT`]), and the disturbed share
/// of the mean call as measured ([`DISTURBED_PCT`]). A mean that is mostly
/// correction (a caller of many traced calls) is only as good as the
/// calibration; the band covers its bias as well as its spread.
pub fn avg_error_ns(st: &FuncStats, error_pct: Option<f64>) -> u64 {
    let Some(spread) = error_pct else {
        return 0;
    };
    let Some(removed) = st.probe_ns.checked_div(st.calls) else {
        return 0;
    };
    let measured = st.measured_avg_ns() as f64;
    let err = removed as f64 * (spread.max(0.0) + HOST_SPEED_PCT) / 100.0
        + measured * DISTURBED_PCT / 100.0;
    err.round() as u64
}

/// For a function too cheap to time this way (its probes cost over
/// [`TOO_CHEAP`] times its corrected mean), the bound its mean is under:
/// the mean and its error ([`avg_error_ns`]). None: its mean is a figure.
pub fn avg_below_ns(st: &FuncStats, error_pct: Option<f64>) -> Option<u64> {
    error_pct?;
    let removed = st.probe_ns.checked_div(st.calls)?;
    (removed > TOO_CHEAP.saturating_mul(st.avg_ns()))
        .then(|| st.avg_ns() + avg_error_ns(st, error_pct))
}

/// Function indices of `stacks` with at least one call or unfinished
/// frame, with their stats.
pub fn active_funcs(stacks: &Stacks) -> Vec<(usize, &FuncStats)> {
    stacks
        .funcs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.calls > 0 || s.unfinished > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mean_that_is_mostly_correction_is_as_uncertain_as_the_calibration() {
        // 10 calls, 400 µs measured, 350 µs of it the probes' cost.
        let st = FuncStats {
            calls: 10,
            sum_ns: 50_000,
            probe_ns: 350_000,
            ..Default::default()
        };
        let session = |spread, drift| Session {
            cost_spread_pct: spread,
            cost_drift_pct: drift,
            ..Default::default()
        };
        // The larger of the spread and the move over the session, either way.
        assert_eq!(session(Some(4.0), Some(-12.0)).cost_error_pct(), Some(12.0));
        assert_eq!(session(Some(4.0), Some(2.0)).cost_error_pct(), Some(4.0));
        assert_eq!(session(Some(4.0), None).cost_error_pct(), Some(4.0));
        // Durations as measured: nothing taken out, no error from it.
        assert_eq!(session(None, Some(12.0)).cost_error_pct(), None);
        assert_eq!(avg_error_ns(&st, None), 0);
        // 35 µs taken out of a mean call, 12% and the host's 30% of it,
        // and 10% of the 40 µs measured: ± 18.7 µs on 5 µs. A bias of
        // hits 25% dearer than calibrated (8.75 µs) is inside it.
        assert_eq!(avg_error_ns(&st, Some(12.0)), 18_700);
        assert_eq!(avg_error_ns(&FuncStats::default(), Some(12.0)), 0);
        // 7 times its mean taken out: still a figure.
        assert_eq!(avg_below_ns(&st, Some(12.0)), None);
    }

    #[test]
    fn a_function_too_cheap_to_time_gets_a_bound() {
        // 100 ns left of 1.6 µs measured: the probes cost 15 times that.
        let st = FuncStats {
            calls: 10,
            sum_ns: 1_000,
            probe_ns: 15_000,
            ..Default::default()
        };
        // 1.5 µs × 42% + 1.6 µs × 10% = 790 ns: under 890 ns.
        assert_eq!(avg_error_ns(&st, Some(12.0)), 790);
        assert_eq!(avg_below_ns(&st, Some(12.0)), Some(890));
        // Durations as measured: no bound.
        assert_eq!(avg_below_ns(&st, None), None);
    }
}
