//! Writes a finished `record` session's files: the spine's report, JSON,
//! folded stacks, flame graph and pprof; dispatches; stages; startup.
use std::fmt::Write;

use crate::{
    analyze::cpu_profile::CpuProfile,
    analyze::dispatch::{self, Dispatcher},
    analyze::stacks::Stacks,
    analyze::stages::{self, StagesResult},
    analyze::startup::StartupReport,
    output::dispatches,
    output::html::Page,
    output::report::{self, Report},
    output::OutDir,
    text::{fmt_count, fmt_ns},
    Error, Result,
};

/// Files `record` may write (checked for symlinks before attaching).
pub const RECORD_FILES: &[&str] = &[
    "report.html",
    "report.txt",
    "functions.json",
    "trace.folded",
    "flamegraph.svg",
    "profile.pb.gz",
    "trace.json",
    "dispatches.txt",
    "dispatches.json",
    "hangs.log",
    "cpu.folded",
    "cpu.svg",
    "cpu.txt",
    "cpu.pb.gz",
    "offcpu.folded",
    "offcpu.svg",
    "offcpu.txt",
    "stages.txt",
    "stages.json",
    "startup.txt",
    "startup.json",
    "startup.folded",
    "startup.svg",
    "profile.data",
];

/// Writes `{stem}.folded` and `{stem}.svg` (a flame graph titled `title`);
/// returns the SVG.
pub fn flame(out: &OutDir, stem: &str, lines: &[String], title: &str) -> Result<Vec<u8>> {
    out.write(&format!("{stem}.folded"), folded_text(lines).as_bytes())?;
    svg_or_err(out, &format!("{stem}.svg"), lines, title)
}

fn svg_or_err(out: &OutDir, name: &str, lines: &[String], title: &str) -> Result<Vec<u8>> {
    let svg = report::flame::svg(lines, title).map_err(|reason| Error::Output {
        path: out.path().join(name),
        reason,
    })?;
    out.write(name, &svg)?;
    Ok(svg)
}

fn folded_text(lines: &[String]) -> String {
    let mut t = lines.join("\n");
    t.push('\n');
    t
}

/// `report.txt`, `functions.json`, `trace.folded`, `flamegraph.svg`,
/// `profile.pb.gz`. Prints the text report; gives the page the function
/// table and the wall-clock flame graph.
pub fn spine(out: &OutDir, report: &Report, page: &mut Page) -> Result<()> {
    let text = report::text::render(report);
    // Printed first: on a full disk the summary is still seen.
    print!("{text}");
    out.write("report.txt", text.as_bytes())?;
    out.write("functions.json", report::json::render(report).as_bytes())?;
    let folded = report::flame::folded(report);
    out.write("trace.folded", folded_text(&folded).as_bytes())?;
    out.write(
        "profile.pb.gz",
        &crate::output::export::wall_pprof(
            &folded,
            report.session.duration_ns,
            report.session.start_unix_ns,
        ),
    )?;
    let partial = if report.session.damage.is_some() {
        " (PARTIAL RECORDING: see report.txt)"
    } else {
        ""
    };
    let title = format!(
        "profiler: PID {} wall-clock by call path{partial}",
        report.session.pid
    );
    let svg = svg_or_err(out, "flamegraph.svg", &folded, &title)?;
    page.functions(report);
    page.flame("wall", &title, &svg);
    Ok(())
}

/// `dispatches.txt`, `dispatches.json`, `dispatch-<n>.svg`. Prints the text.
/// A partial recording's `damage` heads the text.
pub fn dispatches(
    out: &OutDir,
    d: &Dispatcher,
    duration_ns: u64,
    damage: Option<&str>,
    page: &mut Page,
) -> Result<()> {
    let mut text = dispatches::text(d, duration_ns);
    if let Some(damage) = damage {
        text = format!("warning: PARTIAL RECORDING: {damage}\n{text}");
    }
    out.write("dispatches.txt", text.as_bytes())?;
    let json = dispatches::json(d, duration_ns);
    out.write("dispatches.json", json.as_bytes())?;
    page.dispatches(&json, crate::output::html::group_trees(d));
    for (name, svg) in dispatches::svgs(d) {
        out.write(&name, &svg)?;
    }
    print!("\n{text}");
    Ok(())
}

