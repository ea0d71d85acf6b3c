//! Command-line interface: clap derive structs and value parsers.
use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

/// Finds out why a program's main thread stalls: eBPF uprobes on function
/// entry and exit, exact per-thread call stacks, reports and flame graphs.
// `about` comes from the doc comment above, not from Cargo.toml's
// description: xtask compiles this file too (man pages), with its own.
#[derive(Debug, Parser)]
#[command(name = "profiler", version = VERSION)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What `--version` prints after the name: the package version and, when
/// the build saw a git checkout, its commit, e.g. `0.1.0 (1a2b3c4)`
/// (`build.rs` sets `PROFILER_VERSION`). Without it (a build from a source
/// archive, or this file compiled into xtask), the package version alone.
pub const VERSION: &str = match option_env!("PROFILER_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// Subcommands.
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per run; boxing buys nothing"
)]
pub enum Command {
    /// Trace function entries and exits of a running process.
    Record(RecordArgs),
    /// Watch processes until stopped, always on: one line in stalls.jsonl
    /// per main-thread stall as it happens, following the targets across
    /// restarts, with a flight recorder of samples; no uprobes.
    Watch(WatchArgs),
    /// List the functions a selection would probe, without attaching.
    List(ListArgs),
    /// Sample stacks of one process (`--pid`) or of the whole system
    /// (`--all`) with the cpu-clock event; probes nothing.
    Sample(SampleArgs),
    /// Differential flame graph of two recordings (red: grew, blue: shrank).
    Diff(DiffArgs),
    /// Render a recording's outputs again from its profile.data, offline
    /// and without root, optionally with other dispatch thresholds.
    Report(ReportArgs),
    /// Compile the unwind tables the samplers would use for ELF files, and
    /// print their size, build time and coverage (no root needed).
    Tables(TablesArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) to stdout, e.g. `profiler completions bash >
    /// /etc/bash_completion.d/profiler`.
    Completions(CompletionsArgs),
    /// Say what this kernel supports of what the profiler uses, whether
    /// each of its eBPF programs loads, and what works (root); exit
    /// status 1 when recording or sampling cannot work here.
    Check(CheckArgs),
}

/// `profiler check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also list every program, and print the verifier's log of each one
    /// the kernel refuses.
    #[arg(long, short)]
    pub verbose: bool,
}

/// `profiler completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write the script for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `profiler tables`.
#[derive(Debug, Args)]
pub struct TablesArgs {
    /// ELF files (executables or shared libraries).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Build each table this many times and report the fastest.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100), value_name = "N")]
    pub repeat: u32,
    /// Print JSON instead of one line per file.
    #[arg(long)]
    pub json: bool,
}

/// `profiler report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A recording directory (holding profile.data) or a profile.data file.
    pub recording: PathBuf,
    /// Where to write (default: the recording's directory).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Slow-dispatch threshold (default: the recording's).
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub threshold: Option<Duration>,
    /// Hang threshold (default: the recording's; checked at the recorded
    /// 10 ms ticks).
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub hang: Option<Duration>,
    /// Frame interval (default: the recording's).
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub frame_interval: Option<Duration>,
    /// Keep whole dispatch trees.
    #[arg(long)]
    pub full_tree: bool,
    /// Calls written to trace.json (default: the recording's).
    #[arg(long, value_name = "N")]
    pub trace_events: Option<u64>,
}

