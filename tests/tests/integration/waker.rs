//! Who woke the main thread (issue 13): `fixtures/waker.c` runs four slow
//! dispatches with known wakers: a mutex held by `worker-1` while it spins
//! 200 ms in `compress_block` (from `flush_to_disk`), a condition variable
//! signalled by `worker-2` from `network_reply` after 150 ms, a 100 ms
//! sleep (a timer), and a read from a pipe written by the child process
//! `helper` in `write_reply` after 120 ms. One recording, shared by the
//! checks below; `profiler report` replays it to the same `dispatches.json`.
//! A second one, with `--no-wakers`, has the same dispatches and no wakers.
use std::sync::OnceLock;

use profiler_tests::*;
use serde_json::Value;

const ARGS: [&str; 6] = [
    "--dispatch",
    "dispatch_message",
    "--func",
    "handle_*",
    "--threshold",
    "50ms",
];

struct Run {
    truth: Value,
    /// The profiler's BPF links while it recorded.
    links: usize,
    d: Value,
    txt: String,
    trace: Value,
    replayed: Value,
}

/// Open BPF links of process `pid` (a perf-event program's link holds
/// its perf event).
fn bpf_links(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the profiler's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy() == "anon_inode:bpf_link")
        .count()
}

/// Online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
fn online_cpus() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    list.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| record(&[]))
}

fn run_without_wakers() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| record(&["--no-wakers"]))
}

/// Records the fixture's schedule with [`ARGS`] and `extra`, and replays it.
fn record(extra: &[&str]) -> Run {
    let exe = build_c(
        "waker.c",
        "waker",
        &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
    );
    let out = TempDir::new("waker");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(&exe, &[]);
    let args: Vec<&str> = ARGS.iter().chain(extra).copied().collect();
    let rec = Recording::start(fx.pid, out.path(), &args);
    let ours = rec.pid();
    let links = bpf_links(ours);
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[ours]);
    fx.release();
    let again = replay(out.path(), "waker-replay");
    Run {
        truth,
        links,
        d: read_json(out.path(), "dispatches.json"),
        txt: read(out.path(), "dispatches.txt"),
        trace: read_json(out.path(), "trace.json"),
        replayed: read_json(again.path(), "dispatches.json"),
    }
}

impl Run {
    /// The fixture's slow dispatch of `kind`: (index, wait_ns).
    fn truth_of(&self, kind: &str) -> (u64, u64) {
        let t = self.truth["dispatches"]
            .as_array()
            .expect("truth dispatches")
            .iter()
            .find(|d| d["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} dispatch in the truth {}", self.truth));
        (num(t, "index"), num(t, "wait_ns"))
    }

    /// The profiler's slow dispatch of `kind`.
    fn slow(&self, kind: &str) -> &Value {
        let (index, _) = self.truth_of(kind);
        self.d["slow"]
            .as_array()
            .expect("slow array")
            .iter()
            .find(|s| num(s, "index") == index)
            .unwrap_or_else(|| panic!("dispatch {index} ({kind}) not slow: {}", self.d))
    }

    /// The slow dispatch's only waker, whose fields are all there.
    fn waker(&self, kind: &str) -> &Value {
        let s = self.slow(kind);
        let w = s["wakers"].as_array().expect("wakers array");
        assert_eq!(w.len(), 1, "{kind}: one waker: {s}");
        let w = &w[0];
        let mut keys: Vec<&str> = w
            .as_object()
            .expect("waker object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "blocked_ns",
                "comm",
                "function",
                "kind",
                "label",
                "pid",
                "stack",
                "tid",
                "waker_on_cpu_ns"
            ],
            "{kind}: waker fields"
        );
        w
    }

    /// Asserts the waker's blocked time is within 5% of the fixture's wait.
    /// The fixture's clock also counts the wait for a CPU once woken, which
    /// on a loaded machine is milliseconds: the dispatch's runnable time is
    /// added (its handlers do next to nothing besides the wait).
    fn assert_wait(&self, kind: &str) {
        let (_, wait) = self.truth_of(kind);
        let blocked = num(self.waker(kind), "blocked_ns");
        let runnable = num(self.slow(kind), "runnable_ns");
        // Under emulation the dispatch waits for a CPU elsewhere too (its
        // runnable time is not all after the wake-up: 37 ms of it around
        // an 82-ms pipe wait in the 6.12 VM): the wait lies between the
        // blocked time and that plus all the runnable time.
        let within = (blocked + runnable).abs_diff(wait) * 20 <= wait
            || (relaxed(&format!(
                "{kind}: the fixture's wait of {wait} ns between blocked {blocked} ns and blocked + \
                 runnable {} ns, 5% either way (the dispatch is runnable elsewhere too)",
                blocked + runnable
            )) && wait * 20 >= blocked * 19
                && wait * 20 <= (blocked + runnable) * 21);
        assert!(
            within,
            "{kind}: blocked {blocked} ns + runnable {runnable} ns, fixture waited {wait} ns"
        );
        assert!(
            blocked <= wait,
            "{kind}: blocked {blocked} ns > waited {wait} ns"
        );
    }
}

