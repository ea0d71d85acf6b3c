//! Benchmark g: what `profile.data` takes per event (format 3 against the
//! format-2 size of the same stream), and what writing it costs the agent.
//!
//! The nop fixture runs flat out under `profiler record --func leaf --func
//! mid --trace-events 0`, once writing profile.data and once with
//! `--data-limit 0` (none); the profiler's `profile.data:` line gives the
//! file's size, its records and events, the format-2 size and its writing
//! thread's CPU time; the agent's CPU time is its rusage.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::proc::{read_functions_json, ReadyOn, Target, Tracer};
use crate::util::profiler_bin;

/// One run's figures.
#[derive(Clone, Copy, Default)]
pub struct Run {
    /// profile.data's size (0 without one).
    pub bytes: f64,
    pub records: f64,
    pub events: f64,
    pub format2_bytes: f64,
    /// CPU of the thread that compresses and writes, seconds.
    pub write_cpu: f64,
    /// The whole agent's CPU (user + system), seconds.
    pub agent_cpu: f64,
    /// Events in functions.json and lost events.
    pub seen: f64,
    pub lost: f64,
}

pub struct Measured {
    pub with: Run,
    pub without: Run,
}

/// CPU time (user + system, seconds) of the reaped children so far.
fn children_cpu_secs() -> f64 {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The numbers of the profiler's `profile.data:` line.
fn parse_line(line: &str) -> Option<Run> {
    let nums: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.trim_matches('.').parse().ok())
        .collect();
    // bytes, records, events, blocks, per record, (format) 2, format-2 per
    // record, cpu s, wall s
    let [bytes, records, events, _blocks, _per, _two, per2, cpu, _wall] = nums[..] else {
        return None;
    };
    Some(Run {
        bytes,
        records,
        events,
        format2_bytes: per2 * records,
        write_cpu: cpu,
        ..Run::default()
    })
}

fn once(bin: &Path, iters: u64, data: bool, work: &Path) -> Result<Run> {
    let out = work.join("prof-datafile");
    let _ = std::fs::remove_dir_all(&out);
    let mut target = Target::start(Command::new(bin).args([iters.to_string(), "1".into()]))?;
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["record", "--pid", &target.pid().to_string()])
        .args([
            "--func",
            "leaf",
            "--func",
            "mid",
            "--trace-events",
            "0",
            "--out",
        ])
        .arg(&out);
    if !data {
        cmd.args(["--data-limit", "0"]);
    }
    let mut tracer = Tracer::start(&mut cmd, ReadyOn::Stderr, "attached")?;
    target.go()?;
    target.result(Duration::from_secs(300))?;
    let before = children_cpu_secs();
    let status = tracer.finish(Duration::from_secs(10))?;
    let agent_cpu = children_cpu_secs() - before;
    if !status.success() {
        bail!("the profiler exited with {status}:\n{}", tracer.output());
    }
    let output = tracer.output();
    let mut run = match output
        .lines()
        .find(|l| l.starts_with("profiler: profile.data:"))
    {
        Some(l) => parse_line(l).with_context(|| format!("cannot parse {l:?}"))?,
        None if !data => Run::default(),
        None => bail!("no `profile.data:` line from the profiler:\n{output}"),
    };
    if data {
        let size = std::fs::metadata(out.join("profile.data"))?.len() as f64;
        if size != run.bytes {
            bail!(
                "profile.data is {size} bytes; the profiler said {}",
                run.bytes
            );
        }
    }
    let json = read_functions_json(&out)?;
    run.agent_cpu = agent_cpu;
    run.seen = json["events"].as_f64().unwrap_or(f64::NAN);
    run.lost = json["lost_events"].as_f64().unwrap_or(f64::NAN);
    Ok(run)
}

/// `repeat` runs each way, alternating; the medians.
pub fn measure(bin: &Path, iters: u64, repeat: usize, work: &Path) -> Result<Measured> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        with.push(once(bin, iters, true, work)?);
        without.push(once(bin, iters, false, work)?);
    }
    let med = |runs: &[Run]| {
        let m = |f: fn(&Run) -> f64| super::median(runs.iter().map(f).collect());
        Run {
            bytes: m(|r| r.bytes),
            records: m(|r| r.records),
            events: m(|r| r.events),
            format2_bytes: m(|r| r.format2_bytes),
            write_cpu: m(|r| r.write_cpu),
            agent_cpu: m(|r| r.agent_cpu),
            seen: m(|r| r.seen),
            lost: m(|r| r.lost),
        }
    };
    Ok(Measured {
        with: med(&with),
        without: med(&without),
    })
}

pub fn rows(m: &Result<Measured>) -> String {
    let m = match m {
        Ok(m) => m,
        Err(e) => return format!("error: {}\n", super::percall::one_line(e)),
    };
    let (w, n) = (&m.with, &m.without);
    let per_m = |secs: f64, events: f64| secs / (events / 1e6);
    let mut s = String::from(
        "| | bytes per event | profile.data | agent CPU per M events | writing thread CPU per M events |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
    );
    writeln!(
        s,
        "| format 2 (same stream, computed) | {:.2} | {:.1} MB | | |",
        w.format2_bytes / w.events,
        w.format2_bytes / 1e6
    )
    .unwrap();
    writeln!(
        s,
        "| format 3 (written) | {:.2} | {:.1} MB | {:.3} s | {:.3} s |",
        w.bytes / w.events,
        w.bytes / 1e6,
        per_m(w.agent_cpu, w.seen),
        per_m(w.write_cpu, w.events),
    )
    .unwrap();
    writeln!(
        s,
        "| no profile.data (`--data-limit 0`) | | | {:.3} s | |",
        per_m(n.agent_cpu, n.seen)
    )
    .unwrap();
    writeln!(
        s,
        "\nFormat 3 is {:.1}× smaller than format 2. Events recorded: {:.0} with profile.data ({:.0} lost), \
         {:.0} without ({:.0} lost); agent CPU with profile.data / without: {:.2}×.",
        w.format2_bytes / w.bytes,
        w.seen,
        w.lost,
        n.seen,
        n.lost,
        per_m(w.agent_cpu, w.seen) / per_m(n.agent_cpu, n.seen)
    )
    .unwrap();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_profilers_line() {
        let r = parse_line(
            "profiler: profile.data: 1234 bytes for 600 records (598 entry/exit events) in 3 blocks, \
             2.06 bytes per record (format 2: 29.00); its writing thread used 0.012 s of CPU in 1.500 s",
        )
        .unwrap();
        assert_eq!((r.bytes, r.records, r.events), (1234.0, 600.0, 598.0));
        assert_eq!(r.format2_bytes, 29.0 * 600.0);
        assert_eq!(r.write_cpu, 0.012);
    }
}
