//! `report.txt`: the session summary and the top functions by self and by
//! total time.
use std::fmt::Write;

use super::{active_funcs, Report};
use crate::analyze::{processes::Processes, stacks::FuncStats};
use crate::text::{fmt_ns, line_if};
use crate::tracee::exits::ExitProbe;

/// How many functions each table lists.
const TOP: usize = 20;

fn table(out: &mut String, r: &Report, title: &str, rows: &[(usize, &FuncStats)]) {
    let _ = writeln!(out, "\n{title}");
    let _ = writeln!(
        out,
        "{:>10} {:>11} {:>11} {:>11} {:>11} {:>11}  function",
        "calls", "total", "self", "min", "avg", "max"
    );
    for (i, st) in rows.iter().take(TOP) {
        let _ = writeln!(
            out,
            "{:>10} {:>11} {:>11} {:>11} {:>11} {:>11}  {}{}",
            st.calls,
            fmt_ns(st.total_ns),
            fmt_ns(st.self_ns),
            fmt_ns(st.min_ns),
            match super::avg_below_ns(st, r.session.cost_error_pct()) {
                Some(below) => format!("< {}", fmt_ns(below)),
                None => fmt_ns(st.avg_ns()),
            },
            fmt_ns(st.max_ns),
            r.funcs[*i].name,
            notes(st, &r.funcs[*i], r.detached_at(*i)),
        );
    }
    if rows.len() > TOP {
        let _ = writeln!(out, "  ... {} more in functions.json", rows.len() - TOP);
    }
}

/// What to say beside a function's row: frames without a return, and
/// functions counted at entry only.
fn notes(st: &FuncStats, f: &crate::tracee::select::Func, detached_at: Option<u64>) -> String {
    let mut parts = Vec::new();
    if st.unfinished > 0 {
        parts.push(format!("{} unfinished", st.unfinished));
    }
    if st.unwound > 0 {
        parts.push(format!("{} unwound", st.unwound));
    }
    if st.detached > 0 {
        parts.push(format!("{} closed at the detach", st.detached));
    }
    if let ExitProbe::EntryOnly(_) = f.exit {
        parts.push("entry only: no durations".to_string());
    }
    if let Some(at) = detached_at {
        parts.push(format!("partial: detached after {:.2} s", at as f64 / 1e9));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("  ({})", parts.join(", "))
    }
}

/// How many functions a process's row names.
const TOP_PER_PROCESS: usize = 3;

/// The per-process table (several processes traced).
fn processes(out: &mut String, r: &Report, ps: &Processes) {
    let how = if r.session.follow {
        " (--follow: the targets and the processes they made)"
    } else {
        ""
    };
    let _ = writeln!(out, "\nProcesses: {}{how}", ps.len());
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:>11} {:>9} {:>10} {:>15} {:>11}  program; top functions by calls",
        "pid", "ppid", "lifetime", "exit", "calls", "dispatches/slow", "max"
    );
    for p in ps.iter() {
        let lifetime = match p.end_ns {
            Some(end) => fmt_ns(end.saturating_sub(p.start_ns)),
            None => "running".to_string(),
        };
        let exit = match (p.exit_code(), p.signal()) {
            (Some(code), _) => code.to_string(),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "-".to_string(),
        };
        let mut funcs = active_funcs(&p.stacks);
        let calls: u64 = funcs.iter().map(|(_, st)| st.calls).sum();
        funcs.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(&b.0)));
        let top: Vec<String> = funcs
            .iter()
            .take(TOP_PER_PROCESS)
            .map(|(i, st)| format!("{} {}", r.funcs[*i].name, st.calls))
            .collect();
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:>11} {:>9} {:>10} {:>15} {:>11}  {}; {}",
            p.pid,
            p.ppid,
            lifetime,
            exit,
            calls,
            format!("{}/{}", p.dispatches.stats.count, p.dispatches.slow),
            fmt_ns(p.dispatches.max_ns),
            p.exe,
            if top.is_empty() {
                "no calls".to_string()
            } else {
                top.join(", ")
            }
        );
        for e in &p.execs {
            let since = match e.probed_ns {
                Some(at) => format!(
                    "its {} functions probed {} after the exec (calls before then not seen)",
                    e.probed,
                    fmt_ns(at.saturating_sub(e.ts_ns))
                ),
                None => "nothing new to probe in it".to_string(),
            };
            let _ = writeln!(out, "{:>8} exec'd {}: {since}", "", e.exe);
        }
    }
    if ps.unattributed > 0 {
        let _ = writeln!(
            out,
            "note: {} events came from threads whose process was not known (their first sighting was lost): in the totals, in no process",
            ps.unattributed
        );
    }
}

