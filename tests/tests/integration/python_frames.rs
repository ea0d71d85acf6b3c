//! CPython frames by PID (issue 22; 3.8-3.10, issue 44): a script started
//! without flags, by every CPython 3.8+ on the machine (Debian's
//! python3.11, pyenv's builds), sampled by PID: the samples in the
//! interpreter carry the script's Python functions and lines, under the
//! evaluator frames that run them, checked against the script's known
//! call structure.
use profiler_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `outer` (line 12) calls `middle` (line 9), which calls `leaf` (lines
/// 4-7), forever.
const SCRIPT: &str = concat!(
    "import os, time\n",
    "def leaf(n):\n",
    "    s = 0\n",
    "    for i in range(n):\n",
    "        s += i * i\n",
    "    return s\n",
    "\n",
    "def middle(n):\n",
    "    return leaf(n) + 1\n",
    "def outer():\n",
    "    while True:\n",
    "        middle(100000)\n",
    "print('ready', os.getpid(), flush=True)\n",
    "outer()\n",
);

/// The CPython 3.11+ interpreters installed: Debian's (and its debug build,
/// `python3.11-dbg`), then pyenv's.
fn pythons() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = vec!["/usr/bin/python3.11".into(), "/usr/bin/python3.11d".into()];
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
        let mut v: Vec<PathBuf> = versions
            .flatten()
            .flat_map(|v| (11..=13).map(move |m| v.path().join(format!("bin/python3.{m}"))))
            .collect();
        v.sort();
        found.extend(v);
    }
    found.retain(|p| p.exists());
    found
}

/// Of the samples of `stacks` in the evaluator, the share whose Python
/// frames are `<module>` → `outer` → `middle` → `leaf` at the script's
/// lines, and how many were in the evaluator. From 3.11 one evaluator call
/// runs them all, and they are adjacent; before (`one_per_eval`) each has
/// a call of its own, and each must be just inside an evaluator frame.
fn named_share(stacks: &[(Vec<String>, u64)], script: &Path, one_per_eval: bool) -> (f64, u64) {
    let s = script.display();
    let chain = [
        format!("py:<module> ({s}:14)"),
        format!("py:outer ({s}:12)"),
        format!("py:middle ({s}:9)"),
    ];
    let leaf = format!("py:leaf ({s}:");
    let (mut in_eval, mut named) = (0, 0);
    for (frames, n) in stacks {
        if !frames.iter().any(|f| f == "_PyEval_EvalFrameDefault") {
            continue;
        }
        in_eval += n;
        let py: Vec<String>;
        let frames = match one_per_eval {
            false => frames,
            true => {
                // The evaluator frame's inlined callees (`_Py_DECREF_[i]`)
                // stay with it.
                let placed = frames.iter().enumerate().all(|(i, f)| {
                    !f.starts_with("py:")
                        || frames[..i]
                            .iter()
                            .rev()
                            .find(|f| !f.ends_with("_[i]"))
                            .is_some_and(|f| f == "_PyEval_EvalFrameDefault")
                });
                if !placed {
                    continue;
                }
                py = frames
                    .iter()
                    .filter(|f| f.starts_with("py:"))
                    .cloned()
                    .collect();
                &py
            }
        };
        let ok = frames.windows(4).any(|w| {
            w[..3].iter().zip(&chain).all(|(a, b)| a == b)
                && w[3]
                    .strip_prefix(&leaf)
                    .and_then(|l| l.strip_suffix(')'))
                    .and_then(|l| l.parse::<u32>().ok())
                    .is_some_and(|l| (4..=6).contains(&l))
        });
        if ok {
            named += n;
        }
    }
    (named as f64 / in_eval.max(1) as f64, in_eval)
}

