//! Slow main-thread dispatches (BlockCanary / Matrix): the `eventloop` fixture
//! runs 300 messages on a known schedule through `dispatch_message`, and the
//! profiler's `dispatches.json` must flag exactly its slow ones, explain them
//! (on-CPU vs blocked, the trimmed tree, one group per cause), report the hang
//! while it is still running, and bucket every dispatch into frame classes as
//! the fixture's own durations do.
use profiler_tests::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Probes and thresholds of the main test (the issue's command line).
const DISPATCH_ARGS: [&str; 18] = [
    "--dispatch",
    "dispatch_message",
    "--func",
    "handle_*",
    "--func",
    "step_*",
    "--func",
    "load_config",
    "--func",
    "parse_json",
    "--func",
    "save_state",
    "--func",
    "sleep_handler",
    "--threshold",
    "50ms",
    "--hang",
    "1s",
];
const THRESHOLD_NS: u64 = 50_000_000;
const HANG_NS: u64 = 1_000_000_000;
/// Messages the fixture dispatches (NMSG in eventloop.c).
const MESSAGES: usize = 300;

/// Under emulation the session's first dispatch also holds the first
/// return probe's hit, which maps the process's out-of-line page (see
/// `fast_dispatches_leave_no_detail_but_a_worst_summary`): 19-32 ms past
/// the fixture's clock in the 6.1 VM.
const FIRST_HIT_NS: u64 = 50_000_000;

/// Under emulation, the fast messages that emulation stretched (see
/// [`TCG_STALL_NS`]): longer than [`fast_message_bound`] by their own
/// clock, or reported longer than it (at most a fifth of them). Each one reported (`slow` or `worst`) must be no shorter
/// than the fixture's clock and no longer than a stall past it (and, for
/// the first dispatch, the page's mapping). Empty outside emulation.
fn stretched(msgs: &[Msg], d: &Value) -> BTreeSet<u64> {
    if !emulated() {
        return BTreeSet::new();
    }
    let reported: BTreeMap<u64, u64> = arr(d, "slow")
        .iter()
        .chain(arr(d, "worst"))
        .map(|e| (num(e, "index"), num(e, "duration_ns")))
        .collect();
    let bound = fast_message_bound(THRESHOLD_NS);
    let mut set = BTreeSet::new();
    for m in msgs.iter().filter(|m| m.kind == "fast") {
        let tol = (m.duration_ns / 20).max(500_000);
        let got = reported.get(&m.index).copied();
        if m.duration_ns < bound && got.is_none_or(|g| g <= m.duration_ns + tol) {
            continue;
        }
        if let Some(g) = got {
            let extra = TCG_STALL_NS + if m.index == 0 { FIRST_HIT_NS } else { 0 };
            assert!(
                g + tol >= m.duration_ns && g <= m.duration_ns + tol + extra,
                "fast message {}: profiler says {g} ns, the fixture {} ns: more than emulation stretches",
                m.index,
                m.duration_ns
            );
        }
        set.insert(m.index);
    }
    let fast = msgs.iter().filter(|m| m.kind == "fast").count();
    assert!(
        set.len() * 5 <= fast,
        "fixture ran off its design (machine overloaded?): {} of {fast} fast messages stretched: {set:?}",
        set.len()
    );
    if !set.is_empty() {
        relaxed(&format!(
            "fast messages {set:?} stretched by the emulation (a vCPU stalled up to 100 ms; the first \
             dispatch maps the out-of-line page) may be reported slow, within that of the fixture's clock"
        ));
    }
    set
}

/// The indexes `d` must report slow: the fixture's slow messages, and
/// under emulation the [`stretched`] fast ones it did report slow.
fn want_slow_in(msgs: &[Msg], d: &Value) -> BTreeSet<u64> {
    let stretched = stretched(msgs, d);
    let reported: BTreeSet<u64> = arr(d, "slow").iter().map(|s| num(s, "index")).collect();
    msgs.iter()
        .filter(|m| {
            m.kind != "fast" || (stretched.contains(&m.index) && reported.contains(&m.index))
        })
        .map(|m| m.index)
        .collect()
}

/// `target/fixtures/eventloop`, built once per test process from
/// `fixtures/eventloop.c`.
fn eventloop_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "eventloop.c",
            "eventloop",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

/// `profiler record --pid PID --out OUT extra…` with every stderr line
/// prefixed by the CLOCK_REALTIME microsecond at which it was written (bash's
/// `$EPOCHREALTIME`), so that the `HANG` line can be placed against the
/// fixture's own clock. `exec` keeps the profiler's PID the child's PID, so
/// [`Recording::stop`] signals the profiler itself.
fn timestamped_record(pid: u32, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(
            r#"exec "$@" 2> >(while IFS= read -r l; do printf '%s %s\n' "${EPOCHREALTIME/[.,]/}" "$l"; done >&2)"#,
        )
        .arg("bash")
        .arg(profiler_bin())
        .args(["record", "--pid", &pid.to_string(), "--out"])
        .arg(out)
        .args(extra);
    cmd
}

/// Splits a [`timestamped_record`] stderr line into (realtime ns, text).
fn stamped(line: &str) -> (u64, &str) {
    let (us, text) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("untimestamped stderr line {line:?}"));
    let us: u64 = us
        .parse()
        .unwrap_or_else(|_| panic!("bad timestamp in stderr line {line:?}"));
    (us * 1000, text)
}

