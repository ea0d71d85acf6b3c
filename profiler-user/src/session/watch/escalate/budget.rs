//! What keeps an escalation's probes within `--max-overhead`: the probes'
//! calibrated cost, how often the estimate is judged, whether a stall ran
//! while the governor detached, and the functions too hot to probe again.
use std::{
    collections::HashSet,
    sync::{Once, OnceLock},
    time::Duration,
};

use super::Traced;
use crate::{
    attach::calibrate::{self, HitCost},
    tracee::select,
};

/// How often the overhead governor judges a traced group's probes. Not
/// `record`'s 250 ms (50 ms for its first 2 s): a traced stall lasts a few
/// hundred ms, and one over the budget runs many times slower until its
/// hottest functions are off (python3.11's asyncio app: 96% of the thread
/// in probes, 4,800 hits of each of two functions per 100 ms).
pub(super) const EVERY: Duration = Duration::from_millis(20);
/// The probes' cost on this host, measured once for every watched
/// process, on a thread of its own (0.1-0.3 s, seconds on a loaded
/// machine: a worker waiting for it would let stalls go by untraced).
pub(super) static CALIBRATED: OnceLock<HitCost> = OnceLock::new();
static CALIBRATING: Once = Once::new();

/// Starts the calibration, once, with the session's wait tracepoints.
pub(super) fn calibrate_soon(waits: calibrate::WaitTracepoints) {
    CALIBRATING.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("watch-calibrate".into())
            .spawn(move || {
                let cost = calibrate::calibrate(waits).unwrap_or_else(|e| {
                    eprintln!(
                        "profiler: warning: {}; the overhead governor assumes {} µs per probe hit",
                        crate::error::chain(&e),
                        HitCost::FALLBACK.entry_ns / 1000.0
                    );
                    HitCost::FALLBACK
                });
                let _ = CALIBRATED.set(cost);
            });
        if spawned.is_err() {
            let _ = CALIBRATED.set(HitCost::FALLBACK);
        }
    });
}

/// Whether the overhead governor detached some of `t`'s functions during
/// `(start_ns, end_ns)`.
pub(super) fn governed_in(t: &Traced, (start_ns, end_ns): (u64, u64)) -> bool {
    t.governed_ns.is_some_and(|g| g >= start_ns && g <= end_ns)
}

/// Leaves out of `funcs` those `too_hot` names (the overhead governor
/// detached them in an earlier escalation of the process); returns their
/// names.
pub(super) fn without_too_hot(
    funcs: &mut Vec<select::Func>,
    too_hot: &HashSet<String>,
) -> Vec<String> {
    let mut gone = Vec::new();
    funcs.retain(|f| match too_hot.contains(&f.name) {
        true => {
            gone.push(f.name.clone());
            false
        }
        false => true,
    });
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracee::exits::ExitProbe;

    #[test]
    fn functions_too_hot_in_an_earlier_escalation_are_left_out() {
        let func = |name: &str| select::Func {
            name: name.into(),
            binary: 0,
            offset: 0,
            dispatch: false,
            exit: ExitProbe::Uretprobe,
            unprobed: None,
            cost: Default::default(),
            semaphores: [0; 2],
            tails: Vec::new(),
            entry_shift: 0,
        };
        let mut funcs = vec![
            func("_PyEval_EvalFrameDefault"),
            func("parse"),
            func("PyLong_FromLong"),
        ];
        let hot: HashSet<String> = ["PyLong_FromLong", "_PyEval_EvalFrameDefault"]
            .into_iter()
            .map(String::from)
            .collect();
        let gone = without_too_hot(&mut funcs, &hot);
        assert_eq!(gone, ["_PyEval_EvalFrameDefault", "PyLong_FromLong"]);
        assert_eq!(
            funcs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["parse"]
        );
    }
}
