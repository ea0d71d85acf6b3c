//! Running one fixture, untraced or under one tracer, and reading its result.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::proc::{calls_of, read_functions_json, ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// What observes the fixture.
pub enum With<'a> {
    Nothing,
    /// `profiler record --func leaf --func mid`, plus extra arguments.
    Profiler {
        out: PathBuf,
        extra: &'a [String],
    },
    /// bpftrace counting entries and returns of leaf and mid.
    Bpftrace,
    /// `uftrace record` (the fixture must be the mcount build).
    Uftrace {
        dir: PathBuf,
    },
}

/// What one run measured.
#[derive(Debug, Default)]
pub struct Run {
    /// The fixture's `result:` fields.
    pub fields: HashMap<String, f64>,
    /// Calls of leaf + mid seen by the tracer, when it reports them.
    pub seen_calls: Option<u64>,
    /// The profiler's lost_events.
    pub lost: Option<u64>,
    /// The profiler's events.
    pub events: Option<u64>,
}

impl Run {
    pub fn get(&self, key: &str) -> f64 {
        self.fields.get(key).copied().unwrap_or(f64::NAN)
    }

    /// Calls the fixture made (leaf + mid).
    pub fn expected_calls(&self) -> u64 {
        (self.get("calls_leaf") + self.get("calls_mid")) as u64
    }
}

/// Parse `result: k=v k=v ...`.
pub fn parse_result(line: &str) -> HashMap<String, f64> {
    line.trim_start_matches("result:")
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Run `bin ARGS...` under `with` and return what it measured.
pub fn run(bin: &Path, args: &[String], with: With) -> Result<Run> {
    let timeout = Duration::from_secs(120);
    if let With::Uftrace { dir } = &with {
        let mut cmd = Command::new("uftrace");
        cmd.args(["record", "--no-libcall", "-d"])
            .arg(dir)
            .arg(bin)
            .args(args);
        let mut target = Target::start(&mut cmd)?;
        target.go()?;
        let line = target.result(timeout)?;
        return Ok(Run {
            fields: parse_result(&line),
            ..Run::default()
        });
    }

    let mut target = Target::start(Command::new(bin).args(args))?;
    let pid = target.pid().to_string();
    let mut tracer = match &with {
        With::Nothing | With::Uftrace { .. } => None,
        With::Profiler { out, extra } => {
            let _ = std::fs::remove_dir_all(out);
            let mut cmd = Command::new(profiler_bin());
            cmd.args([
                "record",
                "--pid",
                &pid,
                "--func",
                "leaf",
                "--func",
                "mid",
                // Every hit is measured: no overhead governor.
                "--max-overhead",
                "0",
                "--out",
            ])
            .arg(out)
            .args(*extra);
            Some(Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?)
        }
        With::Bpftrace => {
            let b = bin.display();
            let script = format!(
                "uprobe:{b}:leaf,uprobe:{b}:mid,uretprobe:{b}:leaf,uretprobe:{b}:mid {{ @[probe] = count(); }}"
            );
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-p", &pid, "-e", &script]);
            let t = Tracer::start(&mut cmd, ReadyOn::Stdout, "Attaching")?;
            // bpftrace prints the line before the last probe is live.
            thread::sleep(Duration::from_secs(1));
            Some(t)
        }
    };
    target.go()?;
    let line = target.result(timeout)?;
    let mut run = Run {
        fields: parse_result(&line),
        ..Run::default()
    };

    if let Some(tracer) = tracer.as_mut() {
        let status = tracer.finish(Duration::from_secs(10))?;
        match &with {
            With::Profiler { out, .. } => {
                if !status.success() {
                    anyhow::bail!("the profiler exited with {status}:\n{}", tracer.output());
                }
                let json = read_functions_json(out)
                    .with_context(|| format!("profiler output:\n{}", tracer.output()))?;
                run.seen_calls = Some(calls_of(&json, "leaf") + calls_of(&json, "mid"));
                run.lost = json["lost_events"].as_u64();
                run.events = json["events"].as_u64();
            }
            With::Bpftrace => run.seen_calls = Some(bpftrace_entries(&tracer.output())),
            _ => {}
        }
    }
    Ok(run)
}

/// Sum the `@[uprobe:...]: N` lines (entries only) of bpftrace's map dump.
fn bpftrace_entries(output: &str) -> u64 {
    output
        .lines()
        .filter(|l| l.starts_with("@[uprobe:"))
        .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_result_line() {
        let f = parse_result("result: threads=1 iters=10 calls_leaf=20 ns_per_iter=3.56");
        assert_eq!(f["threads"], 1.0);
        assert_eq!(f["calls_leaf"], 20.0);
        assert_eq!(f["ns_per_iter"], 3.56);
    }

    #[test]
    fn sums_bpftrace_entries() {
        let out = "Attaching 4 probes...\n\n@[uretprobe:/b:leaf]: 20\n@[uprobe:/b:mid]: 10\n@[uprobe:/b:leaf]: 20\n";
        assert_eq!(bpftrace_entries(out), 30);
    }
}