/// Samples [`SCRIPT`] run by `python` for 2 s by PID, and asserts that
/// 95% of the samples in the evaluator carry its functions at its lines.
/// Returns the script's process, still running.
fn sampled_by_pid_carry_the_scripts_frames(python: &Path, script: &Path) -> Fixture {
    let mut cmd = Command::new(python);
    cmd.arg(script);
    let fx = Fixture::spawn_cmd(cmd, python);
    let out = TempDir::new("pyframes-out");
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{}: {fin:?}", python.display());
    assert!(
        !fin.stderr.iter().any(|l| l.contains("not walked")),
        "{}: {:?}",
        python.display(),
        fin.stderr
    );
    let stacks = folded(&read(out.path(), "cpu.folded"));
    let old = ["3.8", "3.9", "3.10"]
        .iter()
        .any(|v| python.to_string_lossy().ends_with(&format!("python{v}")));
    let (share, total) = named_share(&stacks, script, old);
    eprintln!(
        "{}: <module>;outer;middle;leaf with their lines in {:.1}% of {total} samples in the evaluator",
        python.display(),
        share * 100.0
    );
    assert!(
        total >= 100,
        "{}: only {total} samples in the evaluator",
        python.display()
    );
    assert!(
        share >= 0.95,
        "{}: {:.3} of {total}",
        python.display(),
        share
    );
    let txt = read(out.path(), "cpu.txt");
    assert!(
        txt.contains("samples in the interpreter (_PyEval_EvalFrameDefault)"),
        "cpu.txt counts them: {txt}"
    );
    fx
}

#[test]
fn python_frames_by_pid_in_every_installed_cpython() {
    require_root!();
    let pythons = pythons();
    if pythons.is_empty() {
        eprintln!("SKIP python_frames_by_pid_in_every_installed_cpython: no CPython 3.11+");
        return;
    }
    let dir = TempDir::new("pyframes");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).expect("write app.py");
    for python in &pythons {
        let _running = sampled_by_pid_carry_the_scripts_frames(python, &script);
        if python == Path::new("/usr/bin/python3.11") {
            // System-wide, the same names (the Debian build only: one
            // system-wide session is enough).
            let out = TempDir::new("pyframes-all");
            let fin = profiler(&[
                "sample",
                "--all",
                "--hz",
                "499",
                "--duration",
                "3s",
                "--out",
                out.path().to_str().unwrap(),
            ]);
            assert!(fin.status.success(), "--all: {fin:?}");
            let stacks = folded(&read(out.path(), "cpu.folded"));
            let mine: Vec<(Vec<String>, u64)> = stacks
                .into_iter()
                .filter(|(s, _)| s[0] == "python3.11")
                .collect();
            let (share, total) = named_share(&mine, &script, false);
            eprintln!("--all: named in {:.1}% of {total}", share * 100.0);
            assert!(
                total >= 100 && share >= 0.95,
                "--all: {share:.3} of {total}"
            );
        }
    }
}

/// A Python older than the walker knows (3.7) gets one line naming its
/// version, and its native frames as before; never a Python name.
#[test]
fn an_unsupported_python_says_so_once_and_keeps_native_frames() {
    require_root!();
    let Some(python) = pyenv_pythons(7..=7).into_iter().next() else {
        eprintln!("SKIP an_unsupported_python_says_so_once_and_keeps_native_frames: no CPython 3.7 (pyenv)");
        return;
    };
    let dir = TempDir::new("pyold");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).expect("write app.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script);
    let fx = Fixture::spawn_cmd(cmd, &python);
    let out = TempDir::new("pyold-out");
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "1s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    let notes: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("whose frames are not walked"))
        .collect();
    assert_eq!(notes.len(), 1, "one line: {:?}", fin.stderr);
    assert!(notes[0].contains("Python 3.7"), "{}", notes[0]);
    assert!(notes[0].contains("supported: 3.8 to 3.13"), "{}", notes[0]);
    let folded = read(out.path(), "cpu.folded");
    assert!(!folded.contains("py:"), "no Python names for it");
    assert!(
        folded.contains("_PyEval_EvalFrameDefault"),
        "native frames as before"
    );
}

