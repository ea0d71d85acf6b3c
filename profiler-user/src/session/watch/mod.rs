//! A `profiler watch` session, always on, the way BlockCanary and Matrix
//! run inside an app: the targets found and followed (`--pid`, `--exe`,
//! `--cgroup`, `--unit`; a new process that matches is picked up within a
//! second, one that exits is dropped), each watched on a thread of its own
//! ([`worker`]: the loop's waits, the scheduler, the in-dispatch sampler
//! and its flight recorder, no uprobes), and every stall written as it
//! happens ([`journal`]: `stalls.jsonl`, `groups.json`, the groups'
//! reports, within `--max-disk`).
//!
//! Signals: SIGINT and SIGTERM end it with everything flushed (exit 0);
//! SIGHUP reopens `stalls.jsonl` (log rotation); SIGUSR1 writes a snapshot
//! of each process's flight recorder (`snapshots/`). With
//! `--profile-every`, each worker also hands over a pprof per window
//! ([`profiles`]), and its partial window when its watch ends.
mod escalate;
mod files;
mod journal;
mod profiles;
#[cfg(test)]
mod tests;
mod worker;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use self::journal::{GROUPS, STALLS};
use crate::{
    cli::WatchArgs,
    output::metrics::{Metrics, Origin},
    output::watch::{Escalation, StallLine, StallReport},
    tracee::watched::Matcher,
    Error, Result,
};

/// How often `/proc` is scanned for new processes that match.
const SCAN_EVERY: Duration = Duration::from_millis(200);
/// A process whose watch failed is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// How long the end waits for the workers to flush.
const END_WAIT: Duration = Duration::from_secs(10);

/// What a worker tells the journal.
pub enum Msg {
    /// Watching a process from now on.
    Watching {
        pid: u32,
        comm: Vec<u8>,
        exe: Vec<u8>,
    },
    /// A process's loop: its busy share of the last seconds, and the
    /// events its kernel side lost so far.
    Loop {
        pid: u32,
        busy: Option<f64>,
        lost: u64,
    },
    /// A stall ended.
    Stall(Box<StallMsg>),
    /// A hang, still running.
    Hang { line: Box<StallLine> },
    /// An iteration that was not the program's stall.
    Excluded { reason: String },
    /// SIGUSR1's snapshot of a flight recorder.
    Snapshot {
        pid: u32,
        comm: String,
        samples: usize,
        keep_ns: u64,
        folded: Vec<String>,
    },
    /// A window's pprof (`--profile-every`), begun at `unix_ns`.
    Profile { pid: u32, unix_ns: u64, gz: Vec<u8> },
    /// A group's escalation changed (`--trace-stalls`).
    Escalation { key: String, escalation: Escalation },
    /// The watch of a process ended, and why.
    Stopped { pid: u32, reason: String },
}

/// A stall, with what its report needs.
pub struct StallMsg {
    pub report: StallReport,
}

static STOP: AtomicBool = AtomicBool::new(false);
static HUP: AtomicBool = AtomicBool::new(false);
static USR1: AtomicBool = AtomicBool::new(false);

/// Flags set by SIGINT/SIGTERM, SIGHUP and SIGUSR1 (the workers' tokio
/// loops see SIGINT and SIGTERM too, and end).
fn install_signals() -> Result<()> {
    for (sig, flag) in [
        (libc::SIGINT, &STOP),
        (libc::SIGTERM, &STOP),
        (libc::SIGHUP, &HUP),
        (libc::SIGUSR1, &USR1),
    ] {
        // SAFETY: the action only stores to an atomic, which is
        // async-signal-safe.
        unsafe { signal_hook_registry::register(sig, move || flag.store(true, Ordering::SeqCst)) }
            .map_err(|e| Error::io("installing a signal handler", e))?;
    }
    Ok(())
}

/// A process being watched.
struct Watched {
    thread: JoinHandle<()>,
    snapshot: Arc<AtomicBool>,
}

