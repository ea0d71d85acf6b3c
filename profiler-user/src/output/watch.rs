//! What `profiler watch` writes, as data: one [`StallLine`] per stall in
//! `stalls.jsonl`, the full [`StallReport`] of a group's first and worst
//! stalls (`groups/G/NAME.json`, rendered as `NAME.txt` and `NAME.svg`),
//! and the groups' summary ([`GroupsFile`], `groups.json`). `watch` writes
//! them as stalls happen; `profiler report DIR` renders the reports again
//! from their JSON, offline.
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::{
    analyze::dispatch::tree::{FlatNode, Kind},
    text::fmt_ns,
};

/// The most nodes a line's `call_tree` holds (the tree is trimmed to its
/// heaviest paths before; this bounds a line whatever `--full-tree` says).
pub const MAX_LINE_NODES: usize = 200;

/// One node of a stall's call tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The function, or `[blocked] …` / `[waited for: …]` pseudo-frames.
    pub name: String,
    /// Calls (traced), samples (sampled) or waits (blocked).
    pub calls: u64,
    /// Inclusive time, ns (estimated from samples for a sampled node).
    pub total_ns: u64,
    /// Self time, ns.
    pub self_ns: u64,
    /// `traced`, `sampled`, `blocked` or `waker`.
    pub kind: String,
    /// Callees, heaviest first as the tree orders them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Node>,
}

/// A dispatch's pre-order tree (depth 0 its root) as nested nodes; the
/// root is a synthetic `(iteration)` node when the tree has several roots.
/// At most `max` nodes are kept (pre-order: the heaviest paths first).
pub fn nest(tree: &[FlatNode], duration_ns: u64, max: usize) -> Option<Node> {
    fn kind(k: Kind) -> &'static str {
        match k {
            Kind::Traced => "traced",
            Kind::Sampled => "sampled",
            Kind::Blocked => "blocked",
            Kind::Waker => "waker",
        }
    }
    let mut root = Node {
        name: "(iteration)".into(),
        calls: 1,
        total_ns: duration_ns,
        self_ns: 0,
        kind: "iteration".into(),
        children: Vec::new(),
    };
    // The path of open nodes, as indices into each level's children.
    let mut path: Vec<usize> = Vec::new();
    for n in tree.iter().take(max) {
        let depth = n.depth as usize;
        path.truncate(depth);
        let mut parent = &mut root;
        for &i in &path {
            parent = &mut parent.children[i];
        }
        if path.len() < depth {
            // A node deeper than the one before it plus one: hung under it.
            continue;
        }
        parent.children.push(Node {
            name: n.name.clone(),
            calls: n.calls,
            total_ns: n.total_ns,
            self_ns: n.self_ns,
            kind: kind(n.kind).into(),
            children: Vec::new(),
        });
        path.push(parent.children.len() - 1);
    }
    if root.children.is_empty() {
        return None;
    }
    let covered: u64 = root.children.iter().map(|c| c.total_ns).sum();
    root.self_ns = duration_ns.saturating_sub(covered);
    Some(root)
}

/// One line of `stalls.jsonl`: a stall, told within a second of its end
/// (or a hang, told while it runs: `hang` true, and told again when it
/// ends).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StallLine {
    /// The process.
    pub pid: u32,
    /// The watched thread.
    pub tid: u32,
    /// Its process's name.
    pub comm: String,
    /// Its executable.
    pub exe: String,
    /// The stall's ordinal among the thread's iterations since the watch
    /// of this process began.
    pub index: u64,
    /// Its start, CLOCK_MONOTONIC, ns.
    pub start_ns: u64,
    /// Its start, wall clock, RFC 3339 UTC.
    pub time: String,
    /// Wall time, ns (for a hang still running: how long so far).
    pub duration_ns: u64,
    /// On a CPU, ns.
    pub on_cpu_ns: u64,
    /// Blocked, ns.
    pub blocked_ns: u64,
    /// Waiting for a CPU, ns.
    pub runnable_ns: u64,
    /// The group key, as `record` names it.
    pub key: String,
    /// The group's stable id: the same key gives the same id, in every
    /// process and every run.
    pub group: String,
    /// One-line verdict.
    pub verdict: String,
    /// Who woke it where it blocked the most, if it blocked.
    pub waker: Option<String>,
    /// Who woke the loop out of its wait before it (the iteration's
    /// source: a notifier thread, a producer, a timer), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `sampled` (from the flight recorder's samples) or `traced` (exact,
    /// from uprobes).
    pub tree: String,
    /// What its group's escalation probed in it: the functions traced all
    /// through a traced stall, or why a stall begun with them on is not
    /// traced (the overhead governor took some off while it ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<String>,
    /// The probes' time taken out of `duration_ns` (its wall time is the
    /// sum): its hits' calibrated cost, or its samples in uprobe handling.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub probe_ns: u64,
    /// Samples taken inside it.
    pub samples: u32,
    /// True on the line told while a hang still runs.
    #[serde(default)]
    pub hang: bool,
    /// Why its figures may be incomplete (events lost, the agent behind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertain: Option<String>,
    /// Past `--max-reports-per-hour` for its group: no call tree, no report.
    #[serde(default, skip_serializing_if = "is_false")]
    pub rate_limited: bool,
    /// Its full report, relative to the output directory, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
    /// The call tree, `{name, calls, total_ns, children}` nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_tree: Option<Node>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A stall's full report: its line, and what a line leaves out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StallReport {
    /// The stall.
    pub line: StallLine,
    /// Folded stacks of its whole tree (ns), for its flame graph.
    pub folded: Vec<String>,
    /// Folded stacks (sample counts) of what the thread did in the
    /// `keep_ns` before the stall began, from the flight recorder.
    pub before: Vec<String>,
    /// How far back `before` looks, ns.
    pub keep_ns: u64,
    /// Where it blocked the most: ns and frames, innermost first.
    pub blocking_stacks: Vec<(u64, Vec<String>)>,
    /// Who woke it, one line each.
    pub wakers: Vec<String>,
}