/// pyenv's `bin/python3.M` for each minor version `M` of `minors`
/// installed, sorted.
fn pyenv_pythons(minors: std::ops::RangeInclusive<u32>) -> Vec<PathBuf> {
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = versions
        .flatten()
        .flat_map(|v| {
            minors
                .clone()
                .map(move |m| v.path().join(format!("bin/python3.{m}")))
        })
        .filter(|p| p.exists())
        .collect();
    v.sort();
    v
}

/// pyenv's CPython 3.`minor`, or None (said on stderr: `test` skips it).
fn pyenv_python(test: &str, minor: u32) -> Option<PathBuf> {
    let found = pyenv_pythons(minor..=minor).into_iter().next();
    if found.is_none() {
        eprintln!("SKIP {test} for 3.{minor}: no CPython 3.{minor} (pyenv install 3.{minor})");
    }
    found
}

/// CPython 3.8, 3.9 and 3.10 (issue 44): their `PyFrameObject` chains,
/// found by each thread's `pthread_self()`, named from `co_name` and
/// `co_lnotab` (3.8, 3.9) or 3.10's `co_linetable`.
#[test]
fn python_frames_by_pid_in_cpython_3_8_to_3_10() {
    require_root!();
    let dir = TempDir::new("pyframes-old");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).expect("write app.py");
    for minor in 8..=10 {
        let test = "python_frames_by_pid_in_cpython_3_8_to_3_10";
        if let Some(python) = pyenv_python(test, minor) {
            sampled_by_pid_carry_the_scripts_frames(&python, &script);
        }
    }
}

/// An asyncio app on CPython 3.10: every 0.4 s a stall of 220 ms,
/// alternately on the CPU (`blocking_parse`) and blocked (`time.sleep` in
/// `staller`), each logged with its own clock.
const ASYNCIO_APP: &str = r#"
import asyncio, json, os, sys, time

def blocking_parse():
    t = time.monotonic()
    x = 0
    while time.monotonic() - t < 0.22:
        for i in range(1000):
            x += i * i % 7
    return x

async def ticker():
    while True:
        await asyncio.sleep(0.005)

async def staller(log):
    i = 0
    while True:
        await asyncio.sleep(0.4)
        kind = "cpu" if i % 2 == 0 else "sleep"
        t0 = time.monotonic_ns()
        if kind == "cpu":
            blocking_parse()
        else:
            time.sleep(0.22)
        log.write(json.dumps({"kind": kind, "start_ns": t0, "end_ns": time.monotonic_ns()}) + "\n")
        log.flush()
        i += 1

async def main():
    with open(sys.argv[1], "w") as log:
        await asyncio.gather(ticker(), staller(log))

print("ready", os.getpid(), flush=True)
asyncio.run(main())
"#;

