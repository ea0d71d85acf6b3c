//! Reading the profiler's output directory and comparing it with a fixture's
//! ground truth.
use serde_json::Value;
use std::path::Path;

/// The files a recording writes into `--out DIR`.
pub struct Outputs {
    /// functions.json, parsed.
    pub json: Value,
    /// report.txt.
    pub report: String,
    /// trace.folded.
    pub folded: String,
    /// flamegraph.svg.
    pub svg: String,
}

/// Reads `dir/name` as text.
pub fn read(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Reads field `key` of `v` as u64, panicking with context if absent.
pub fn num(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer {key:?} in {v}"))
}

/// Asserts `got` is within 5% or 0.5 ms (whichever is larger) of `want`.
pub fn assert_close(what: &str, got: u64, want: u64) {
    let mut tol = (want / 20).max(500_000);
    if got.abs_diff(want) > tol
        && crate::relaxed(&format!(
            "{what}: {got} ns against the fixture's {want} ns, outside 5%: 50% allowed"
        ))
    {
        tol *= 10;
    }
    assert!(
        got.abs_diff(want) <= tol,
        "{what}: profiler says {got} ns, fixture measured {want} ns (tolerance {tol} ns)"
    );
}

/// Like [`assert_close`] for the total time of `calls` calls, except that
/// the profiler's figure may also exceed the fixture's by `probe_ns` per
/// call: its timestamps are taken inside the call's own entry and exit
/// probes, the fixture's inside the function, so each call's figure holds
/// part of what those two probes cost (about 20 µs a call on a slow host).
pub fn assert_close_probed(what: &str, got: u64, want: u64, calls: u64, probe_ns: u64) {
    let mut tol = (want / 20).max(500_000);
    let mut slack = calls.saturating_mul(probe_ns);
    if !(got + tol >= want && got <= want + tol + slack)
        && crate::relaxed(&format!(
            "{what}: {got} ns against the fixture's {want} ns, outside 5% and {probe_ns} ns a call: \
             50%, and ten times that or 2 ms a call allowed (a probe's first hits translate code)"
        ))
    {
        tol *= 10;
        slack = slack.saturating_mul(10).max(calls.saturating_mul(2_000_000));
    }
    assert!(
        got + tol >= want && got <= want + tol + slack,
        "{what}: profiler says {got} ns, fixture measured {want} ns (tolerance {tol} ns, \
         and up to {slack} ns more for {calls} calls' own probes)"
    );
}

impl Outputs {
    /// Loads all four outputs from `dir`.
    pub fn load(dir: &Path) -> Outputs {
        let json = read(dir, "functions.json");
        let json = serde_json::from_str(&json).unwrap_or_else(|e| panic!("functions.json: {e}"));
        Outputs {
            json,
            report: read(dir, "report.txt"),
            folded: read(dir, "trace.folded"),
            svg: read(dir, "flamegraph.svg"),
        }
    }

    /// Top-level field as u64.
    pub fn get(&self, key: &str) -> u64 {
        num(&self.json, key)
    }

    /// Entries of `functions` whose name is `name` or, for generics
    /// (`render::<u32>`), starts with `name::<`.
    pub fn functions(&self, name: &str) -> Vec<&Value> {
        entries(&self.json["functions"], name)
    }

    /// Sum of `key` over [`Outputs::functions`]`(name)`; panics if none.
    pub fn sum(&self, name: &str, key: &str) -> u64 {
        let fs = self.functions(name);
        assert!(
            !fs.is_empty(),
            "no function {name:?} in functions.json: {}",
            self.names()
        );
        fs.iter().map(|f| num(f, key)).sum()
    }

    /// Names listed in `functions`, for messages.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.json["functions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["name"].as_str())
            .collect();
        names.join(", ")
    }

    /// The `threads` entry with this tid.
    pub fn thread(&self, tid: u64) -> &Value {
        self.json["threads"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["tid"].as_u64() == Some(tid)))
            .unwrap_or_else(|| panic!("no thread {tid} in {}", self.json["threads"]))
    }

    /// The most one call's own entry and exit probes cost, from the
    /// calibration in `functions.json` (`governor.cost`). Without one, 0
    /// where durations were corrected (launch mode: the governor is off,
    /// each call's own share was taken out), but `profiler check`'s
    /// calibration on this host, measured once per test run, where nothing
    /// was taken out (`--raw-durations` with the governor off: no function
    /// has `hits_ns`).
    pub fn own_probes_ns(&self) -> u64 {
        let c = &self.json["governor"]["cost"];
        let get = |k: &str| c[k].as_f64().unwrap_or(0.0);
        let entry = get("entry_ns")
            .max(get("entry_push_ns"))
            .max(get("entry_nop_ns"));
        let exit = get("ret_site_ns").max(get("uretprobe_ns"));
        let raw = self.json["functions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|f| f["hits_ns"].as_u64().unwrap_or(0) == 0);
        match (entry + exit).ceil() as u64 {
            0 if raw => host_probes_ns(),
            ns => ns,
        }
    }

    /// Asserts exact call counts and close inclusive totals for every
    /// function of the fixture's `truth`, overall and per thread.
    pub fn assert_matches_truth(&self, truth: &Value, per_thread: bool) {
        // Each preemption of a fixture's thread (below) may have landed
        // inside a probe's handling of any function: the whole process's
        // count is allowed for on each function's total.
        let preempted = preempted(truth);
        for f in truth["functions"].as_array().expect("truth functions") {
            let name = f["name"].as_str().unwrap();
            assert_eq!(self.sum(name, "calls"), num(f, "calls"), "calls of {name}");
            let want = num(f, "total_ns");
            let calls = num(f, "calls");
            let waits = preempted
                .saturating_mul(SCHED_SLICE_NS)
                .div_ceil(calls.max(1));
            if want > 0 {
                assert_close_probed(
                    &format!("total_ns of {name} (preempted {preempted} times)"),
                    self.sum(name, "total_ns"),
                    want,
                    calls,
                    self.own_probes_ns() + waits,
                );
            }
        }
        if !per_thread {
            return;
        }
        for t in truth["threads"].as_array().expect("truth threads") {
            let tid = num(t, "tid");
            let got = self.thread(tid);
            for f in t["functions"].as_array().unwrap() {
                let name = f["name"].as_str().unwrap();
                let fs = entries(&got["functions"], name);
                let calls: u64 = fs.iter().map(|g| num(g, "calls")).sum();
                assert_eq!(calls, num(f, "calls"), "calls of {name} in thread {tid}");
                let total: u64 = fs.iter().map(|g| num(g, "total_ns")).sum();
                // A thread the scheduler preempted (the fixture counts it:
                // `preempted`, its involuntary context switches) may have
                // waited for a CPU inside its probes' handling, where the
                // fixture's clock does not run: each such wait may add up to
                // one scheduler slice to the profiler's figure alone.
                let preempted = t["preempted"].as_u64().unwrap_or(0);
                let calls = num(f, "calls");
                let waits = preempted
                    .saturating_mul(SCHED_SLICE_NS)
                    .div_ceil(calls.max(1));
                assert_close_probed(
                    &format!("total_ns of {name} in {tid} (preempted {preempted} times)"),
                    total,
                    num(f, "total_ns"),
                    calls,
                    self.own_probes_ns() + waits,
                );
            }
        }
    }
}