/// Whether durations leave out the probes' cost, and by how much per call.
fn probe_costs(out: &mut String, r: &Report) {
    let Some(spread) = r.session.cost_spread_pct else {
        let _ = writeln!(
            out,
            "durations are as measured, the probes' own cost included (--raw-durations, or a recording made before it was taken out)"
        );
        return;
    };
    let costs: Vec<_> = active_funcs(r.stacks)
        .into_iter()
        .map(|(i, _)| r.funcs[i].cost)
        .filter(|c| c.exit_ns > 0)
        .collect();
    let range = |f: &dyn Fn(&crate::tracee::exits::ProbeCost) -> u64| {
        let lo = costs.iter().map(f).min().unwrap_or(0);
        let hi = costs.iter().map(f).max().unwrap_or(0);
        match lo == hi {
            true => fmt_ns(lo),
            false => format!("{}-{}", fmt_ns(lo), fmt_ns(hi)),
        }
    };
    let taken: u64 = r.stacks.funcs.iter().map(|f| f.probe_ns).sum();
    if costs.is_empty() {
        let _ = writeln!(
            out,
            "durations leave out the probes' own cost, calibrated at attach (rounds on each CPU; they varied {spread:.0}%); no traced call returned, so none was taken out"
        );
        return;
    }
    let _ = writeln!(
        out,
        "durations leave out the probes' own cost, calibrated at attach (rounds on each CPU; they varied {spread:.0}%): \
         {} per traced call out of its callers' times, {} out of its own; {} in all out of the functions' \
         summed times; --raw-durations keeps it in, functions.json has both",
        range(&|c| c.hits_ns()),
        range(&|c| u64::from(c.inside_ns)),
        fmt_ns(taken)
    );
    match r.session.cost_drift_pct {
        Some(drift) if drift.abs() < 1.0 => {
            let _ = writeln!(
                out,
                "calibrated again at the end, the traced calls' hits cost the same as at attach (within 1%)"
            );
        }
        Some(drift) => {
            let _ = writeln!(
                out,
                "calibrated again at the end, the traced calls' hits cost {:.0}% {} than at attach: what was taken out may be off by that much",
                drift.abs(),
                if drift < 0.0 { "less" } else { "more" }
            );
        }
        None => {}
    }
    let error = r.session.cost_error_pct().unwrap_or(spread);
    too_cheap(out, r, error);
    uncertain(out, r, error);
}

/// The functions too cheap to time with probes: their probes cost over
/// [`super::TOO_CHEAP`] times their corrected mean, which is then given
/// as a bound.
fn too_cheap(out: &mut String, r: &Report, error: f64) {
    let rows: Vec<(usize, u64, &FuncStats)> = active_funcs(r.stacks)
        .into_iter()
        .filter_map(|(i, st)| Some((i, super::avg_below_ns(st, Some(error))?, st)))
        .collect();
    for &(i, below, st) in rows.iter().take(UNCERTAIN_LINES) {
        let measured = st.measured_avg_ns();
        let _ = writeln!(
            out,
            "too cheap to time this way: {}'s probes cost {} of its {} measured a call, over {}× \
             what is left: its mean is under {}, not a figure",
            r.funcs[i].name,
            fmt_ns(measured.saturating_sub(st.avg_ns())),
            fmt_ns(measured),
            super::TOO_CHEAP,
            fmt_ns(below)
        );
    }
    if rows.len() > UNCERTAIN_LINES {
        let _ = writeln!(
            out,
            "too cheap to time this way: {} more functions (functions.json: avg_below_ns)",
            rows.len() - UNCERTAIN_LINES
        );
    }
}