/// `record --pid` on a 3.10 asyncio app: each slow dispatch that holds a
/// stall of the app's log is keyed by the stall's Python function
/// (`py:blocking_parse` on the CPU, `py:staller` around the sleep), and
/// the in-dispatch samples carry Python frames.
#[test]
fn a_python_3_10_asyncio_stall_is_named_by_its_python_function() {
    require_root!();
    let test = "a_python_3_10_asyncio_stall_is_named_by_its_python_function";
    let Some(python) = pyenv_python(test, 10) else {
        return;
    };
    let dir = TempDir::new("asyncio310");
    let app = dir.join("app.py");
    let log = dir.join("stalls.log");
    std::fs::write(&app, ASYNCIO_APP).expect("write app.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&app).arg(&log);
    let fx = Fixture::spawn_cmd(cmd, &python);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = TempDir::new("asyncio310-out");
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &["--threshold", "100ms", "--duration", "5s"],
    );
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    drop(fx);
    let d = read_json(out.path(), "dispatches.json");
    let with_py = num(&d["sampler"], "with_python_frames");
    assert!(
        with_py * 100 >= num(&d["sampler"], "samples") * 95,
        "samples with Python frames: {}",
        d["sampler"]
    );
    let stalls = stall_log(&log);
    let session_start = num(&d, "session_start_ns");
    let (mut cpu, mut sleep) = (0, 0);
    for g in d["slow"].as_array().expect("slow dispatches") {
        let (s, e) = (
            session_start + num(g, "start_ns"),
            session_start + num(g, "start_ns") + num(g, "measured_ns"),
        );
        let Some(stall) = stalls
            .iter()
            .find(|st| num(st, "start_ns") >= s && num(st, "end_ns") <= e)
        else {
            continue;
        };
        let key = g["key"].as_str().unwrap_or_default();
        let named = match stall["kind"].as_str() {
            Some("cpu") => {
                cpu += 1;
                "py:blocking_parse ("
            }
            _ => {
                sleep += 1;
                "py:staller ("
            }
        };
        assert!(key.contains(named), "the key names {named}…: {g}");
    }
    eprintln!(
        "3.10 asyncio: {cpu} CPU stalls and {sleep} sleeps, each keyed by its Python function"
    );
    assert!(
        cpu >= 3 && sleep >= 3,
        "about 6 of each in 5 s: {cpu} and {sleep}"
    );
}

/// An asyncio app that, told `go` on stdin, runs exactly five full
/// collections over about 400,000 live objects, 0.3 s apart (about 50 ms
/// each), each in its own loop iteration, and prints how long each took.
const GC_SCRIPT: &str = r#"
import asyncio, gc, json, os, sys, time
class Node:
    def __init__(self): self.ref = self
keep = [[Node() for _ in range(1000)] for _ in range(400)]
took = []
def collect(loop):
    t = time.perf_counter()
    gc.collect()
    took.append(int((time.perf_counter() - t) * 1e9))
    if len(took) < 5:
        loop.call_later(0.3, collect, loop)
    else:
        print(json.dumps({"collections": len(took), "ns": took}), flush=True)
def line(loop):
    cmd = sys.stdin.readline().strip()
    if cmd == "go":
        loop.call_later(0.3, collect, loop)
    elif cmd in ("exit", ""):
        loop.stop()
gc.disable()
loop = asyncio.new_event_loop()
loop.add_reader(sys.stdin.fileno(), line, loop)
print("ready", os.getpid(), flush=True)
loop.run_forever()
loop.close()
"#;