/// `profiler sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// PID of the process to sample (all its threads).
    #[arg(long, short = 'p', value_parser = parse_pid, conflicts_with = "all", required_unless_present = "all")]
    pub pid: Option<u32>,
    /// Sample every process on every CPU.
    #[arg(long, short = 'a')]
    pub all: bool,
    /// With --all, sample only the processes in this cgroup v2 and its
    /// descendants: a directory under /sys/fs/cgroup, or its path relative
    /// to it (as /proc/PID/cgroup shows it).
    #[arg(long, value_name = "PATH", requires = "all")]
    pub cgroup: Option<PathBuf>,
    /// How user stacks are walked: `tables` (default: each binary's
    /// `.eh_frame` compiled into tables the kernel walks; frame pointers in
    /// JIT code), `fp` (frame pointers only), or `copy` (16 KiB of stack
    /// copied per sample and unwound in the agent; with --pid only).
    #[arg(long, value_enum, default_value_t = UnwindMode::Tables, value_name = "HOW")]
    pub unwind: UnwindMode,
    /// Kernel memory for the unwind tables (e.g. 64M, 1G, 512MiB). Default:
    /// what the traced processes' binaries need and a quarter, plus 16M
    /// (64M with --all) for what they load later, within 1/64 of the
    /// available memory clamped to 32M..256M (64M..256M). Binaries whose tables
    /// do not fit are walked with frame pointers; the report names those
    /// that samples landed in.
    #[arg(long, value_parser = parse_unwind_memory, value_name = "SIZE")]
    pub unwind_memory: Option<u64>,
    /// Same as `--unwind copy` (kept for older scripts).
    #[arg(long, hide = true, conflicts_with = "all")]
    pub dwarf: bool,
    /// Also record where threads block, weighted by the time off the CPU
    /// (offcpu.folded, offcpu.svg).
    #[arg(long)]
    pub off_cpu: bool,
    /// Samples per second per CPU (default 997 with --pid, 99 with --all).
    #[arg(long, value_name = "HZ", value_parser = parse_hz)]
    pub hz: Option<u64>,
    /// Stop after this long (e.g. 10s). Otherwise stop on Ctrl-C, SIGTERM or
    /// when the target exits.
    #[arg(long, short = 'd', value_parser = parse_duration, value_name = "DUR")]
    pub duration: Option<Duration>,
    /// Directory for the outputs (created if missing).
    #[arg(long, short = 'o', default_value = "prof", value_name = "DIR")]
    pub out: PathBuf,
}

/// `profiler diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The earlier recording: a directory (its cpu.folded, else trace.folded) or a folded file.
    pub before: PathBuf,
    /// The later recording, likewise.
    pub after: PathBuf,
    /// Where to write the differential flame graph.
    #[arg(long, short = 'o', default_value = "diff.svg", value_name = "FILE")]
    pub output: PathBuf,
    /// Compare shares of the total instead of absolute counts (for runs of different lengths).
    #[arg(long)]
    pub normalize: bool,
}

/// Which process to trace.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// PID of the running process to attach to.
    #[arg(long, short = 'p', value_parser = parse_pid)]
    pub pid: u32,
}

/// Which functions to probe.
#[derive(Debug, Args, Clone, Default)]
pub struct SelectArgs {
    /// Probe functions whose demangled or raw name matches this glob
    /// (repeatable). Without it, the main executable's functions are chosen.
    #[arg(long = "func", short = 'f', value_name = "GLOB")]
    pub funcs: Vec<String>,
    /// Leave out functions matching this glob (repeatable).
    #[arg(long = "exclude", short = 'x', value_name = "GLOB")]
    pub excludes: Vec<String>,
    /// Also search this shared library (repeatable): a path, or a name found
    /// as the target's dynamic loader would (RPATH, LD_LIBRARY_PATH,
    /// RUNPATH, /etc/ld.so.cache, default directories; a prefix such as
    /// `libc` matches a mapped file or a cache entry). It need not be mapped
    /// yet: its probes fire once it is (launch mode, dlopen).
    #[arg(long = "lib", short = 'l', value_name = "NAME_OR_PATH")]
    pub libs: Vec<String>,
    /// Dispatch function (repeatable): one outermost call of it on the
    /// watched thread is one event-loop dispatch. Without it, presets for
    /// GLib, Qt and libuv apply when the target has their symbols; failing
    /// that, every outermost traced call on the watched thread counts.
    #[arg(long = "dispatch", value_name = "GLOB")]
    pub dispatch: Vec<String>,
    /// Probe at most this many functions [default: 2000; 250 on kernels
    /// before 6.10, where each probe is a perf event of its own, attached
    /// and detached one at a time]. Each probed call costs about 4 µs on a
    /// plain uprobe (0.3 µs where the function starts with a 5-byte nop).
    #[arg(long, value_name = "N", value_parser = parse_max_funcs)]
    pub max_funcs: Option<usize>,
    /// How returns are seen: `ret` (and `auto`, the default) puts a uprobe
    /// on each return instruction of a function, leaving the target's stack
    /// alone (C++ exceptions, Rust panics, Go stack copies and stack
    /// sampling stay right); `uretprobe` uses the kernel's return probes,
    /// cheaper per call, which rewrite the return address on the stack.
    #[arg(long, value_enum, default_value_t = ExitProbes::Auto, value_name = "HOW")]
    pub exit_probes: ExitProbes,
}