fn stack_has(w: &Value, name: &str) -> bool {
    w["stack"]
        .as_array()
        .expect("stack array")
        .iter()
        .any(|f| f == name)
}

#[test]
fn mutex_waker_is_worker_1_busy_in_compress_block() {
    require_root!();
    let r = run();
    let w = r.waker("mutex");
    assert_eq!(w["kind"], "thread");
    assert_eq!(num(w, "tid"), num(&r.truth, "worker1_tid"));
    assert_eq!(num(w, "pid"), num(&r.truth, "pid"));
    assert_eq!(w["comm"], "worker-1");
    assert!(stack_has(w, "flush_to_disk"), "{w}");
    assert_eq!(w["function"], "flush_to_disk <- save_all");
    r.assert_wait("mutex");
    // What it did meanwhile: sampled on-CPU time against its own CPU clock
    // over compress_block (the machine may be loaded: the share of wall
    // time is asserted only when the fixture itself got > 90% of a CPU).
    let on_cpu = num(w, "waker_on_cpu_ns");
    let (cpu, wall) = (
        num(&r.truth, "compress_cpu_ns"),
        num(&r.truth, "compress_ns"),
    );
    let blocked = num(w, "blocked_ns");
    eprintln!("worker-1 on-CPU {on_cpu} ns sampled, {cpu} ns by its clock, {wall} ns wall");
    let want = cpu.min(blocked);
    let close = on_cpu.abs_diff(want) * 4 <= want + 20_000_000;
    // Under emulation, samples are about half the CPU time (an emulated
    // vCPU is not run while the other is, and the timer's periods missed
    // meanwhile give no sample): at least a third, and never more.
    let relaxed_ok = !close
        && relaxed(&format!(
            "sampled on-CPU {on_cpu} ns against the thread's CPU time {want} ns: a third to all \
             of it allowed (missed timer periods of an emulated vCPU)"
        ))
        && on_cpu * 3 >= want
        && on_cpu <= want + 20_000_000;
    assert!(
        close || relaxed_ok,
        "sampled on-CPU {on_cpu} ns vs the thread's CPU time {cpu} ns"
    );
    if cpu * 10 > wall * 9 {
        // Under emulation the 997-Hz timer's samples come late or not at
        // all (78% of the blocked time sampled, against 94% by the clock,
        // on this host; 55% in the 6.1 VM).
        let tenths = match relaxed("the sampled share of the blocked time: 30%, not 80%") {
            true => 3,
            false => 8,
        };
        assert!(
            on_cpu * 10 > blocked * tenths,
            "on-CPU {on_cpu} of {blocked} ns"
        );
    }
    let s = r.slow("mutex");
    let verdict = s["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("blocked on futex")
            && verdict.contains("worker-1")
            && verdict.contains("`flush_to_disk <- save_all`")
            && verdict.contains("in `compress_block`"),
        "verdict names the chain: {verdict}"
    );
    // The tree: [waited for: worker-1 (tid N)] with its samples under it.
    let tree = s["tree"].as_array().unwrap();
    let node = format!("[waited for: worker-1 (tid {})]", num(w, "tid"));
    let at = tree
        .iter()
        .position(|n| n["name"] == node.as_str())
        .unwrap_or_else(|| panic!("no {node} node: {s}"));
    assert_eq!(tree[at]["kind"], "waker");
    assert_eq!(num(&tree[at], "total_ns"), blocked);
    if on_cpu > 0 {
        let depth = num(&tree[at], "depth");
        assert!(
            tree[at + 1..]
                .iter()
                .take_while(|n| num(n, "depth") > depth)
                .any(|n| n["name"] == "compress_block" && n["kind"] == "waker"),
            "compress_block under {node}: {s}"
        );
    }
}

