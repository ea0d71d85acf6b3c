//! Explains one slow dispatch from its buffered records: rebuilds the traced
//! tree (same pairing rule as the main shadow stacks), hangs sampled and
//! blocked frames under the traced call that was running, picks the key and
//! writes the verdict.
use std::collections::HashMap;

use profiler_common::KIND_ENTRY;

use super::{
    frames,
    sched::Split,
    tree::{pct, Kind, Tree},
    wakers::{self, Interval, PeerRec, WakeRec, Waker},
    Dispatcher, Open, Rec, Slow,
};
use crate::analyze::stacks::{is_dead, same_frame};

/// Trimmed tree size.
const TREE_LIMIT: usize = 20;
/// Blocking stacks listed per slow dispatch.
const TOP_BLOCKING: usize = 5;

/// A slow dispatch and the folded stacks of its full tree.
pub struct Explained {
    /// The report entry.
    pub slow: Slow,
    /// Folded stacks for its flame graph.
    pub folded: Vec<String>,
}

struct Frame {
    node: usize,
    func: u32,
    sp: u64,
    entry_ns: u64,
    child_ns: u64,
    /// The probe hits of the traced calls inside it, in ns.
    probe_ns: u64,
}

/// Completes frame `f` (popped off `stack`) at `ts` in `tree`: its time
/// without the probes' cost (as `analyze/stacks.rs` does), added to its
/// caller's with its hits.
fn close(
    d: &Dispatcher,
    tree: &mut Option<Tree>,
    stack: &mut [Frame],
    f: &Frame,
    ts: u64,
    detached: bool,
) {
    let cost = match f.func {
        ROOT_FUNC => Default::default(),
        func => d.cost(func),
    };
    let measured = ts.saturating_sub(f.entry_ns);
    // Never so much that the call ends shorter than its traced calls, as
    // in `analyze/stacks.rs`.
    let dur = measured
        - cost
            .removed(measured, f.probe_ns)
            .min(measured.saturating_sub(f.child_ns));
    if let Some(t) = tree {
        t.complete(f.node, dur, dur.saturating_sub(f.child_ns));
        if detached {
            t.nodes[f.node].detached += 1;
        }
    }
    if let Some(p) = stack.last_mut() {
        p.child_ns += dur;
        p.probe_ns += f.probe_ns + cost.hits_ns();
    }
}

/// Root of an event-loop iteration's tree ([`super::Config::wait_loop`]).
pub const ITERATION_ROOT: &str = "(loop iteration)";
/// The iteration's root in the stack of open frames: no exit matches it.
const ROOT_FUNC: u32 = u32::MAX;

/// The part of a sampled stack (innermost first) below the open frame
/// `top` of `tree`, outermost first: all of it below an iteration's root.
fn chain_below_frame(names: &[String], tree: &Tree, top: &Frame) -> Vec<String> {
    if top.func == ROOT_FUNC {
        return names.iter().rev().cloned().collect();
    }
    chain_below(names, &tree.nodes[top.node].name)
}

/// The part of a sampled stack (innermost first) below the traced function
/// `traced`, outermost first. If the traced function is not in it (a frame
/// that tail-jumped away, or one closed late because its probe was
/// detached while it was open), the frames up to the innermost of the
/// program's own ([`frames::is_own`]), so the chain still names the code
/// that ran; the innermost frame alone if none is the program's.
fn chain_below(names: &[String], traced: &str) -> Vec<String> {
    let end = match names.iter().position(|n| n == traced) {
        Some(pos) => pos,
        None => {
            let under = frames::under_python(names);
            names
                .iter()
                .zip(&under)
                .position(|(n, &u)| frames::is_own_in(n, u))
                .map_or(names.len().min(1), |own| own + 1)
        }
    };
    names[..end].iter().rev().cloned().collect()
}

/// How many sampled ticks the sampler may have missed and a sample still
/// stand for them: at most this many periods of on-CPU time each.
const MAX_SAMPLE_PERIODS: u64 = 4;