/// `--unwind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// Compiled `.eh_frame` tables walked in the kernel, frame pointers
    /// where a binary has none.
    #[default]
    Tables,
    /// Frame pointers only (the kernel's own walk).
    Fp,
    /// A copy of the top 16 KiB of the stack per sample, unwound in the
    /// agent (`--pid` only).
    Copy,
}

/// `--rings`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RingMode {
    /// One ring per CPU: writers on different CPUs never contend; the agent
    /// merges the rings by timestamp.
    #[default]
    PerCpu,
    /// One ring shared by every CPU.
    Shared,
}

/// `--exit-probes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ExitProbes {
    /// A uprobe on every return instruction.
    Ret,
    /// Return uprobes (they rewrite the return address on the stack).
    Uretprobe,
    /// `ret` (the report names the target's C++/Rust unwinding or Go).
    #[default]
    Auto,
}

/// `profiler record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// PID of a running process to attach to; repeat it to trace several
    /// (each gets its own section in the outputs). Or give a command after
    /// `--` to launch it with the probes live before its first instruction.
    #[arg(long, short = 'p', value_parser = parse_pid, required_unless_present_any = ["command", "pid_of"], value_name = "PID")]
    pub pid: Vec<u32>,
    /// Trace every current process whose name (comm) or executable's file
    /// name is NAME (repeatable), each in its own section.
    #[arg(long, value_name = "NAME")]
    pub pid_of: Vec<String>,
    /// Also trace the processes the targets make (fork, vfork, clone,
    /// posix_spawn), from their first instruction, and the programs they
    /// exec that the selection matches; each process gets its own section.
    #[arg(long)]
    pub follow: bool,
    /// Command to launch under the profiler (after `--`). It runs as the
    /// invoking user under sudo; the profiler exits with its exit status.
    /// A script (a pyenv shim) or `env …` is followed through its execs to
    /// the program it runs. When the session ends first (`--duration`,
    /// Ctrl-C, SIGTERM), the command is stopped: SIGTERM, then SIGKILL 3 s
    /// later.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
    /// Launch mode: when the session ends before the command, leave the
    /// command running (every probe removed first) instead of stopping it.
    #[arg(long, requires = "command")]
    pub keep_running: bool,
    /// Which functions to probe.
    #[command(flatten)]
    pub select: SelectArgs,
    /// Directory for the outputs (created if missing).
    #[arg(long, short = 'o', default_value = "prof", value_name = "DIR")]
    pub out: PathBuf,
    /// Stop after this long (e.g. 500ms, 10s, 2m). Otherwise stop on Ctrl-C,
    /// SIGTERM or when the target exits.
    #[arg(long, short = 'd', value_parser = parse_duration, value_name = "DUR")]
    pub duration: Option<Duration>,
    /// Size of each kernel-to-agent ring buffer in bytes (K/M suffixes): one
    /// ring per CPU (with `--rings per-cpu`, the default), so the kernel
    /// memory is this times the number of CPUs. A power of two, at least
    /// 4K. Each event takes 32 bytes.
    #[arg(long, default_value = "16M", value_parser = parse_ring_size, value_name = "BYTES")]
    pub ring_size: u32,
    /// One ring per CPU (`per-cpu`), or one ring all CPUs share (`shared`,
    /// for comparison: many writers contend for its lock).
    #[arg(long, value_enum, default_value_t = RingMode::PerCpu, value_name = "HOW")]
    pub rings: RingMode,
    /// Keep each thread's estimated time in probes under PCT percent by
    /// detaching the hottest functions while recording (default 10 with
    /// --pid, off when launching a command; 0 turns it off).
    #[arg(long, value_parser = parse_overhead, value_name = "PCT", allow_negative_numbers = true)]
    pub max_overhead: Option<f64>,
    /// Report durations as measured, with the probes' own cost in them. By
    /// default every duration (calls, self time, dispatches) has the
    /// calibrated cost of the probe hits inside it taken out; the JSON
    /// keeps the measured figures beside the corrected ones.
    #[arg(long)]
    pub raw_durations: bool,
    /// Largest profile.data (K/M/G suffixes; 0: none). It holds every
    /// event, for `profiler report` to replay; past the limit the recording
    /// still completes, and a replay covers the part before it, marked
    /// partial.
    #[arg(long, default_value = "1G", value_parser = parse_size, value_name = "BYTES")]
    pub data_limit: u64,
    /// Write at most this many calls to trace.json (0: no trace.json); calls
    /// past it are counted in the report.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub trace_events: u64,
    /// Also record where the target's threads block, weighted by the time
    /// off the CPU: offcpu.folded and offcpu.svg.
    #[arg(long)]
    pub off_cpu: bool,
    /// Also sample all the target's threads' stacks with cpu-clock at HZ
    /// (default 997): writes cpu.folded and cpu.svg.
    #[arg(long, value_name = "HZ", num_args = 0..=1, default_missing_value = "997", value_parser = parse_hz)]
    pub sample: Option<u64>,
    /// How user stacks are walked by every sampler (`--sample`, the
    /// in-dispatch sampler, blocked and off-CPU stacks): `tables` (default)
    /// or `fp`. See `profiler sample --help`.
    #[arg(long, value_enum, default_value_t = UnwindMode::Tables, value_name = "HOW")]
    pub unwind: UnwindMode,
    /// Kernel memory for the unwind tables (e.g. 64M, 1G, 512MiB); see
    /// `profiler sample --help`.
    #[arg(long, value_parser = parse_unwind_memory, value_name = "SIZE")]
    pub unwind_memory: Option<u64>,
    /// Slow dispatches of the watched thread.
    #[command(flatten)]
    pub dispatch: DispatchArgs,
    /// Stages and startup timing.
    #[command(flatten)]
    pub stages: StageArgs,
}