/// Each installed CPython whose binary carries the `gc__start` USDT probe
/// (Debian's python3.11 and its debug build; pyenv's are built without).
fn pythons_with_gc_probes() -> Vec<PathBuf> {
    pythons()
        .into_iter()
        .filter(|p| {
            std::fs::read(p)
                .map(|d| d.windows(9).any(|w| w == b"gc__start"))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn a_python_gc_stall_is_named_as_gc() {
    require_root!();
    let found = pythons_with_gc_probes();
    if found.is_empty() {
        eprintln!("SKIP a_python_gc_stall_is_named_as_gc: no CPython with USDT probes");
        return;
    }
    for python in &found {
        gc_stall_is_named(python);
    }
}

#[test]
fn a_python_gc_stall_is_named_as_gc_with_one_perf_event_a_probe() {
    require_root!();
    // The path of kernels without uprobe_multi links (before 6.10): the
    // GC probes' semaphores go with perf events of their own. Detaching
    // the functions expedites RCU grace periods, and restores the setting.
    let Some(python) = pythons_with_gc_probes().into_iter().next() else {
        eprintln!("SKIP a_python_gc_stall_is_named_as_gc_with_one_perf_event_a_probe: no CPython with USDT probes");
        return;
    };
    // The setting starts at 0 (the kernel's default), so that the
    // profiler changes it, and must set it back; the machine's own value
    // is put back after.
    let knob = "/sys/kernel/rcu_expedited";
    let before = std::fs::read_to_string(knob).unwrap_or_default();
    std::fs::write(knob, "0").expect("write /sys/kernel/rcu_expedited");
    let err = gc_stall_is_named_with(&python, true);
    let after = std::fs::read_to_string(knob).unwrap_or_default();
    let _ = std::fs::write(knob, before.trim());
    assert!(
        err.contains("(one perf event per probe)"),
        "the per-probe path was not taken: {err}"
    );
    assert!(
        !err.lines().any(|l| l.contains("Python GC")
            && ["refused", "not timed", "not traced"]
                .iter()
                .any(|w| l.contains(w))),
        "Python GC was refused or left untimed: {err}"
    );
    assert_eq!(after.trim(), "0", "{knob} was not set back");
}

fn gc_stall_is_named(python: &Path) {
    gc_stall_is_named_with(python, false);
}

/// Asserts the five collections of [`GC_SCRIPT`] are named and timed,
/// attached one perf event a probe if `per_probe`. Returns the profiler's
/// stderr.
fn gc_stall_is_named_with(python: &Path, per_probe: bool) -> String {
    eprintln!("{}: five collections", python.display());
    let dir = TempDir::new("pygc");
    let script = dir.join("gcapp.py");
    std::fs::write(&script, GC_SCRIPT).expect("write gcapp.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script);
    let mut fx = Fixture::spawn_cmd(cmd, python);
    let out = dir.join("out");
    // One perf event a probe detaches in one RCU grace period a probe
    // (60 ms each on 6.18, where it waits for an RCU-tasks-trace one):
    // 16 functions, the GC's probes beside them, 40 probes or so.
    let extra: &[&str] = match per_probe {
        true => &["--threshold", "20ms", "--max-funcs", "16"],
        false => &["--threshold", "20ms"],
    };
    let mut rec = Recording::command(fx.pid, &out, extra);
    if per_probe {
        rec.env("PROFILER_PER_PROBE", "1");
    }
    let rec = Recording::spawn(rec);
    let truth = fx.run();
    // The app prints its truth inside the fifth collection's iteration;
    // that iteration ends when the loop is back in its wait, a few ms
    // later with probe hits at 16 µs apiece. Stopped at once, the agent
    // had detached the wait tracepoints first, and the fifth slow
    // dispatch was left open (CI, stop 46: 4 of 5).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "{fin:?}");
    fx.release();
    let took = u64s(&truth, "ns");
    assert_eq!(took.len(), 5, "{truth}");
    // Exactly the five collections, each one call of `Python GC`.
    let o = Outputs::load(&out);
    let gc = o.functions("Python GC");
    assert_eq!(gc.len(), 1, "one Python GC function: {}", o.names());
    assert_eq!(num(gc[0], "calls"), 5, "{}", gc[0]);
    // Each took what the app measured around gc.collect() (which also
    // holds the call and the timing themselves).
    let total = num(gc[0], "total_ns");
    let want: u64 = took.iter().sum();
    assert!(
        total <= want && total * 10 >= want * 8,
        "Python GC total {total} ns against the app's {want} ns"
    );
    // The slow dispatches they stalled are one group, named GC.
    let d = read_json(&out, "dispatches.json");
    let groups = d["groups"].as_array().expect("groups");
    let gc_groups: Vec<&Value> = groups
        .iter()
        .filter(|g| {
            g["key"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Python GC")
        })
        .collect();
    assert_eq!(gc_groups.len(), 1, "{groups:?}");
    assert_eq!(num(gc_groups[0], "count"), 5, "{groups:?}");
    let txt = read(&out, "dispatches.txt");
    assert!(
        txt.lines()
            .any(|l| l.contains("verdict:") && l.contains("in Python GC")),
        "the verdict names Python GC: {txt}"
    );
    fin.stderr.join("\n")
}