/// The text of a report (`NAME.txt`).
pub fn report_text(r: &StallReport) -> String {
    let l = &r.line;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stall of {} on thread {} of PID {} ({}, {}), at {}",
        fmt_ns(l.duration_ns),
        l.tid,
        l.pid,
        l.comm,
        l.exe,
        l.time
    );
    let _ = writeln!(out, "group {} [{}]", l.group, l.key);
    let _ = writeln!(out, "verdict: {}", l.verdict);
    let _ = writeln!(
        out,
        "on-CPU {}, blocked {}, runnable {}; {} samples; tree {}",
        fmt_ns(l.on_cpu_ns),
        fmt_ns(l.blocked_ns),
        fmt_ns(l.runnable_ns),
        l.samples,
        l.tree
    );
    if let Some(u) = &l.uncertain {
        let _ = writeln!(out, "uncertain: {u}");
    }
    for w in &r.wakers {
        let _ = writeln!(out, "  {w}");
    }
    if let Some(t) = &l.call_tree {
        let _ = writeln!(out, "\ncall tree:");
        tree_text(&mut out, t, 0);
    }
    if !r.blocking_stacks.is_empty() {
        let _ = writeln!(out, "\nwhere it blocked:");
        for (ns, stack) in &r.blocking_stacks {
            let _ = writeln!(out, "  {}: {}", fmt_ns(*ns), stack.join(" <- "));
        }
    }
    let _ = writeln!(
        out,
        "\nthe {} before it began (the flight recorder's samples of the thread, most first):",
        fmt_ns(r.keep_ns)
    );
    if r.before.is_empty() {
        let _ = writeln!(out, "  no samples: the thread was idle in its loop's wait");
    }
    let mut before: Vec<(&str, u64)> = r
        .before
        .iter()
        .filter_map(|l| {
            let (stack, n) = l.rsplit_once(' ')?;
            Some((stack, n.parse().ok()?))
        })
        .collect();
    before.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (stack, n) in before.iter().take(10) {
        let frames: Vec<&str> = stack.rsplit(';').take(4).collect();
        let _ = writeln!(out, "  {n:>5} samples  {}", frames.join(" <- "));
    }
    out
}

fn tree_text(out: &mut String, n: &Node, depth: usize) {
    let approx = if n.kind == "sampled" { "~" } else { "" };
    let count = match n.kind.as_str() {
        "traced" | "iteration" => format!(" {}x", n.calls),
        "sampled" => format!(" [{} samples]", n.calls),
        "blocked" => format!(" [blocked: {} waits]", n.calls),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  {}{}{count} {approx}{} (self {approx}{})",
        ".".repeat(depth),
        n.name,
        fmt_ns(n.total_ns),
        fmt_ns(n.self_ns)
    );
    for c in &n.children {
        tree_text(out, c, depth + 1);
    }
}

/// The flame graph of a report (`NAME.svg`).
pub fn report_svg(r: &StallReport) -> Option<Vec<u8>> {
    let title = format!(
        "stall of {} in PID {} [{}]",
        fmt_ns(r.line.duration_ns),
        r.line.pid,
        r.line.key
    );
    match r.folded.is_empty() {
        true => None,
        false => crate::output::report::flame::svg(&r.folded, &title).ok(),
    }
}