/// Stages (Pury-style scenarios) and startup timing.
#[derive(Debug, Args)]
pub struct StageArgs {
    /// A stage: `NAME=FUNC` (the function's entry to its exit) or
    /// `NAME=A..B` (entry of A to exit of B); repeatable. Nesting is derived
    /// from what contains what.
    #[arg(long = "stage", value_name = "NAME=FUNC|NAME=A..B")]
    pub stages: Vec<String>,
    /// A scenario: the stage whose occurrences are the runs (repeatable;
    /// default: the first --stage).
    #[arg(long = "scenario", value_name = "NAME")]
    pub scenarios: Vec<String>,
    /// Runs per scenario; the session ends once every scenario has them.
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// Keep recording after the runs are complete.
    #[arg(long)]
    pub keep_going: bool,
    /// Launch mode: the entry of this function marks the app ready
    /// (default: the first dispatch on the watched thread).
    #[arg(long, value_name = "FUNC")]
    pub ready: Option<String>,
    /// Launch mode: flag a startup (exec to ready) at least this long.
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub startup_threshold: Option<Duration>,
}

/// Slow main-thread dispatches.
#[derive(Debug, Args)]
pub struct DispatchArgs {
    /// Thread whose dispatches are watched: `main` (tid == pid), a TID or a
    /// thread name (a JVM's Java threads by their whole names, read from
    /// the JVM; another name longer than the 15 characters Linux keeps
    /// matches the thread named its first 15, said on stderr). Default: the main
    /// thread; in a JVM (whose launcher's main thread only waits for the
    /// VM), the event-dispatch thread (`AWT-EventQueue-0`, or JavaFX's
    /// application thread) while the Java main thread is parked, else the
    /// Java main thread, said on stderr.
    #[arg(long, value_name = "main|TID|NAME")]
    pub thread: Option<String>,
    /// A dispatch at least this long is slow and explained.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DUR")]
    pub threshold: Duration,
    /// A dispatch running longer than this is reported at once, as a hang.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DUR")]
    pub hang: Duration,
    /// Frame interval for dropped-frame statistics (60 Hz by default).
    #[arg(long, default_value = "16.67ms", value_parser = parse_duration, value_name = "DUR")]
    pub frame_interval: Duration,
    /// Keep whole dispatch trees instead of trimming them to about 20 nodes.
    #[arg(long)]
    pub full_tree: bool,
    /// cpu-clock samples per second of the watched thread during dispatches
    /// (0 turns sampling off).
    #[arg(long, default_value_t = 997, value_name = "HZ")]
    pub dispatch_hz: u64,
    /// Do not record who wakes the watched thread in a dispatch: no waker
    /// stacks (of any process on the machine), no sampling of the target's
    /// other threads on every CPU.
    #[arg(long)]
    pub no_wakers: bool,
}