#[test]
fn condvar_waker_is_worker_2_in_network_reply() {
    require_root!();
    let r = run();
    let w = r.waker("cond");
    assert_eq!(w["kind"], "thread");
    assert_eq!(num(w, "tid"), num(&r.truth, "worker2_tid"));
    assert_eq!(w["comm"], "worker-2");
    assert!(stack_has(w, "network_reply"), "{w}");
    r.assert_wait("cond");
    // worker-2 slept before signalling: it was hardly on a CPU.
    let (on_cpu, blocked) = (num(w, "waker_on_cpu_ns"), num(w, "blocked_ns"));
    assert!(on_cpu * 5 < blocked, "on-CPU {on_cpu} of {blocked} ns");
    let verdict = r.slow("cond")["verdict"].as_str().unwrap().to_string();
    assert!(
        verdict.contains("worker-2") && verdict.contains("network_reply"),
        "{verdict}"
    );
}

#[test]
fn sleep_is_woken_by_a_timer_not_a_thread() {
    require_root!();
    let r = run();
    let w = r.waker("sleep");
    assert_eq!(w["kind"], "irq", "{w}");
    assert_eq!(w["label"], "timer");
    assert_eq!((num(w, "tid"), num(w, "pid")), (0, 0));
    assert_eq!(num(w, "waker_on_cpu_ns"), 0);
    assert!(stack_has(w, "hrtimer_wakeup_[k]"), "{w}");
    r.assert_wait("sleep");
    let verdict = r.slow("sleep")["verdict"].as_str().unwrap();
    assert!(verdict.contains("woken by a timer"), "{verdict}");
}

#[test]
fn pipe_waker_is_the_helper_process_in_write_reply() {
    require_root!();
    let r = run();
    let w = r.waker("pipe");
    assert_eq!(w["kind"], "process");
    assert_eq!(num(w, "pid"), num(&r.truth, "helper_pid"));
    assert_eq!(num(w, "tid"), num(&r.truth, "helper_pid"));
    assert_eq!(w["comm"], "helper");
    assert!(stack_has(w, "write_reply"), "{w}");
    r.assert_wait("pipe");
    let verdict = r.slow("pipe")["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("process helper") && verdict.contains("write_reply"),
        "{verdict}"
    );
}

#[test]
fn groups_are_keyed_by_the_waker() {
    require_root!();
    let r = run();
    let keys: Vec<&str> = ["mutex", "cond", "sleep", "pipe"]
        .iter()
        .map(|k| r.slow(k)["key"].as_str().unwrap())
        .collect();
    for (key, want) in keys
        .iter()
        .zip(["flush_to_disk", "network_reply", "timer", "write_reply"])
    {
        assert!(key.contains(want), "key {key:?} names {want}");
    }
    let groups = r.d["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "four distinct groups: {groups:?}");
    for key in &keys {
        assert_eq!(
            groups.iter().filter(|g| g["key"] == *key).count(),
            1,
            "one group for {key}"
        );
    }
}

#[test]
fn text_and_timeline_show_the_chain_and_replay_matches() {
    require_root!();
    let r = run();
    let tid1 = num(&r.truth, "worker1_tid");
    assert!(
        r.txt.contains(&format!(
            "woken by worker-1 (tid {tid1}) in flush_to_disk <- save_all"
        )),
        "dispatches.txt:\n{}",
        r.txt
    );
    assert!(r.txt.contains("[waited for: "), "{}", r.txt);
    // trace.json: a flow from each waking thread or process to the main
    // thread, both ends sharing an id.
    let events = r.trace["traceEvents"].as_array().unwrap();
    let main = num(&r.truth, "pid");
    for waker in [
        tid1,
        num(&r.truth, "worker2_tid"),
        num(&r.truth, "helper_pid"),
    ] {
        let start = events
            .iter()
            .find(|e| e["ph"] == "s" && num(e, "tid") == waker)
            .unwrap_or_else(|| panic!("no flow start on {waker}"));
        let id = num(start, "id");
        let end = events
            .iter()
            .find(|e| e["ph"] == "f" && num(e, "id") == id)
            .unwrap_or_else(|| panic!("no flow end for id {id}"));
        assert_eq!((num(end, "pid"), num(end, "tid")), (main, main));
        assert_eq!(end["bp"], "e");
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "X" && num(e, "tid") == waker && e["cat"] == "waker"),
            "a slice on the waker's track for the arrow to leave from"
        );
    }
    assert_eq!(r.replayed, r.d, "profile.data replays the wakers");
}