/// `stages.txt` and `stages.json`. Prints the text. `session_start_ns`
/// places the runs on the page's timeline.
pub fn stages(
    out: &OutDir,
    results: &[StagesResult],
    session_start_ns: u64,
    page: &mut Page,
) -> Result<()> {
    let text = stages::render::render_text(results);
    out.write("stages.txt", text.as_bytes())?;
    let json = stages::render::render_json(results);
    out.write("stages.json", json.as_bytes())?;
    let starts = results
        .iter()
        .map(|r| {
            r.run_starts_ns
                .iter()
                .map(|s| s.saturating_sub(session_start_ns))
                .collect()
        })
        .collect();
    page.stages(&json, starts);
    print!("\n{text}");
    Ok(())
}

/// `startup.txt`, `startup.json`, and the startup window's flame graph
/// (`startup.folded`, `startup.svg`): completed calls from exec to ready.
pub fn startup(
    out: &OutDir,
    report: Option<&StartupReport>,
    ready_what: &str,
    threshold_ns: Option<u64>,
    window: &Report,
) -> Result<()> {
    let summary = crate::analyze::startup::StartupSummary::of(
        report.into_iter().cloned().collect::<Vec<_>>().as_slice(),
    );
    let mut text = summary.render_text(ready_what);
    if let (Some(r), Some(limit)) = (report, threshold_ns) {
        if let Some(ns) = r.exec_to_ready_ns.filter(|&ns| ns >= limit) {
            let _ = writeln!(
                text,
                "SLOW STARTUP: {} from exec to ready (threshold {})",
                fmt_ns(ns),
                fmt_ns(limit)
            );
            eprintln!(
                "profiler: slow startup {} (threshold {})",
                fmt_ns(ns),
                fmt_ns(limit)
            );
        }
    }
    if let Some(main) = window.stacks.thread_state(window.session.pid) {
        let names: Vec<String> = window.funcs.iter().map(|f| f.name.clone()).collect();
        let tree =
            dispatch::tree::Tree::from_calltree("startup (exec to ready)", &main.tree, &names);
        let _ = writeln!(
            text,
            "\nStartup call tree of the main thread (trimmed like a slow dispatch):"
        );
        dispatches::tree_lines(&mut text, &tree.trimmed(20, &[]));
    }
    let window_top = report::text::render(window);
    let _ = write!(text, "\nStartup window (exec to ready), calls in it (frames open at ready cut there):\n{window_top}");
    out.write("startup.txt", text.as_bytes())?;
    out.write("startup.json", summary.render_json().as_bytes())?;
    let folded = report::flame::folded(window);
    out.write("startup.folded", folded_text(&folded).as_bytes())?;
    svg_or_err(
        out,
        "startup.svg",
        &folded,
        "profiler: startup, exec to ready",
    )?;
    print!("\n{text}");
    Ok(())
}

/// Writes `offcpu.folded`, `offcpu.svg` and `offcpu.txt` (weights: ns
/// off the CPU, from switch-out to switch-in); returns the summary text.
pub fn write_offcpu(
    out: &OutDir,
    prof: &CpuProfile,
    what: &str,
    page: &mut Page,
) -> Result<String> {
    let title = format!("profiler: off-CPU time of {what} (ns blocked, by stack)");
    let svg = flame(out, "offcpu", &prof.folded, &title)?;
    page.flame("offcpu", &title, &svg);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Off-CPU time of {what}: {} blocked in total; complete stacks {:.1}%",
        fmt_ns(prof.samples),
        prof.complete_share() * 100.0
    );
    let _ = writeln!(
        text,
        "\nTop blocking frames (innermost), by time off the CPU"
    );
    for (leaf, ns) in prof.leaves.iter().take(20) {
        let _ = writeln!(
            text,
            "{:>12} {:>6.1}%  {leaf}",
            fmt_ns(*ns),
            *ns as f64 * 100.0 / prof.samples.max(1) as f64
        );
    }
    out.write("offcpu.txt", text.as_bytes())?;
    page.note(text.lines().next().unwrap_or_default());
    Ok(text)
}