/// `profiler watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// A running process to watch (repeatable). It is dropped when it
    /// exits.
    #[arg(long, short = 'p', value_parser = parse_pid, value_name = "PID")]
    pub pid: Vec<u32>,
    /// Watch every process running this executable, now and later
    /// (repeatable): one started after the watch is picked up within a
    /// second.
    #[arg(long, value_name = "PATH")]
    pub exe: Vec<PathBuf>,
    /// Watch every process in this cgroup (a path under /sys/fs/cgroup, or
    /// relative to it), now and later.
    #[arg(long, value_name = "PATH", conflicts_with = "unit")]
    pub cgroup: Option<PathBuf>,
    /// Watch every process of this systemd unit (`NAME.service`), now and
    /// later: its cgroup under /sys/fs/cgroup/system.slice.
    #[arg(long, value_name = "NAME")]
    pub unit: Option<String>,
    /// Directory for stalls.jsonl, groups.json and the groups' reports
    /// (created if missing; a watcher started on it again appends).
    #[arg(long, short = 'o', default_value = "watch", value_name = "DIR")]
    pub out: PathBuf,
    /// How far back the flight recorder keeps the watched thread's samples:
    /// a group's report shows what the thread did this long before its
    /// stall; SIGUSR1 writes this much as a snapshot.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DUR")]
    pub keep: Duration,
    /// Most disk the output directory may take (K/M/G suffixes). The
    /// oldest full reports are deleted first, then the oldest rotated
    /// stalls.N.jsonl; groups.json still counts every stall.
    #[arg(long, default_value = "100M", value_parser = parse_size, value_name = "BYTES")]
    pub max_disk: u64,
    /// Per group, at most this many stalls an hour are told on stderr and
    /// get a full report; past it their lines in stalls.jsonl are written
    /// without a call tree and marked "rate_limited" (every stall is still
    /// a line, and counted).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub max_reports_per_hour: u32,
    /// Per group, the worst this many stalls keep a full report (besides
    /// the group's first).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub worst: usize,
    /// The flight recorder's rate: an iteration of the loop is sampled at
    /// about this many Hz until it has run `--full-rate-after`, then at
    /// `--dispatch-hz` (an idle thread, in its loop's wait, is not
    /// sampled at all).
    #[arg(long, default_value_t = 99, value_parser = parse_hz, value_name = "HZ")]
    pub flight_hz: u64,
    /// How long an iteration runs before it is sampled at the full
    /// `--dispatch-hz` (default: a quarter of `--threshold`).
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub full_rate_after: Option<Duration>,
    /// Every DUR (e.g. 1m; at least 1s), one pprof per watched process,
    /// profiles/PID-TIME.pb.gz: the watched thread's samples of that
    /// window, labelled pid, comm, exe, cgroup or unit, thread, and stalled
    /// (true inside a stall of stalls.jsonl). Off by default; the files
    /// stay in DIR (within --max-disk, the oldest deleted first), nothing
    /// is sent anywhere.
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub profile_every: Option<Duration>,
    /// Serve Prometheus metrics (text format) at http://ADDR/metrics: a bare
    /// port listens on 127.0.0.1 only, HOST:PORT there. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Stop after this long (otherwise on Ctrl-C or SIGTERM).
    #[arg(long, short = 'd', value_parser = parse_duration, value_name = "DUR")]
    pub duration: Option<Duration>,
    /// Size of each kernel-to-agent ring buffer, per watched process and
    /// CPU (K/M suffixes; a power of two, at least 4K).
    #[arg(long, default_value = "1M", value_parser = parse_ring_size, value_name = "BYTES")]
    pub ring_size: u32,
    /// How user stacks are walked: `tables` (default) or `fp`.
    #[arg(long, value_enum, default_value_t = UnwindMode::Tables, value_name = "HOW")]
    pub unwind: UnwindMode,
    /// Kernel memory for the unwind tables (e.g. 64M), per watched process.
    #[arg(long, value_parser = parse_unwind_memory, value_name = "SIZE")]
    pub unwind_memory: Option<u64>,
    /// Escalation: when a group of stalls is first seen in a process, the
    /// native functions on its stall's samples (in the main executable,
    /// with their tail callers) get uprobes, so the group's next N stalls
    /// carry an exact call tree ("tree": "traced"); then the probes come
    /// off. 0 turns escalation off (no uprobes ever).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub trace_stalls: u32,
    /// While a group is traced, keep the watched thread's estimated time
    /// in probes under PCT percent of its CPU time: the hottest functions
    /// are detached as `record`'s governor does (0 turns the governor
    /// off).
    #[arg(long, default_value = "10", value_parser = parse_overhead, value_name = "PCT", allow_negative_numbers = true)]
    pub max_overhead: f64,
    /// Slow dispatches of the watched thread: `--thread`, `--threshold`,
    /// `--hang`, `--dispatch-hz`, `--no-wakers` as in `record`.
    #[command(flatten)]
    pub dispatch: DispatchArgs,
}