/// The on-CPU time one in-dispatch sample stands for: the scheduler's exact
/// on-CPU time of the dispatch shared among its samples, so that sampled
/// frames add up to the time the thread ran. That is the sampling period
/// where the sampler fires on time; where its ticks are lost (software
/// emulation, a host that starves the timer), more, up to
/// [`MAX_SAMPLE_PERIODS`] periods; never less than one period. `samples`
/// leaves out those in uprobe handling, as `split` leaves out their time.
fn sample_weight(period_ns: u64, samples: u64, split: Split) -> u64 {
    match split.on_cpu_ns.checked_div(samples) {
        Some(share) => share.clamp(period_ns, period_ns.saturating_mul(MAX_SAMPLE_PERIODS)),
        None => period_ns,
    }
}

/// Builds the explanation of the dispatch `open`, made of `recs`.
pub(super) fn explain(
    d: &mut Dispatcher,
    open: &Open,
    recs: &[Rec],
    start_ns: u64,
    duration_ns: u64,
    probe_ns: u64,
    split: Split,
) -> Explained {
    // Weighed by the periods each stands for (`watch` samples an
    // iteration's start at a lower rate).
    let code_samples = recs
        .iter()
        .map(|r| match r {
            Rec::Sample(ts, _, kernel) if !d.probe_sample(kernel) => {
                d.sample_periods(open.start_ns, *ts)
            }
            _ => 0,
        })
        .sum::<u64>();
    let sample_ns = sample_weight(d.cfg.sample_period_ns, code_samples, split);
    let mut tree: Option<Tree> = None;
    let mut stack: Vec<Frame> = Vec::new();
    let mut pending_block: Option<(usize, Vec<String>, Vec<String>, u64)> = None;
    let mut pending_waker: Option<WakeRec> = None;
    let mut intervals: Vec<Interval> = Vec::new();
    let mut peers: Vec<PeerRec> = Vec::new();
    let mut source: Option<&WakeRec> = None;
    let mut syscalls: HashMap<String, u64> = HashMap::new();
    let mut blocking: HashMap<Vec<String>, u64> = HashMap::new();
    // Per traced node, what its frame (the innermost open) showed of the
    // probes' own time: samples inside uprobe handling, and ns blocked
    // there. The judge took it out of the dispatch beyond the calibrated
    // hits; it comes out of these nodes too (`take_out_probes`).
    let mut in_probes: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut probe_block: Option<(usize, u64)> = None;
    if d.by_waits() {
        tree = Some(Tree::new(ITERATION_ROOT));
        stack.push(Frame {
            node: 0,
            func: ROOT_FUNC,
            sp: 0,
            entry_ns: open.start_ns,
            child_ns: 0,
            probe_ns: 0,
        });
    }
    for rec in recs {
        match rec {
            Rec::Unwound(level, ts) => {
                while stack.last().is_some_and(|f| is_dead(f.sp, *level)) {
                    let f = stack.pop().expect("checked");
                    let detached = d.closed_by_detach(f.func, *ts);
                    close(d, &mut tree, &mut stack, &f, *ts, detached);
                }
            }
            Rec::Call(ev) if ev.kind() == KIND_ENTRY => {
                let name = d.name(ev.func()).to_string();
                let node = match (&mut tree, stack.last()) {
                    (None, _) => {
                        tree = Some(Tree::new(&name));
                        0
                    }
                    (Some(t), parent) => t.enter(parent.map_or(0, |f| f.node), &name),
                };
                if let (true, Some(t)) = (ev.tail_call(), &mut tree) {
                    t.nodes[node].tail_calls += 1;
                }
                stack.push(Frame {
                    node,
                    func: ev.func(),
                    sp: ev.sp,
                    entry_ns: ev.ts_ns,
                    child_ns: 0,
                    probe_ns: 0,
                });
            }
            Rec::Call(ev) | Rec::Detached(ev) => {
                let Some(pos) = stack
                    .iter()
                    .rposition(|f| f.func == ev.func() && same_frame(f.sp, ev.sp))
                else {
                    continue;
                };
                stack.truncate(pos + 1);
                let f = stack.pop().expect("pos is in the stack");
                let detached = matches!(rec, Rec::Detached(_));
                close(d, &mut tree, &mut stack, &f, ev.ts_ns, detached);
            }
            Rec::Sample(ts, user, kernel) => {
                let periods = d.sample_periods(open.start_ns, *ts);
                let (Some(t), Some(top)) = (&mut tree, stack.last()) else {
                    continue;
                };
                // The probes' time, taken out of the dispatch's.
                if d.probe_sample(kernel) {
                    in_probes.entry(top.node).or_default().0 += 1;
                    continue;
                }
                let names = displayed(d.symbolizer.user_stack(user));
                let chain = chain_below_frame(&names, t, top);
                // (An empty chain, a sample in the traced frame's own code,
                // still counts in its `seen_ns`.)
                t.add_chain(top.node, &chain, Kind::Sampled, sample_ns * periods);
            }
            Rec::Block(ts, user, kernel) => {
                let (Some(t), Some(top)) = (&tree, stack.last()) else {
                    continue;
                };
                // Waiting inside the probes' handling (for the lock the
                // kernel's probe registration holds): the probes' time,
                // taken out of the dispatch's, and its waker is the
                // profiler.
                if d.probe_sample(kernel) {
                    pending_block = None;
                    pending_waker = None;
                    probe_block = Some((top.node, *ts));
                    continue;
                }
                probe_block = None;
                let names = displayed(d.symbolizer.user_stack(user));
                let chain = chain_below_frame(&names, t, top);
                let mut full = d.symbolizer.kernel_stack(kernel);
                full.extend(names);
                pending_block = Some((top.node, chain, full, *ts));
                pending_waker = None;
            }
            Rec::Waker(w) => {
                if pending_block.is_some() {
                    pending_waker = Some((**w).clone());
                }
            }
            Rec::Peer(p) => peers.push(p.clone()),
            Rec::Source(w) => source = Some(w),
            Rec::Resume(ts) => {
                if let Some((node, out_ns)) = probe_block.take() {
                    in_probes.entry(node).or_default().1 += ts.saturating_sub(out_ns);
                }
                let Some((node, chain, full, out_ns)) = pending_block.take() else {
                    continue;
                };
                let blocked = ts.saturating_sub(out_ns);
                let mut leaf = node;
                if let Some(t) = &mut tree {
                    // (An empty chain still counts in the frame's `seen_ns`.)
                    leaf = t.add_chain(node, &chain, Kind::Blocked, blocked);
                }
                if let Some(sc) = wakers::syscall_of(&full) {
                    *syscalls.entry(sc).or_default() += blocked;
                }
                *blocking.entry(full).or_default() += blocked;
                intervals.push(Interval {
                    node: leaf,
                    out_ns,
                    end_ns: *ts,
                    waker: pending_waker.take(),
                });
            }
        }
    }
    if d.by_waits() {
        // Calls still open when the iteration ended ran until its end.
        let end_ns = open.start_ns + duration_ns + probe_ns;
        while let Some(f) = stack.pop() {
            close(d, &mut tree, &mut stack, &f, end_ns, false);
        }
    }
    let mut tree = tree.unwrap_or_else(|| Tree::new("?"));
    take_out_probes(&mut tree, duration_ns, &in_probes);
    let key_node = if d.keys_from_samples {
        tree.samples_key_node_given(split.runnable_ns)
    } else {
        tree.key_node_given(split.runnable_ns)
    };
    let mut key = tree.signature(key_node);
    let (mut verdict, mut pinned) = verdict(&tree, key_node, split, duration_ns);
    pinned.push(key_node);
    let wakers = wakers::attach(
        &mut d.symbolizer,
        &mut tree,
        &intervals,
        &peers,
        d.pid,
        d.cfg.sample_period_ns,
        d.session_start_ns,
    );
    let source = source.map(|w| wakers::source(&mut d.symbolizer, w, d.pid, d.session_start_ns));
    if let Some(w) = blocked_mostly(split, &wakers) {
        let syscall = syscalls
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(s, _)| s);
        if let Some(sc) = syscall {
            verdict = verdict.replacen("% blocked in ", &format!("% blocked on {sc} in "), 1);
        }
        verdict.push_str(&wakers::chain_text(w, d.cfg.sample_period_ns > 0));
        match blocked_leaf(&tree, key_node) {
            Some(b) => {
                let (site, call, own) = tree.call_site(b);
                pinned.extend([b, call, own]);
                // The waker it names, under the blocked frame.
                let node = format!("[waited for: {}]", w.who());
                pinned.extend(
                    tree.nodes[b]
                        .children
                        .iter()
                        .copied()
                        .find(|&c| tree.nodes[c].kind == Kind::Waker && tree.nodes[c].name == node),
                );
                key = format!("{site} | woken in {}", wakers::key_of(w));
            }
            None => key = format!("{key} | woken in {}", wakers::key_of(w)),
        }
    }
    let flat = if d.cfg.full_tree {
        tree.full()
    } else {
        tree.trimmed(TREE_LIMIT, &pinned)
    };
    let mut blocking_stacks: Vec<(u64, Vec<String>)> =
        blocking.into_iter().map(|(s, ns)| (ns, s)).collect();
    blocking_stacks.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    blocking_stacks.truncate(TOP_BLOCKING);
    Explained {
        folded: tree.folded(),
        slow: Slow {
            index: open.index,
            start_ns,
            duration_ns,
            split,
            dropped_frames: duration_ns / d.cfg.frame_interval_ns.max(1),
            key,
            verdict,
            samples: open.samples,
            tree: flat,
            blocking_stacks,
            truncated: open.truncated,
            wakers,
            source,
            detached_frames: open.detached,
            probe_ns,
            probes_mainly: false,
        },
    }
}

