//! Sampling: what `profiler sample` costs a CPU-bound process against
//! `perf record -g` at the same rate (per process and system-wide), how long
//! blazesym (the library the agent symbolizes with) takes for 100,000
//! distinct addresses, and whether the profiler's top frames agree with
//! `perf report` on the same process.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::median;
use super::run::parse_result;
use crate::proc::{Guard, Lines, ReadyOn, Target, Tracer};
use crate::util::{display, profiler_bin};

/// Who samples the fixture.
#[derive(Clone, Copy, PartialEq)]
pub enum Sampler {
    Nothing,
    /// `profiler sample --pid P --hz N`.
    ProfilerPid(u64),
    /// `perf record -g -F N -e cpu-clock -p P`.
    PerfPid(u64),
    /// `profiler sample --all --hz N`.
    ProfilerAll(u64),
    /// `perf record -a -g -F N -e cpu-clock`.
    PerfAll(u64),
    /// `perf record --call-graph dwarf -F N -e cpu-clock -p P`.
    PerfDwarfPid(u64),
    /// `perf record -a --call-graph dwarf -F N -e cpu-clock`.
    PerfDwarfAll(u64),
    /// `perf record -F N -e cpu-clock -p P`, no call graph: the floor, what
    /// the tick and a sample record cost with no stack taken at all.
    PerfNoStackPid(u64),
}

impl Sampler {
    fn is_perf(self) -> bool {
        !matches!(
            self,
            Sampler::Nothing | Sampler::ProfilerPid(_) | Sampler::ProfilerAll(_)
        )
    }

    fn label(self) -> String {
        match self {
            Sampler::Nothing => "untraced".into(),
            Sampler::ProfilerPid(hz) => format!("profiler, `--pid`, {hz} Hz"),
            Sampler::PerfPid(hz) => format!("perf, `-p`, {hz} Hz"),
            Sampler::ProfilerAll(hz) => format!("profiler, `--all`, {hz} Hz"),
            Sampler::PerfAll(hz) => format!("perf, `-a`, {hz} Hz"),
            Sampler::PerfDwarfPid(hz) => format!("perf `--call-graph dwarf`, `-p`, {hz} Hz"),
            Sampler::PerfDwarfAll(hz) => format!("perf `--call-graph dwarf`, `-a`, {hz} Hz"),
            Sampler::PerfNoStackPid(hz) => format!("perf, no call graph, `-p`, {hz} Hz"),
        }
    }

    fn command(self, pid: u32, work: &Path) -> Option<Command> {
        let out = work.join("prof-sampling");
        let data = work.join("perf-sampling.data");
        let pid = pid.to_string();
        let mut cmd;
        match self {
            Sampler::Nothing => return None,
            Sampler::ProfilerPid(hz) | Sampler::ProfilerAll(hz) => {
                let _ = std::fs::remove_dir_all(&out);
                cmd = Command::new(profiler_bin());
                cmd.arg("sample");
                if let Sampler::ProfilerPid(_) = self {
                    cmd.args(["--pid", &pid]);
                } else {
                    cmd.arg("--all");
                }
                cmd.args(["--hz", &hz.to_string(), "--out"]).arg(out);
            }
            Sampler::PerfPid(hz)
            | Sampler::PerfAll(hz)
            | Sampler::PerfDwarfPid(hz)
            | Sampler::PerfDwarfAll(hz)
            | Sampler::PerfNoStackPid(hz) => {
                let _ = std::fs::remove_file(&data);
                cmd = Command::new("perf");
                cmd.arg("record");
                match self {
                    Sampler::PerfDwarfPid(_) | Sampler::PerfDwarfAll(_) => {
                        cmd.args(["--call-graph", "dwarf"])
                    }
                    Sampler::PerfNoStackPid(_) => &mut cmd,
                    _ => cmd.arg("-g"),
                };
                cmd.args(["-F", &hz.to_string(), "-e", "cpu-clock"]);
                match self {
                    Sampler::PerfPid(_) | Sampler::PerfDwarfPid(_) | Sampler::PerfNoStackPid(_) => {
                        cmd.args(["-p", &pid])
                    }
                    _ => cmd.arg("-a"),
                };
                cmd.arg("-o").arg(data);
            }
        }
        Some(cmd)
    }
}