/// What cpu.txt, report.html and stderr say of the unwind tables' budget.
#[derive(Debug, Default)]
pub struct UnwindNotes {
    /// Binaries samples landed in that the budget left to frame pointers,
    /// each with its share of the samples and the option to raise.
    pub warnings: Vec<String>,
    /// Samples walked by frame pointers before their binaries' tables
    /// were built, tables dropped for sampled binaries.
    pub info: Vec<String>,
}

/// The notes of `prof` on the unwind tables' budget.
pub fn unwind_notes(prof: &CpuProfile) -> UnwindNotes {
    use crate::unwind::budget::{fmt_bytes, suggest, ROW_BYTES};
    let mut notes = UnwindNotes::default();
    let Some(u) = &prof.unwinding else {
        return notes;
    };
    let pct = |n: u64| n as f64 * 100.0 / prof.samples.max(1) as f64;
    let budget = fmt_bytes(u.capacity * ROW_BYTES);
    let mut starved: Vec<(&String, &u64)> = prof.unwind_starved.iter().collect();
    starved.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if !starved.is_empty() {
        let need: u64 = starved
            .iter()
            .filter_map(|(p, _)| u.starved_rows.get(*p))
            .sum();
        let names: Vec<String> = starved
            .iter()
            .map(|(p, n)| {
                let size = u
                    .starved_rows
                    .get(*p)
                    .map(|r| format!("; its table needs about {}", fmt_bytes(r * ROW_BYTES)))
                    .unwrap_or_default();
                format!("{p} ({:.1}% of samples{size})", pct(**n))
            })
            .collect();
        notes.warnings.push(format!(
            "unwind table memory ({budget}) full: walked by frame pointers in {}; raise it with --unwind-memory (e.g. --unwind-memory {})",
            names.join(", "),
            fmt_bytes(suggest(u.rows + need).max(u.capacity * ROW_BYTES * 2)),
        ));
    }
    if prof.fp_meantime > 0 || u.dropped > 0 {
        notes.info.push(format!(
            "unwind tables for what runs: {} samples ({:.1}%) walked by frame pointers before their binaries' tables were built; {} tables of binaries no sample touched dropped for sampled ones",
            prof.fp_meantime,
            pct(prof.fp_meantime),
            u.dropped
        ));
    }
    notes
}