/// Makes the tree agree with the dispatch's duration, `duration_ns`: the
/// judge took out of it what the samples and blocked stacks showed of the
/// probes' time beyond the calibrated hits ([`super::own_cost`]), which
/// the tree's traced nodes (corrected by the calibration alone) still
/// hold. That excess comes out of the nodes whose frames showed it
/// (`in_probes`: samples in uprobe handling, ns blocked there), blocked
/// time first as measured, the rest by their samples; what a node's own
/// time cannot give comes out of the root's. A root longer than its
/// dispatch would read as code the profiler took out.
fn take_out_probes(tree: &mut Tree, duration_ns: u64, in_probes: &HashMap<usize, (u64, u64)>) {
    let mut excess = tree.nodes[0].total_ns.saturating_sub(duration_ns);
    if excess == 0 {
        return;
    }
    let mut nodes: Vec<(usize, u64, u64)> = in_probes
        .iter()
        .map(|(&n, &(samples, blocked))| (n, samples, blocked))
        .collect();
    // The same order each time (a replay's tree is the recording's).
    nodes.sort_unstable();
    for &(n, _, blocked) in &nodes {
        excess -= tree.take_out(n, blocked.min(excess));
    }
    let samples: u64 = nodes.iter().map(|&(_, s, _)| s).sum();
    if samples > 0 {
        let share = excess;
        for &(n, s, _) in &nodes {
            let ns = (u128::from(share) * u128::from(s) / u128::from(samples)) as u64;
            excess -= tree.take_out(n, ns.min(excess));
        }
    }
    if excess > 0 {
        tree.take_out(0, excess);
    }
}