/// `profiler list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The process whose functions are listed.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Which functions, as `record` would choose them.
    #[command(flatten)]
    pub select: SelectArgs,
}

fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("{s:?} is not a PID: give a positive integer")),
        Ok(1) => Err(
            "PID 1 is init: a fault in it takes the whole system down, so it is not traced; \
             give the PID of an application"
                .into(),
        ),
        Ok(pid) if pid == std::process::id() => Err(format!(
            "PID {pid} is this profiler itself: give the PID of the process to trace"
        )),
        Ok(pid) => Ok(pid),
    }
}

/// A sampling rate: 1 to 100000 Hz (0 would sample nothing).
fn parse_hz(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(hz @ 1..=100_000) => Ok(hz),
        _ => Err(format!("--hz {s} is out of range: use 1 to 100000")),
    }
}

/// The longest duration accepted (a session, a threshold): 100 days.
const MAX_DURATION: Duration = Duration::from_secs(100 * 24 * 3600);

/// Parses `500ms`, `10s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: use e.g. 500ms, 10s, 2m"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "bad duration unit {unit:?} in {s:?}: use ns, us, ms, s, m or h"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("bad duration {s:?}: must be positive"));
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero() && *d <= MAX_DURATION)
        .ok_or_else(|| format!("bad duration {s:?}: use 1ns to 100 days"))
}

