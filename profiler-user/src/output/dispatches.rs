//! `dispatches.txt`, `dispatches.json` and `dispatch-<n>.svg`.
use std::fmt::Write;

use serde::Serialize;

use crate::analyze::dispatch::{
    hang_stack_text,
    quality::SampleQuality,
    retain::{KEEP_RECENT, KEEP_WORST},
    stats::Frames,
    tree::{FlatNode, Kind},
    wakers::{self, Waker, WakerKind},
    Dispatcher,
};
use crate::text::fmt_ns;

/// Flame graphs drawn, for the costliest groups.
pub const SVG_GROUPS: usize = 5;

#[derive(Serialize)]
struct Thread<'a> {
    tid: u32,
    name: &'a str,
}

#[derive(Serialize)]
struct BlockingJson<'a> {
    ns: u64,
    stack: &'a [String],
}

#[derive(Serialize)]
struct WakerJson<'a> {
    tid: u32,
    pid: u32,
    comm: &'a str,
    kind: WakerKind,
    label: Option<&'a str>,
    function: &'a str,
    blocked_ns: u64,
    stack: &'a [String],
    waker_on_cpu_ns: u64,
}

impl<'a> WakerJson<'a> {
    fn of(w: &'a Waker) -> Self {
        WakerJson {
            tid: w.tid,
            pid: w.pid,
            comm: &w.comm,
            kind: w.kind,
            label: w.label,
            function: &w.function,
            blocked_ns: w.blocked_ns,
            stack: &w.stack,
            waker_on_cpu_ns: w.on_cpu_ns,
        }
    }
}

#[derive(Serialize)]
struct SlowJson<'a> {
    index: u64,
    start_ns: u64,
    /// Without the probes' cost (`measured_ns - probe_ns`).
    duration_ns: u64,
    /// As measured, the probes' own cost included.
    measured_ns: u64,
    /// The probe hits' cost taken out.
    probe_ns: u64,
    /// Slow (its measured wall time over the threshold) but under the
    /// threshold without the probes' estimated cost: slow mainly because
    /// of them.
    probes_mainly: bool,
    on_cpu_ns: u64,
    blocked_ns: u64,
    runnable_ns: u64,
    dropped_frames: u64,
    key: &'a str,
    verdict: &'a str,
    samples: u32,
    truncated: bool,
    /// Frames closed when the overhead governor detached their function.
    detached_frames: u32,
    tree: &'a [FlatNode],
    blocking_stacks: Vec<BlockingJson<'a>>,
    /// Absent with `--no-wakers` (not recorded, rather than none found).
    #[serde(skip_serializing_if = "Option::is_none")]
    wakers: Option<Vec<WakerJson<'a>>>,
    /// Who woke the loop out of its wait before it: the iteration's
    /// source (absent where not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<WakerJson<'a>>,
}

/// The in-dispatch sampler's stack quality.
#[derive(Serialize)]
struct SamplerJson<'a> {
    samples: u64,
    complete_stacks_share: f64,
    no_user_stack: u64,
    walks_ended: &'a std::collections::BTreeMap<&'static str, u64>,
    /// Samples that carry CPython frames.
    with_python_frames: u64,
    /// Samples that carry V8's JavaScript frames.
    with_javascript_frames: u64,
}

#[derive(Serialize)]
struct GroupJson<'a> {
    key: &'a str,
    count: u64,
    total_ns: u64,
    max_ns: u64,
    p95_ns: u64,
    /// False when the group outgrew its exact durations: the p95 then
    /// comes from a histogram (within 1%).
    p95_exact: bool,
    verdict: &'a str,
    svg: Option<String>,
}

#[derive(Serialize)]
struct HangJson<'a> {
    index: u64,
    start_ns: u64,
    reported_after_ns: u64,
    duration_ns: Option<u64>,
    stack: &'a [String],
}

#[derive(Serialize)]
struct WorstJson<'a> {
    index: u64,
    start_ns: u64,
    duration_ns: u64,
    key: &'a str,
}