#[test]
fn no_wakers_records_the_same_dispatches_without_wakers() {
    require_root!();
    let (on, off) = (run(), run_without_wakers());
    assert_eq!(on.d["wakers_recorded"], true);
    assert_eq!(off.d["wakers_recorded"], false);
    // The waker sampler (cpu-clock on every CPU) is not attached.
    assert_eq!(
        on.links - off.links,
        online_cpus(),
        "BPF links with wakers {} and without {}",
        on.links,
        off.links
    );
    for kind in ["mutex", "cond", "sleep", "pipe"] {
        let s = off.slow(kind);
        assert!(
            s.get("wakers").is_none(),
            "{kind}: no wakers key (not recorded, rather than none found): {s}"
        );
        assert!(on.slow(kind)["wakers"]
            .as_array()
            .is_some_and(|w| w.len() == 1));
        // The blocked time is still split exactly.
        let (_, wait) = off.truth_of(kind);
        let blocked = num(s, "blocked_ns") + num(s, "runnable_ns");
        let mut tol = wait / 20;
        if blocked.abs_diff(wait) > tol
            && relaxed(&format!(
                "{kind}: blocked + runnable {blocked} ns against the fixture's wait of {wait} ns, \
                 outside 5%: 15% allowed (the emulated CPU runs the fixture's code around the \
                 wait, on-CPU, for milliseconds)"
            ))
        {
            tol = wait * 3 / 20;
        }
        assert!(
            blocked.abs_diff(wait) <= tol,
            "{kind}: blocked + runnable {blocked} ns, fixture waited {wait} ns"
        );
        let verdict = s["verdict"].as_str().unwrap();
        assert!(!verdict.contains("woken by"), "{kind}: {verdict}");
    }
    assert!(
        off.txt.contains("wakers: not recorded (--no-wakers)") && !off.txt.contains("woken by"),
        "dispatches.txt:\n{}",
        off.txt
    );
    assert!(
        !off.trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["ph"] == "s" || e["cat"] == "waker"),
        "no waker slices or flows in trace.json"
    );
    assert_eq!(off.replayed, off.d, "profile.data replays --no-wakers");
}

/// Issue 44: a loop that waits on a condition variable (a futex) for a
/// producer's items (`fixtures/queue_loop.c`) gets each iteration's
/// source: the producer thread, named where it posted the item. Its 4
/// slow items are 4 slow dispatches, exactly, each started by the
/// producer in `post_item <- producer_main`.
#[test]
fn a_futex_loops_iterations_are_sourced_by_the_producer_that_woke_it() {
    require_root!();
    let exe = build_c(
        "queue_loop.c",
        "queue_loop",
        &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
    );
    let mut fx = Fixture::spawn(&exe, &[]);
    let out = TempDir::new("queue-loop");
    let rec = Recording::start(fx.pid, out.path(), &["--threshold", "100ms"]);
    let truth = fx.run();
    // The truth is printed in an iteration of its own; let the loop go
    // back to its wait before the stop.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    fx.release();
    assert_nothing_attached();
    let d = read_json(out.path(), "dispatches.json");
    let rule = d["rule"].as_str().unwrap_or_default();
    assert!(rule.contains("the loop's wait is futex"), "{rule}");
    let slow = d["slow"].as_array().expect("slow array");
    assert_eq!(slow.len() as u64, num(&truth, "slow"), "{slow:?}");
    let producer = num(&truth, "producer_tid");
    for s in slow {
        let src = &s["source"];
        assert_eq!(src["comm"], "producer", "{s}");
        assert_eq!(num(src, "tid"), producer, "{s}");
        assert_eq!(src["kind"], "thread", "{s}");
        let f = src["function"].as_str().unwrap_or_default();
        assert!(f.starts_with("post_item"), "where it posted: {src}");
        assert!(
            s["key"]
                .as_str()
                .unwrap_or_default()
                .contains("handle_item"),
            "{s}"
        );
    }
    let txt = read(out.path(), "dispatches.txt");
    assert!(
        txt.contains("started by producer (tid ") && txt.contains("in post_item"),
        "{txt}"
    );
}