/// A group in `groups.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupEntry {
    /// Its stable id (the directory of its reports, `groups/ID/`).
    pub group: String,
    /// Its key.
    pub key: String,
    /// The verdict of its longest stall.
    pub verdict: String,
    /// Stalls counted, every one since the output directory was first
    /// used.
    pub count: u64,
    /// Their total wall time, ns.
    pub total_ns: u64,
    /// The longest, ns.
    pub max_ns: u64,
    /// Median, ns (over the stalls of this watcher's run: see
    /// `percentiles_of`).
    pub p50_ns: u64,
    /// 95th percentile, ns.
    pub p95_ns: u64,
    /// How many stalls the percentiles are over.
    pub percentiles_of: u64,
    /// First and last seen, RFC 3339.
    pub first_seen: String,
    pub last_seen: String,
    /// The processes it was seen in, the most recent last (at most 16).
    pub pids: Vec<u32>,
    /// Its full reports still on disk, relative to the output directory.
    pub reports: Vec<String>,
    /// Stalls past `--max-reports-per-hour`: lines without a tree.
    pub rate_limited: u64,
    /// Its escalation (`--trace-stalls`) in the process it was last
    /// escalated in: absent when it never was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
}

/// A group's escalation in one process (`watch --trace-stalls`): the
/// native functions on its first stall's samples probed, so that its next
/// stalls carry an exact call tree, then unprobed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    /// The process.
    pub pid: u32,
    /// `traced` (its functions probed now), `queued` (waiting for another
    /// group's probes to come off), `done` (probed, then unprobed) or
    /// `refused` (never probed: `reason` says why).
    pub state: String,
    /// Functions probed for it.
    pub functions: usize,
    /// Its stalls with an exact tree so far.
    pub traced_stalls: u32,
    /// Of `functions`, those the overhead governor detached early.
    #[serde(default)]
    pub governed: usize,
    /// The highest estimated share of the watched thread's CPU time
    /// spent in probes while it was traced, %.
    #[serde(default)]
    pub peak_overhead_pct: f64,
    /// The same since the governor's last detach (or the attach): what
    /// the probes left on cost, held under `--max-overhead`, %.
    #[serde(default)]
    pub settled_overhead_pct: f64,
    /// Why the probes came off, or why it was refused or queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `groups.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupsFile {
    /// Stalls counted in every group.
    pub stalls: u64,
    /// Hangs told while they ran.
    pub hangs: u64,
    /// Iterations that were not the programs' own stalls, by reason
    /// (stopped, suspended), never lines.
    pub excluded: Vec<(String, u64)>,
    /// Processes watched so far.
    pub processes_watched: u64,
    /// Reports deleted to stay within `--max-disk` (their stalls still
    /// counted).
    pub reports_deleted: u64,
    /// Rotated `stalls.N.jsonl` deleted to stay within `--max-disk`.
    pub lines_deleted: u64,
    /// `profiles/PID-TIME.pb.gz` written (`--profile-every`).
    #[serde(default)]
    pub profiles_written: u64,
    /// Of those, deleted to stay within `--max-disk` (the oldest first).
    #[serde(default)]
    pub profiles_deleted: u64,
    /// Groups, most total time first.
    pub groups: Vec<GroupEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(name: &str, depth: u32, total_ns: u64) -> FlatNode {
        FlatNode {
            name: name.into(),
            depth,
            calls: 1,
            total_ns,
            self_ns: 0,
            kind: Kind::Sampled,
            detached: 0,
            tail_calls: 0,
        }
    }

    #[test]
    fn a_pre_order_tree_nests() {
        let tree = [
            flat("handle", 0, 90),
            flat("parse", 1, 60),
            flat("tokenize", 2, 50),
            flat("log", 1, 20),
            flat("other", 0, 5),
        ];
        let root = nest(&tree, 100, MAX_LINE_NODES).unwrap();
        assert_eq!(root.children.len(), 2);
        assert_eq!(root.self_ns, 5);
        let handle = &root.children[0];
        assert_eq!(handle.name, "handle");
        assert_eq!(handle.children[0].children[0].name, "tokenize");
        assert_eq!(handle.children[1].name, "log");
        let cut = nest(&tree, 100, 2).unwrap();
        assert_eq!(cut.children[0].children.len(), 1);
        assert!(nest(&[], 100, 10).is_none());
        let json = serde_json::to_string(&root).unwrap();
        let back: Node = serde_json::from_str(&json).unwrap();
        assert_eq!(back, root);
    }
}