#[derive(Serialize)]
struct DispatchesJson<'a> {
    rule: &'a str,
    /// CLOCK_MONOTONIC at the session start: every `start_ns` counts from
    /// it (add it to compare with the target's own monotonic clock).
    session_start_ns: u64,
    thread: Thread<'a>,
    threshold_ns: u64,
    hang_ns: u64,
    frame_interval_ns: u64,
    /// Who woke the thread was recorded (false with `--no-wakers`).
    wakers_recorded: bool,
    dispatches: u64,
    dispatches_per_sec: f64,
    p50_ns: u64,
    p95_ns: u64,
    p99_ns: u64,
    slow_not_detailed: u64,
    /// Slow dispatches counted in the group of keys beyond the limit.
    slow_in_other_keys: u64,
    hangs_not_listed: u64,
    /// Dispatches whose outermost frame was of a function the governor
    /// detached: they ended at the detach (their return could not be seen).
    ended_by_detach: u64,
    /// Dispatches whose outermost return was never seen (a later call's
    /// stack pointer proved the frame gone): they end at their last traced
    /// event.
    ended_unseen: u64,
    /// Dispatches that began after the session stopped, while its probes
    /// were being detached: not counted or analysed.
    started_after_stop: u64,
    /// The probes' cost taken out of all dispatches' durations, in ns.
    probe_ns: u64,
    /// Slow dispatches (wall time over the threshold) under it once the
    /// probes' estimated cost is out: counted slow, flagged
    /// (`probes_mainly`).
    slow_only_with_probes: u64,
    sampler: SamplerJson<'a>,
    slow: Vec<SlowJson<'a>>,
    groups: Vec<GroupJson<'a>>,
    hangs: Vec<HangJson<'a>>,
    frames: Frames,
    worst: Vec<WorstJson<'a>>,
    /// With event-loop iterations: the loop's idle time.
    #[serde(skip_serializing_if = "Option::is_none")]
    event_loop: Option<LoopJson>,
}

/// The event loop's idle time (time in its own wait), as libuv's
/// `uv_metrics_idle_time`.
#[derive(Serialize)]
struct LoopJson {
    /// Returns from the loop's own wait.
    loop_waits: u64,
    /// Returns from other waits (inside iterations: blocked time).
    inner_waits: u64,
    /// Idle nanoseconds in each second of the session.
    idle_ns_per_second: Vec<u64>,
}

/// Name of the flame graph of the `rank`-th group (0-based), if drawn.
pub fn svg_name(rank: usize) -> Option<String> {
    (rank < SVG_GROUPS).then(|| format!("dispatch-{}.svg", rank + 1))
}

fn key_of(d: &Dispatcher, index: u64) -> &str {
    d.slow
        .iter()
        .find(|s| s.index == index)
        .map_or("", |s| s.key.as_str())
}