/// The waker to name in the verdict and key: the one that ended most of
/// the blocked time, when blocked time dominates the dispatch.
fn blocked_mostly(split: Split, wakers: &[Waker]) -> Option<&Waker> {
    let Split {
        on_cpu_ns,
        blocked_ns,
        runnable_ns,
    } = split;
    if blocked_ns < on_cpu_ns || blocked_ns < runnable_ns {
        return None;
    }
    wakers
        .first()
        .filter(|w| w.blocked_ns.saturating_mul(2) >= blocked_ns)
}

/// Frame names as dispatch trees hold them ([`frames::display`]: one name
/// per function, whatever JIT tier ran it).
fn displayed(names: Vec<String>) -> Vec<String> {
    names
        .into_iter()
        .map(|n| match frames::display(&n) {
            std::borrow::Cow::Borrowed(_) => n,
            std::borrow::Cow::Owned(o) => o,
        })
        .collect()
}

/// The blocked frame a verdict names: the heaviest blocked leaf under the
/// key node, else anywhere.
fn blocked_leaf(tree: &Tree, key: usize) -> Option<usize> {
    tree.heaviest(key, Kind::Blocked)
        .or_else(|| tree.heaviest(0, Kind::Blocked))
}

/// `92% on-CPU in parse_json <- load_config`, `81% blocked in fsync <-
/// save_state`: a blocked verdict names the call the program made
/// ([`Tree::call_site`]: `nanosleep <- handler`, `JS:execSync … <-
/// JS:sleepHandler …`), not the C library or runtime frames inside it.
/// Also returns the nodes it names, for the trimmed tree to keep.
fn verdict(tree: &Tree, key: usize, split: Split, duration_ns: u64) -> (String, Vec<usize>) {
    let sig = tree.signature(key);
    let Split {
        on_cpu_ns,
        blocked_ns,
        runnable_ns,
    } = split;
    if blocked_ns >= on_cpu_ns && blocked_ns >= runnable_ns {
        let p = pct(blocked_ns, duration_ns);
        return match blocked_leaf(tree, key) {
            Some(b) => {
                let (site, call, own) = tree.call_site(b);
                (format!("{p}% blocked in {site}"), vec![b, call, own])
            }
            None => (format!("{p}% blocked in {sig}"), Vec::new()),
        };
    }
    if runnable_ns > on_cpu_ns {
        return (
            format!(
                "{}% waiting for a CPU in {sig}",
                pct(runnable_ns, duration_ns)
            ),
            Vec::new(),
        );
    }
    let p = pct(on_cpu_ns, duration_ns);
    let hot = tree
        .heaviest(key, Kind::Sampled)
        .filter(|&h| tree.nodes[h].self_ns.saturating_mul(2) >= tree.nodes[key].total_ns);
    match hot {
        Some(h) => (
            format!(
                "{p}% on-CPU in {sig} (hot: {} ~{}%)",
                frames::key_name(&tree.nodes[h].name),
                pct(tree.nodes[h].self_ns, tree.nodes[key].total_ns)
            ),
            vec![h],
        ),
        None => (format!("{p}% on-CPU in {sig}"), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_share_the_dispatchs_on_cpu_time_within_four_periods() {
        const MS: u64 = 1_000_000;
        let on_cpu = |ns| Split {
            on_cpu_ns: ns,
            blocked_ns: 0,
            runnable_ns: 0,
        };
        // The sampler kept time: one period each.
        assert_eq!(sample_weight(MS, 100, on_cpu(101 * MS)), 1_010_000);
        // Under emulation 817 samples in 1.87 s on a CPU: 2.3 periods each.
        assert_eq!(sample_weight(MS, 817, on_cpu(1_871 * MS)), 2_290_085);
        // Never more than four periods, never less than one.
        assert_eq!(sample_weight(MS, 2, on_cpu(500 * MS)), 4 * MS);
        assert_eq!(sample_weight(MS, 50, on_cpu(10 * MS)), MS);
        // No sample, or no sampler: the period.
        assert_eq!(sample_weight(MS, 0, on_cpu(10 * MS)), MS);
        assert_eq!(sample_weight(0, 5, on_cpu(10 * MS)), 0);
    }

    #[test]
    fn chain_below_the_traced_frame() {
        let names: Vec<String> = [
            "__memcpy_avx_unaligned",
            "parse_inner",
            "parse_json",
            "load_config",
            "main",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            chain_below(&names, "parse_json"),
            ["parse_inner", "__memcpy_avx_unaligned"]
        );
        assert_eq!(
            chain_below(&names, "__memcpy_avx_unaligned"),
            Vec::<String>::new()
        );
        // Not in the stack: up to the innermost frame of the program's own.
        assert_eq!(
            chain_below(&names, "absent"),
            ["parse_inner", "__memcpy_avx_unaligned"]
        );
        let runtime: Vec<String> = ["clock_nanosleep", "[unknown] python3.11+0x1fcda3"]
            .map(String::from)
            .to_vec();
        assert_eq!(chain_below(&runtime, "absent"), ["clock_nanosleep"]);
        let py: Vec<String> = [
            "clock_nanosleep",
            "[unknown] python3.11+0x1fcda3",
            "py:staller (/app/stall.py:12)",
            "_PyEval_EvalFrameDefault",
            "PyObject_Call",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            chain_below(&py, "PyObject_Call_absent"),
            [
                "py:staller (/app/stall.py:12)",
                "[unknown] python3.11+0x1fcda3",
                "clock_nanosleep"
            ]
        );
        assert_eq!(chain_below(&[], "absent"), Vec::<String>::new());
    }

    /// The judge took 60 ms of probe time out of a 100-ms dispatch (a GC
    /// that hit probes while they were being detached): the tree's root
    /// agrees with the 40 ms, and the time comes out of the frames whose
    /// samples and blocked stacks showed it, in proportion.
    #[test]
    fn probe_time_the_judge_took_out_comes_out_of_the_tree_where_it_was() {
        const MS: u64 = 1_000_000;
        let tree = || {
            let mut t = Tree::new("dispatch");
            let gc = t.enter(0, "gc");
            t.complete(gc, 90 * MS, 90 * MS);
            t.complete(0, 100 * MS, 10 * MS);
            (t, gc)
        };
        let (mut t, gc) = tree();
        let seen = HashMap::from([(gc, (50, 0)), (0, (10, 0))]);
        take_out_probes(&mut t, 40 * MS, &seen);
        assert_eq!(t.nodes[0].total_ns, 40 * MS);
        assert_eq!(
            (t.nodes[gc].total_ns, t.nodes[gc].self_ns),
            (40 * MS, 40 * MS)
        );
        assert_eq!(t.nodes[0].self_ns, 0);
        // Blocked time first, as measured; then samples.
        let (mut t, gc) = tree();
        let seen = HashMap::from([(gc, (0, 30 * MS)), (0, (4, 0))]);
        take_out_probes(&mut t, 60 * MS, &seen);
        assert_eq!(t.nodes[gc].total_ns, 60 * MS);
        assert_eq!(t.nodes[0].total_ns, 60 * MS);
        assert_eq!(t.nodes[0].self_ns, 0);
        // Nothing taken beyond the calibration: nothing changes.
        let (mut t, gc) = tree();
        take_out_probes(&mut t, 100 * MS, &seen);
        assert_eq!(
            (t.nodes[0].total_ns, t.nodes[gc].total_ns),
            (100 * MS, 90 * MS)
        );
        // Nothing showed where: out of the root's own time, no more.
        let (mut t, _) = tree();
        take_out_probes(&mut t, 95 * MS, &HashMap::new());
        assert_eq!((t.nodes[0].total_ns, t.nodes[0].self_ns), (95 * MS, 5 * MS));
    }

    #[test]
    fn verdicts_name_the_cause() {
        let mut t = Tree::new("dispatch");
        let s = t.enter(0, "save_state");
        t.complete(s, 100, 100);
        t.complete(0, 100, 0);
        t.add_chain(s, &["fsync".to_string()], Kind::Blocked, 81);
        let split = |on_cpu_ns, blocked_ns| Split {
            on_cpu_ns,
            blocked_ns,
            runnable_ns: 0,
        };
        assert_eq!(
            verdict(&t, t.key_node(), split(19, 81), 100).0,
            "81% blocked in fsync <- save_state"
        );
        assert_eq!(
            verdict(&t, t.key_node(), split(92, 8), 100).0,
            "92% on-CPU in save_state <- dispatch"
        );
    }
}