/// One message of the fixture's ground truth.
#[derive(Debug, Clone)]
struct Msg {
    index: u64,
    kind: String,
    duration_ns: u64,
}

fn messages(truth: &Value) -> Vec<Msg> {
    let msgs: Vec<Msg> = truth["messages"]
        .as_array()
        .expect("truth messages")
        .iter()
        .map(|m| Msg {
            index: num(m, "index"),
            kind: m["type"].as_str().expect("message type").to_string(),
            duration_ns: num(m, "duration_ns"),
        })
        .collect();
    assert_eq!(msgs.len(), MESSAGES, "fixture message count");
    // The schedule only means something if the fixture ran as designed: a
    // heavily loaded machine could stretch a fast message past the threshold.
    // Under emulation a fast one may hold a vCPU stall ([`stretched`]).
    let fast_bound = if emulated() {
        THRESHOLD_NS / 5 + TCG_STALL_NS
    } else {
        fast_message_bound(THRESHOLD_NS)
    };
    for m in &msgs {
        let fast = m.kind == "fast";
        assert!(
            if fast {
                m.duration_ns < fast_bound
            } else {
                m.duration_ns > THRESHOLD_NS * 2
            },
            "fixture ran off its design (machine overloaded?): {m:?}"
        );
    }
    msgs
}

/// Reads and parses `dir/dispatches.json`, saying what is missing if absent.
fn load_dispatches(dir: &Path, fin: &Finished) -> Value {
    let p = dir.join("dispatches.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        let files: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        panic!(
            "{} not written ({e}): slow-dispatch detection missing? --out holds {files:?}; \
             profiler stderr: {:?}",
            p.display(),
            fin.stderr
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("dispatches.json is not JSON: {e}"))
}

fn arr<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no array {key:?} in dispatches.json: {v}"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no string {key:?} in {v}"))
}

/// Every value of an `"index"` key anywhere in `v`.
fn all_indexes(v: &Value, acc: &mut Vec<u64>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                if k == "index" {
                    if let Some(i) = x.as_u64() {
                        acc.push(i);
                    }
                }
                all_indexes(x, acc);
            }
        }
        Value::Array(xs) => xs.iter().for_each(|x| all_indexes(x, acc)),
        _ => {}
    }
}

/// Frame bucket of a dispatch (Matrix FrameTracer).
fn bucket(duration_ns: u64, frame_ns: u64) -> &'static str {
    match duration_ns / frame_ns {
        42.. => "frozen",
        24.. => "high",
        9.. => "middle",
        3.. => "normal",
        _ => "best",
    }
}

/// Runs the fixture under `profiler record extra…` (stderr timestamped) and
/// returns (truth, finished run, dispatches.json, output dir).
fn record(tag: &str, extra: &[&str]) -> (Value, Finished, Value, TempDir) {
    let out = TempDir::new(tag);
    let state = TempDir::new(&format!("{tag}-state"));
    let mut fx = Fixture::spawn(eventloop_exe(), &[state.path().to_str().unwrap()]);
    let rec = Recording::spawn(timestamped_record(fx.pid, out.path(), extra));
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    assert!(fx.alive(), "fixture died while profiled");
    assert_text_unchanged(fx.pid, &fx.exe);
    let d = load_dispatches(out.path(), &fin);
    assert_eq!(
        num(&d["thread"], "tid"),
        u64::from(fx.pid),
        "watched thread is the main thread (tid == pid): {}",
        d["thread"]
    );
    fx.release();
    (truth, fin, d, out)
}