/// Parses a byte size with an optional K/M/G suffix (binary multiples;
/// `KiB`, `KB` and the like are read the same).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| {
            t.strip_suffix('B')
                .filter(|r| r.ends_with(['K', 'k', 'M', 'm', 'G', 'g']))
        })
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s:?}: use bytes with an optional K, M or G suffix"))
}

/// `--max-funcs` when not given, with uprobe_multi links.
pub const DEFAULT_MAX_FUNCS: usize = 2000;
/// `--max-funcs` when not given, where each probe is its own perf event.
pub const PER_PROBE_MAX_FUNCS: usize = 250;

impl SelectArgs {
    /// `--max-funcs`, or its default ([`DEFAULT_MAX_FUNCS`]; `record` sets
    /// [`PER_PROBE_MAX_FUNCS`] on kernels without uprobe_multi links).
    pub fn max_funcs(&self) -> usize {
        self.max_funcs.unwrap_or(DEFAULT_MAX_FUNCS)
    }
}

fn parse_max_funcs(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("--max-funcs 0 would probe nothing: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a count: give a positive integer")),
    }
}

fn parse_overhead(s: &str) -> Result<f64, String> {
    match s.strip_suffix('%').unwrap_or(s).parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "{s:?} is not a percentage: give a number from 0 to 100 (0 turns the governor off)"
        )),
    }
}

/// Smallest `--unwind-memory` accepted.
pub const UNWIND_MEMORY_MIN: u64 = 64 << 10;

/// Largest `--unwind-memory` accepted (2^29 rows of 8 bytes; one table's
/// binary search covers 2^24 rows, so any one binary stays far below).
pub const UNWIND_MEMORY_MAX: u64 = 4 << 30;

/// `--unwind-memory`: a size within the bounds the tables accept.
fn parse_unwind_memory(s: &str) -> Result<u64, String> {
    // Spelled out, not through `crate::text`: xtask compiles this file on
    // its own for the man pages (std and clap only).
    let n = parse_size(s)?;
    if !(UNWIND_MEMORY_MIN..=UNWIND_MEMORY_MAX).contains(&n) {
        return Err(format!(
            "--unwind-memory {s} is out of range: use {}K to {}G",
            UNWIND_MEMORY_MIN >> 10,
            UNWIND_MEMORY_MAX >> 30
        ));
    }
    Ok(n)
}

fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if n < 4096 || !n.is_power_of_two() || n > (1 << 30) {
        return Err(format!(
            "ring size {s} must be a power of two between 4K and 1G"
        ));
    }
    Ok(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
        assert!(
            parse_duration("1e30h").is_err(),
            "huge: refused, not a panic"
        );
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("0.1ns").is_err(), "rounds to zero");
        assert_eq!(parse_duration("100d").ok(), None, "unknown unit");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1GB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_unwind_memory("1G").unwrap(), 1 << 30);
        assert!(parse_unwind_memory("1K").is_err());
        assert!(parse_unwind_memory("64T").is_err());
        assert_eq!(parse_ring_size("4096").unwrap(), 4096);
        assert_eq!(parse_overhead("10").unwrap(), 10.0);
        assert_eq!(parse_overhead("2.5%").unwrap(), 2.5);
        assert_eq!(parse_overhead("0").unwrap(), 0.0);
        for bad in ["-1", "200", "abc", "NaN", ""] {
            assert!(parse_overhead(bad).is_err(), "{bad}");
        }
        assert!(parse_ring_size("5000").is_err());
        assert!(parse_ring_size("1K").is_err());
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("1").unwrap_err().contains("init"));
        assert!(parse_pid(&std::process::id().to_string())
            .unwrap_err()
            .contains("profiler itself"));
        assert_eq!(parse_pid("4321"), Ok(4321));
        assert!(parse_hz("0").is_err());
        assert!(parse_hz("100001").is_err());
        assert_eq!(parse_hz("99"), Ok(99));
        assert!(parse_pid("abc").is_err());
    }
}
