//! `profiler watch`: always on, one line per stall in `stalls.jsonl` as it
//! happens, targets followed across restarts, no false stalls, bounded
//! disk. The target is `stall_server` (`fixtures/stall_server.c`), an epoll
//! loop whose stalls (on-CPU and asleep, of known lengths) it logs itself,
//! as they end, with CLOCK_MONOTONIC.
use profiler_tests::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn stall_server() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c("stall_server.c", "stall_server", &["-O1"]))
}

/// One stall as the server logged it.
#[derive(Debug, Clone, Copy)]
struct Truth {
    cpu: bool,
    start_ns: u64,
    duration_ns: u64,
}

/// A stall_server run (or another fixture that logs its stalls the same
/// way, `watch_escalation.rs`'s): started, its lines read as it logs them.
pub(crate) struct Server {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    pub(crate) pid: u32,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server::spawn(stall_server(), args)
    }

    /// Starts `exe` with `args` and waits for its `ready PID` line.
    pub(crate) fn spawn(exe: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let ready = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("ready line");
        let pid = ready.strip_prefix("ready ").unwrap().parse().unwrap();
        Server {
            child,
            stdin,
            lines,
            pid,
        }
    }

    /// Waits for `w` to say it watches this server, then starts its stalls.
    pub(crate) fn go_when_watched(&mut self, w: &mut Recording) {
        let attached = format!("watching PID {} (", self.pid);
        if !w.stderr_so_far().iter().any(|l| l.contains(&attached)) {
            w.wait_for_line(&attached, Duration::from_secs(30));
        }
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("a held server");
        writeln!(stdin, "go").and_then(|_| stdin.flush()).unwrap();
    }

    /// Reads lines until `done`, waits for a clean exit, and returns them.
    pub(crate) fn lines_to_end(&mut self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("the fixture ended its run");
            if line == "done" {
                break;
            }
            lines.push(line);
        }
        assert!(self.child.wait().unwrap().success());
        lines
    }

    /// Reads stall lines until `done`; returns them.
    fn run_to_end(&mut self, limit: Duration) -> Vec<Truth> {
        self.lines_to_end(limit)
            .iter()
            .map(|l| parse_truth(l))
            .collect()
    }

    /// Waits for the next stall line.
    fn next_stall(&mut self) -> Truth {
        parse_truth(
            &self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("a stall"),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_truth(line: &str) -> Truth {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[0], "stall", "{line}");
    Truth {
        cpu: f[1] == "cpu",
        start_ns: f[2].parse().unwrap(),
        duration_ns: f[3].parse().unwrap(),
    }
}

fn watcher(out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(profiler_bin());
    cmd.args(["watch", "--out"]).arg(out).args(extra);
    cmd
}

/// The lines of `stalls.jsonl` (every one must parse).
fn lines(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("stalls.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// The lines of `pid` in `stalls.jsonl`, hangs still running left out.
pub(crate) fn lines_of(out: &Path, pid: u32) -> Vec<Value> {
    lines(out)
        .into_iter()
        .filter(|l| l["pid"] == pid && l["hang"] != true)
        .collect()
}

/// Waits up to `limit` for `n` lines of `pid`.
fn wait_lines(out: &Path, pid: u32, n: usize, limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let l = lines_of(out, pid);
        if l.len() >= n || Instant::now() > deadline {
            return l;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each line is one of the server's stalls: the same start (the line's
/// iteration begins before the handler measures, by at most a few ms), a
/// duration within 2% (plus 2 ms for the loop's own work around the
/// handler), and the split of its kind.
fn assert_matches(lines: &[Value], truth: &[Truth]) {
    assert_eq!(
        lines.len(),
        truth.len(),
        "one line per stall: {lines:#?}\n{truth:#?}"
    );
    for (l, t) in lines.iter().zip(truth) {
        let start = l["start_ns"].as_u64().unwrap();
        let dur = l["duration_ns"].as_u64().unwrap();
        assert!(
            start <= t.start_ns && t.start_ns - start < 5_000_000,
            "line starts at {start}, the stall at {}: {l}",
            t.start_ns
        );
        let slack = t.duration_ns / 50 + 2_000_000;
        assert!(
            dur.abs_diff(t.duration_ns) <= slack,
            "line lasts {dur} ns, the stall {} ns: {l}",
            t.duration_ns
        );
        let (on_cpu, blocked, runnable) = (
            l["on_cpu_ns"].as_u64().unwrap(),
            l["blocked_ns"].as_u64().unwrap(),
            l["runnable_ns"].as_u64().unwrap(),
        );
        let key = l["key"].as_str().unwrap();
        if t.cpu {
            // Waiting for a CPU is part of running on this 2-CPU machine.
            assert!(
                on_cpu + runnable >= dur * 9 / 10 && blocked < dur / 10,
                "{l}"
            );
            assert!(key.contains("spin_stall"), "{l}");
        } else {
            assert!(blocked >= dur * 9 / 10, "{l}");
            assert!(key.contains("sleep_stall"), "{l}");
        }
        // Sampled, or traced for a few stalls after its group's first
        // (`--trace-stalls`, on by default: watch_escalation.rs).
        assert!(l["tree"] == "sampled" || l["tree"] == "traced", "{l}");
        assert_eq!(l["group"].as_str().unwrap().len(), 16, "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
        assert!(l["call_tree"]["children"].is_array(), "{l}");
    }
}

#[test]
fn watch_follows_an_executable_across_restarts_with_a_line_per_stall() {
    require_root!();
    let before = prof_prog_ids();
    let out = TempDir::new("watch-exe");
    let exe = stall_server().display().to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--exe", &exe, "--threshold", "100ms"]),
        "no process matches yet",
    );
    // Its stalls start 300 ms after the watch has attached.
    let mut first = Server::start(&["6", "@300", "300"]);
    first.go_when_watched(&mut w);
    let truth1 = first.run_to_end(Duration::from_secs(60));
    // All there before the second run starts. Each is written within a
    // second of its stall's end, except the last: it ends 5 ms before the
    // process exits, and its line comes with the end of the watch of that
    // process (measured 1.1-1.2 s after the exit on this machine).
    let lines1 = wait_lines(out.path(), first.pid, truth1.len(), Duration::from_secs(3));
    assert_matches(&lines1, &truth1);
    w.wait_for_line(
        &format!("stopped watching PID {}: it exited", first.pid),
        Duration::from_secs(5),
    );
    let mut second = Server::start(&["4", "@300", "300"]);
    assert_ne!(second.pid, first.pid);
    second.go_when_watched(&mut w);
    let truth2 = second.run_to_end(Duration::from_secs(60));
    let lines2 = wait_lines(out.path(), second.pid, truth2.len(), Duration::from_secs(3));
    assert_matches(&lines2, &truth2);
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    // No line without a stall.
    assert_eq!(lines(out.path()).len(), truth1.len() + truth2.len());
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["stalls"], (truth1.len() + truth2.len()) as u64);
    let g = groups["groups"].as_array().unwrap();
    assert_eq!(g.len(), 2, "an on-CPU and an asleep group: {groups}");
    for e in g {
        let reports = e["reports"].as_array().unwrap();
        assert!(!reports.is_empty(), "{e}");
        let r = reports[0].as_str().unwrap();
        let text = std::fs::read_to_string(out.path().join(format!("{r}.txt"))).unwrap();
        assert!(text.contains("before it began"), "{text}");
    }
    assert_none_left_since(&before, &[]);
}

#[test]
fn a_stopped_process_is_neither_a_stall_nor_a_hang() {
    require_root!();
    let before = prof_prog_ids();
    let out = TempDir::new("watch-stop");
    let mut server = Server::start(&["2", "@300", "6000"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid, "--hang", "1s"]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let t1 = server.next_stall();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(server.pid as i32, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(5));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server.pid as i32, libc::SIGCONT) }, 0);
    let t2 = server.next_stall();
    let rest = server.run_to_end(Duration::from_secs(30));
    assert!(rest.is_empty());
    let got = wait_lines(out.path(), server.pid, 2, Duration::from_secs(2));
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    assert_matches(&got, &[t1, t2]);
    assert!(
        lines(out.path()).iter().all(|l| l["hang"] != true),
        "no hang while stopped"
    );
    let stopped: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("is stopped"))
        .collect();
    assert_eq!(
        stopped.len(),
        1,
        "one line says it was stopped: {:?}",
        fin.stderr
    );
    assert!(
        !fin.stderr.iter().any(|l| l.contains("HANG")),
        "{:?}",
        fin.stderr
    );
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["stalls"], 2);
    assert_eq!(groups["excluded"][0][1], 1, "{groups}");
    assert_none_left_since(&before, &[]);
}