/// How often the fixture's threads were preempted (`preempted` in its
/// truth, each thread's involuntary context switches): each time, a wait
/// for a CPU inside a probe's handling may lengthen the profiler's figures
/// alone, by up to [`SCHED_SLICE_NS`].
pub fn preempted(truth: &Value) -> u64 {
    truth["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["preempted"].as_u64().unwrap_or(0))
        .sum()
}

/// The longest a runnable thread waits for a CPU at one preemption, as
/// the tests allow it: EEVDF's base slice (0.75 ms, scaled by 1 + log2 of
/// the CPU count: 1.5 ms on two CPUs), doubled for the host's own noise.
pub const SCHED_SLICE_NS: u64 = 3_000_000;

fn entries<'a>(list: &'a Value, name: &str) -> Vec<&'a Value> {
    let generic = format!("{name}::<");
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["name"]
                .as_str()
                .is_some_and(|n| n == name || n.starts_with(&generic))
        })
        .collect()
}

/// The `TRUTH {json}` line the stages fixture prints on stdout.
pub fn truth_line(stdout: &str) -> Value {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TRUTH "))
        .unwrap_or_else(|| panic!("no TRUTH line from the fixture in stdout:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad truth line {line:?}: {e}"))
}

/// A list of u64 in `v[key]`.
pub fn u64s(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no array {key:?} in {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("{key}: {x} not u64")))
        .collect()
}

