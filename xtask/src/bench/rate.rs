//! Benchmark c: the highest event rate the profiler sustains with no loss.
//!
//! The nop fixture runs paced in 1 ms batches at a target call rate for a
//! fixed time; the rate doubles until events are lost or the traced fixture
//! cannot keep up, then two bisection steps refine the boundary.

use std::fmt::Write as _;
use std::path::Path;

use super::run::{run, With};

/// One sweep: a thread count and an optional `--ring-size`.
pub struct Sweep {
    pub threads: u32,
    pub ring: Option<u64>,
    /// `--rings` (None: the default).
    pub rings: Option<&'static str>,
    /// Highest achieved events/s (2 per call) with lost_events == 0.
    pub best: Option<Step>,
    /// Lowest rate that lost events.
    pub first_loss: Option<Step>,
    /// The fixture could not reach the target rate while traced.
    pub saturated: bool,
    pub error: Option<String>,
}

#[derive(Clone, Copy)]
pub struct Step {
    pub events_per_s: f64,
    pub lost: u64,
    pub events: u64,
}

/// Run one sweep, `secs` seconds per step.
pub fn sweep(bin: &Path, threads: u32, ring: Option<u64>, secs: f64, work: &Path) -> Sweep {
    sweep_rings(bin, threads, ring, None, secs, work)
}

/// [`sweep`] with `--rings rings`.
pub fn sweep_rings(
    bin: &Path,
    threads: u32,
    ring: Option<u64>,
    rings: Option<&'static str>,
    secs: f64,
    work: &Path,
) -> Sweep {
    let mut s = Sweep {
        threads,
        ring,
        rings,
        best: None,
        first_loss: None,
        saturated: false,
        error: None,
    };
    let mut extra: Vec<String> = ring
        .map(|r| vec!["--ring-size".into(), r.to_string()])
        .unwrap_or_default();
    if let Some(m) = rings {
        extra.extend(["--rings".into(), m.into()]);
    }
    let out = work.join(format!("prof-rate-{threads}t"));
    // Target calls/s over all threads.
    let mut lo = 0.0_f64;
    let mut hi: Option<f64> = None;
    let mut target = 100_000.0_f64;
    for _ in 0..10 {
        let per_thread = target / threads as f64;
        let iters = (per_thread * secs / 3.0).max(1.0) as u64;
        let args = vec![
            iters.to_string(),
            threads.to_string(),
            format!("{per_thread:.0}"),
        ];
        let t0 = std::time::Instant::now();
        let r = match run(
            bin,
            &args,
            With::Profiler {
                out: out.clone(),
                extra: &extra,
            },
        ) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("bench: rate step failed: {e:#}");
                s.error = Some(super::percall::one_line(&e));
                break;
            }
        };
        let achieved = r.get("calls_per_s");
        let step = Step {
            events_per_s: 2.0 * achieved,
            lost: r.lost.unwrap_or(u64::MAX),
            events: r.events.unwrap_or(0),
        };
        let complete = r.seen_calls == Some(r.expected_calls());
        eprintln!(
            "bench: rate {threads} thread(s) ring {ring:?} {rings:?}: target {:.0} calls/s, achieved {achieved:.0}, \
             events {}, lost {}, calls {:?}/{} ({:.1} s)",
            target,
            step.events,
            step.lost,
            r.seen_calls,
            r.expected_calls(),
            t0.elapsed().as_secs_f64()
        );
        if step.lost == 0 && complete {
            if s.best.is_none_or(|b| b.events_per_s < step.events_per_s) {
                s.best = Some(step);
            }
            lo = target;
            if achieved < 0.85 * target {
                s.saturated = true;
                break;
            }
        } else {
            if s.first_loss
                .is_none_or(|f| f.events_per_s > step.events_per_s)
            {
                s.first_loss = Some(step);
            }
            hi = Some(target);
        }
        target = match hi {
            None => target * 2.0,
            Some(h) if lo == 0.0 && h > 10_000.0 => h / 4.0,
            Some(_) if lo == 0.0 => break,
            Some(h) if h / lo.max(1.0) > 1.2 => (lo * h).sqrt(),
            Some(_) => break,
        };
    }
    s
}

pub fn rows(sweeps: &[Sweep]) -> String {
    let mut s = String::from(
        "| threads | ring size | highest zero-loss rate | lowest lossy rate | note |\n\
         | ---: | --- | ---: | ---: | --- |\n",
    );
    for w in sweeps {
        let [ring, best, loss, note] = cells(w, " (tracing cost bound)");
        writeln!(s, "| {} | {ring} | {best} | {loss} | {note} |", w.threads).unwrap();
    }
    s
}

/// A sweep's ring size, highest zero-loss rate, lowest lossy rate and note
/// (`saturated` is appended to the note when the fixture was the limit).
pub fn cells(w: &Sweep, saturated: &str) -> [String; 4] {
    let ring = w
        .ring
        .map_or("default".into(), |r| format!("{} KiB", r >> 10));
    let best = w.best.map_or("—".into(), |b| {
        format!("{:.2} M events/s", b.events_per_s / 1e6)
    });
    let loss = w.first_loss.map_or("—".into(), |f| {
        format!(
            "{:.2} M events/s ({} of {} lost)",
            f.events_per_s / 1e6,
            f.lost,
            f.events + f.lost
        )
    });
    let note = match (&w.error, w.saturated) {
        (Some(e), _) => format!("error: {e}"),
        (None, true) => format!("no loss; the traced fixture could not go faster{saturated}"),
        (None, false) if w.first_loss.is_some() => "loss bound".into(),
        (None, false) => String::new(),
    };
    [ring, best, loss, note]
}