#[test]
fn the_disk_cap_holds_and_groups_count_every_stall() {
    require_root!();
    let out = TempDir::new("watch-cap");
    // 400 stalls of 30-50 ms, 10 ms apart.
    let mut server = Server::start(&["400", "@300", "10", "30"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(
            out.path(),
            &["--pid", &pid, "--threshold", "20ms", "--max-disk", "2M"],
        ),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let truth = server.run_to_end(Duration::from_secs(120));
    assert_eq!(truth.len(), 400);
    let fin = w.wait();
    assert!(fin.status.success(), "{fin:?}");
    assert!(
        fin.stderr
            .iter()
            .any(|l| l.contains("every process given with --pid has exited")),
        "{:?}",
        fin.stderr
    );
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["stalls"], 400, "{groups}");
    let counted: u64 = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 400);
    let size = du(out.path());
    assert!(size <= 2 << 20, "{size} bytes on disk, over --max-disk 2M");
    let mut on_disk = 0;
    for e in std::fs::read_dir(out.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            for l in std::fs::read_to_string(&p).unwrap().lines() {
                let _: Value = serde_json::from_str(l).unwrap();
                on_disk += 1;
            }
        }
    }
    assert_eq!(on_disk + groups["lines_deleted"].as_u64().unwrap(), 400);
}