/// The main recording (the issue's command line, [`DISPATCH_ARGS`]), made
/// once by the first check that asks for it and read by all of them.
struct Main {
    truth: Value,
    msgs: Vec<Msg>,
    /// Under emulation, the fast messages emulation stretched ([`stretched`]).
    stretched: BTreeSet<u64>,
    fin: Finished,
    /// dispatches.json.
    d: Value,
    /// dispatches.txt, or why it could not be read.
    txt: Result<String, String>,
    /// Each flame graph `groups` names, or why it could not be read.
    svgs: BTreeMap<String, Result<String, String>>,
}

/// The shared recording; the output directory is read into memory and
/// removed once it is made.
fn main_recording() -> &'static Main {
    static MAIN: OnceLock<Main> = OnceLock::new();
    MAIN.get_or_init(|| {
        let (truth, fin, d, out) = record("dispatch", &DISPATCH_ARGS);
        let msgs = messages(&truth);
        let read = |name: &str| {
            let p = out.join(name);
            std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))
        };
        let txt = read("dispatches.txt");
        let svgs = arr(&d, "groups")
            .iter()
            .filter_map(|g| g["svg"].as_str())
            .map(|name| (name.to_string(), read(name)))
            .collect();
        Main {
            stretched: stretched(&msgs, &d),
            truth,
            msgs,
            fin,
            d,
            txt,
            svgs,
        }
    })
}

impl Main {
    fn by_index(&self) -> BTreeMap<u64, &Msg> {
        self.msgs.iter().map(|m| (m.index, m)).collect()
    }

    /// Indexes of the fixture's slow messages (and under emulation the
    /// [`stretched`] fast ones reported slow).
    fn want_slow(&self) -> BTreeSet<u64> {
        want_slow_in(&self.msgs, &self.d)
    }

    /// The `slow` entries by index.
    fn slow_of(&self) -> BTreeMap<u64, &Value> {
        arr(&self.d, "slow")
            .iter()
            .map(|s| (num(s, "index"), s))
            .collect()
    }

    /// The slow entries of the five config (parse_json) messages.
    fn config(&self) -> Vec<&Value> {
        let slow_of = self.slow_of();
        self.msgs
            .iter()
            .filter(|m| m.kind == "config")
            .map(|m| slow_of[&m.index])
            .collect()
    }

    /// The key of the first config dispatch: parse_json's group.
    fn config_key(&self) -> &str {
        str_of(self.config()[0], "key")
    }

    fn frame_ns(&self) -> u64 {
        num(&self.d, "frame_interval_ns")
    }

    /// Indexes of the messages longer than `--hang`.
    fn want_hangs(&self) -> BTreeSet<u64> {
        self.msgs
            .iter()
            .filter(|m| m.duration_ns > HANG_NS)
            .map(|m| m.index)
            .collect()
    }
}

#[test]
fn header_has_the_rule_thresholds_count_and_percentiles() {
    require_root!();
    let d = &main_recording().d;
    let rule = str_of(d, "rule");
    assert!(
        rule.contains("--dispatch"),
        "rule {rule:?} names --dispatch"
    );
    assert_eq!(num(d, "threshold_ns"), THRESHOLD_NS, "threshold_ns");
    assert_eq!(num(d, "hang_ns"), HANG_NS, "hang_ns");
    let frame_ns = num(d, "frame_interval_ns");
    assert!(
        (16_660_000..=16_670_000).contains(&frame_ns),
        "default frame interval 16.67 ms, got {frame_ns} ns"
    );
    assert_eq!(
        num(d, "dispatches"),
        MESSAGES as u64,
        "every message is one dispatch"
    );
    assert!(
        d["dispatches_per_sec"].as_f64().is_some_and(|r| r > 0.0),
        "dispatches_per_sec: {}",
        d["dispatches_per_sec"]
    );
    let (p50, p95, p99) = (num(d, "p50_ns"), num(d, "p95_ns"), num(d, "p99_ns"));
    assert!(p50 < THRESHOLD_NS, "p50 {p50} ns under the threshold");
    assert!(
        p50 <= p95 && p95 <= p99,
        "p50 {p50} <= p95 {p95} <= p99 {p99}"
    );
}