/// Reads and parses `dir/name` as JSON.
pub fn read_json(dir: &Path, name: &str) -> Value {
    let text = read(dir, name);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// The share of `comm`'s `total` samples that are complete (from
/// `_start`), pass through frame `within`, and do not hold frame `without`:
/// a program's own work beside the chain a test follows.
pub fn complete_share_beside(
    stacks: &[(Vec<String>, u64)],
    comm: &str,
    within: &str,
    without: &str,
    total: u64,
) -> f64 {
    stacks
        .iter()
        .filter(|(s, _)| s[0] == comm && s.get(1).is_some_and(|f| f == "_start"))
        .filter(|(s, _)| s.iter().any(|f| f == within) && !s.iter().any(|f| f == without))
        .map(|(_, n)| n)
        .sum::<u64>() as f64
        / total.max(1) as f64
}

/// `cpu.folded` (or any folded file) as (frames, count) pairs.
pub fn folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, n) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {l:?}"));
            let n = n
                .parse()
                .unwrap_or_else(|_| panic!("folded line count: {l:?}"));
            (stack.split(';').map(str::to_string).collect(), n)
        })
        .collect()
}

/// The "complete stacks X%" share of cpu.txt's first line, in percent.
pub fn complete_share(cpu_txt: &str) -> f64 {
    let first = cpu_txt.lines().next().unwrap_or_default();
    let pct = first
        .split("complete stacks ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .unwrap_or_else(|| panic!("no `complete stacks N%` in cpu.txt's first line {first:?}"));
    pct.parse()
        .unwrap_or_else(|_| panic!("bad share {pct:?} in {first:?}"))
}

/// Looks up function `name` in the fixture's truth.
pub fn truth_fn<'a>(truth: &'a Value, name: &str) -> &'a Value {
    truth["functions"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in truth {truth}"))
}

/// The most a call's two probe hits cost on this host, from the line of
/// `profiler check` that prices them (`a probe hit costs: entry … µs …;
/// exit … µs …`): the dearest entry plus the dearest exit.
fn host_probes_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        let out = crate::profiler(&["check"]);
        let line = out
            .stdout
            .lines()
            .find(|l| l.contains("a probe hit costs:"))
            .unwrap_or_else(|| panic!("no probe cost in `profiler check`: {}", out.stdout))
            .to_string();
        let (entry, exit) = line
            .split_once("; exit")
            .unwrap_or_else(|| panic!("no exit cost in {line:?}"));
        let dearest = |part: &str| {
            part.split(" µs")
                .filter_map(|s| s.rsplit(' ').next()?.parse::<f64>().ok())
                .fold(0.0, f64::max)
        };
        let ns = ((dearest(entry) + dearest(exit)) * 1000.0).ceil() as u64;
        assert!(ns > 0, "no probe cost in {line:?}");
        ns
    })
}

/// An app's own log of its stalls: one JSON object a line, with its
/// CLOCK_MONOTONIC `start_ns` and `end_ns` (`fixtures/tk_app.py`, the
/// asyncio apps).
pub fn stall_log(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("stall line"))
        .collect()
}

/// The indices of the `stalls` (from [`stall_log`]) that lie wholly
/// between `start_ns` and `end_ns` (CLOCK_MONOTONIC).
pub fn stalls_within(stalls: &[Value], start_ns: u64, end_ns: u64) -> Vec<usize> {
    (0..stalls.len())
        .filter(|&i| num(&stalls[i], "start_ns") >= start_ns && num(&stalls[i], "end_ns") <= end_ns)
        .collect()
}