/// Functions named uncertain one by one, at most; the rest are counted.
const UNCERTAIN_LINES: usize = 5;

/// The functions whose mean is mostly correction: `spread`, the
/// calibration's uncertainty in %, of what was taken out is more than a
/// quarter of what is left.
fn uncertain(out: &mut String, r: &Report, spread: f64) {
    let mut rows: Vec<(usize, u64, &FuncStats)> = active_funcs(r.stacks)
        .into_iter()
        .filter(|(_, st)| st.calls > 0)
        .filter(|(_, st)| super::avg_below_ns(st, Some(spread)).is_none())
        .map(|(i, st)| (i, super::avg_error_ns(st, Some(spread)), st))
        .filter(|&(_, err, st)| err > 0 && err.saturating_mul(4) > st.avg_ns())
        .collect();
    // The least certain first: the largest error for what is left.
    rows.sort_by(|a, b| {
        let ratio =
            |(_, err, st): &(usize, u64, &FuncStats)| *err as f64 / st.avg_ns().max(1) as f64;
        ratio(b).total_cmp(&ratio(a)).then(a.0.cmp(&b.0))
    });
    for &(i, err, st) in rows.iter().take(UNCERTAIN_LINES) {
        let measured = st.measured_avg_ns();
        let _ = writeln!(
            out,
            "uncertain: {} averages {} a call after {} of probe cost was taken out of {} measured; \
             at the calibration's uncertainty of {spread:.0}%, the host's speed ({:.0}%) and what \
             the probes disturb that is ± {}",
            r.funcs[i].name,
            fmt_ns(st.avg_ns()),
            fmt_ns(measured.saturating_sub(st.avg_ns())),
            fmt_ns(measured),
            super::HOST_SPEED_PCT,
            fmt_ns(err)
        );
    }
    if rows.len() > UNCERTAIN_LINES {
        let _ = writeln!(
            out,
            "uncertain: {} more functions as well (functions.json: avg_error_ns)",
            rows.len() - UNCERTAIN_LINES
        );
    }
}

/// The overhead governor's lines: its budget and calibration, and every
/// function it detached, when and why.
fn governor(out: &mut String, r: &Report) {
    let Some(g) = &r.session.governor else {
        return;
    };
    let _ = writeln!(
        out,
        "overhead governor: --max-overhead {}%; a probe hit costs {:.1} µs here ({:.1} µs on a push, \
         {:.2} µs on a 5-byte nop, {:.1} µs on a 4-byte nop, {:.1} µs on endbr64, {:.1} µs at a return site, {:.1} µs a return uprobe); highest estimate {:.1}% of a thread's CPU time, {:.1}% since the last detach; {} functions detached",
        g.max_overhead_pct,
        g.cost.entry_ns / 1000.0,
        g.cost.entry_push_ns / 1000.0,
        g.cost.entry_nop_ns / 1000.0,
        g.cost.entry_nopl_ns / 1000.0,
        g.cost.entry_endbr_ns / 1000.0,
        g.cost.ret_site_ns / 1000.0,
        g.cost.uretprobe_ns / 1000.0,
        g.peak_pct,
        g.settled_pct,
        g.detached.len()
    );
    for d in &g.detached {
        let _ = writeln!(
            out,
            "  detached {} after {:.2} s: {} calls/s, est. {:.1}% of a thread's CPU time (thread {} at {:.1}%); \
             its counts stop there (partial)",
            r.funcs[d.func as usize].name,
            d.at_ns as f64 / 1e9,
            crate::text::fmt_count(d.calls_per_s as u64),
            d.overhead_pct,
            d.tid,
            d.thread_pct
        );
    }
    line_if(
        out,
        r.stacks.detached_frames() > 0,
        format_args!(
            "  {} frames of detached functions were open at the detach: their returns could no longer \
             be seen, so they closed there, marked detached (their callers closed normally)",
            r.stacks.detached_frames()
        ),
    );
    line_if(
        out,
        r.stacks.exits_after_detach > 0,
        format_args!(
            "  {} returns of detached functions came after their entry probe was gone (calls entered \
             while detaching; not counted as orphans)",
            r.stacks.exits_after_detach
        ),
    );
    if !g.protected_hot.is_empty() {
        let names: Vec<&str> = g
            .protected_hot
            .iter()
            .map(|&i| r.funcs[i as usize].name.as_str())
            .collect();
        let _ = writeln!(
            out,
            "  kept though hot (needed for --dispatch, --stage or startup): {}",
            names.join(", ")
        );
    }
}

