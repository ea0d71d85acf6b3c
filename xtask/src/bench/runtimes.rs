//! Part n: what walking interpreter and JIT frames costs the kernel per
//! CPU sample. Debian's python3.11 (four Python frames deep), node (five
//! JavaScript frames deep) and OpenJDK 17 (`tests/fixtures/java/Chain.java`:
//! four Java frames, three interpreted and one compiled; also run with
//! `-XX:+PreserveFramePointer`, so that the native walk reaches the same
//! depth), each sampled by PID at 999 Hz, with the runtime's walk on and off
//! (`PROFILER_PYTHON_FRAMES=0`, `PROFILER_JS_FRAMES=0`,
//! `PROFILER_JAVA_FRAMES=0`) in alternating rounds against the same process.
//! The figure is the sampler program's own run time per run
//! (`kernel.bpf_stats_enabled`, read with `bpftool` while it runs).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use super::median;

const PYTHON: &str = "\
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle(n):
    return leaf(n) + 1
def outer():
    while True:
        middle(100000)
outer()
";

const NODE: &str = "\
function leaf(n) { let s = 0; for (let i = 0; i < n; i++) s += Math.sqrt(i); return s; }
function middle(n) { return leaf(n) + 1; }
function tick() { middle(2000000); }
setInterval(tick, 5);
";

/// One runtime's figures: ns per sample with its walk and without.
pub struct Row {
    pub runtime: String,
    pub with: Vec<f64>,
    pub without: Vec<f64>,
}

struct Stats(Option<String>);

impl Stats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";
    fn enable() -> Self {
        let old = std::fs::read_to_string(Self::PATH).ok();
        let _ = std::fs::write(Self::PATH, "1");
        Stats(old)
    }
}

impl Drop for Stats {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(Self::PATH, old.trim());
        }
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `run_time_ns / run_cnt` of the loaded `prof_cpu_sample` programs.
fn ns_per_run() -> Result<f64> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "name", "prof_cpu_sample", "--json"])
        .output()
        .context("bpftool")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let progs = match v {
        serde_json::Value::Array(a) => a,
        one => vec![one],
    };
    let (mut ns, mut n) = (0u64, 0u64);
    for p in &progs {
        ns += p["run_time_ns"].as_u64().unwrap_or(0);
        n += p["run_cnt"].as_u64().unwrap_or(0);
    }
    if n == 0 {
        bail!("no run of prof_cpu_sample counted (bpf_stats_enabled?)");
    }
    Ok(ns as f64 / n as f64)
}