/// A running sampler: the profiler (ready when it says `attached`) or perf
/// (ready once it holds perf-event file descriptors).
struct Running {
    guard: Guard,
    stderr: Lines,
    shown: String,
}

/// How many `anon_inode:[perf_event]` descriptors `pid` holds.
fn perf_event_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy() == "anon_inode:[perf_event]")
                .count()
        })
        .unwrap_or(0)
}

fn start_sampler(mut cmd: Command, perf: bool) -> Result<Running> {
    let shown = display(&cmd);
    if !perf {
        let t = Tracer::start(&mut cmd, ReadyOn::Stderr, "sampler at")?;
        let Tracer { guard, lines, .. } = t;
        return Ok(Running {
            guard,
            stderr: lines,
            shown,
        });
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut guard = Guard::spawn(&mut cmd)?;
    let mut stderr = Lines::tap(guard.child.stderr.take().expect("piped"), None);
    // perf prints nothing when it starts sampling: wait until it holds
    // perf-event descriptors, then give it time to mmap and enable them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while perf_event_fds(guard.pid()) == 0 {
        if let Some(status) = guard.wait_timeout(Duration::from_millis(20))? {
            bail!(
                "`{shown}` exited with {status}:\n{}",
                stderr.drain(Duration::from_secs(2)).join("\n")
            );
        }
        if Instant::now() > deadline {
            bail!("`{shown}` opened no perf event in 30 s");
        }
    }
    thread::sleep(Duration::from_millis(500));
    Ok(Running {
        guard,
        stderr,
        shown,
    })
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

impl Running {
    /// SIGINT (if still running), wait for the exit, and return the sampler's
    /// CPU time and its stderr.
    fn stop(mut self) -> Result<(f64, String)> {
        let before = children_cpu_secs();
        let status = self.guard.stop(Duration::from_secs(120))?;
        let cpu = children_cpu_secs() - before;
        let err = self.stderr.drain(Duration::from_secs(2)).join("\n");
        // perf record exits 0 or with the SIGINT status after writing.
        if !status.success() && status.code() != Some(130) && status.code().is_some() {
            bail!("`{}` exited with {status}:\n{err}", self.shown);
        }
        Ok((cpu, err))
    }
}

/// One sampled run: the fixture's elapsed ns, samples taken, sampler CPU s,
/// and for perf the CPU s of `perf report` on what it wrote (where perf's
/// stacks are unwound and named; the profiler's own run did that already).
struct Once {
    elapsed_ns: f64,
    samples: Option<u64>,
    cpu_secs: Option<f64>,
    report_cpu_secs: Option<f64>,
}

fn once(bin: &Path, rounds: u64, sampler: Sampler, work: &Path) -> Result<Once> {
    let mut target = Target::start(Command::new(bin).arg(rounds.to_string()))?;
    let running = match sampler.command(target.pid(), work) {
        None => None,
        Some(cmd) => Some(start_sampler(cmd, sampler.is_perf())?),
    };
    target.go()?;
    let line = target.result(Duration::from_secs(300))?;
    let elapsed_ns = parse_result(&line)
        .get("elapsed_ns")
        .copied()
        .unwrap_or(f64::NAN);
    let Some(running) = running else {
        return Ok(Once {
            elapsed_ns,
            samples: None,
            cpu_secs: None,
            report_cpu_secs: None,
        });
    };
    let (cpu, err) = running.stop()?;
    let (samples, report_cpu_secs) = match sampler.is_perf() {
        true => (
            perf_samples(&err),
            perf_report_cpu(&work.join("perf-sampling.data")),
        ),
        false => (
            std::fs::read_to_string(work.join("prof-sampling/cpu.txt"))
                .ok()
                .and_then(|t| profiler_samples(&t)),
            None,
        ),
    };
    Ok(Once {
        elapsed_ns,
        samples,
        cpu_secs: Some(cpu),
        report_cpu_secs,
    })
}

/// CPU seconds of `perf report --stdio -i DATA` (call graphs included:
/// for `--call-graph dwarf` data, this is where the stacks are unwound).
fn perf_report_cpu(data: &Path) -> Option<f64> {
    let before = children_cpu_secs();
    let status = Command::new("perf")
        .args(["report", "--stdio", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    status.success().then(|| children_cpu_secs() - before)
}

/// `[ perf record: Captured and wrote 0.150 MB FILE (1798 samples) ]`.
fn perf_samples(stderr: &str) -> Option<u64> {
    let l = stderr.lines().find(|l| l.contains("samples)"))?;
    l.rsplit('(')
        .next()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// First line of cpu.txt: `CPU samples of …: N at HZ Hz over …`.
/// The count is the number before `at HZ Hz` (the line goes on with
/// `…; lost: …`, and the path may hold anything).
fn profiler_samples(cpu_txt: &str) -> Option<u64> {
    let words: Vec<&str> = cpu_txt.lines().next()?.split_whitespace().collect();
    words
        .windows(4)
        .find(|w| w[1] == "at" && w[3].starts_with("Hz"))
        .and_then(|w| w[0].parse().ok())
}

/// Overheads below this (percent) are within run-to-run noise.
const NOISE_PCT: f64 = 0.5;

/// The per-process rate of the comparison.
const HZ: u64 = 997;

/// Ten times that: at 997 Hz, taking 2,000 stacks costs the fixture a few
/// milliseconds, less than run-to-run noise; at this rate each sampler's
/// per-sample cost shows above it.
const AMPLIFIED_HZ: u64 = 9973;

/// One row of the overhead table.
pub struct Row {
    sampler: Sampler,
    elapsed_ms: Result<f64>,
    samples: Option<u64>,
    cpu_secs: Option<f64>,
    report_cpu_secs: Option<f64>,
}

/// Runs the fixture untraced and under each sampler, `repeat` rounds, each
/// round running every sampler once (interleaved, so that a drift of the
/// machine's speed falls on all of them alike).
pub fn overhead(bin: &Path, rounds: u64, repeat: usize, work: &Path) -> Vec<Row> {
    let configs = [
        Sampler::Nothing,
        Sampler::PerfNoStackPid(HZ),
        Sampler::ProfilerPid(HZ),
        Sampler::PerfPid(HZ),
        Sampler::PerfDwarfPid(HZ),
        Sampler::ProfilerAll(99),
        Sampler::PerfAll(99),
        Sampler::PerfDwarfAll(99),
        Sampler::PerfNoStackPid(AMPLIFIED_HZ),
        Sampler::ProfilerPid(AMPLIFIED_HZ),
        Sampler::PerfPid(AMPLIFIED_HZ),
        Sampler::PerfDwarfPid(AMPLIFIED_HZ),
    ];
    type Runs = (
        Vec<f64>,
        Vec<f64>,
        Vec<f64>,
        Vec<f64>,
        Option<anyhow::Error>,
    );
    let mut runs: Vec<Runs> = configs
        .iter()
        .map(|_| (vec![], vec![], vec![], vec![], None))
        .collect();
    for round in 0..repeat.max(1) {
        for (sampler, (times, samples, cpus, reports, err)) in configs.iter().zip(&mut runs) {
            eprintln!("bench: sampling, round {}, {}", round + 1, sampler.label());
            match once(bin, rounds, *sampler, work) {
                Ok(o) => {
                    times.push(o.elapsed_ns / 1e6);
                    samples.extend(o.samples.map(|s| s as f64));
                    cpus.extend(o.cpu_secs);
                    reports.extend(o.report_cpu_secs);
                }
                Err(e) => {
                    eprintln!("bench: {}: {e:#}", sampler.label());
                    *err = Some(e);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (sampler, (times, samples, cpus, reports, err)) in configs.into_iter().zip(runs) {
        rows.push(Row {
            sampler,
            elapsed_ms: match (times.is_empty(), err) {
                (true, Some(e)) => Err(e),
                _ => Ok(median(times)),
            },
            samples: (!samples.is_empty()).then(|| median(samples) as u64),
            cpu_secs: (!cpus.is_empty()).then(|| median(cpus)),
            report_cpu_secs: (!reports.is_empty()).then(|| median(reports)),
        });
    }
    rows
}

/// Markdown: the overhead table and the profiler/perf ratios.
pub fn overhead_rows(rows: &[Row]) -> String {
    let base = rows
        .iter()
        .find(|r| matches!(r.sampler, Sampler::Nothing))
        .and_then(|r| r.elapsed_ms.as_ref().ok().copied());
    let pct = |r: &Row| match (&r.elapsed_ms, base) {
        (Ok(t), Some(b)) if !matches!(r.sampler, Sampler::Nothing) => Some((t - b) / b * 100.0),
        _ => None,
    };
    let mut s = String::from(
        "| sampler | fixture elapsed (median) | overhead vs untraced | samples | sampler CPU time | `perf report` CPU time |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let t = match &r.elapsed_ms {
            Ok(v) => format!("{v:.0} ms"),
            Err(e) => format!("error: {}", format!("{e:#}").lines().next().unwrap_or("")),
        };
        writeln!(
            s,
            "| {} | {t} | {} | {} | {} | {} |",
            r.sampler.label(),
            pct(r).map_or("—".into(), |p| format!("{p:+.2}%")),
            r.samples.map_or("—".into(), |n| n.to_string()),
            r.cpu_secs
                .map_or("—".into(), |c| format!("{:.0} ms", c * 1000.0)),
            r.report_cpu_secs
                .map_or("—".into(), |c| format!("{:.0} ms", c * 1000.0)),
        )
        .unwrap();
    }
    s.push_str(
        "\n| mode | profiler (`--unwind tables`) overhead | perf `-g` overhead | perf `--call-graph dwarf` overhead | ratio profiler / perf `-g` | ratio profiler / perf dwarf | above the no-stack floor: profiler / perf `-g` / perf dwarf | CPU time profiler / perf `-g` | CPU time with `perf report`: profiler / perf `-g` / perf dwarf |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |\n",
    );
    let find = |want: Sampler| rows.iter().find(|r| r.sampler == want);
    for (mode, p, q, d, floor) in [
        (
            format!("one process, {HZ} Hz"),
            find(Sampler::ProfilerPid(HZ)),
            find(Sampler::PerfPid(HZ)),
            find(Sampler::PerfDwarfPid(HZ)),
            // What sampling costs with no stack at all (the tick, one
            // record); measured per process only.
            find(Sampler::PerfNoStackPid(HZ)).and_then(pct),
        ),
        (
            "system-wide, 99 Hz".to_string(),
            find(Sampler::ProfilerAll(99)),
            find(Sampler::PerfAll(99)),
            find(Sampler::PerfDwarfAll(99)),
            None,
        ),
        (
            format!("one process, {AMPLIFIED_HZ} Hz (amplified)"),
            find(Sampler::ProfilerPid(AMPLIFIED_HZ)),
            find(Sampler::PerfPid(AMPLIFIED_HZ)),
            find(Sampler::PerfDwarfPid(AMPLIFIED_HZ)),
            find(Sampler::PerfNoStackPid(AMPLIFIED_HZ)).and_then(pct),
        ),
    ] {
        let (op, oq, od) = (p.and_then(pct), q.and_then(pct), d.and_then(pct));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b.abs() > f64::EPSILON => format!("{:.2}", a / b),
            _ => "—".into(),
        };
        // A ratio of two overheads is only meaningful when both are above
        // run-to-run noise.
        let overhead_ratio = |op: Option<f64>, oq: Option<f64>| match (op, oq) {
            (Some(a), Some(b)) if a >= NOISE_PCT && b >= NOISE_PCT => ratio(op, oq),
            (Some(_), Some(_)) => format!("n/a (an overhead is below {NOISE_PCT}%)"),
            _ => "—".into(),
        };
        let show = |v: Option<f64>| v.map_or("—".into(), |v| format!("{v:+.2}%"));
        // The stack-taking cost alone: each overhead less the floor, and
        // the profiler's against perf's (when both are above noise).
        let above = match (floor, op, oq, od) {
            (Some(f), Some(a), Some(b), Some(c)) => {
                let (a, b, c) = (a - f, b - f, c - f);
                let r = |x: f64| match a >= NOISE_PCT && x >= NOISE_PCT {
                    true => format!("{:.2}", a / x),
                    false => "n/a".into(),
                };
                format!(
                    "{a:+.2}% / {b:+.2}% / {c:+.2}% (profiler / perf `-g` {}, / perf dwarf {})",
                    r(b),
                    r(c)
                )
            }
            _ => "—".into(),
        };
        // Sampler CPU plus, for perf, `perf report` (the profiler's own
        // run symbolized and wrote its outputs already).
        let total = |r: Option<&Row>| {
            r.and_then(|r| Some(r.cpu_secs? + r.report_cpu_secs.unwrap_or(0.0)))
                .map_or("—".into(), |c| format!("{:.0} ms", c * 1000.0))
        };
        let totals = format!("{} / {} / {}", total(p), total(q), total(d));
        writeln!(
            s,
            "| {mode} | {} | {} | {} | {} | {} | {above} | {} | {totals} |",
            show(op),
            show(oq),
            show(od),
            overhead_ratio(op, oq),
            overhead_ratio(op, od),
            ratio(p.and_then(|r| r.cpu_secs), q.and_then(|r| r.cpu_secs)),
        )
        .unwrap();
    }
    s
}

/// One blazesym measurement.
pub struct SymRow {
    binary: PathBuf,
    size_mib: f64,
    has_dwarf: bool,
    debug_syms: bool,
    result: Result<SymTimes>,
}

struct SymTimes {
    cold: Duration,
    warm: Duration,
    resolved: usize,
}

/// File offset and size of `.text` in `bin` (from `readelf -SW`), and whether
/// it has `.debug_info`.
fn text_section(bin: &Path) -> Result<(u64, u64, bool)> {
    let out = Command::new("readelf")
        .arg("-SW")
        .arg(bin)
        .output()
        .context("running readelf (Debian package binutils)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let dwarf = text.contains(" .debug_info ");
    let line = text
        .lines()
        .find(|l| l.contains(" .text "))
        .with_context(|| format!("no .text in {}", bin.display()))?;
    // `[15] .text PROGBITS <addr> <off> <size> ...`
    let f: Vec<&str> = line
        .split(']')
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let hex = |s: &str| u64::from_str_radix(s, 16).with_context(|| format!("parsing `{line}`"));
    Ok((
        hex(f.get(3).copied().unwrap_or(""))?,
        hex(f.get(4).copied().unwrap_or(""))?,
        dwarf,
    ))
}

fn symbolize_once(bin: &Path, debug_syms: bool, n: u64) -> Result<SymTimes> {
    let (off, size, _) = text_section(bin)?;
    if size < n {
        bail!("{}: .text has only {size} bytes", bin.display());
    }
    let offsets: Vec<u64> = (0..n).map(|i| off + i * size / n).collect();
    let src = Source::Elf(Elf {
        debug_syms,
        ..Elf::new(bin)
    });
    let sym = Symbolizer::new();
    let t = Instant::now();
    let first = sym.symbolize(&src, Input::FileOffset(&offsets))?;
    let cold = t.elapsed();
    let resolved = first
        .iter()
        .filter(|s| matches!(s, Symbolized::Sym(_)))
        .count();
    let t = Instant::now();
    let second = sym.symbolize(&src, Input::FileOffset(&offsets))?;
    let warm = t.elapsed();
    assert_eq!(second.len(), first.len());
    Ok(SymTimes {
        cold,
        warm,
        resolved,
    })
}

/// Symbolizes `n` distinct file offsets spread over `.text` of the release
/// profiler (no DWARF) and of this xtask binary (a debug build, with DWARF),
/// with and without debug symbols.
pub fn symbolization(n: u64) -> Vec<SymRow> {
    let mut bins = vec![profiler_bin()];
    if let Ok(me) = std::env::current_exe() {
        bins.push(me);
    }
    let mut rows = Vec::new();
    for bin in bins {
        let size_mib = std::fs::metadata(&bin).map_or(0.0, |m| m.len() as f64 / 1048576.0);
        let has_dwarf = text_section(&bin).map(|t| t.2).unwrap_or(false);
        for debug_syms in [true, false] {
            eprintln!(
                "bench: sampling, blazesym on {} (debug_syms: {debug_syms})",
                bin.display()
            );
            rows.push(SymRow {
                binary: bin.clone(),
                size_mib,
                has_dwarf,
                debug_syms,
                result: symbolize_once(&bin, debug_syms, n),
            });
        }
    }
    rows
}

pub fn sym_rows(rows: &[SymRow], n: u64) -> String {
    let mut s = String::from(
        "| binary | size | DWARF in file | `debug_syms` | first call (parse + symbolize) | per address | second call (cached) | per address | resolved |\n\
         | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let name = r
            .binary
            .strip_prefix(crate::util::workspace_root())
            .unwrap_or(&r.binary)
            .display()
            .to_string();
        let cells = match &r.result {
            Ok(t) => format!(
                "{:.0} ms | {:.2} µs | {:.0} ms | {:.2} µs | {} / {n}",
                t.cold.as_secs_f64() * 1e3,
                t.cold.as_secs_f64() * 1e6 / n as f64,
                t.warm.as_secs_f64() * 1e3,
                t.warm.as_secs_f64() * 1e6 / n as f64,
                t.resolved
            ),
            Err(e) => format!(
                "error: {} | | | |",
                format!("{e:#}").lines().next().unwrap_or("")
            ),
        };
        writeln!(
            s,
            "| `{name}` | {:.1} MiB | {} | {} | {cells} |",
            r.size_mib,
            if r.has_dwarf { "yes" } else { "no" },
            r.debug_syms
        )
        .unwrap();
    }
    s
}

/// Frame names with their self-sample percentage, highest first.
type Top = Vec<(String, f64)>;

/// Top frames of both samplers on the same run: (profiler, perf).
pub struct Agreement {
    result: Result<(Top, Top)>,
}

/// `   COUNT   PCT%  NAME` lines after `Top frames by self samples`.
fn profiler_top(cpu_txt: &str, k: usize) -> Vec<(String, f64)> {
    cpu_txt
        .lines()
        .skip_while(|l| !l.starts_with("Top frames by self samples"))
        .skip(1)
        .map_while(|l| {
            let mut it = l.split_whitespace();
            let _count: u64 = it.next()?.parse().ok()?;
            let pct: f64 = it.next()?.strip_suffix('%')?.parse().ok()?;
            let name = it.collect::<Vec<_>>().join(" ");
            Some((name, pct))
        })
        .take(k)
        .collect()
}

/// `    62.18%  [.] burn_c` lines of `perf report --sort sym -q -g none`.
fn perf_top(report: &str, k: usize) -> Vec<(String, f64)> {
    report
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let pct: f64 = it.next()?.strip_suffix('%')?.parse().ok()?;
            let kind = it.next()?;
            let name = it.collect::<Vec<_>>().join(" ");
            let name = if kind == "[k]" {
                format!("{name}_[k]")
            } else {
                name
            };
            Some((name, pct))
        })
        .take(k)
        .collect()
}

/// Runs `profiler sample --pid` and `perf record -g -p` on the same fixture
/// run, both at 997 Hz, and reads both top-5 self-sample lists.
pub fn agreement(bin: &Path, rounds: u64, work: &Path) -> Agreement {
    let result = (|| {
        let mut target = Target::start(Command::new(bin).arg(rounds.to_string()))?;
        let pid = target.pid();
        let prof = start_sampler(Sampler::ProfilerPid(997).command(pid, work).unwrap(), false)?;
        let perf = start_sampler(Sampler::PerfPid(997).command(pid, work).unwrap(), true)?;
        target.go()?;
        target.result(Duration::from_secs(300))?;
        prof.stop()?;
        perf.stop()?;
        let txt = std::fs::read_to_string(work.join("prof-sampling/cpu.txt"))
            .context("reading cpu.txt")?;
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--sort",
                "sym",
                "-q",
                "-g",
                "none",
                "-i",
            ])
            .arg(work.join("perf-sampling.data"))
            .output()
            .context("running perf report")?;
        Ok((
            profiler_top(&txt, 5),
            perf_top(&String::from_utf8_lossy(&out.stdout), 5),
        ))
    })();
    Agreement { result }
}

pub fn agreement_rows(a: &Agreement) -> String {
    let (p, q) = match &a.result {
        Ok(v) => v,
        Err(e) => return format!("error: {}\n", format!("{e:#}").replace('\n', " ")),
    };
    let mut s = String::from(
        "| rank | profiler (cpu.txt) | self % | perf report | self % |\n| ---: | --- | ---: | --- | ---: |\n",
    );
    for i in 0..p.len().max(q.len()) {
        let cell = |v: &[(String, f64)]| {
            v.get(i)
                .map_or("— | —".into(), |(n, pct)| format!("`{n}` | {pct:.1}%"))
        };
        writeln!(s, "| {} | {} | {} |", i + 1, cell(p), cell(q)).unwrap();
    }
    let top1 = p.first().zip(q.first());
    let same = top1.is_some_and(|(a, b)| a.0 == b.0);
    let within = top1.is_some_and(|(a, b)| (a.1 - b.1).abs() <= 5.0);
    writeln!(
        s,
        "\nTop-1 agrees: **{}**; top-1 share within 5 points: **{}**{}.",
        if same { "yes" } else { "no" },
        if within { "yes" } else { "no" },
        top1.map_or(String::new(), |(a, b)| format!(
            " ({:.1}% vs {:.1}%)",
            a.1, b.1
        ))
    )
    .unwrap();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_top_lists() {
        let txt = "CPU samples of PID 1 (/b: x): 1798 at 997 Hz over 2.39 s; complete stacks 99.9%; no user stack 0; lost: 0 user stacks unreadable\n\n\
                   Top frames by self samples\n      1100   61.2%  burn_c\n       450   25.0%  burn_b\n         4    0.2%  handle_softirqs_[k]\n";
        assert_eq!(profiler_samples(txt), Some(1798));
        let top = profiler_top(txt, 5);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], ("burn_c".to_string(), 61.2));
        assert_eq!(top[2].0, "handle_softirqs_[k]");
        let rep =
            "    62.18%  [.] burn_c\n    25.19%  [.] burn_b\n     0.06%  [k] handle_softirqs\n\n";
        let top = perf_top(rep, 5);
        assert_eq!(top[0], ("burn_c".to_string(), 62.18));
        assert_eq!(top[2].0, "handle_softirqs_[k]");
        let err = "[ perf record: Woken up 1 times to write data ]\n[ perf record: Captured and wrote 0.150 MB /x (1798 samples) ]";
        assert_eq!(perf_samples(err), Some(1798));
    }
}