/// Renders `report.txt`.
pub fn render(r: &Report) -> String {
    let s = &r.session;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "profiler: PID {} ({}), {} recorded, stopped: {}",
        s.pid,
        s.exe,
        fmt_ns(s.duration_ns),
        s.stop_reason
    );
    let _ = writeln!(
        out,
        "probed {} functions in {} threads; {} events, {} lost, {} orphan exits, {} unfinished frames",
        s.functions_probed,
        r.stacks.thread_count(),
        r.stacks.events,
        s.lost_events,
        r.stacks.orphan_exits(),
        r.stacks.unfinished_frames(),
    );
    if let Some(d) = &s.damage {
        let _ = writeln!(out, "warning: PARTIAL RECORDING: {d}");
    }
    line_if(
        &mut out,
        !s.exit_rule.is_empty(),
        format_args!("returns: {}", s.exit_rule),
    );
    let tails = r.stacks.tail_calls_followed;
    line_if(
        &mut out,
        tails > 0,
        format_args!(
            "note: {tails} tail calls followed: each caller stayed open until its callee returned \
             (the callee is marked [tail call] in the dispatch trees)"
        ),
    );
    let unwound = r.stacks.unwound_frames();
    line_if(
        &mut out,
        unwound > 0,
        format_args!(
            "note: {unwound} frames ended without a return (an exception, longjmp, a tail call, or a return not seen); \
             they were closed when the stack showed them gone, marked unwound"
        ),
    );
    line_if(
        &mut out,
        s.lost_events > 0,
        format_args!(
            "warning: {} events were lost because the ring buffer was full: raise --ring-size or probe fewer functions",
            s.lost_events
        ),
    );
    line_if(
        &mut out,
        s.capped > 0,
        format_args!(
            "note: {} more functions matched but were not probed (--max-funcs)",
            s.capped
        ),
    );
    line_if(
        &mut out,
        s.failed_probes > 0,
        format_args!("note: {} functions could not be probed", s.failed_probes),
    );
    for line in &s.never_mapped {
        let _ = writeln!(out, "note: {line}");
    }
    line_if(
        &mut out,
        s.untraced_children > 0,
        format_args!(
            "note: the traced processes started {} child processes that were not traced (their calls are not counted): add --follow to trace them",
            s.untraced_children
        ),
    );
    if let Some(ps) = r.processes {
        processes(&mut out, r, ps);
    }
    governor(&mut out, r);
    probe_costs(&mut out, r);
    let mut rows = r.active_funcs();
    rows.sort_by(|a, b| b.1.self_ns.cmp(&a.1.self_ns).then(a.0.cmp(&b.0)));
    table(&mut out, r, "Top functions by self time", &rows);
    rows.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
    table(&mut out, r, "Top functions by total time", &rows);
    out
}