/// Writes `cpu.folded`, `cpu.svg` and `cpu.txt`; returns the summary text.
pub fn write_cpu(
    out: &OutDir,
    prof: &CpuProfile,
    what: &str,
    hz: u64,
    duration_ns: u64,
    page: &mut Page,
) -> Result<String> {
    let title = format!("profiler: CPU samples of {what} at {hz} Hz");
    let svg = flame(out, "cpu", &prof.folded, &title)?;
    page.flame("cpu", &title, &svg);
    let mut text = String::new();
    let (stack_lost, counts_full, dwarf_lost) = prof.lost;
    let _ = writeln!(
        text,
        "CPU samples of {what}: {} at {hz} Hz over {}; complete stacks {:.1}%; no user stack {}; \
         lost: {stack_lost} user stacks unreadable, {counts_full} samples not counted (map full), \
         {dwarf_lost} --dwarf samples dropped (ring full)",
        prof.samples,
        fmt_ns(duration_ns),
        prof.complete_share() * 100.0,
        prof.no_user_stack
    );
    let (in_eval, named) = prof.python;
    if in_eval > 0 {
        let _ = writeln!(
            text,
            "Python: {in_eval} samples in the interpreter ({}), {named} of them with Python frames ({:.1}%)",
            crate::symbolize::python::EVAL_FRAME,
            named as f64 * 100.0 / in_eval as f64
        );
    }
    let (in_js, named) = prof.javascript;
    if in_js > 0 {
        let _ = writeln!(
            text,
            "JavaScript: {in_js} samples in JavaScript code, {named} of them with every JavaScript \
             frame named ({:.1}%)",
            named as f64 * 100.0 / in_js as f64
        );
    }
    if let Some(u) = &prof.unwinding {
        let fp: Vec<String> = u
            .methods
            .iter()
            .filter(|(_, how)| *how != "tables")
            .map(|(bin, how)| format!("{bin}: {how}"))
            .collect();
        let _ = writeln!(
            text,
            "unwinding: compiled .eh_frame tables for {} binaries ({} functions, {} rows of which {} unsupported, {:.1} MiB of {:.1} MiB, {} compiled in {} ms, {} put back after eviction){}",
            u.methods.values().filter(|h| *h == "tables").count(),
            u.fdes,
            u.rows,
            u.unsupported_rows,
            (u.rows * crate::unwind::budget::ROW_BYTES) as f64 / (1 << 20) as f64,
            (u.capacity * crate::unwind::budget::ROW_BYTES) as f64 / (1 << 20) as f64,
            u.built,
            u.build_ms,
            u.reloaded,
            if fp.is_empty() {
                String::new()
            } else {
                format!("; frame pointers for {}", fp.join(", "))
            }
        );
    }
    let notes = unwind_notes(prof);
    for line in notes.warnings.iter().chain(&notes.info) {
        let _ = writeln!(text, "{line}");
    }
    for w in notes.warnings {
        page.warn(w);
    }
    if !prof.ends.is_empty() {
        let total: u64 = prof.ends.values().sum();
        let mut ends: Vec<(&String, &u64)> = prof.ends.iter().collect();
        ends.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = ends
            .iter()
            .map(|(why, n)| format!("{why} {:.1}%", **n as f64 * 100.0 / total.max(1) as f64))
            .collect();
        let _ = writeln!(text, "stack walks ended: {}", parts.join(", "));
    }
    if prof.per_pid.len() > 1 {
        let mut pids: Vec<(&u32, &u64)> = prof.per_pid.iter().collect();
        pids.sort_by(|a, b| b.1.cmp(a.1));
        let _ = writeln!(text, "\nTop processes by samples");
        let shown: Vec<(&u32, &u64)> = pids.into_iter().take(10).collect();
        // With cgroups known (system-wide), a column of them, padded.
        let width = shown
            .iter()
            .filter_map(|(p, _)| prof.cgroups.get(*p).map(String::len))
            .max();
        for (pid, n) in shown {
            // Processes that exited are counted under the first of their
            // cgroup to exit.
            let also = match prof.folded_processes.get(pid) {
                Some(k) => format!(" and {} more exited processes of its cgroup", fmt_count(*k)),
                None => String::new(),
            };
            let _ = match width {
                Some(w) => {
                    let cg = prof.cgroups.get(pid).map_or("?", String::as_str);
                    writeln!(text, "{:>10}  {cg:<w$}  PID {pid}{also}", fmt_count(*n))
                }
                None => writeln!(text, "{:>10}  PID {pid}{also}", fmt_count(*n)),
            };
        }
    }
    let _ = writeln!(text, "\nTop frames by self samples");
    for (leaf, n) in prof.leaves.iter().take(20) {
        let loc = prof
            .locations
            .get(leaf)
            .map(|l| format!("  ({l})"))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{:>10} {:>6.1}%  {leaf}{loc}",
            n,
            *n as f64 * 100.0 / prof.samples.max(1) as f64
        );
    }
    out.write("cpu.txt", text.as_bytes())?;
    // The sampling and unwinding figures: everything before the top lists.
    page.note(text.split("\n\n").next().unwrap_or_default());
    Ok(text)
}

/// Marks open frames unfinished and returns the stacks (for reports).
pub fn finished(mut s: Stacks) -> Stacks {
    s.finish();
    s
}