fn du(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            match e.file_type().unwrap().is_dir() {
                true => du(&e.path()),
                false => e.metadata().unwrap().len(),
            }
        })
        .sum()
}

#[test]
fn after_a_sigkill_every_line_parses_and_a_new_watcher_appends() {
    require_root!();
    let before = prof_prog_ids();
    let out = TempDir::new("watch-kill");
    let mut server = Server::start(&["5", "@300", "1500"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    server.next_stall();
    server.next_stall();
    wait_lines(out.path(), server.pid, 2, Duration::from_secs(1));
    let killed = w.stop(libc::SIGKILL);
    assert!(!killed.status.success());
    let first = lines_of(out.path(), server.pid);
    assert_eq!(first.len(), 2, "{first:?}");
    let w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid]),
        &format!("watching PID {pid}"),
    );
    let rest = server.run_to_end(Duration::from_secs(30));
    let fin = w.wait();
    assert!(fin.status.success(), "{fin:?}");
    let all = lines_of(out.path(), server.pid);
    // The first watcher's lines stay, the second's follow them; a stall
    // while neither watched is not there.
    assert!(all.len() > 2 && all.len() <= 2 + rest.len(), "{all:?}");
    assert_eq!(all[..2], first[..]);
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(
        groups["stalls"],
        all.len() as u64,
        "counts carried on: {groups}"
    );
    assert_none_left_since(&before, &[]);
}

#[test]
fn watch_refuses_bad_input_in_one_line() {
    require_root!();
    let out = TempDir::new("watch-bad");
    let dir = out.path().display().to_string();
    for (args, needle) in [
        (vec!["watch", "--out", &dir], "nothing to watch"),
        (
            vec!["watch", "--out", &dir, "--exe", "/nonexistent/app"],
            "--exe /nonexistent/app",
        ),
        (
            vec![
                "watch",
                "--out",
                &dir,
                "--pid",
                "99999999",
                "--max-disk",
                "10K",
            ],
            "--max-disk",
        ),
        (
            vec![
                "watch",
                "--out",
                &dir,
                "--pid",
                "99999999",
                "--profile-every",
                "100ms",
            ],
            "--profile-every",
        ),
    ] {
        let fin = profiler(&args);
        assert_error(&fin, needle, true);
    }
}