fn one(runtime: &str, cmd: &mut Command, env: &str, rounds: usize, work: &Path) -> Result<Row> {
    let target = Killed(cmd.stdout(Stdio::null()).spawn()?);
    std::thread::sleep(Duration::from_secs(1));
    let pid = target.0.id().to_string();
    let mut row = Row {
        runtime: runtime.into(),
        with: Vec::new(),
        without: Vec::new(),
    };
    for round in 0..rounds * 2 {
        let walk = round % 2 == 0;
        let out = work.join("prof-runtimes");
        let _ = std::fs::remove_dir_all(&out);
        let mut prof = Command::new(crate::util::profiler_bin());
        prof.args([
            "sample",
            "--pid",
            &pid,
            "--hz",
            "999",
            "--duration",
            "5s",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if !walk {
            prof.env(env, "0");
        }
        let mut prof = Killed(prof.spawn()?);
        // From the sampler's first runs (after the tables are built), for
        // two seconds.
        let mut waited = 0;
        while ns_per_run().is_err() && waited < 100 {
            std::thread::sleep(Duration::from_millis(50));
            waited += 1;
        }
        std::thread::sleep(Duration::from_secs(2));
        let ns = ns_per_run();
        let status = prof.0.wait()?;
        if !status.success() {
            bail!("profiler sample exited with {status}");
        }
        let txt = std::fs::read_to_string(out.join("cpu.txt")).unwrap_or_default();
        // The runtime's line ends with the share of its samples named
        // (Java has no such line: its main thread's stacks are read).
        let named = if env == "PROFILER_JAVA_FRAMES" {
            java_named(&out)
        } else {
            txt.lines()
                .filter(|l| l.starts_with("Python: ") || l.starts_with("JavaScript: "))
                .filter_map(|l| {
                    l.rsplit('(')
                        .next()?
                        .strip_suffix("%)")?
                        .parse::<f64>()
                        .ok()
                })
                .any(|share| share > 50.0)
        };
        if named != walk {
            bail!(
                "{runtime}: {} frames named with the walk {}",
                if named { "its" } else { "none of its" },
                if walk { "on" } else { "off" }
            );
        }
        if walk {
            &mut row.with
        } else {
            &mut row.without
        }
        .push(ns?);
    }
    Ok(row)
}

/// Whether most of the JVM's main-thread samples (its launcher's name,
/// `java`) hold a named Java frame of the fixture.
fn java_named(out: &Path) -> bool {
    let folded = std::fs::read_to_string(out.join("cpu.folded")).unwrap_or_default();
    let (mut all, mut named) = (0u64, 0u64);
    for (stack, n) in folded.lines().filter_map(|l| l.rsplit_once(' ')) {
        let n: u64 = n.parse().unwrap_or(0);
        if stack.starts_with("java;") {
            all += n;
            if stack.contains(";java:Chain.inner (") {
                named += n;
            }
        }
    }
    named * 2 > all
}

pub fn measure(rounds: usize, work: &Path) -> Vec<Result<Row>> {
    let _stats = Stats::enable();
    let mut rows = Vec::new();
    let py = work.join("runtimes.py");
    let js = work.join("runtimes.js");
    if std::fs::write(&py, PYTHON).is_ok() && Path::new("/usr/bin/python3.11").exists() {
        rows.push(one(
            "python3.11 (Debian), 4 Python frames",
            Command::new("/usr/bin/python3.11").arg(&py),
            "PROFILER_PYTHON_FRAMES",
            rounds,
            work,
        ));
    }
    if std::fs::write(&js, NODE).is_ok() && crate::util::find_program("node").is_some() {
        rows.push(one(
            "node, 5 JavaScript frames",
            Command::new("node").arg(&js),
            "PROFILER_JS_FRAMES",
            rounds,
            work,
        ));
    }
    let chain = crate::util::workspace_root().join("tests/fixtures/java/Chain.java");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(work)
        .arg(&chain)
        .status();
    if javac.is_ok_and(|s| s.success()) {
        // Also with frame pointers kept in compiled code: the native walk
        // then steps through the Java frames by rbp, unnamed, to the same
        // depth, where without them it stops at the compiled leaf. The
        // ratio of walks over the same stack.
        for (runtime, flags) in [
            ("OpenJDK 17 (Debian), 4 Java frames", &[][..]),
            (
                "OpenJDK 17, 4 Java frames, -XX:+PreserveFramePointer",
                &["-XX:+PreserveFramePointer"][..],
            ),
        ] {
            rows.push(one(
                runtime,
                Command::new("java")
                    .args(flags)
                    .arg("-cp")
                    .arg(work)
                    .args(["Chain", "600"]),
                "PROFILER_JAVA_FRAMES",
                rounds,
                work,
            ));
        }
    }
    rows
}

pub fn rows(rows: &[Result<Row>]) -> String {
    let mut md = String::from(
        "| runtime | ns per sample, with its walk | native walk only | ratio of medians |\n\
         | --- | --- | --- | --- |\n",
    );
    for r in rows {
        match r {
            Ok(r) => {
                let list = |v: &[f64]| {
                    let mut v = v.to_vec();
                    v.sort_by(|a, b| a.total_cmp(b));
                    v.iter()
                        .map(|x| format!("{x:.0}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let (a, b) = (median(r.with.clone()), median(r.without.clone()));
                let _ = writeln!(
                    md,
                    "| {} | {} (median {a:.0}) | {} (median {b:.0}) | {:.2}× |",
                    r.runtime,
                    list(&r.with),
                    list(&r.without),
                    a / b
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| failed: {e:#} | | | |");
            }
        }
    }
    md
}
