//! g. The table unwinder's own costs (issue 8): how long a binary's table
//! takes to build and how big it is (`profiler tables`), the kernel memory
//! of the agent's BPF maps, and the agent's steady-state CPU time while it
//! samples the whole system at 99 Hz (tables refreshed every second).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::proc::{ReadyOn, Tracer};
use crate::util::profiler_bin;

/// Binaries whose tables are timed: libc, libpython3.11 (or the python3.11
/// executable, which links it in), and one of 50 MB or more.
fn binaries() -> Vec<(String, PathBuf)> {
    let mut out = vec![(
        "libc".to_string(),
        PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
    )];
    for p in [
        "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
        "/usr/bin/python3.11",
    ] {
        if Path::new(p).exists() {
            out.push(("python 3.11".into(), p.into()));
            break;
        }
    }
    if let Some(big) = big_binary() {
        out.push(("50 MB or more".into(), big));
    }
    out
}

/// A binary of at least 50 MB: the Rust compiler's driver library from the
/// toolchain this machine builds with, else Chromium (which has little CFI).
fn big_binary() -> Option<PathBuf> {
    const MIN: u64 = 50_000_000;
    let big = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.len() >= MIN);
    let home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| "/root/.rustup".into());
    let toolchains = std::fs::read_dir(Path::new(&home).join("toolchains")).ok()?;
    for tc in toolchains.flatten() {
        for f in std::fs::read_dir(tc.path().join("lib"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.starts_with("librustc_driver-") && big(&f.path()) {
                return Some(f.path());
            }
        }
    }
    let chromium = Path::new("/usr/lib/chromium/chromium");
    big(chromium).then(|| chromium.into())
}

/// One binary's table.
pub struct TableRow {
    what: String,
    path: PathBuf,
    figures: Result<serde_json::Value>,
}

/// `profiler tables --json --repeat 3` on each binary.
pub fn tables() -> Vec<TableRow> {
    binaries()
        .into_iter()
        .map(|(what, path)| {
            eprintln!("bench: unwind table of {}", path.display());
            let figures = (|| {
                let out = Command::new(profiler_bin())
                    .args(["tables", "--json", "--repeat", "3"])
                    .arg(&path)
                    .output()
                    .context("run `profiler tables`")?;
                if !out.status.success() {
                    bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
                }
                let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
                Ok(v[0].clone())
            })();
            TableRow {
                what,
                path,
                figures,
            }
        })
        .collect()
}

/// The agent while it samples every process at 99 Hz.
pub struct Steady {
    /// Seconds measured (after the warm-up).
    secs: f64,
    /// CPU time used in them, as a share of one core (percent).
    cpu_pct: f64,
    /// Kernel memory of its BPF maps (sum of `memlock` of its map fds).
    map_bytes: u64,
    /// cpu.txt's `unwinding:` line.
    unwinding: String,
}

/// utime + stime of `pid`, in seconds.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is 3rd.
    let rest = stat.rsplit_once(')').context("bad /proc/PID/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// Sum of `memlock:` over the BPF map descriptors `pid` holds.
fn map_memlock(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut sum = 0;
    for e in dir.flatten() {
        let is_map =
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-map");
        if !is_map {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        sum += info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    sum
}

/// `profiler sample --all --hz 99` for a warm-up then `secs` measured.
pub fn steady(work: &Path, warmup: Duration, secs: Duration) -> Result<Steady> {
    let out = work.join("prof-steady");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["sample", "--all", "--hz", "99", "--out"])
        .arg(&out);
    let mut t = Tracer::start(&mut cmd, ReadyOn::Stderr, "sampler at")?;
    let pid = t.guard.pid();
    std::thread::sleep(warmup);
    let (c0, t0) = (cpu_secs(pid)?, Instant::now());
    std::thread::sleep(secs);
    let (c1, t1) = (cpu_secs(pid)?, Instant::now());
    let map_bytes = map_memlock(pid);
    t.guard.signal(libc::SIGINT);
    t.finish(Duration::from_secs(60))?;
    let cpu_txt = std::fs::read_to_string(out.join("cpu.txt")).unwrap_or_default();
    let unwinding = cpu_txt
        .lines()
        .find(|l| l.starts_with("unwinding:"))
        .unwrap_or("(no unwinding line in cpu.txt)")
        .to_string();
    let secs = (t1 - t0).as_secs_f64();
    Ok(Steady {
        secs,
        cpu_pct: (c1 - c0) / secs * 100.0,
        map_bytes,
        unwinding,
    })
}

/// Markdown for both.
pub fn rows(tables: &[TableRow], steady: &Result<Steady>) -> String {
    let mut md = String::from(
        "| binary | file | size | build (best of 3) | first build | rows | table | goal |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for t in tables {
        match &t.figures {
            Ok(v) => {
                let ms = v["build_ms"].as_f64().unwrap_or(f64::NAN);
                let goal = if t.what == "libc" {
                    if ms < 50.0 {
                        "< 50 ms: met"
                    } else {
                        "< 50 ms: NOT met"
                    }
                } else {
                    ""
                };
                let _ = writeln!(
                    md,
                    "| {} | `{}` | {:.1} MB | {ms:.1} ms | {:.1} ms | {} | {:.2} MiB | {goal} |",
                    t.what,
                    t.path.display(),
                    v["file_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                    v["first_build_ms"].as_f64().unwrap_or(f64::NAN),
                    v["rows"],
                    v["table_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64,
                );
            }
            Err(e) => {
                let _ = writeln!(
                    md,
                    "| {} | `{}` | failed: {e:#} | | | | | |",
                    t.what,
                    t.path.display()
                );
            }
        }
    }
    md.push_str("\n| `profiler sample --all --hz 99`, steady state | value | goal |\n| --- | ---: | --- |\n");
    match steady {
        Ok(s) => {
            let met = if s.cpu_pct < 1.0 { "met" } else { "NOT met" };
            let _ = writeln!(
                md,
                "| agent CPU over {:.0} s after warm-up | {:.2}% of a core | < 1%: {met} |",
                s.secs, s.cpu_pct
            );
            let _ = writeln!(
                md,
                "| kernel memory of its BPF maps (`memlock`) | {:.1} MiB | |",
                s.map_bytes as f64 / (1u64 << 20) as f64
            );
            let _ = writeln!(md, "\ncpu.txt of that run: `{}`", s.unwinding);
        }
        Err(e) => {
            let _ = writeln!(md, "| failed: {e:#} | | |");
        }
    }
    md
}