#[test]
fn exactly_the_slow_messages_with_their_durations_splits_and_trees() {
    require_root!();
    let r = main_recording();
    let (by_index, want_slow, frame_ns) = (r.by_index(), r.want_slow(), r.frame_ns());
    let slow = arr(&r.d, "slow");
    let got_slow: BTreeSet<u64> = slow.iter().map(|s| num(s, "index")).collect();
    assert_eq!(got_slow, want_slow, "slow dispatch indexes");
    assert_eq!(
        slow.len(),
        want_slow.len(),
        "one `slow` entry per slow dispatch"
    );
    let slow_of = r.slow_of();
    let mut last_start = 0;
    for (&i, s) in &slow_of {
        let m = by_index[&i];
        if r.stretched.contains(&i) {
            continue;
        }
        assert_close(
            &format!("duration_ns of dispatch {i} ({})", m.kind),
            num(s, "duration_ns"),
            m.duration_ns,
        );
        let start = num(s, "start_ns");
        assert!(start >= last_start, "start_ns increases with index: {s}");
        last_start = start;
        // on-CPU / blocked / runnable split the dispatch's wall time.
        let (dur, on_cpu) = (num(s, "duration_ns"), num(s, "on_cpu_ns"));
        let (blocked, runnable) = (num(s, "blocked_ns"), num(s, "runnable_ns"));
        let split = format!(
            "dispatch {i} ({}): on_cpu {on_cpu} blocked {blocked} runnable {runnable} of {dur} ns",
            m.kind
        );
        assert!(
            (on_cpu + blocked + runnable).abs_diff(dur) <= dur / 100,
            "on_cpu + blocked + runnable = duration: {split}"
        );
        let share = on_cpu as f64 / dur as f64;
        match m.kind.as_str() {
            "config" | "trap" | "hang" => {
                // On a shared machine a spinning thread also waits for a CPU
                // (runnable); that wait is not its own doing, so the strict
                // share applies to the time it was not kept off the CPU.
                let busy = on_cpu as f64 / dur.saturating_sub(runnable).max(1) as f64;
                if runnable > dur / 10 {
                    eprintln!("note: machine loaded, {split}");
                } else {
                    assert!(share > 0.8, "CPU-bound, on-CPU share > 80%: {split}");
                }
                assert!(
                    busy > 0.8,
                    "CPU-bound, on-CPU > 80% of the time not runnable: {split}"
                );
                assert!(num(s, "samples") > 0, "sampled while on-CPU: {s}");
            }
            "sleep" | "save" => {
                // Under emulation the probes' and the scheduler's own work
                // on the thread grows tenfold (on-CPU 20% of a 152-ms save,
                // 31% of a 182-ms one with the host loaded).
                let (on_max, blocked_min) = match relaxed(
                    "a blocked dispatch: on-CPU < 40% and blocked > 60%, not 20% and 80%",
                ) {
                    true => (0.4, 0.6),
                    false => (0.2, 0.8),
                };
                assert!(share < on_max, "blocked, on-CPU share small: {split}");
                assert!(
                    blocked as f64 > blocked_min * dur as f64,
                    "blocked most of the time: {split}"
                );
            }
            other => panic!("unexpected slow type {other}"),
        }
        let dropped = num(s, "dropped_frames");
        assert_eq!(
            dropped,
            num(s, "duration_ns") / frame_ns,
            "dropped_frames = floor(duration / frame interval): {s}"
        );
        let tree = arr(s, "tree");
        assert!(!tree.is_empty(), "slow dispatch {i} has a tree");
        assert_eq!(num(&tree[0], "depth"), 0, "tree root depth: {s}");
        assert_eq!(
            str_of(&tree[0], "name"),
            "dispatch_message",
            "tree root is the dispatch function"
        );
        assert!(
            tree.len() <= 25,
            "trimmed tree of dispatch {i} keeps ~20 nodes, has {}",
            tree.len()
        );
    }
}