/// Renders `dispatches.json`.
pub fn json(d: &Dispatcher, duration_ns: u64) -> String {
    let groups = d.sorted_groups();
    let doc = DispatchesJson {
        event_loop: d.by_waits().then(|| LoopJson {
            loop_waits: d.loop_wait.loop_waits,
            inner_waits: d.loop_wait.inner_waits,
            idle_ns_per_second: d.loop_wait.idle_per_second(None),
        }),
        rule: &d.rule(),
        session_start_ns: d.session_start_ns(),
        thread: Thread {
            tid: d.cfg.tid,
            name: &d.cfg.thread_name,
        },
        threshold_ns: d.cfg.threshold_ns,
        hang_ns: d.cfg.hang_ns,
        frame_interval_ns: d.cfg.frame_interval_ns,
        wakers_recorded: d.cfg.wakers,
        dispatches: d.stats.count,
        dispatches_per_sec: d.stats.count as f64 / (duration_ns.max(1) as f64 / 1e9),
        p50_ns: d.stats.quantile(0.50),
        p95_ns: d.stats.quantile(0.95),
        p99_ns: d.stats.quantile(0.99),
        slow_not_detailed: d.slow_dropped,
        slow_in_other_keys: d.groups_merged,
        hangs_not_listed: d.hangs_dropped,
        ended_by_detach: d.ended_by_detach,
        ended_unseen: d.ended_unseen,
        started_after_stop: d.started_after_stop,
        probe_ns: d.probe_ns,
        slow_only_with_probes: d.slow_only_with_probes,
        sampler: SamplerJson {
            samples: d.quality.samples,
            complete_stacks_share: d.quality.complete_share(),
            no_user_stack: d.quality.no_user_stack,
            walks_ended: &d.quality.ends,
            with_python_frames: d.quality.python,
            with_javascript_frames: d.quality.javascript,
        },
        slow: d
            .slow
            .iter()
            .map(|s| SlowJson {
                index: s.index,
                start_ns: s.start_ns,
                duration_ns: s.duration_ns,
                measured_ns: s.duration_ns + s.probe_ns,
                probe_ns: s.probe_ns,
                probes_mainly: s.probes_mainly,
                on_cpu_ns: s.split.on_cpu_ns,
                blocked_ns: s.split.blocked_ns,
                runnable_ns: s.split.runnable_ns,
                dropped_frames: s.dropped_frames,
                key: &s.key,
                verdict: &s.verdict,
                samples: s.samples,
                truncated: s.truncated,
                detached_frames: s.detached_frames,
                tree: &s.tree,
                blocking_stacks: s
                    .blocking_stacks
                    .iter()
                    .map(|(ns, stack)| BlockingJson { ns: *ns, stack })
                    .collect(),
                wakers: d
                    .cfg
                    .wakers
                    .then(|| s.wakers.iter().map(WakerJson::of).collect()),
                source: s.source.as_ref().map(WakerJson::of),
            })
            .collect(),
        groups: groups
            .iter()
            .enumerate()
            .map(|(rank, g)| GroupJson {
                key: &g.key,
                count: g.count(),
                total_ns: g.total_ns(),
                max_ns: g.max_ns(),
                p95_ns: g.durations.p95_ns(),
                p95_exact: g.durations.p95_exact(),
                verdict: &g.verdict,
                svg: svg_name(rank),
            })
            .collect(),
        hangs: d
            .hangs
            .iter()
            .map(|h| HangJson {
                index: h.index,
                start_ns: h.start_ns,
                reported_after_ns: h.reported_after_ns,
                duration_ns: h.duration_ns,
                stack: &h.stack,
            })
            .collect(),
        frames: d.stats.frames,
        worst: d
            .stats
            .worst()
            .into_iter()
            .map(|w| WorstJson {
                index: w.index,
                start_ns: w.start_ns,
                duration_ns: w.duration_ns,
                key: key_of(d, w.index),
            })
            .collect(),
    };
    let mut out = serde_json::to_string_pretty(&doc).expect("plain data serializes");
    out.push('\n');
    out
}

/// Writes a pre-order tree as `<dots for depth>name Nx total (self s)` lines.
pub fn tree_lines(out: &mut String, tree: &[FlatNode]) {
    for n in tree {
        // A traced node counts its calls; the others are not calls: a
        // sampled leaf counts its samples, a blocked leaf its waits.
        let plural = |n: u64, one: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {one}s")
            }
        };
        let (count, marker) = match n.kind {
            Kind::Traced => (format!(" {}x", n.calls), String::new()),
            Kind::Sampled if n.calls > 0 => (
                String::new(),
                format!("  [sampled: {}]", plural(n.calls, "sample")),
            ),
            Kind::Sampled => (String::new(), "  [sampled]".into()),
            Kind::Blocked if n.calls > 0 => (
                String::new(),
                format!("  [blocked: {}]", plural(n.calls, "wait")),
            ),
            Kind::Blocked => (String::new(), "  [blocked]".into()),
            Kind::Waker => (String::new(), "  [waker]".into()),
        };
        let approx = if n.kind == Kind::Sampled { "~" } else { "" };
        let detached = match n.detached {
            0 => String::new(),
            d if d == n.calls => "  [detached]".into(),
            d => format!("  [{d} detached]"),
        };
        let tail = match n.tail_calls {
            0 => String::new(),
            t if t == n.calls => "  [tail call]".into(),
            t => format!("  [{t} tail calls]"),
        };
        let _ = writeln!(
            out,
            "    {}{}{count} {}{} (self {}{}){marker}{detached}{tail}",
            ".".repeat(n.depth as usize),
            n.name,
            approx,
            fmt_ns(n.total_ns),
            approx,
            fmt_ns(n.self_ns),
        );
    }
}