#[test]
fn a_hang_is_a_line_while_it_runs_and_another_when_it_ends() {
    require_root!();
    let out = TempDir::new("watch-hang");
    // Two stalls of 600 and 600 ms (the first two of a 600-ms base).
    let mut server = Server::start(&["2", "@300", "1000", "600"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid, "--hang", "300ms"]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let truth = server.run_to_end(Duration::from_secs(30));
    let fin = w.wait();
    assert!(fin.status.success(), "{fin:?}");
    let all = lines(out.path());
    let hangs: Vec<&Value> = all.iter().filter(|l| l["hang"] == true).collect();
    assert_eq!(hangs.len(), 2, "a hang line per stall: {all:#?}");
    for h in &hangs {
        let running = h["duration_ns"].as_u64().unwrap();
        assert!((300_000_000..600_000_000).contains(&running), "{h}");
        assert_eq!(h["pid"], server.pid);
    }
    assert_matches(&lines_of(out.path(), server.pid), &truth);
    let told: Vec<&String> = fin.stderr.iter().filter(|l| l.contains("HANG")).collect();
    assert_eq!(told.len(), 2, "{:?}", fin.stderr);
}

#[test]
fn sighup_reopens_the_lines_and_sigusr1_writes_the_flight_recorder() {
    require_root!();
    let out = TempDir::new("watch-signals");
    let mut server = Server::start(&["3", "@300", "1500"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    server.next_stall();
    wait_lines(out.path(), server.pid, 1, Duration::from_secs(1));
    // logrotate: moved away, then SIGHUP.
    std::fs::rename(out.join("stalls.jsonl"), out.join("stalls.jsonl.1")).unwrap();
    w.signal(libc::SIGHUP);
    w.wait_for_line("SIGHUP", Duration::from_secs(5));
    w.signal(libc::SIGUSR1);
    let told = w.wait_for_line("flight recorder", Duration::from_secs(5));
    assert!(told.contains(&format!("PID {pid}")), "{told}");
    let rest = server.run_to_end(Duration::from_secs(30));
    let fin = w.wait();
    assert!(fin.status.success(), "{fin:?}");
    let moved = std::fs::read_to_string(out.join("stalls.jsonl.1")).unwrap();
    assert_eq!(moved.lines().count(), 1);
    assert_eq!(lines_of(out.path(), server.pid).len(), rest.len());
    let snaps: Vec<_> = std::fs::read_dir(out.join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let text = std::fs::read_to_string(&snaps[0]).unwrap();
    assert!(text.contains("the flight recorder of PID"), "{text}");
}

#[test]
fn a_real_prometheus_counts_the_lines_of_a_process_with_a_hostile_name() {
    require_root!();
    if profiler_tests::prometheus::binary_or_skip(module_path!()).is_none() {
        return;
    }
    let out = TempDir::new("watch-metrics");
    // A process named `a"b\n{c}`: its executable's file name.
    let hostile = out.join("a\"b\n{c}");
    std::fs::copy(stall_server(), &hostile).unwrap();
    let port = profiler_tests::prometheus::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // By --exe: the watch (and its metrics) outlives the process.
    let mut w = Recording::spawn_until(
        watcher(
            &out.join("w"),
            &[
                "--exe",
                hostile.to_str().unwrap(),
                "--metrics",
                &port.to_string(),
                "--duration",
                "60s",
            ],
        ),
        "no process matches yet",
    );
    let mut server = Server::spawn(&hostile, &["4", "@300", "400"]);
    let pid = server.pid;
    server.go_when_watched(&mut w);
    let prom = profiler_tests::prometheus::Prometheus::start(&[addr]);
    let truth = server.run_to_end(Duration::from_secs(60)).len();
    assert_eq!(truth, 4);
    // The series stay a while after the process exits.
    let q = format!("sum(profiler_stalls_total{{pid=\"{pid}\"}})");
    prom.wait_for(&q, Duration::from_secs(20), |s| {
        s.first().is_some_and(|s| s.value == truth as f64)
    });
    let lines = lines_of(&out.join("w"), pid);
    assert_eq!(lines.len(), truth, "{lines:?}");
    let series = prom.query(&format!("profiler_stalls_total{{pid=\"{pid}\"}}"));
    assert!(!series.is_empty());
    for s in &series {
        assert_eq!(
            s.labels.get("comm").map(String::as_str),
            Some("a\"b\n{c}"),
            "{s:?}"
        );
    }
    drop(prom);
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
}

/// One sample of `go tool pprof -raw`: its values and its labels.
#[derive(Debug)]
struct RawSample {
    count: u64,
    cpu_ns: u64,
    labels: std::collections::BTreeMap<String, String>,
}

/// Reads a pprof file with `go tool pprof -raw` (it must read it without
/// error) and returns its samples.
fn pprof_raw(path: &Path) -> Vec<RawSample> {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(path)
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof -raw {} failed: {}{text}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("samples/count cpu/nanoseconds"),
        "{}: {text}",
        path.display()
    );
    let mut samples: Vec<RawSample> = Vec::new();
    let mut in_samples = false;
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" => in_samples = true,
            "Locations" | "Mappings" => in_samples = false,
            l if in_samples && l.contains(":[") => {
                let last = samples.last_mut().expect("labels follow a sample");
                for part in l.split("] ") {
                    let (k, v) = part.trim().split_once(":[").expect("key:[value]");
                    last.labels
                        .insert(k.to_string(), v.trim_end_matches(']').to_string());
                }
            }
            l if in_samples => {
                let Some((values, _locations)) = l.split_once(':') else {
                    continue;
                };
                let v: Vec<u64> = values
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if let [count, cpu_ns] = v[..] {
                    samples.push(RawSample {
                        count,
                        cpu_ns,
                        labels: Default::default(),
                    });
                }
            }
            _ => {}
        }
    }
    samples
}

#[test]
fn profile_every_writes_pprof_windows_whose_stalled_samples_are_the_stalls_cpu() {
    require_root!();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "SKIP {}: go is missing; apt-get install golang-go",
            module_path!()
        );
        return;
    }
    let out = TempDir::new("watch-pprof");
    // 6 stalls of 300, 300, 400, 400, 500 and 500 ms, on-CPU and asleep
    // in turn, 700 ms apart: about 9 s, so 4 windows of 2 s or more.
    let mut server = Server::start(&["6", "@300", "700", "300"]);
    let pid = server.pid.to_string();
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid, "--profile-every", "2s"]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let truth = server.run_to_end(Duration::from_secs(60));
    // The watch ends with the process: its partial window is written too.
    let fin = w.wait();
    assert!(fin.status.success(), "{fin:?}");
    let lines = lines_of(out.path(), server.pid);
    assert_matches(&lines, &truth);
    let on_cpu: u64 = lines.iter().map(|l| l["on_cpu_ns"].as_u64().unwrap()).sum();

    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("profiles"))
        .expect("profiles/")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // (A window with only a sleeping stall and idle ticks may have no
    // sample, and no file.)
    assert!(files.len() >= 2, "a pprof per 2-s window: {files:?}");
    let (mut stalled_ns, mut other_ns, mut samples) = (0u64, 0u64, 0u64);
    for f in &files {
        // PID-TIME.pb.gz, TIME a compact UTC timestamp.
        let name = f.file_name().unwrap().to_str().unwrap();
        let time = name
            .strip_prefix(&format!("{pid}-"))
            .and_then(|n| n.strip_suffix(".pb.gz"))
            .unwrap_or_else(|| panic!("{name} is not PID-TIME.pb.gz"));
        assert!(
            time.len() == 22 && time.ends_with('Z') && time.as_bytes()[8] == b'T',
            "{name}"
        );
        for s in pprof_raw(f) {
            assert_eq!(s.labels.get("pid"), Some(&pid), "{s:?}");
            assert_eq!(
                s.labels.get("comm").map(String::as_str),
                Some("stall_server"),
                "{s:?}"
            );
            assert!(s.labels.contains_key("exe") && s.labels.contains_key("thread"));
            samples += s.count;
            match s.labels.get("stalled").map(String::as_str) {
                Some("true") => stalled_ns += s.cpu_ns,
                Some("false") => other_ns += s.cpu_ns,
                x => panic!("stalled is {x:?}: {s:?}"),
            }
        }
    }
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["profiles_written"], files.len() as u64, "{groups}");
    assert!(samples > 0);
    // The samples inside stalls are the stalls' time on a CPU: each
    // weighs the periods it stands for (the flight rate's first 25 ms).
    let ratio = stalled_ns as f64 / on_cpu as f64;
    eprintln!(
        "stalled samples: {stalled_ns} ns of CPU, the stalls' on_cpu_ns: {on_cpu} ns (ratio {ratio:.3}); other samples {other_ns} ns, {samples} samples in {} files",
        files.len()
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "stalled samples' CPU {stalled_ns} ns vs the stalls' on_cpu_ns {on_cpu} ns: ratio {ratio:.3}"
    );
}

