//! `functions.json`: the machine-readable report. Field names are a
//! contract other tools read; add fields, never rename them.
use serde::Serialize;

use super::Report;
use crate::analyze::{processes::Process, stacks::Stacks};

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
    /// Frames closed when the governor detached their function (their
    /// return could no longer be seen), at the detach.
    detached_frames: u64,
    /// Returns of functions the governor detached, seen after their entry
    /// probe was gone (not orphans).
    exits_after_detach: u64,
    /// Tail calls followed: the caller kept open until its callee
    /// returned (`docs/usage.md`, *Tail calls as written*).
    tail_calls_followed: u64,
    exit_rule: &'a str,
    /// One line per `--lib` never mapped during the session.
    libraries_never_mapped: &'a [String],
    /// Present only for a replayed recording that was cut short or
    /// damaged: what is missing; the figures cover only the part before.
    #[serde(skip_serializing_if = "Option::is_none")]
    recording_damage: Option<&'a str>,
    /// Processes the targets made that were not traced (no `--follow`).
    untraced_children: u64,
    /// What the overhead governor did; null when it was off.
    governor: Option<&'a crate::analyze::overhead::GovernorReport>,
    functions: Vec<FunctionJson<'a>>,
    threads: Vec<ThreadJson>,
    /// One section per process, when several were traced (`--follow`,
    /// several `--pid`, `--pid-of`); `functions` above sums them.
    #[serde(skip_serializing_if = "Option::is_none")]
    processes: Option<Vec<ProcessJson<'a>>>,
}

#[derive(Serialize)]
struct ProcessJson<'a> {
    pid: u32,
    ppid: u32,
    exe: &'a str,
    /// Made by a traced process (`--follow`), not a named target.
    child: bool,
    start_ns: u64,
    /// None: still running when recording stopped.
    end_ns: Option<u64>,
    /// Exit status; None when killed by a signal or still running.
    exit_code: Option<i32>,
    /// The signal that killed it.
    signal: Option<u32>,
    execs: Vec<ExecJson<'a>>,
    events: u64,
    orphan_exits: u64,
    unfinished_frames: u64,
    /// Its main thread's dispatches (the session's dispatch rule).
    dispatches: DispatchesJson,
    functions: Vec<FunctionJson<'a>>,
}

#[derive(Serialize)]
struct DispatchesJson {
    count: u64,
    /// At least `--threshold` long.
    slow: u64,
    p50_ns: u64,
    p95_ns: u64,
    max_ns: u64,
}

#[derive(Serialize)]
struct ExecJson<'a> {
    ts_ns: u64,
    exe: &'a str,
    /// When its new program's functions were probed (its calls before
    /// that were not seen); None when there was nothing new to probe.
    probed_ns: Option<u64>,
    probed_functions: usize,
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
    /// Calls closed when the governor detached the function (included in
    /// `calls`): their time runs to the detach.
    detached: u64,
    /// How returns were seen: `ret`, `uretprobe` or `entry` (no exit
    /// probe: `calls` counts entries and there are no durations).
    exit_probe: &'static str,
    /// The mean inclusive duration as measured, the probes' cost in it
    /// (`avg_ns` leaves it out).
    measured_avg_ns: u64,
    /// The probes' cost taken out of its calls' inclusive durations, summed.
    probe_ns: u64,
    /// How far `avg_ns` may be off: what was taken out of a mean call,
    /// times the larger of the calibration's spread from round to round and
    /// its move over the session, plus the host's speed (its bias), and a
    /// share of the measured call (interruptions, cold caches); 0: nothing
    /// taken out.
    avg_error_ns: u64,
    /// Too cheap to time this way (the probes cost over 10 times its
    /// corrected mean): its mean is under this bound, `avg_ns` is no
    /// figure. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    avg_below_ns: Option<u64>,
    /// What one call's probe hits cost: both whole, in its callers' times,
    /// and the part in its own.
    hits_ns: u64,
    inside_ns: u32,
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
    detached_frames: u64,
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

/// Per-function rows of `stacks`.
fn functions<'a>(r: &Report<'a>, stacks: &Stacks) -> Vec<FunctionJson<'a>> {
    super::active_funcs(stacks)
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
                detached: st.detached,
                exit_probe: f.exit.kind(),
                measured_avg_ns: st.measured_avg_ns(),
                probe_ns: st.probe_ns,
                avg_error_ns: super::avg_error_ns(st, r.session.cost_error_pct()),
                avg_below_ns: super::avg_below_ns(st, r.session.cost_error_pct()),
                hits_ns: f.cost.hits_ns(),
                inside_ns: f.cost.inside_ns,
                partial: r.detached_at(i).is_some(),
                detached_at_ns: r.detached_at(i),
            }
        })
        .collect()
}

fn process<'a>(r: &Report<'a>, p: &'a Process) -> ProcessJson<'a> {
    ProcessJson {
        pid: p.pid,
        ppid: p.ppid,
        exe: &p.exe,
        child: p.child,
        start_ns: p.start_ns,
        end_ns: p.end_ns,
        exit_code: p.exit_code(),
        signal: p.signal(),
        execs: p
            .execs
            .iter()
            .map(|e| ExecJson {
                ts_ns: e.ts_ns,
                exe: &e.exe,
                probed_ns: e.probed_ns,
                probed_functions: e.probed,
            })
            .collect(),
        events: p.stacks.events,
        orphan_exits: p.stacks.orphan_exits(),
        unfinished_frames: p.stacks.unfinished_frames(),
        dispatches: DispatchesJson {
            count: p.dispatches.stats.count,
            slow: p.dispatches.slow,
            p50_ns: p.dispatches.stats.quantile(0.5),
            p95_ns: p.dispatches.stats.quantile(0.95),
            max_ns: p.dispatches.max_ns,
        },
        functions: functions(r, &p.stacks),
    }
}

/// Renders `functions.json`.
pub fn render(r: &Report) -> String {
    let s = &r.session;
    let functions = functions(r, r.stacks);
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
            detached_frames: t.detached_frames,
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
        detached_frames: r.stacks.detached_frames(),
        exits_after_detach: r.stacks.exits_after_detach,
        tail_calls_followed: r.stacks.tail_calls_followed,
        exit_rule: &s.exit_rule,
        libraries_never_mapped: &s.never_mapped,
        recording_damage: s.damage.as_deref(),
        untraced_children: s.untraced_children,
        governor: s.governor.as_ref(),
        functions,
        threads,
        processes: r
            .processes
            .map(|ps| ps.iter().map(|p| process(r, p)).collect()),
    };
    let mut out = serde_json::to_string_pretty(&doc).expect("plain data serializes");
    out.push('\n');
    out
}