/// `  woken by …` lines: who ended the blocked time, where, and what it
/// did meanwhile.
pub fn waker_lines(out: &mut String, wakers: &[Waker]) {
    for w in wakers {
        let _ = write!(out, "  woken by {}", w.who());
        if matches!(w.kind, WakerKind::Thread | WakerKind::Process) {
            let _ = write!(out, " in {}", w.function);
        }
        let _ = write!(out, ": blocked {}", fmt_ns(w.blocked_ns));
        if w.kind == WakerKind::Thread {
            let _ = write!(
                out,
                ", waker on-CPU ~{} ({}%)",
                fmt_ns(w.on_cpu_ns),
                (w.on_cpu_ns * 100).checked_div(w.blocked_ns).unwrap_or(0)
            );
            if let Some(h) = &w.hot {
                let _ = write!(out, ", mostly in {h}");
            }
        }
        let _ = writeln!(out);
    }
}

/// Renders `dispatches.txt`.
pub fn text(d: &Dispatcher, duration_ns: u64) -> String {
    let mut out = String::new();
    let slow_count: u64 = d.groups.values().map(|g| g.count()).sum();
    let _ = writeln!(
        out,
        "dispatches on thread {} ({}): {} in {}, {:.1}/s; {} slow (>= {}); rule: {}",
        d.cfg.tid,
        d.cfg.thread_name,
        d.stats.count,
        fmt_ns(duration_ns),
        d.stats.count as f64 / (duration_ns.max(1) as f64 / 1e9),
        slow_count,
        fmt_ns(d.cfg.threshold_ns),
        d.rule()
    );
    let _ = writeln!(
        out,
        "duration p50 {}  p95 {}  p99 {}",
        fmt_ns(d.stats.quantile(0.5)),
        fmt_ns(d.stats.quantile(0.95)),
        fmt_ns(d.stats.quantile(0.99))
    );
    if d.by_waits() {
        let idle: u64 = d.loop_wait.idle_per_second(None).iter().sum();
        let _ = writeln!(
            out,
            "event loop: idle (in its wait) {} of {}, busy {:.1}%; per second in dispatches.json \
             and trace.json",
            fmt_ns(idle),
            fmt_ns(duration_ns),
            100.0 - idle as f64 * 100.0 / duration_ns.max(1) as f64
        );
    }
    if d.probe_ns > 0 {
        let _ = writeln!(
            out,
            "durations leave out the probes' own cost: {} taken out of all dispatches \
             (--raw-durations keeps it in; dispatches.json has both)",
            fmt_ns(d.probe_ns)
        );
    }
    if d.slow_only_with_probes > 0 {
        let _ = writeln!(
            out,
            "{} slow dispatches were over the threshold only with the probes' estimated cost in \
             them: counted slow (the threshold judges the wall time the user felt), their verdicts \
             say \"slow mainly because of them\" (dispatches.json: probes_mainly)",
            d.slow_only_with_probes
        );
    }
    if d.cfg.sample_period_ns > 0 {
        let _ = writeln!(out, "{}", sampler_line(&d.quality));
    }
    if !d.cfg.wakers {
        let _ = writeln!(out, "wakers: not recorded (--no-wakers)");
    }
    if d.ended_by_detach > 0 {
        let _ = writeln!(
            out,
            "{} dispatches ended when the overhead governor detached their function: its return \
             could no longer be seen, so they end at the detach",
            d.ended_by_detach
        );
    }
    if d.ended_unseen > 0 {
        let _ = writeln!(
            out,
            "{} dispatches ended without their return seen (a later call showed the frame gone): \
             they end at their last traced event",
            d.ended_unseen
        );
    }
    if d.started_after_stop > 0 {
        let _ = writeln!(
            out,
            "{} dispatches began after the session stopped, while its probes were being \
             detached: not counted",
            d.started_after_stop
        );
    }
    if d.slow_dropped > 0 {
        let _ = writeln!(
            out,
            "slow dispatches in detail: {} of {} (the {KEEP_WORST} longest of each group and the \
             last {KEEP_RECENT}); the other {} are in their groups' counts, totals and p95",
            d.slow.len(),
            slow_count,
            d.slow_dropped
        );
    }
    if d.groups_merged > 0 {
        let _ = writeln!(
            out,
            "{} slow dispatches had keys beyond the first {} groups: counted in one group",
            d.groups_merged,
            crate::analyze::dispatch::retain::MAX_GROUPS
        );
    }
    let groups = d.sorted_groups();
    let _ = writeln!(out, "\nSlow dispatch groups, by total time");
    if groups.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for (rank, g) in groups.iter().enumerate() {
        let _ = writeln!(
            out,
            "\n#{} [{}] count {}  total {}  max {}  p95 {}{}{}",
            rank + 1,
            g.key,
            g.count(),
            fmt_ns(g.total_ns()),
            fmt_ns(g.max_ns()),
            if g.durations.p95_exact() { "" } else { "~" },
            fmt_ns(g.durations.p95_ns()),
            svg_name(rank)
                .map(|s| format!("  ({s})"))
                .unwrap_or_default()
        );
        let _ = writeln!(out, "  verdict: {}", g.verdict);
        waker_lines(&mut out, &g.worst_wakers);
        if let Some(s) = &g.worst_source {
            let _ = writeln!(
                out,
                "  started by {} (who woke the loop out of its wait)",
                wakers::source_text(s)
            );
        }
        let _ = writeln!(out, "  worst instance:");
        tree_lines(&mut out, &g.worst_tree);
    }
    let _ = writeln!(out, "\nHangs (over {})", fmt_ns(d.cfg.hang_ns));
    if d.hangs.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for h in &d.hangs {
        let _ = writeln!(
            out,
            "  dispatch #{} at +{}: reported after {}, {}; stack: {}",
            h.index,
            fmt_ns(h.start_ns),
            fmt_ns(h.reported_after_ns),
            h.duration_ns
                .map_or("still running at the end".to_string(), |ns| format!(
                    "lasted {}",
                    fmt_ns(ns)
                )),
            hang_stack_text(&h.stack)
        );
    }
    if d.hangs_dropped > 0 {
        let _ = writeln!(
            out,
            "  … and {} more hangs, counted only (the first {} are listed)",
            d.hangs_dropped,
            d.hangs.len()
        );
    }
    let f = d.stats.frames;
    let _ = writeln!(
        out,
        "\nFrames (interval {}): dropped frames per dispatch",
        fmt_ns(d.cfg.frame_interval_ns)
    );
    let _ = writeln!(
        out,
        "  best (<3) {}  normal (>=3) {}  middle (>=9) {}  high (>=24) {}  frozen (>=42) {}",
        f.best, f.normal, f.middle, f.high, f.frozen
    );
    let _ = writeln!(out, "\nWorst dispatches");
    for w in d.stats.worst() {
        let _ = writeln!(
            out,
            "  #{:<8} at +{:<10} {:>10}  {}",
            w.index,
            fmt_ns(w.start_ns),
            fmt_ns(w.duration_ns),
            key_of(d, w.index)
        );
    }
    out
}

