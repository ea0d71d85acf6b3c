//! `functions.json`: the machine-readable report. Field names are a
//! contract other tools read; add fields, never rename them.
use serde::Serialize;

use super::Report;

#[derive(Serialize)]
struct FunctionsJson<'a> {
    pid: u32,
    exe: &'a str,
    duration_ns: u64,
    stop_reason: &'a str,
    functions_probed: usize,
    functions_capped: usize,
    failed_probes: usize,
    events: u64,
    lost_events: u64,
    orphan_exits: u64,
    unfinished_frames: u64,
    unwound_frames: u64,
    /// Returns of functions the governor detached, seen after their entry
    /// probe was gone (not orphans).
    exits_after_detach: u64,
    exit_rule: &'a str,
    /// One line per `--lib` never mapped during the session.
    libraries_never_mapped: &'a [String],
    /// Present only for a replayed recording that was cut short or
    /// damaged: what is missing; the figures cover only the part before.
    #[serde(skip_serializing_if = "Option::is_none")]
    recording_damage: Option<&'a str>,
    /// What the overhead governor did; null when it was off.
    governor: Option<&'a crate::analyze::overhead::GovernorReport>,
    functions: Vec<FunctionJson<'a>>,
    threads: Vec<ThreadJson>,
}

#[derive(Serialize)]
struct FunctionJson<'a> {
    name: &'a str,
    binary: String,
    calls: u64,
    total_ns: u64,
    self_ns: u64,
    min_ns: u64,
    avg_ns: u64,
    max_ns: u64,
    unfinished: u64,
    /// Calls closed without a return (included in `calls`).
    unwound: u64,
    /// How returns were seen: `ret`, `uretprobe` or `entry` (no exit
    /// probe: `calls` counts entries and there are no durations).
    exit_probe: &'static str,
    /// True when the overhead governor detached it: its counts stop at
    /// `detached_at_ns`.
    partial: bool,
    /// When it was detached, in ns after the session's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    detached_at_ns: Option<u64>,
}

#[derive(Serialize)]
struct ThreadJson {
    tid: u32,
    name: String,
    events: u64,
    orphan_exits: u64,
    unfinished_frames: u64,
    unwound_frames: u64,
    /// For the aggregate of exited threads of one name: how many (0: a
    /// live thread, reported on its own).
    exited_threads: u64,
    functions: Vec<ThreadFunctionJson>,
}

#[derive(Serialize)]
struct ThreadFunctionJson {
    name: String,
    calls: u64,
    total_ns: u64,
    self_ns: u64,
}

/// Per-function aggregates of one thread, derived from its call tree.
fn thread_functions(
    r: &Report,
    t: &crate::analyze::stacks::ThreadState,
) -> Vec<ThreadFunctionJson> {
    let mut acc: std::collections::BTreeMap<u32, (u64, u64, u64)> = Default::default();
    for (id, n) in t.tree.nodes().iter().enumerate().skip(1) {
        let e = acc.entry(n.func).or_default();
        e.0 += n.calls;
        e.2 += n.self_ns;
        if !t.tree.has_ancestor(id as u32, n.func) {
            e.1 += n.total_ns;
        }
    }
    acc.into_iter()
        .filter(|(_, (calls, _, _))| *calls > 0)
        .map(|(f, (calls, total_ns, self_ns))| ThreadFunctionJson {
            name: r.funcs[f as usize].name.clone(),
            calls,
            total_ns,
            self_ns,
        })
        .collect()
}

/// Renders `functions.json`.
pub fn render(r: &Report) -> String {
    let s = &r.session;
    let functions = r
        .active_funcs()
        .into_iter()
        .map(|(i, st)| {
            let f = &r.funcs[i];
            FunctionJson {
                name: &f.name,
                binary: r.binaries[f.binary as usize].path.display().to_string(),
                calls: st.calls,
                total_ns: st.total_ns,
                self_ns: st.self_ns,
                min_ns: st.min_ns,
                avg_ns: st.avg_ns(),
                max_ns: st.max_ns,
                unfinished: st.unfinished,
                unwound: st.unwound,
                exit_probe: f.exit.kind(),
                partial: r.detached_at(i).is_some(),
                detached_at_ns: r.detached_at(i),
            }
        })
        .collect();
    let mut threads: Vec<ThreadJson> = r
        .stacks
        .threads()
        .map(|t| ThreadJson {
            tid: t.tid,
            name: r.name_of(t),
            events: t.events,
            orphan_exits: t.orphan_exits,
            unfinished_frames: t.unfinished_frames,
            unwound_frames: t.unwound_frames,
            exited_threads: t.exited_threads,
            functions: thread_functions(r, t),
        })
        .collect();
    threads.sort_by_key(|t| t.tid);
    let doc = FunctionsJson {
        pid: s.pid,
        exe: &s.exe,
        duration_ns: s.duration_ns,
        stop_reason: &s.stop_reason,
        functions_probed: s.functions_probed,
        functions_capped: s.capped,
        failed_probes: s.failed_probes,
        events: r.stacks.events,
        lost_events: s.lost_events,
        orphan_exits: r.stacks.orphan_exits(),
        unfinished_frames: r.stacks.unfinished_frames(),
        unwound_frames: r.stacks.unwound_frames(),
        exits_after_detach: r.stacks.exits_after_detach,
        exit_rule: &s.exit_rule,
        libraries_never_mapped: &s.never_mapped,
        recording_damage: s.damage.as_deref(),
        governor: s.governor.as_ref(),
        functions,
        threads,
    };
    let mut out = serde_json::to_string_pretty(&doc).expect("plain data serializes");
    out.push('\n');
    out
}