#[test]
fn sigterm_writes_the_partial_window_of_profile_every() {
    require_root!();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "SKIP {}: go is missing; apt-get install golang-go",
            module_path!()
        );
        return;
    }
    let out = TempDir::new("watch-pprof-term");
    let mut server = Server::start(&["10", "@300", "700", "300"]);
    let pid = server.pid.to_string();
    // A window of an hour: none is over before the SIGTERM.
    let mut w = Recording::spawn_until(
        watcher(out.path(), &["--pid", &pid, "--profile-every", "1h"]),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let truth = [server.next_stall(), server.next_stall()];
    let lines = wait_lines(out.path(), server.pid, 2, Duration::from_secs(3));
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    assert_matches(&lines, &truth);
    let lines = lines_of(out.path(), server.pid);
    let on_cpu: u64 = lines.iter().map(|l| l["on_cpu_ns"].as_u64().unwrap()).sum();
    let files: Vec<PathBuf> = std::fs::read_dir(out.join("profiles"))
        .expect("profiles/ after a SIGTERM")
        .map(|e| e.unwrap().path())
        .collect();
    // One, or two if an hour of the wall clock began meanwhile.
    assert!((1..=2).contains(&files.len()), "{files:?}");
    let stalled_ns: u64 = files
        .iter()
        .flat_map(|f| pprof_raw(f))
        .filter(|s| s.labels.get("stalled").map(String::as_str) == Some("true"))
        .map(|s| s.cpu_ns)
        .sum();
    let ratio = stalled_ns as f64 / on_cpu as f64;
    eprintln!("after SIGTERM: stalled samples {stalled_ns} ns, the stalls' on_cpu_ns {on_cpu} ns (ratio {ratio:.3})");
    assert!(
        (0.9..=1.1).contains(&ratio),
        "stalled samples' CPU {stalled_ns} ns vs the stalls' on_cpu_ns {on_cpu} ns: ratio {ratio:.3}"
    );
}