/// The five parse_json dispatches: one cause, one group of five.
#[test]
fn parse_json_dispatches_share_one_key_and_one_group() {
    require_root!();
    let r = main_recording();
    let (config, want_slow) = (r.config(), r.want_slow());
    assert_eq!(config.len(), 5, "fixture has five config messages");
    let key = str_of(config[0], "key");
    assert!(
        key.contains("parse_json"),
        "config key {key:?} names parse_json"
    );
    for s in &config {
        assert_eq!(str_of(s, "key"), key, "same cause, same key: {s}");
        let verdict = str_of(s, "verdict");
        // The verdict names the dominant state of the measured split: on a
        // loaded machine a CPU-bound dispatch may mostly wait for a CPU.
        let state = if s["runnable_ns"].as_u64() > s["on_cpu_ns"].as_u64() {
            "waiting for a CPU"
        } else {
            "on-CPU"
        };
        assert!(
            verdict.contains(state) && verdict.contains("parse_json"),
            "config verdict {verdict:?} says {state} in parse_json: {s}"
        );
    }
    let groups = arr(&r.d, "groups");
    let pj: Vec<&Value> = groups
        .iter()
        .filter(|g| str_of(g, "key").contains("parse_json"))
        .collect();
    assert_eq!(
        pj.len(),
        1,
        "exactly one group for parse_json: {:?}",
        pj.iter().map(|g| &g["key"]).collect::<Vec<_>>()
    );
    assert_eq!(str_of(pj[0], "key"), key, "group key");
    assert_eq!(num(pj[0], "count"), 5, "parse_json group count: {}", pj[0]);
    let want_total: u64 = config.iter().map(|s| num(s, "duration_ns")).sum();
    let got_total = num(pj[0], "total_ns");
    assert!(
        got_total.abs_diff(want_total) <= 1_000_000,
        "group total {got_total} = sum of its dispatches {want_total}"
    );
    let totals: Vec<u64> = groups.iter().map(|g| num(g, "total_ns")).collect();
    assert!(
        totals.windows(2).all(|w| w[0] >= w[1]),
        "groups sorted by total time: {totals:?}"
    );
    let counted: u64 = groups.iter().map(|g| num(g, "count")).sum();
    assert_eq!(
        counted,
        want_slow.len() as u64,
        "groups cover the slow dispatches"
    );
}

/// Blocked dispatches: the verdict says blocked, the tree hangs a `blocked`
/// node under the handler, and the blocking stacks account for the blocked
/// time. (Not asserted: that a raw stack names the handler; frame-pointer
/// unwinding out of a frameless libc function skips it.)
#[test]
fn blocked_dispatches_show_where_they_blocked() {
    require_root!();
    let r = main_recording();
    let slow_of = r.slow_of();
    for m in r
        .msgs
        .iter()
        .filter(|m| m.kind == "sleep" || m.kind == "save")
    {
        let s = slow_of[&m.index];
        let verdict = str_of(s, "verdict");
        let handler = if m.kind == "sleep" {
            "sleep_handler"
        } else {
            "save_state"
        };
        assert!(
            verdict.contains("blocked") && verdict.contains(handler),
            "{} verdict {verdict:?} says blocked in {handler}",
            m.kind
        );
        let tree = arr(s, "tree");
        let blocked_parent = tree.iter().enumerate().find_map(|(n, node)| {
            (str_of(node, "kind") == "blocked").then(|| {
                let depth = num(node, "depth");
                tree[..n]
                    .iter()
                    .rev()
                    .find(|p| num(p, "depth") + 1 == depth)
                    .map(|p| str_of(p, "name"))
            })?
        });
        assert_eq!(
            blocked_parent,
            Some(handler),
            "dispatch {} tree has a blocked node under {handler}: {tree:?}",
            m.index
        );
        let stacks = arr(s, "blocking_stacks");
        let stacked: u64 = stacks.iter().map(|b| num(b, "ns")).sum();
        let blocked = num(s, "blocked_ns");
        assert!(
            !stacks.is_empty() && stacked.abs_diff(blocked) <= blocked / 20 + 500_000,
            "blocking stacks of dispatch {} sum to blocked_ns {blocked}: {stacks:?}",
            m.index
        );
        assert!(
            stacks.iter().any(|b| arr(b, "stack")
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.contains("nanosleep")))),
            "a blocking stack of dispatch {} is in nanosleep: {stacks:?}",
            m.index
        );
    }
}

/// BlockCanary's trap: A1 (790 ms), A2 (30 ms), A3 (300 ms).
#[test]
fn blockcanary_trap_is_blamed_on_step_a1() {
    require_root!();
    let r = main_recording();
    let trap = r.msgs.iter().find(|m| m.kind == "trap").unwrap();
    let s = r.slow_of()[&trap.index];
    let names: Vec<&str> = arr(s, "tree").iter().map(|n| str_of(n, "name")).collect();
    let pos = |f: &str| names.iter().position(|n| *n == f);
    let (a1, a3) = (pos("step_a1"), pos("step_a3"));
    assert!(
        a1.is_some() && a3.is_some() && a1 < a3,
        "trap tree names step_a1 before step_a3: {names:?}"
    );
    assert!(
        pos("step_a2").is_none(),
        "trap tree trims step_a2 (30 ms of 1120): {names:?}"
    );
    let (tkey, tverdict) = (str_of(s, "key"), str_of(s, "verdict"));
    assert!(
        tkey.contains("step_a1") && !tkey.contains("step_a2"),
        "trap key {tkey:?} names step_a1"
    );
    assert!(
        tverdict.contains("step_a1") && !tverdict.contains("step_a2"),
        "trap verdict {tverdict:?} names step_a1"
    );
}