/// The in-dispatch sampler's quality figures, as cpu.txt gives them for the
/// CPU profile.
fn sampler_line(q: &SampleQuality) -> String {
    let mut line = format!(
        "in-dispatch samples: {}; complete stacks {:.1}%; no user stack {}",
        q.samples,
        q.complete_share() * 100.0,
        q.no_user_stack
    );
    if !q.ends.is_empty() {
        let ends: Vec<String> = q.ends.iter().map(|(why, n)| format!("{why} {n}")).collect();
        let _ = write!(line, "; stack walks ended: {}", ends.join(", "));
    }
    if q.python > 0 {
        let _ = write!(line, "; with Python frames {}", q.python);
    }
    if q.javascript > 0 {
        let _ = write!(line, "; with JavaScript frames {}", q.javascript);
    }
    line
}

/// The flame graphs of the costliest groups: `(file name, svg)`.
pub fn svgs(d: &Dispatcher) -> Vec<(String, Vec<u8>)> {
    d.sorted_groups()
        .iter()
        .enumerate()
        .filter_map(|(rank, g)| {
            let name = svg_name(rank)?;
            let title = format!("slow dispatch [{}]: worst of {}", g.key, g.count());
            crate::output::report::flame::svg(&g.worst_folded, &title)
                .ok()
                .map(|svg| (name, svg))
        })
        .collect()
}