/// Issue 43: a process found through `--cgroup` has its pprof samples
/// labelled with that cgroup, and under `--max-disk` the oldest profiles
/// make room, each deletion counted in `groups.json`.
#[test]
fn a_cgroups_profiles_carry_the_cgroup_and_the_oldest_make_room_under_the_cap() {
    require_root!();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "SKIP {}: go is missing; apt-get install golang-go",
            module_path!()
        );
        return;
    }
    let name = format!("profiler-watch-{}", std::process::id() % 100_000);
    let cg = Cgroup::new(&name);
    let out = TempDir::new("watch-cgroup");
    // 40 stalls of 100-170 ms, 250 ms apart: about 15 s, 15 windows.
    let mut server = Server::start(&["40", "@300", "250", "100"]);
    cg.add(server.pid);
    let pid = server.pid.to_string();
    let cgroup = format!("/{name}");
    // (About 170 KB go to the lines, groups.json and the groups'
    // reports; 64 KB are kept in reserve.)
    let cap = 288 * 1024;
    let mut w = Recording::spawn_until(
        watcher(
            out.path(),
            &[
                "--cgroup",
                &cgroup,
                "--profile-every",
                "1s",
                "--max-disk",
                "288K",
            ],
        ),
        &format!("watching PID {pid}"),
    );
    server.go_when_watched(&mut w);
    let truth = server.run_to_end(Duration::from_secs(90));
    // The process has exited; the cgroup stays watched until the stop.
    std::thread::sleep(Duration::from_millis(1500));
    let fin = w.stop(libc::SIGTERM);
    assert!(fin.status.success(), "{fin:?}");
    let groups = read_json(out.path(), "groups.json");
    assert_eq!(groups["stalls"], truth.len() as u64, "{groups}");
    let files: Vec<PathBuf> = std::fs::read_dir(out.join("profiles"))
        .expect("profiles/")
        .map(|e| e.unwrap().path())
        .collect();
    let written = groups["profiles_written"].as_u64().unwrap();
    let deleted = groups["profiles_deleted"].as_u64().unwrap();
    eprintln!(
        "{written} profiles written, {deleted} deleted, {} on disk; {} bytes in all",
        files.len(),
        du(out.path())
    );
    assert!(written >= 8, "a profile a second: {groups}");
    assert!(deleted > 0, "the oldest profiles made room: {groups}");
    assert_eq!(written - deleted, files.len() as u64, "{files:?}");
    let size = du(out.path());
    assert!(size <= cap, "{size} bytes on disk, over --max-disk 288K");
    assert!(!files.is_empty(), "the newest profiles stay");
    let mut samples = 0;
    for f in &files {
        for s in pprof_raw(f) {
            assert_eq!(s.labels.get("pid"), Some(&pid), "{s:?}");
            assert_eq!(s.labels.get("cgroup"), Some(&cgroup), "{s:?}");
            samples += s.count;
        }
    }
    assert!(samples > 0);
}