/// Runs `profiler watch` until SIGINT/SIGTERM, `--duration`, or every
/// `--pid` given has exited (when only PIDs were given).
pub fn run(args: &WatchArgs) -> Result<()> {
    let mut matcher = Matcher::new(
        &args.pid,
        &args.exe,
        args.cgroup.as_deref(),
        args.unit.as_deref(),
    )?;
    let mut journal = journal::Journal::open(
        &args.out,
        journal::Limits {
            max_disk: args.max_disk,
            per_hour: args.max_reports_per_hour,
            worst: args.worst,
        },
    )?;
    let metrics = args.metrics.as_ref().map(|spec| {
        let m = Arc::new(std::sync::Mutex::new(Metrics::new(
            crate::output::metrics::DEFAULT_GROUP_CAP,
        )));
        (spec.clone(), m)
    });
    let _server = match &metrics {
        Some((spec, m)) => {
            let server = crate::output::metrics::serve(spec, m.clone())?;
            eprintln!(
                "profiler: Prometheus metrics at http://{}/metrics",
                server.local_addr()
            );
            Some(server)
        }
        None => None,
    };
    let mut state = State {
        metrics: metrics.map(|(_, m)| m),
        unit: args.unit.clone(),
        cgroup: matcher.cgroup().map(str::to_string),
        lost: HashMap::new(),
    };
    install_signals()?;
    let mut wargs = worker::WorkerArgs::of(args);
    wargs.origin = match (&args.unit, matcher.cgroup()) {
        (Some(u), _) => Some(("unit".into(), u.clone())),
        (None, Some(c)) => Some(("cgroup".into(), c.to_string())),
        _ => None,
    };
    let (tx, rx) = mpsc::channel::<Msg>();
    let mut watched: HashMap<u32, Watched> = HashMap::new();
    let mut failed: HashMap<u32, Instant> = HashMap::new();
    let started = Instant::now();
    let mut last_scan: Option<Instant> = None;
    let mut ever = false;
    eprintln!(
        "profiler: watching {} for stalls over {} (stalls.jsonl and groups.json in {}); stop with Ctrl-C",
        describe(args, &matcher),
        crate::text::fmt_ns(args.dispatch.threshold.as_nanos() as u64),
        journal.dir().display()
    );
    if let Some(every) = args.profile_every {
        eprintln!(
            "profiler: a pprof of each watched process every {} in {} (kept within --max-disk; nothing is sent anywhere)",
            crate::text::fmt_ns(every.as_nanos() as u64),
            journal.dir().join(profiles::PROFILES).display()
        );
    }
    let mut said_waiting = false;
    loop {
        if STOP.load(Ordering::SeqCst) {
            break;
        }
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if last_scan.is_none_or(|t| t.elapsed() >= SCAN_EVERY) {
            last_scan = Some(Instant::now());
            let now = matcher.scan();
            failed.retain(|pid, at| now.contains(pid) && at.elapsed() < RETRY_AFTER);
            for pid in now {
                if watched.contains_key(&pid) || failed.contains_key(&pid) {
                    continue;
                }
                let snapshot = Arc::new(AtomicBool::new(false));
                let (tx, wargs, snap) = (tx.clone(), wargs.clone(), snapshot.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("watch-{pid}"))
                    .spawn(move || worker::run(pid, wargs, tx, snap))
                    .map_err(|e| Error::io("starting a watch thread", e))?;
                watched.insert(pid, Watched { thread, snapshot });
                ever = true;
            }
            if watched.is_empty() && !said_waiting && !matcher.pids_only() {
                said_waiting = true;
                eprintln!("profiler: no process matches yet; waiting for one to start");
            }
            if watched.is_empty() && matcher.pids_only() && ever {
                eprintln!("profiler: every process given with --pid has exited");
                break;
            }
        }
        if HUP.swap(false, Ordering::SeqCst) {
            journal.reopen()?;
            eprintln!(
                "profiler: SIGHUP: {} reopened",
                journal.dir().join(STALLS).display()
            );
        }
        if USR1.swap(false, Ordering::SeqCst) {
            for w in watched.values() {
                w.snapshot.store(true, Ordering::SeqCst);
            }
        }
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(msg) => {
                handle(&mut journal, &mut watched, &mut failed, &mut state, msg)?;
                while let Ok(msg) = rx.try_recv() {
                    handle(&mut journal, &mut watched, &mut failed, &mut state, msg)?;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("we hold a sender"),
        }
        journal.flush_groups(false)?;
    }
    // The workers end on SIGINT/SIGTERM; a stop of our own sends one.
    if !STOP.load(Ordering::SeqCst) && !watched.is_empty() {
        // SAFETY: raise has no preconditions; SIGTERM's handlers are ours.
        unsafe { libc::raise(libc::SIGTERM) };
    }
    drop(tx);
    let deadline = Instant::now() + END_WAIT;
    while !watched.is_empty() && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(msg) => handle(&mut journal, &mut watched, &mut failed, &mut state, msg)?,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for (_, w) in watched.drain() {
        let _ = w.thread.join();
    }
    journal.flush_groups(true)?;
    eprintln!(
        "profiler: watch ended; {} and {} in {}",
        journal.dir().join(STALLS).display(),
        GROUPS,
        journal.dir().display()
    );
    Ok(())
}

/// `profiler report DIR` on a watch's directory: every report's `.txt`
/// and `.svg` rendered again from its `.json`, and the groups printed.
pub fn render(dir: &std::path::Path) -> Result<()> {
    use crate::output::watch::{report_svg, report_text, GroupsFile};
    let groups: GroupsFile = std::fs::read(dir.join(GROUPS))
        .map_err(|e| Error::io(format!("reading {}", dir.join(GROUPS).display()), e))
        .and_then(|b| {
            serde_json::from_slice(&b).map_err(|e| Error::Output {
                path: dir.join(GROUPS),
                reason: format!("not a groups.json this profiler wrote ({e})"),
            })
        })?;
    let mut rendered = 0;
    let mut text = format!(
        "{} stalls in {} groups, {} hangs, from {} processes\n",
        groups.stalls,
        groups.groups.len(),
        groups.hangs,
        groups.processes_watched
    );
    for g in &groups.groups {
        text.push_str(&format!(
            "#{} [{}] count {}  total {}  max {}  p95 {}  last {}\n  verdict: {}\n",
            g.group,
            g.key,
            g.count,
            crate::text::fmt_ns(g.total_ns),
            crate::text::fmt_ns(g.max_ns),
            crate::text::fmt_ns(g.p95_ns),
            g.last_seen,
            g.verdict
        ));
        for base in &g.reports {
            let json = dir.join(format!("{base}.json"));
            let Ok(bytes) = std::fs::read(&json) else {
                continue;
            };
            let r: StallReport = serde_json::from_slice(&bytes).map_err(|e| Error::Output {
                path: json.clone(),
                reason: format!("not a report this profiler wrote ({e})"),
            })?;
            let out = |x: &str| dir.join(format!("{base}.{x}"));
            let write = |p: std::path::PathBuf, b: &[u8]| {
                std::fs::write(&p, b).map_err(|e| Error::Output {
                    path: p.clone(),
                    reason: e.to_string(),
                })
            };
            write(out("txt"), report_text(&r).as_bytes())?;
            if let Some(svg) = report_svg(&r) {
                write(out("svg"), &svg)?;
            }
            text.push_str(&format!("  report: {base}.txt\n"));
            rendered += 1;
        }
    }
    print!("{text}");
    eprintln!(
        "profiler: rendered {rendered} reports again in {}",
        dir.display()
    );
    Ok(())
}

/// The targets, in words.
fn describe(args: &WatchArgs, m: &Matcher) -> String {
    let mut what: Vec<String> = args.pid.iter().map(|p| format!("PID {p}")).collect();
    what.extend(
        args.exe
            .iter()
            .map(|e| format!("every process of {}", e.display())),
    );
    if let Some(c) = m.cgroup() {
        what.push(match &args.unit {
            Some(u) => format!("unit {u} (cgroup {c})"),
            None => format!("cgroup {c}"),
        });
    }
    what.join(", ")
}

/// What the supervisor keeps beside the journal.
struct State {
    metrics: Option<Arc<std::sync::Mutex<Metrics>>>,
    unit: Option<String>,
    cgroup: Option<String>,
    /// Events each process's kernel side lost, processes gone included.
    lost: HashMap<u32, u64>,
}

impl State {
    fn metrics(&self, f: impl FnOnce(&mut Metrics)) {
        if let Some(m) = &self.metrics {
            if let Ok(mut m) = m.lock() {
                f(&mut m);
            }
        }
    }
}

fn handle(
    journal: &mut journal::Journal,
    watched: &mut HashMap<u32, Watched>,
    failed: &mut HashMap<u32, Instant>,
    state: &mut State,
    msg: Msg,
) -> Result<()> {
    match msg {
        Msg::Watching { pid, comm, exe } => {
            journal.watching();
            let (unit, cgroup) = (state.unit.clone(), state.cgroup.clone());
            state.metrics(|m| {
                let origin = match (&unit, &cgroup) {
                    (Some(u), _) => Origin::Unit(u.as_bytes()),
                    (None, Some(c)) => Origin::Cgroup(c.as_bytes()),
                    _ => Origin::Exe(&exe),
                };
                m.add_process(pid, &comm, Some(origin));
                m.set_probe_overhead(pid, 0.0);
            });
        }
        Msg::Loop { pid, busy, lost } => {
            state.lost.insert(pid, lost);
            let total = state.lost.values().sum();
            state.metrics(|m| {
                if let Some(b) = busy {
                    m.set_busy_ratio(pid, b);
                }
                m.set_lost(total);
            });
        }
        Msg::Stall(s) => {
            let line = journal.stall(s.report)?;
            state.metrics(|m| {
                m.stall(
                    line.pid,
                    &line.group,
                    Duration::from_nanos(line.duration_ns),
                )
            });
        }
        Msg::Hang { line } => {
            let pid = line.pid;
            journal.hang(*line)?;
            state.metrics(|m| m.hang(pid));
        }
        Msg::Excluded { reason, .. } => journal.excluded(&reason),
        Msg::Escalation { key, escalation } => {
            // Probes cost only while they are on.
            let ratio = match escalation.state.as_str() {
                "traced" => escalation.peak_overhead_pct / 100.0,
                _ => 0.0,
            };
            let pid = escalation.pid;
            journal.escalation(&key, escalation);
            state.metrics(|m| m.set_probe_overhead(pid, ratio));
        }
        Msg::Snapshot {
            pid,
            comm,
            samples,
            keep_ns,
            folded,
        } => {
            let dir = journal.snapshot(pid, &comm, samples, keep_ns, &folded)?;
            eprintln!(
                "profiler: SIGUSR1: PID {pid}'s flight recorder ({samples} samples) written to {}",
                dir.display()
            );
        }
        Msg::Profile { pid, unix_ns, gz } => {
            journal.profile(pid, unix_ns, &gz)?;
        }
        Msg::Stopped { pid, reason } => {
            eprintln!("profiler: stopped watching PID {pid}: {reason}");
            state.metrics(|m| m.remove_process(pid));
            if let Some(w) = watched.remove(&pid) {
                let _ = w.thread.join();
            }
            if !reason.starts_with("it ") && reason != "the watch was stopped" {
                failed.insert(pid, Instant::now());
            }
        }
    }
    Ok(())
}
