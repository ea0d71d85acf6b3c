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

/// The agent while it samples every process at 99 Hz, under one load.
pub struct Steady {
    /// What else ran: the machine as it was, or with the exec loop too.
    load: &'static str,
    /// Seconds of warm-up, and the agent's CPU in them (percent of a core).
    warmup_secs: f64,
    warmup_pct: f64,
    /// Seconds measured after the warm-up, and the CPU in them.
    secs: f64,
    cpu_pct: f64,
    /// CPU of each 5-second window of the steady part (least, most).
    window_pct: (f64, f64),
    /// 1-minute load average at the start and at the end.
    loadavg: (f64, f64),
    /// Short-lived processes the exec loop started while measured.
    execs: u64,
    /// Kernel memory of its BPF maps (sum of `memlock` of its map fds).
    map_bytes: u64,
    /// cpu.txt's `unwinding:` line.
    unwinding: String,
}

/// The 1-minute load average.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A loop of short-lived processes, as a build makes them: `/bin/true`
/// twenty times, a shell, then a C compile (`cc -O1 -c`), until stopped.
/// Counts the processes it started.
struct ExecLoop {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl ExecLoop {
    fn start(work: &Path) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let src = work.join("exec_loop.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\nint main(void) { puts(\"hi\"); return 0; }\n",
        )?;
        let obj = work.join("exec_loop.o");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            let quiet = |c: &mut Command| {
                c.stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok()
            };
            while !flag.load(Ordering::Relaxed) {
                for _ in 0..20 {
                    n += u64::from(quiet(&mut Command::new("/bin/true")));
                }
                n += u64::from(quiet(Command::new("sh").args(["-c", "ls /proc"])));
                n += u64::from(quiet(
                    Command::new("cc")
                        .arg("-O1")
                        .arg("-c")
                        .arg(&src)
                        .arg("-o")
                        .arg(&obj),
                ));
            }
            n
        });
        Ok(ExecLoop {
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
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

/// Seconds of each window of the steady part.
const WINDOW: Duration = Duration::from_secs(5);

/// `profiler sample --all --hz 99`: its CPU over the `warmup` after it
/// attached (the tables of every process on a CPU built, then of each
/// process as it is first sampled), then over `secs` (whole windows of 5 s),
/// with the exec loop running from before the start when `exec_loop`.
pub fn steady(work: &Path, warmup: Duration, secs: Duration, exec_loop: bool) -> Result<Steady> {
    let out = work.join("prof-steady");
    let _ = std::fs::remove_dir_all(&out);
    let looping = exec_loop.then(|| ExecLoop::start(work)).transpose()?;
    let load0 = loadavg();
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["sample", "--all", "--hz", "99", "--out"])
        .arg(&out);
    let mut t = Tracer::start(&mut cmd, ReadyOn::Stderr, "sampler at")?;
    let pid = t.guard.pid();
    let (c0, t0) = (cpu_secs(pid)?, Instant::now());
    std::thread::sleep(warmup);
    let (c1, t1) = (cpu_secs(pid)?, Instant::now());
    let (mut c, mut at) = (c1, t1);
    let mut windows = Vec::new();
    for _ in 0..(secs.as_secs() / WINDOW.as_secs()).max(1) {
        std::thread::sleep(WINDOW);
        let (cn, tn) = (cpu_secs(pid)?, Instant::now());
        windows.push((cn - c) / (tn - at).as_secs_f64() * 100.0);
        (c, at) = (cn, tn);
    }
    let map_bytes = map_memlock(pid);
    let load1 = loadavg();
    t.guard.signal(libc::SIGINT);
    let execs = looping.map_or(0, ExecLoop::stop);
    t.finish(Duration::from_secs(60))?;
    let cpu_txt = std::fs::read_to_string(out.join("cpu.txt")).unwrap_or_default();
    let unwinding = cpu_txt
        .lines()
        .find(|l| l.starts_with("unwinding:"))
        .unwrap_or("(no unwinding line in cpu.txt)")
        .to_string();
    let warmup_secs = (t1 - t0).as_secs_f64();
    let secs = (at - t1).as_secs_f64();
    let least = windows.iter().copied().fold(f64::INFINITY, f64::min);
    let most = windows.iter().copied().fold(0.0, f64::max);
    Ok(Steady {
        load: if exec_loop {
            "with the exec loop"
        } else {
            "machine as it was"
        },
        warmup_secs,
        warmup_pct: (c1 - c0) / warmup_secs * 100.0,
        secs,
        cpu_pct: (c - c1) / secs * 100.0,
        window_pct: (least, most),
        loadavg: (load0, load1),
        execs,
        map_bytes,
        unwinding,
    })
}

/// Markdown for both.
pub fn rows(tables: &[TableRow], steady: &[Result<Steady>]) -> String {
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
    md.push_str(
        "\n| `profiler sample --all --hz 99` | warm-up: agent CPU | steady: agent CPU | 5-s windows | load average (1 min), start → end | short-lived processes started | BPF map memory (`memlock`) | goal: steady < 1% |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for s in steady {
        match s {
            Ok(s) => {
                let met = if s.cpu_pct < 1.0 { "met" } else { "NOT met" };
                let _ = writeln!(
                    md,
                    "| {} | {:.2}% over {:.0} s | {:.2}% over {:.0} s | {:.2}–{:.2}% | {:.2} → {:.2} | {} | {:.1} MiB | {met} |",
                    s.load,
                    s.warmup_pct,
                    s.warmup_secs,
                    s.cpu_pct,
                    s.secs,
                    s.window_pct.0,
                    s.window_pct.1,
                    s.loadavg.0,
                    s.loadavg.1,
                    s.execs,
                    s.map_bytes as f64 / (1u64 << 20) as f64
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| failed: {e:#} | | | | | | | |");
            }
        }
    }
    for s in steady.iter().flatten() {
        let _ = writeln!(md, "\ncpu.txt, {}: `{}`", s.load, s.unwinding);
    }
    md
}

/// gtk3-demo's fishbowl under Xvfb, drawn through Mesa's software renderer
/// (`GDK_GL=always`, which maps libLLVM): what `profiler sample --pid` and
/// `record --pid` make of it with default options (issue 24).
pub struct Gtk {
    /// The figures of cpu.txt's `unwinding:` line: binaries, functions,
    /// rows, memory used of the budget, build time.
    pub tables: String,
    /// cpu.txt's complete-stack share.
    pub complete: String,
    /// Shares of gtk3-demo's samples through `g_main_context_dispatch`,
    /// and with a `gtk_` frame.
    pub through_dispatch: f64,
    pub gtk_frames: f64,
    pub samples: u64,
    /// The sampling agent's peak RSS (its `wait4` rusage), in KiB.
    pub rss_kib: u64,
    /// Its BPF maps' `memlock`, read while it samples.
    pub map_bytes: u64,
    /// dispatches.txt's in-dispatch sample line from `record --pid`.
    pub in_dispatch: String,
}

/// Waits for `pid` (a child) and returns its peak RSS in KiB.
fn wait_rss(pid: u32) -> Result<u64> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unreaped child; both pointers are valid.
    let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    if rc < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("the profiler failed (wait status {status:#x})");
    }
    Ok(usage.ru_maxrss as u64)
}

/// Measures [`Gtk`]; fails with what to install when Xvfb or gtk3-demo is
/// missing.
pub fn gtk(work: &Path) -> Result<Gtk> {
    use crate::proc::Guard;
    for tool in ["Xvfb", "gtk3-demo"] {
        if crate::util::find_program(tool).is_none() {
            bail!("needs {tool}: run `cargo xtask setup --bench`");
        }
    }
    let display = ":97";
    let _x = Guard::spawn(
        Command::new("Xvfb")
            .args([display, "-screen", "0", "1280x1024x24", "-nolisten", "tcp"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    let app = Guard::spawn(
        Command::new("gtk3-demo")
            .arg("--run=fishbowl")
            .env("DISPLAY", display)
            .env("GDK_GL", "always")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )?;
    std::thread::sleep(Duration::from_secs(6));
    let pid = app.pid().to_string();
    // Pointer motion over the window while it is measured, as a user's
    // (when xdotool is installed): events GTK dispatches beside its frames.
    let _pointer = crate::util::find_program("xdotool")
        .map(|_| {
            Guard::spawn(
                Command::new("sh")
                    .args([
                        "-c",
                        "while :; do for x in 100 300 500 700; do \
                         xdotool mousemove $x $((x / 2 + 100)); sleep 0.05; done; done",
                    ])
                    .env("DISPLAY", display)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null()),
            )
        })
        .transpose()?;

    let out = work.join("gtk-sample");
    let _ = std::fs::remove_dir_all(&out);
    let mut prof = Command::new(profiler_bin())
        .args(["sample", "--pid", &pid, "--duration", "5s", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("run `profiler sample`")?;
    std::thread::sleep(Duration::from_secs(3));
    let map_bytes = map_memlock(prof.id());
    let rss_kib = wait_rss(prof.id());
    // Reaped by wait4 already: forget the handle.
    let _ = prof.try_wait();
    let rss_kib = rss_kib?;
    let cpu_txt = std::fs::read_to_string(out.join("cpu.txt")).context("cpu.txt")?;
    let tables = cpu_txt
        .lines()
        .find_map(|l| l.strip_prefix("unwinding: compiled .eh_frame tables for "))
        .and_then(|l| l.split(')').next())
        .map(|l| format!("{l})"))
        .unwrap_or_else(|| "(no unwinding line)".into());
    let complete = cpu_txt
        .lines()
        .find(|l| l.starts_with("CPU samples"))
        .and_then(|l| l.split("; ").find(|f| f.starts_with("complete stacks")))
        .unwrap_or("(none)")
        .to_string();
    let folded = std::fs::read_to_string(out.join("cpu.folded")).context("cpu.folded")?;
    let (mut samples, mut dispatch, mut gtk) = (0u64, 0u64, 0u64);
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        if !stack.starts_with("gtk3-demo;") {
            continue;
        }
        samples += n;
        if stack.contains(";g_main_context_dispatch;") {
            dispatch += n;
        }
        if stack.contains(";gtk_") {
            gtk += n;
        }
    }

    let rec = work.join("gtk-record");
    let _ = std::fs::remove_dir_all(&rec);
    let fin = Command::new(profiler_bin())
        .args(["record", "--pid", &pid, "--duration", "5s", "--out"])
        .arg(&rec)
        .output()
        .context("run `profiler record`")?;
    if !fin.status.success() {
        bail!(
            "profiler record --pid failed: {}",
            String::from_utf8_lossy(&fin.stderr)
        );
    }
    let in_dispatch = std::fs::read_to_string(rec.join("dispatches.txt"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains("in-dispatch samples:"))
        .unwrap_or("(no in-dispatch samples line)")
        .trim()
        .to_string();
    drop(app);
    Ok(Gtk {
        tables,
        complete,
        through_dispatch: dispatch as f64 / samples.max(1) as f64 * 100.0,
        gtk_frames: gtk as f64 / samples.max(1) as f64 * 100.0,
        samples,
        rss_kib,
        map_bytes,
        in_dispatch,
    })
}

/// Markdown for [`gtk`].
pub fn gtk_rows(g: &Result<Gtk>) -> String {
    let g = match g {
        Ok(g) => g,
        Err(e) => return format!("\ngtk3-demo: not measured: {e:#}\n"),
    };
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let complete_pct: f64 = g
        .in_dispatch
        .split("complete stacks ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    format!(
        "\n| gtk3-demo fishbowl under Xvfb, default options | figure |\n| --- | --- |\n\
         | `sample --pid`: tables | {} |\n\
         | `sample --pid`: BPF map memory (`memlock`) | {:.1} MiB |\n\
         | `sample --pid`: agent peak RSS | {:.1} MB |\n\
         | `sample --pid`: samples of gtk3-demo | {}; {} |\n\
         | through `g_main_context_dispatch` / with a `gtk_` frame | {:.1}% / {:.1}% |\n\
         | `record --pid`: {} | goal ≥ 90% complete: {} |\n",
        g.tables,
        g.map_bytes as f64 / (1u64 << 20) as f64,
        g.rss_kib as f64 * 1024.0 / 1e6,
        g.samples,
        g.complete,
        g.through_dispatch,
        g.gtk_frames,
        g.in_dispatch,
        met(complete_pct >= 90.0),
    )
}