/// Hangs: every dispatch longer than --hang 1s (the 2.5 s hang, and the
/// 1.12 s trap too), each reported while it ran and completed afterwards.
#[test]
fn hangs_are_reported_while_they_run() {
    require_root!();
    let r = main_recording();
    let (by_index, slow_of, want_hangs) = (r.by_index(), r.slow_of(), r.want_hangs());
    let trap = r.msgs.iter().find(|m| m.kind == "trap").unwrap();
    let hangs = arr(&r.d, "hangs");
    let got_hangs: BTreeSet<u64> = hangs.iter().map(|h| num(h, "index")).collect();
    // Under emulation the trap (790 + 30 ms of work) runs past 1 s by the
    // fixture's clock, and either side of it by the profiler's, whose
    // figures leave the probes' cost out: the clear hangs must be there.
    let near = |i: &u64| {
        by_index
            .get(i)
            .is_some_and(|m| m.duration_ns < HANG_NS * 13 / 10)
    };
    let want_hangs: BTreeSet<u64> = match got_hangs != want_hangs
        && relaxed("a dispatch within 30% over the hang threshold may or may not be a hang")
    {
        true => {
            let clear: BTreeSet<u64> = want_hangs.iter().filter(|i| !near(i)).copied().collect();
            assert!(
                clear.is_subset(&got_hangs),
                "hang indexes: {hangs:?}, want {clear:?}"
            );
            got_hangs.clone()
        }
        false => want_hangs,
    };
    assert_eq!(got_hangs, want_hangs, "hang indexes: {hangs:?}");
    assert_eq!(
        hangs.len(),
        want_hangs.len(),
        "one entry per hang: {hangs:?}"
    );
    for h in hangs {
        let i = num(h, "index");
        let after = num(h, "reported_after_ns");
        let dur = h["duration_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("hang duration_ns filled in once it ended: {h}"));
        assert_close(
            &format!("hang {i} duration_ns"),
            dur,
            by_index[&i].duration_ns,
        );
        assert!(
            after < dur,
            "hang {i} reported before it ended: reported_after_ns {after} vs duration_ns {dur}"
        );
        assert!(
            (HANG_NS..HANG_NS + 500_000_000).contains(&after),
            "hang {i} reported soon after --hang 1s: reported_after_ns {after}"
        );
        assert!(!arr(h, "stack").is_empty(), "hang {i} has a stack: {h}");
        assert!(
            num(h, "start_ns").abs_diff(num(slow_of[&i], "start_ns")) <= 1_000_000,
            "hang start_ns equals its dispatch's: {h}"
        );
    }
    // The trap's hang report catches it in step_a3 (790 + 30 ms < 1 s).
    let trap_hang = hangs.iter().find(|h| num(h, "index") == trap.index);
    let trap_stack: Vec<&str> = trap_hang
        .map(|h| arr(h, "stack").iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    assert!(
        (trap_hang.is_none() && !want_hangs.contains(&trap.index))
            || (trap_stack.contains(&"step_a3") && trap_stack.contains(&"handle_trap")),
        "the trap's hang stack at 1 s is in step_a3 <- handle_trap: {trap_stack:?}"
    );
    // The HANG line of the 2.5 s hang is on stderr while the fixture is in it.
    let hang_truth = &r.truth["hang"];
    let (hang_start, hang_end) = (
        num(hang_truth, "start_realtime_ns"),
        num(hang_truth, "end_realtime_ns"),
    );
    let hang_lines: Vec<(u64, &str)> = r
        .fin
        .stderr
        .iter()
        .map(|l| stamped(l))
        .filter(|(_, l)| l.contains("HANG"))
        .collect();
    assert_eq!(
        hang_lines.len(),
        want_hangs.len(),
        "one HANG line per hang: {hang_lines:?}"
    );
    let during: Vec<String> = hang_lines
        .iter()
        .map(|&(t, l)| {
            format!(
                "{l:?} at {} ms into the hang",
                (t as i64 - hang_start as i64) / 1_000_000
            )
        })
        .collect();
    assert_eq!(
        hang_lines
            .iter()
            .filter(|(t, _)| hang_start < *t && *t < hang_end)
            .count(),
        1,
        "one HANG line written while the fixture was inside its {} ms hang: {during:?}",
        (hang_end - hang_start) / 1_000_000
    );
}

/// stderr while recording: one `slow dispatch` line per slow dispatch.
#[test]
fn one_slow_dispatch_line_each_on_stderr() {
    require_root!();
    let r = main_recording();
    let (want_slow, key) = (r.want_slow(), r.config_key());
    let slow_lines: Vec<&str> = r
        .fin
        .stderr
        .iter()
        .map(|l| stamped(l).1)
        .filter(|l| l.starts_with("profiler: slow dispatch"))
        .collect();
    assert_eq!(
        slow_lines.len(),
        want_slow.len(),
        "one `profiler: slow dispatch` line per slow dispatch: {slow_lines:?}"
    );
    assert!(
        slow_lines.iter().any(|l| l.contains(key)),
        "a slow-dispatch line carries the key {key:?}: {slow_lines:?}"
    );
}

/// Frame buckets: every dispatch, fast ones too, as the fixture's durations say.
#[test]
fn frame_buckets_match_the_fixture_durations() {
    require_root!();
    let r = main_recording();
    let frame_ns = r.frame_ns();
    let borders = [3u64, 9, 24, 42];
    let mut want_frames: BTreeMap<&str, u64> = ["best", "normal", "middle", "high", "frozen"]
        .into_iter()
        .map(|b| (b, 0))
        .collect();
    // A stretched message (under emulation) may fall in any bucket: the
    // others must be where the fixture's clock puts them, and the
    // stretched ones make up the rest.
    for m in r.msgs.iter().filter(|m| !r.stretched.contains(&m.index)) {
        assert!(
            borders
                .iter()
                .all(|b| m.duration_ns.abs_diff(b * frame_ns) > 500_000),
            "fixture duration too near a frame-bucket border, retry: {m:?}"
        );
        *want_frames
            .get_mut(bucket(m.duration_ns, frame_ns))
            .unwrap() += 1;
    }
    let mut extra = 0;
    for (b, want) in &want_frames {
        let got = num(&r.d["frames"], b);
        assert!(
            got >= *want && got - want <= r.stretched.len() as u64,
            "frames.{b}: {} (fixture durations give {want_frames:?}, stretched {:?})",
            r.d["frames"],
            r.stretched
        );
        extra += got - want;
    }
    assert_eq!(
        extra,
        r.stretched.len() as u64,
        "every dispatch is in one bucket: {}",
        r.d["frames"]
    );
}

/// Bounded memory: no fast dispatch left any detail behind. `worst` is the
/// exception by design: the N longest dispatches (index, start, duration,
/// key), which past the slow ones may name a fast one; it must list every
/// slow dispatch first, longest first, and carry nothing more for a fast one.
#[test]
fn fast_dispatches_leave_no_detail_but_a_worst_summary() {
    require_root!();
    let r = main_recording();
    let (by_index, want_slow, d) = (r.by_index(), r.want_slow(), &r.d);
    let hang_index = num(&r.truth["hang"], "index");
    let mut seen = Vec::new();
    for (k, v) in d.as_object().expect("dispatches.json is an object") {
        if k != "worst" {
            all_indexes(v, &mut seen);
        }
    }
    let fast_seen: BTreeSet<u64> = seen
        .into_iter()
        .filter(|i| !want_slow.contains(i))
        .collect();
    assert!(
        fast_seen.is_empty(),
        "fast dispatches {fast_seen:?} left detail in dispatches.json"
    );
    let worst = arr(d, "worst");
    assert!(
        !worst.is_empty() && worst.len() <= 20,
        "worst lists a bounded number of dispatches: {worst:?}"
    );
    let durations: Vec<u64> = worst.iter().map(|w| num(w, "duration_ns")).collect();
    assert!(
        durations.windows(2).all(|w| w[0] >= w[1]),
        "worst is longest first: {durations:?}"
    );
    assert_eq!(
        num(&worst[0], "index"),
        hang_index,
        "worst[0] is the hang, the longest dispatch: {worst:?}"
    );
    for (n, w) in worst.iter().enumerate() {
        let i = num(w, "index");
        let m = by_index
            .get(&i)
            .unwrap_or_else(|| panic!("worst names dispatch {i}, beyond the fixture's"));
        let got = num(w, "duration_ns");
        // The first dispatch holds the process's first probe hits, and
        // the first return probe's hit maps the process's out-of-line
        // page (`xol_add_vma`, after the entry's timestamp), where the
        // trampoline's code is then translated for the first time:
        // microseconds on hardware, outside the fixture's clock. In the 6.1
        // VM, 19 ms against the fixture's 9 ms; later dispatches match.
        if r.stretched.contains(&i) {
            // Checked by `stretched`.
        } else if i == 0
            && got > m.duration_ns
            && relaxed(
                "the first dispatch may exceed the fixture's clock by 30 ms: its first \
                 return probe maps the out-of-line page",
            )
        {
            assert!(
                got - m.duration_ns < 30_000_000,
                "worst duration of 0: profiler says {got} ns, fixture measured {} ns",
                m.duration_ns
            );
        } else {
            assert_close(&format!("worst duration of {i}"), got, m.duration_ns);
        }
        if n < want_slow.len() {
            assert!(
                want_slow.contains(&i),
                "worst[{n}] is slow dispatch, got {w}"
            );
        } else {
            let extra: Vec<&String> = w
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| !["index", "start_ns", "duration_ns", "key"].contains(&k.as_str()))
                .collect();
            assert!(
                extra.is_empty(),
                "fast worst entry carries only a summary: {w}"
            );
        }
    }
}

/// dispatches.txt and the flame graphs.
#[test]
fn text_report_and_flame_graphs() {
    require_root!();
    let r = main_recording();
    let key = r.config_key();
    let txt = r.txt.as_ref().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        txt.contains(key),
        "dispatches.txt has the group key {key:?}:\n{txt}"
    );
    assert!(
        txt.contains("frozen"),
        "dispatches.txt has the frame statistics:\n{txt}"
    );
    assert!(
        r.fin.stdout.contains(key),
        "the dispatch report is printed too:\n{}",
        r.fin.stdout
    );
    let groups = arr(&r.d, "groups");
    let mut svgs: Vec<&str> = groups.iter().filter_map(|g| g["svg"].as_str()).collect();
    assert!(
        svgs.contains(&"dispatch-1.svg"),
        "the top group has dispatch-1.svg: {groups:?}"
    );
    svgs.dedup();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    for name in svgs {
        let svg = r.svgs[name].as_ref().unwrap_or_else(|e| panic!("{e}"));
        let doc = roxmltree::Document::parse_with_options(svg, opts)
            .unwrap_or_else(|e| panic!("{name} is not XML: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{name} root");
    }
}

#[test]
fn without_dispatch_every_outermost_call_counts() {
    require_root!();
    let args = [
        "--func",
        "dispatch_message",
        "--func",
        "handle_*",
        "--threshold",
        "50ms",
        "--hang",
        "1s",
    ];
    let (truth, _fin, d, _out) = record("dispatch-fallback", &args);
    let msgs = messages(&truth);
    let rule = str_of(&d, "rule");
    assert!(
        rule.contains("outermost"),
        "fallback rule {rule:?} says every outermost traced call counts"
    );
    assert_eq!(
        num(&d, "dispatches"),
        MESSAGES as u64,
        "every message is one outermost call of dispatch_message (rule {rule:?})"
    );
    let want_slow = want_slow_in(&msgs, &d);
    let got_slow: BTreeSet<u64> = arr(&d, "slow").iter().map(|s| num(s, "index")).collect();
    assert_eq!(got_slow, want_slow, "slow dispatch indexes");
}

/// Harness self-test, no profiler: the fixture's schedule and timing are what
/// the tests above assume.
#[test]
fn eventloop_truth_is_as_designed() {
    let state = TempDir::new("eventloop-truth");
    let mut fx = Fixture::spawn(eventloop_exe(), &[state.path().to_str().unwrap()]);
    let truth = fx.run();
    fx.release();
    let msgs = messages(&truth);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &msgs {
        *kinds.entry(m.kind.as_str()).or_default() += 1;
    }
    let want: BTreeMap<&str, usize> = [
        ("config", 5),
        ("fast", MESSAGES - 9),
        ("hang", 1),
        ("save", 1),
        ("sleep", 1),
        ("trap", 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(kinds, want, "message types");
    let h = &truth["hang"];
    let i = num(h, "index") as usize;
    assert_eq!(msgs[i].kind, "hang", "hang index");
    let mono = num(h, "end_ns") - num(h, "start_ns");
    let real = num(h, "end_realtime_ns") - num(h, "start_realtime_ns");
    assert!(
        mono >= 2_500_000_000 && mono <= msgs[i].duration_ns,
        "hang lasts 2.5 s: {h}"
    );
    assert!(mono.abs_diff(real) < 5_000_000, "realtime agrees: {h}");
    assert!(
        msgs[i].duration_ns > HANG_NS * 2,
        "hang well past --hang 1s"
    );
}
