//! Dispatch tracking: the cost the profiler adds per dispatch (a dispatch
//! function and one handler, both probed), with the in-dispatch sampler off
//! and at 997 Hz, and the agent's peak memory after 100,000 and 1,000,000
//! fast dispatches (it must stay flat: fast dispatches leave nothing behind).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::median;
use super::run::parse_result;
use crate::proc::{ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// One measured configuration.
pub struct Row {
    pub label: String,
    pub dispatches: u64,
    pub ns_per_dispatch: Result<f64>,
    /// Added ns per dispatch against the untraced run.
    pub added: Option<f64>,
    /// Peak RSS of the agent, KiB.
    pub peak_kib: Option<u64>,
    /// Dispatches the profiler counted.
    pub counted: Option<u64>,
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One run: untraced (`hz` = None) or under the profiler.
fn once(
    bin: &Path,
    n: u64,
    hz: Option<u64>,
    out: &Path,
) -> Result<(f64, Option<u64>, Option<u64>)> {
    let mut target = Target::start(Command::new(bin).arg(n.to_string()))?;
    let pid = target.pid().to_string();
    let mut tracer = match hz {
        None => None,
        Some(hz) => {
            let _ = std::fs::remove_dir_all(out);
            let mut cmd = Command::new(profiler_bin());
            cmd.args(["record", "--pid", &pid, "--dispatch", "dispatch_message"])
                .args(["--func", "handle_fast", "--trace-events", "0"])
                .args(["--max-overhead", "0"])
                .args(["--dispatch-hz", &hz.to_string(), "--out"])
                .arg(out);
            Some(Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?)
        }
    };
    target.go()?;
    // Poll the agent's peak RSS while the fixture runs.
    let mut peak = None;
    let line = loop {
        if let Some(t) = &tracer {
            peak = vm_hwm_kib(t.guard.pid()).or(peak);
        }
        match target
            .stdout
            .wait_for(Duration::from_millis(100), |l| l.starts_with("result:"))
        {
            Ok(l) => break l,
            Err(_) if target.guard.wait_timeout(Duration::ZERO)?.is_none() => continue,
            Err(e) => return Err(e.context("the fixture exited without a result line")),
        }
    };
    let ns = parse_result(&line)
        .get("ns_per_dispatch")
        .copied()
        .unwrap_or(f64::NAN);
    let mut counted = None;
    if let Some(t) = tracer.as_mut() {
        peak = vm_hwm_kib(t.guard.pid()).or(peak);
        t.finish(Duration::from_secs(30))?;
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("dispatches.json"))
                .context("reading dispatches.json")?,
        )?;
        counted = json["dispatches"].as_u64();
    }
    Ok((ns, peak, counted))
}

/// Measures every configuration.
pub fn measure(bin: &Path, repeat: usize, work: &Path) -> Vec<Row> {
    let out = work.join("prof-dispatch");
    let mut rows = Vec::new();
    let mut base = None;
    let configs: [(&str, u64, Option<u64>); 5] = [
        ("untraced", 1_000_000, None),
        ("profiler, sampler off", 1_000_000, Some(0)),
        ("profiler, sampler 997 Hz", 1_000_000, Some(997)),
        ("profiler, sampler off (memory)", 100_000, Some(0)),
        ("profiler, sampler 997 Hz (memory)", 100_000, Some(997)),
    ];
    for (label, n, hz) in configs {
        eprintln!("bench: dispatch, {label}, {n} dispatches");
        let mut times = Vec::new();
        let mut peak = None;
        let mut counted = None;
        let mut err = None;
        for _ in 0..repeat.max(1) {
            match once(bin, n, hz, &out) {
                Ok((ns, p, c)) => {
                    times.push(ns);
                    peak = p.max(peak);
                    counted = c;
                }
                Err(e) => err = Some(e),
            }
        }
        let ns = match (times.is_empty(), err) {
            (true, Some(e)) => Err(e),
            _ => Ok(median(times)),
        };
        if hz.is_none() {
            base = ns.as_ref().ok().copied();
        }
        let added = match (&ns, base, hz) {
            (Ok(t), Some(b), Some(_)) => Some(t - b),
            _ => None,
        };
        rows.push(Row {
            label: label.to_string(),
            dispatches: n,
            ns_per_dispatch: ns,
            added,
            peak_kib: peak,
            counted,
        });
    }
    rows
}

/// Markdown table.
pub fn rows(rows: &[Row]) -> String {
    let mut s = String::from(
        "| configuration | dispatches | ns / dispatch | added by the profiler | dispatches counted | agent peak RSS |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let ns = match &r.ns_per_dispatch {
            Ok(v) => format!("{v:.1}"),
            Err(e) => format!("error: {}", format!("{e:#}").lines().next().unwrap_or("")),
        };
        writeln!(
            s,
            "| {} | {} | {ns} | {} | {} | {} |",
            r.label,
            r.dispatches,
            r.added
                .map_or("—".into(), |a| format!("{:.2} µs", a / 1000.0)),
            r.counted.map_or("—".into(), |c| c.to_string()),
            r.peak_kib
                .map_or("—".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
        )
        .unwrap();
    }
    s
}
