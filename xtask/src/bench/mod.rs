//! `cargo xtask bench`: per-call cost against bpftrace (and uftrace), the
//! highest loss-free event rate, and the time to attach 1,000 functions.
//! Prints a markdown report and writes it to `target/bench.md`.

mod attach;
mod datafile;
mod dispatch;
mod escalation;
mod event_loop;
mod fixtures;
mod governor;
mod html;
mod http_load;
mod percall;
mod rate;
mod redis;
mod rings;
mod run;
mod runtimes;
mod sampling;
mod unwind;
mod watch;

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::util::{is_root, stdout_of, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// Runs per measurement (for the per-call parts: interleaved rounds);
    /// the median is reported.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Iterations of the int3 (plain) fixture; each is 3 calls.
    #[arg(long, default_value_t = 200_000)]
    plain_iters: u64,
    /// Iterations of the nop fixture; each is 3 calls.
    #[arg(long, default_value_t = 1_000_000)]
    nop_iters: u64,
    /// Seconds per step of the event-rate sweep.
    #[arg(long, default_value_t = 1.0)]
    rate_secs: f64,
    /// Rounds of the sampling fixture (bench_burn.c); 200,000 take about 1.8 s.
    #[arg(long, default_value_t = 200_000)]
    burn_rounds: u64,
    /// Requests of each test (SET, GET) per redis-benchmark run of the redis row.
    #[arg(long, default_value_t = 20_000)]
    redis_requests: u64,
    /// Part e also measures this profiler binary (one built before waker
    /// tracking, say) in the same rounds.
    #[arg(long, value_name = "PATH")]
    base_profiler: Option<std::path::PathBuf>,
    /// Rounds of the redis row with the profiler attached (each runs both servers).
    #[arg(long, default_value_t = 12)]
    redis_rounds: usize,
    /// Run only these parts (repeatable); default: all.
    #[arg(long, value_enum)]
    only: Vec<Part>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Part {
    /// a, b: per-call cost against bpftrace and uftrace.
    Percall,
    /// c: highest zero-loss event rate.
    Rate,
    /// d: time to attach 1,000 functions.
    Attach,
    /// e: cost per dispatch (sampler off / on; waker tracking on / off) and agent memory.
    Dispatch,
    /// f: sampling overhead against perf, blazesym time, top frames vs perf report.
    Sampling,
    /// g: unwind tables: build time and size, kernel map memory, steady agent CPU.
    Unwind,
    /// h: report.html load time in headless Chromium (1,000 slow dispatches, 10,000 functions).
    Html,
    /// i: profile.data bytes per event (format 3 vs 2) and the cost of writing it.
    Datafile,
    /// j: the overhead governor on redis-server and on its fixture.
    Governor,
    /// j, redis-server row only.
    Redis,
    /// k: attach and detach time for 1,000, 10,000 and 50,000 functions.
    Scale,
    /// l: per-CPU rings against one shared ring (zero-loss rate, agent CPU, pinned writers).
    Rings,
    /// m: event-loop iterations from the loop's waits: cost per iteration on a 10 kHz loop.
    Loop,
    /// n: kernel cost per sample of walking Python, JavaScript and Java frames, on and off.
    Runtimes,
    /// q: `profiler watch`: redis and node throughput watched against unwatched, the watcher's CPU and memory.
    Watch,
    /// r: `profiler watch`'s escalation: a server's throughput while a stall group is traced, and after.
    Escalation,
}

impl Args {
    fn wants(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }
}

pub fn run(args: &Args) -> Result<()> {
    if !is_root() {
        bail!("the bench attaches uprobes and needs root: re-run as root (`sudo -E cargo xtask bench`)");
    }
    crate::setup::run(&crate::setup::Args {
        bench: true,
        ..Default::default()
    })?;
    crate::util::build_profiler()?;
    let started = Instant::now();
    let work = workspace_root().join("target/xtask/bench");
    std::fs::create_dir_all(&work)?;
    let fx = fixtures::build(&work)?;

    let mut md = header();
    if args.wants(Part::Percall) {
        let cases = [
            percall::measure(
                "plain `-O2` (int3)",
                &fx.plain,
                args.plain_iters,
                args.repeat,
                &work,
            ),
            percall::measure(
                "`-O2`, `push %rbx` prologue (emulated)",
                &fx.push,
                args.plain_iters,
                args.repeat,
                &work,
            ),
            percall::measure(
                "`-pg -mfentry -mnop-mcount` (5-byte nop)",
                &fx.nop,
                args.nop_iters,
                args.repeat,
                &work,
            ),
        ];
        let uftrace = percall::measure_uftrace(&fx.mcount, args.nop_iters, args.repeat, &work);
        let nop_base = cases[2].untraced.as_ref().ok().map(|t| t.ns_per_iter);
        md.push_str("\n## a, b. Cost of one traced call (entry + exit)\n\n");
        md.push_str(&percall::rows(&cases, nop_base.map(|b| (&uftrace, b))));
        md.push_str(&format!(
            "\nPer-call cost = (traced − untraced ns/iteration) / 3. Iterations: {} (int3, push), {} (nop); \
             {} interleaved rounds, each running the fixture untraced and under every tracer in a \
             rotating order; the ns columns are medians over the rounds, and each round's ratio to \
             bpftrace is taken within the round. `profiler, default` is `record --pid P --func leaf \
             --func mid --max-overhead 0` (every hit measured): return uprobes for these plain C \
             programs. The profiler records every entry and exit as a ring-buffer event; bpftrace \
             only counts in a map. uftrace's baseline is the nop build untraced.\n",
            args.plain_iters, args.nop_iters, args.repeat
        ));
    }
    if args.wants(Part::Rate) {
        let sweeps: Vec<_> = [(1, None), (2, None), (2, Some(64u64 << 10))]
            .into_iter()
            .map(|(t, ring)| rate::sweep(&fx.nop, t, ring, args.rate_secs, &work))
            .collect();
        md.push_str(
            "\n## c. Highest event rate with zero loss (nop fixture, `--func leaf --func mid`)\n\n",
        );
        md.push_str(&rate::rows(&sweeps));
        md.push_str(&format!(
            "\nEach step runs the fixture paced in 1 ms batches for {} s; 2 events per call. \
             The rate doubles until events are lost (or the traced fixture cannot reach the \
             target), then bisects twice. A step counts only if lost_events = 0 and the \
             profiler's call counts equal the fixture's.\n",
            args.rate_secs
        ));
    }
    if args.wants(Part::Attach) {
        let att = attach::measure(&fx.many, &work);
        md.push_str("\n## d. Time to attach 1,000 functions (`--func 'fn_*'`)\n\n");
        md.push_str(&attach::rows(&att));
        md.push_str("\nOne attach, then SIGINT; the stop includes detaching every probe.\n");
        let node = attach::measure_node(&work);
        md.push_str(
            "\n### d2. node 20 by PID, default options (the selection capped at `--max-funcs`)\n\n",
        );
        md.push_str(&attach::rows(&node));
        md.push_str(
            "\n`node -e 'setInterval(() => {}, 1000)'` idle in its loop, `profiler record --pid P \
             --max-overhead 0`: the libuv preset and the first `--max-funcs` (2,000) of the \
             binary's 74,675 functions.\n",
        );
    }
    if args.wants(Part::Dispatch) {
        md.push_str(&dispatch_section(&fx.dispatch, args, &work)?);
    }
    if args.wants(Part::Sampling) {
        md.push_str(&sampling_section(&fx.burn, args, &work));
    }
    if args.wants(Part::Unwind) {
        md.push_str(&unwind_section(&work));
    }
    if args.wants(Part::Html) {
        let m = html::measure(args.repeat, &work)?;
        md.push_str("\n## h. report.html load time in headless Chromium\n\n");
        md.push_str(&html::rows(&m));
        md.push_str(
            "\nA synthetic page of the issue's size, built by the profiler's page code \
             (`output::html::tests::synthetic`: 1,000 slow dispatches in 1,000 groups with 24-node \
             trees, 10,000 functions, three inferno flame graphs of 10,000 paths), opened with \
             `chromium --headless --dump-dom`. Load time: the page's `performance.now()` at the end \
             of its initialisation (HTML and JSON parsed, every section rendered, style and layout \
             forced), from navigation start. No peer: the figure is held against the issue's goal. \
             Off-screen sections are skipped by `content-visibility: auto`, function rows are \
             virtual, and the group table renders its first 150 rows at once, the rest right after.\n",
        );
    }
    if args.wants(Part::Datafile) {
        let m = datafile::measure(&fx.nop, args.nop_iters, args.repeat, &work);
        md.push_str("\n## i. profile.data: bytes per event and the cost of writing it\n\n");
        md.push_str(&datafile::rows(&m));
        md.push_str(&format!(
            "\nNop fixture, one thread, {} iterations (3 calls, 6 events each) flat out, under \
             `profiler record --pid P --func leaf --func mid --trace-events 0`, with profile.data and with \
             `--data-limit 0`; median of {} runs each. Sizes, records, the format-2 size of the same \
             stream (5 bytes of frame per record) and the writing thread's CPU time \
             (CLOCK_THREAD_CPUTIME_ID: packing is on the collector, zstd, CRC and write on that thread) come \
             from the profiler's `profile.data:` line; agent CPU is the profiler's rusage (user + system).\n",
            args.nop_iters, args.repeat
        ));
    }
    if args.wants(Part::Governor) || args.wants(Part::Redis) {
        md.push_str(&governor_section(args, &work));
    }
    if args.wants(Part::Scale) {
        md.push_str(&scale_section(&work));
    }
    if args.wants(Part::Rings) {
        md.push_str(&rings_section(&fx.nop, args, &work)?);
    }
    if args.wants(Part::Loop) {
        let f = event_loop::measure(&fx.event_loop, args.repeat, &work);
        md.push_str("\n## m. Event-loop iterations from the loop's waits: cost per iteration\n\n");
        md.push_str(&event_loop::rows(&f));
        md.push_str(&format!(
            "\nFixture `xtask/bench/bench_loop.c`, stripped: epoll_wait on a 100 us timerfd, {} \
             iterations, untraced and under `profiler record --pid P --max-overhead 0 --trace-events 0` \
             (no function probed: the waits' `sys_enter`/`sys_exit` tracepoints and the scheduler \
             ones); loop CPU is the fixture's CLOCK_PROCESS_CPUTIME_ID, agent CPU its utime + stime \
             over a long run minus a 2,000-iteration one; medians of {} interleaved rounds.\n",
            event_loop::LONG,
            args.repeat
        ));
    }
    if args.wants(Part::Watch) {
        let w = watch::measure(&fx.event_loop, args.repeat, &work);
        md.push_str("\n## q. `profiler watch`\n\n");
        md.push_str(&watch::rows(&w));
    }
    if args.wants(Part::Escalation) {
        let e = escalation::measure(&fx.escalation, args.repeat, &work);
        md.push_str(
            "\n## r. `profiler watch`'s escalation: throughput while traced, and after\n\n",
        );
        md.push_str(&escalation::rows(&e));
    }
    md.push_str(&format!(
        "\nBench wall time: {:.0} s.\n",
        started.elapsed().as_secs_f64()
    ));
    if args.wants(Part::Runtimes) {
        let rows = runtimes::measure(args.repeat, &work);
        md.push_str("\n## n. Interpreter and JIT frames: kernel cost per CPU sample\n\n");
        md.push_str(&runtimes::rows(&rows));
        md.push_str(
            "\nThe CPU sampler's own run time per sample (`kernel.bpf_stats_enabled`, `bpftool \
             prog show name prof_cpu_sample`) while `profiler sample --pid P --hz 999` samples the \
             runtime, its frame walk on and off (`PROFILER_PYTHON_FRAMES=0`, `PROFILER_JS_FRAMES=0`, \
             `PROFILER_JAVA_FRAMES=0`) in alternating rounds against the same process. Goal: at most 2x the native walk.\n",
        );
    }

    let path = workspace_root().join("target/bench.md");
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// The profiler given with `--base-profiler`, as an absolute path.
fn base_profiler(args: &Args) -> Result<Option<std::path::PathBuf>> {
    args.base_profiler
        .as_ref()
        .map(|p| {
            std::fs::canonicalize(p).with_context(|| format!("--base-profiler {}", p.display()))
        })
        .transpose()
}

fn dispatch_section(
    fixture: &std::path::Path,
    args: &Args,
    work: &std::path::Path,
) -> Result<String> {
    const FAST: u64 = 500_000;
    const PIPE: u64 = 50_000;
    const STORM: u64 = 200_000;
    let profs = dispatch::Profilers {
        new: crate::util::profiler_bin(),
        base: base_profiler(args)?,
    };
    let cfgs = dispatch::configs(FAST, PIPE, STORM, profs.base.is_some());
    let rows = dispatch::measure(fixture, &profs, &cfgs, args.repeat, work);
    let mut md = String::from(
        "\n## e. Dispatch tracking: cost per dispatch, waker tracking, agent memory\n\n",
    );
    md.push_str("### CPU time of the fixture (all its threads), ns per dispatch\n\n");
    md.push_str(&dispatch::comparison(
        &rows,
        FAST,
        PIPE,
        STORM,
        dispatch::Metric::Cpu,
    ));
    md.push_str("\n### Wall time, ns per dispatch\n\n");
    md.push_str(&dispatch::comparison(
        &rows,
        FAST,
        PIPE,
        STORM,
        dispatch::Metric::Wall,
    ));
    md.push_str(&format!(
        "\nFixture `xtask/bench/bench_dispatch.c` (nop build). Each dispatch is `dispatch_message` calling \
         one handler, both probed: `profiler record --pid P --dispatch dispatch_message --func 'handle_*' \
         --trace-events 0 --max-overhead 0 --dispatch-hz HZ`, with waker tracking on (the default), with \
         `--no-wakers`, and{} with the profiler built before waker tracking (`--base-profiler`). \
         *Fast* dispatches call `handle_fast` and never block. *Blocked on a pipe*: `handle_pipe` writes a \
         byte to a worker thread and reads its reply (both threads pinned to one CPU), so the watched thread blocks inside every dispatch and \
         is woken by the worker (a waker record with the worker's stacks, and the worker sampled while it \
         runs). *Round trips in another process*: the same fixture in pipe mode, untraced, while the \
         profiler records an idle process (waiting on stdin): two wake-ups per round trip, none of them in a \
         traced dispatch. Every configuration runs once per round, {} rounds interleaved; the median is \
         shown with the rounds' range. Added = traced − untraced median; the ratios compare added costs. \
         CPU time (`CLOCK_PROCESS_CPUTIME_ID` of the fixture, or of the process doing the round trips) \
         holds the probes, the scheduler programs its threads run, the waker records written by its \
         worker and samples taken while its threads run, but not the time other load preempted it: \
         on a shared machine it is the figure to compare; wall time also counts the agent's work \
         competing for the two CPUs.\n",
        if profs.base.is_some() { "" } else { " (not measured in this run)" },
        args.repeat
    ));
    md.push_str("\n### Agent memory\n\n");
    md.push_str(&dispatch::memory(&rows));
    md.push_str(
        "\nAgent peak RSS (VmHWM), polled while the fixture runs: flat between run sizes means fast \
         dispatches leave nothing behind.\n",
    );
    Ok(md)
}

fn sampling_section(burn: &std::path::Path, args: &Args, work: &std::path::Path) -> String {
    const ADDRS: u64 = 100_000;
    let rows = sampling::overhead(burn, args.burn_rounds, args.repeat, work);
    let agree = sampling::agreement(burn, args.burn_rounds, work);
    let syms = sampling::symbolization(ADDRS);
    let mut md = String::from(
        "\n## f. Sampling\n\n### Overhead against `perf record -g` at the same rate\n\n",
    );
    md.push_str(&sampling::overhead_rows(&rows));
    md.push_str(&format!(
        "\nFixture `xtask/bench/bench_burn.c` (`gcc {}`): {} rounds of a CPU-bound chain \
         `burn_a` → `burn_b` → `burn_c` (1 : 2 : 5 units of self time), single-threaded; it \
         reports its own elapsed time. Each sampler starts first (the profiler once it prints \
         `attached … sampler at … Hz`, perf once it holds perf-event descriptors plus 0.5 s); the \
         fixture then runs, and the sampler is stopped with SIGINT and waited for. Commands: \
         `profiler sample --pid P --hz 997 --out DIR`, `perf record -g -F 997 -e cpu-clock -p P -o FILE`, \
         `profiler sample --all --hz 99 --out DIR`, `perf record -a -g -F 99 -e cpu-clock -o FILE`. \
         `perf record -F 997 -e cpu-clock -p P -o FILE` (no call graph) is the floor: the tick \
         and a sample record with no stack taken. Median of {} rounds, each round running every \
         row once in turn (interleaved). Overhead = fixture elapsed against the untraced median; \
         `above the no-stack floor` subtracts the floor's overhead, leaving what taking the \
         stack costs the process. The per-process rows run again at 9973 Hz (amplified): at \
         997 Hz the 2,000 stacks of a run cost the fixture a few milliseconds, less than the \
         run-to-run noise, and ten times as many show each sampler's per-sample cost above it \
         (the ratios in brackets compare those costs). Sampler CPU time \
         is the sampler process's user + system time (getrusage of the reaped child), including \
         the writing of its outputs (the profiler symbolizes and writes folded/SVG/pprof; perf \
         writes perf.data only). Work done in the sampled process's context (the BPF program or \
         perf's stack copy at each tick) shows up in the overhead column. The profiler/perf ratio \
         of overheads is shown only when both are at least 0.5% (below that it is noise). \
         System-wide sample counts differ because perf also records idle CPUs (`swapper`).\n",
        fixtures::BURN_FLAGS.join(" "),
        args.burn_rounds,
        args.repeat
    ));
    md.push_str("\n### Top frames: profiler against `perf report`, same process, same run\n\n");
    md.push_str(&sampling::agreement_rows(&agree));
    md.push_str(
        "\nBoth samplers ran on the same fixture run at 997 Hz (`profiler sample --pid P --hz 997` and \
         `perf record -g -F 997 -e cpu-clock -p P`). Profiler: the `Top frames by self samples` lines \
         of cpu.txt; perf: `perf report --stdio --no-children --sort sym -q -g none`; kernel \
         symbols from perf get the profiler's `_[k]` suffix. Expected shares: 62.5 / 25 / 12.5%.\n",
    );
    md.push_str(&format!(
        "\n### Symbolization of {ADDRS} distinct addresses (blazesym, measured directly)\n\n"
    ));
    md.push_str(&sampling::sym_rows(&syms, ADDRS));
    md.push_str(&format!(
        "\nThe agent symbolizes with the blazesym crate; this measures that library directly, not \
         the agent (same crate version, in xtask, optimized: `opt-level = 3` for blazesym, gimli and the demanglers). \
         {ADDRS} distinct file offsets evenly spread over `.text`, one `Symbolizer::new()` per row \
         and one `symbolize(Source::Elf, Input::FileOffset)` call with all of them (the first call \
         includes opening and parsing the file), then the same call again (parsed data cached). \
         `debug_syms: true` (the default) reads DWARF when the file has it; the release profiler \
         binary has no DWARF, so both of its rows use the ELF symbol table. The second binary is \
         this xtask (a debug build, with DWARF).\n"
    ));
    md
}

fn unwind_section(work: &std::path::Path) -> String {
    let tables = unwind::tables();
    let steady: Vec<_> = [false, true]
        .into_iter()
        .map(|exec_loop| {
            eprintln!(
                "bench: agent CPU, `profiler sample --all --hz 99`{}",
                if exec_loop { ", with an exec loop" } else { "" }
            );
            unwind::steady(
                work,
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(20),
                exec_loop,
            )
        })
        .collect();
    let mut md = String::from("\n## g. Unwind tables\n\n");
    md.push_str(&unwind::rows(&tables, &steady));
    md.push_str(
        "\nTables: `profiler tables --json --repeat 3 FILE` compiles the file's `.eh_frame` (and \
         `.debug_frame`) into the rows the BPF unwinder walks, as the samplers do, without root or \
         the kernel; the best of 3 builds and the first are shown. Agent CPU: `profiler sample \
         --all --hz 99`, its utime + stime (/proc/PID/stat) over the first 10 s after it attached \
         (warm-up: the tables of every process on a CPU are built, then those of each process the \
         first time it is sampled) and over the next 20 s (steady: from then on, only new \
         binaries, new processes and changed mappings cost anything), with each 5-second window's \
         figure, so a steady state that is not flat shows. Twice: on the machine as it was, and \
         with an exec loop running from before the start (`/bin/true` 20 times, `sh -c 'ls /proc'`, \
         `cc -O1 -c hello.c`, repeated: short-lived processes, as a build makes). The load average \
         says how busy the machine was (2 vCPUs: above 2, other work competed with the agent). Map \
         memory: the sum of `memlock` over the agent's BPF map descriptors (/proc/PID/fdinfo), read \
         at the end of the steady part.\n",
    );
    eprintln!("bench: gtk3-demo under Xvfb, `profiler sample --pid` and `record --pid`");
    md.push_str(&unwind::gtk_rows(&unwind::gtk(work)));
    md.push_str(
        "\ngtk3-demo (Debian's gtk-3-examples) `--run=fishbowl` on an Xvfb display, with \
         `GDK_GL=always` so that GDK draws through Mesa's software renderer, which maps libLLVM \
         (about 100 binaries: the case of issue 24), 6 s after it started, with `xdotool` moving the \
         pointer over it every 50 ms when installed. `profiler sample --pid P \
         --duration 5s` with default options: cpu.txt's table figures and complete-stack share, \
         the shares of the app's samples in cpu.folded that pass through `g_main_context_dispatch` \
         or a `gtk_` function, the agent's peak RSS (`wait4`) and its BPF maps' `memlock` (read 3 s \
         in). Then `profiler record --pid P --duration 5s`: dispatches.txt's in-dispatch samples.\n",
    );
    md
}

fn governor_section(args: &Args, work: &std::path::Path) -> String {
    let mut md = String::from("\n## j. Overhead governor\n\n### redis-server, default options\n\n");
    match redis::redis(args.redis_requests, args.redis_rounds, work) {
        Ok(r) => md.push_str(&redis::rows(&r)),
        Err(e) => md.push_str(&format!("redis: failed: {e:#}\n")),
    }
    md.push_str(&format!(
        "\nTwo copies of Debian's `redis-server --save '' --appendonly no`, A on port 6391 and B \
         on 6392, both pinned to CPU 0; `redis-benchmark -p PORT -t get,set -c 20 -n {n} --csv` \
         pinned to CPU 1, against A and B in turn (the order alternates by round). {c} control \
         rounds with neither traced, then `profiler record --pid B` and nothing else (the default \
         selection: with more functions than `--max-funcs`, those a 300 ms sample of the idle \
         server's main thread shows, and the functions that tail-call them; `--max-overhead 10`) \
         for {r} rounds. Steady state: the rounds that start over 0.5 s after the governor's last \
         detach. Per-round B/A is requests/s over the run's SET and GET; \"all requests\" is \
         total requests over total time of the phase on each server, so the whole run includes \
         the governor's warm-up.\n",
        n = args.redis_requests,
        c = 3,
        r = args.redis_rounds,
    ));
    if args.only.contains(&Part::Redis) && !args.only.contains(&Part::Governor) {
        return md;
    }
    md.push_str("\n### Fixture: a hot tiny function and a cold one\n\n");
    match governor::fixture(work) {
        Ok(f) => md.push_str(&governor::fixture_rows(&f)),
        Err(e) => md.push_str(&format!("fixture: failed: {e:#}\n")),
    }
    md.push_str(
        "\n`tests/fixtures/governor.c` (`-O2`): each unit of work is about 1 µs of arithmetic and \
         one call of `gov_hot`; `gov_cold` runs every 10 ms. It measures its own progress in 100 ms \
         windows: 2 s untraced, then 4 s under `profiler record --pid P --func 'gov_*' \
         --max-overhead 5`. Rates are the 75th percentile of the windows (the machine is shared); \
         \"after the detach\" counts windows from 1.3 s into the traced phase.\n",
    );
    md
}

fn scale_section(work: &std::path::Path) -> String {
    let mut md = String::from(
        "\n## k. Probes at scale: attach and detach time\n\n\
         | functions | attached | probes | attach (reported) | spawn to attached | stop (detach + outputs) |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for n in [1_000usize, 10_000, 50_000] {
        let bin = work.join(format!("many-funcs-{n}"));
        let src = work.join(format!("many-funcs-{n}.c"));
        let built = std::fs::write(&src, fixtures::many_funcs_source(n))
            .map_err(anyhow::Error::from)
            .and_then(|()| crate::util::gcc(&src, &bin, &["-O1"]));
        let row = built.and_then(|()| attach::measure_n(&bin, work, n));
        match row {
            Ok(a) => md.push_str(&format!(
                "| {n} | {} | {} | {:.0} ms | {:.0} ms | {} |\n",
                a.attached,
                a.probes,
                a.reported_ms,
                a.wall_ms,
                a.stop_ms
                    .map_or("> 60 s".to_string(), |ms| format!("{ms:.0} ms"))
            )),
            Err(e) => md.push_str(&format!("| {n} | failed: {e:#} | | | | |\n")),
        }
    }
    md.push_str(
        "\nA generated C program with N `noinline` functions `fn_0000`… (`gcc -O1`), each called \
         every 100 ms; `profiler record --pid P --func 'fn_*' --max-funcs N --max-overhead 0`, then \
         SIGINT after 300 ms. Attach (reported) is the `in X ms` of the attached line (uprobe_multi \
         links: one per binary and kind of probe); spawn to attached adds loading the programs and \
         reading the symbols and code; stop is SIGINT to exit, detaching every probe and writing \
         the outputs.\n",
    );
    md
}

fn rings_section(nop: &std::path::Path, args: &Args, work: &std::path::Path) -> Result<String> {
    const RING: u64 = 64 << 10;
    const PINNED: u32 = 8;
    let cpus = rings::cpus();
    let mut md = String::from(
        "\n## l. Per-CPU rings against one shared ring\n\n### Highest event rate with zero loss\n\n",
    );
    md.push_str(&rings::sweep_rows(&rings::sweeps(
        nop,
        RING,
        args.rate_secs,
        work,
    )));
    md.push_str(&format!(
        "\nAs part c (nop fixture paced in 1 ms batches, {} s per step, `--func leaf --func mid`), \
         with `--rings per-cpu` ({cpus} rings of {} KiB) and `--rings shared` (one ring of {} KiB, \
         and one of {} KiB: the per-CPU rings' memory).\n",
        args.rate_secs,
        RING >> 10,
        RING >> 10,
        (RING * cpus) >> 10
    ));
    md.push_str("\n### Agent CPU per million events\n\n");
    let mut profs = vec![("this build", crate::util::profiler_bin())];
    profs.extend(base_profiler(args)?.map(|p| ("--base-profiler", p)));
    let cpu = rings::cpu_rows_measure(&profs, nop, args.nop_iters, args.repeat, work);
    md.push_str(&rings::cpu_rows(&cpu));
    md.push_str(&format!(
        "\nNop fixture, one thread, {} iterations (6 events each) flat out, under `profiler record --pid P \
         --func leaf --func mid --max-overhead 0 --trace-events 0 --rings MODE` (default ring size, \
         profile.data written). Agent CPU is the profiler's utime + stime (/proc/PID/stat, read until it \
         exits); the same run with 1,000 iterations gives the fixed cost (load, attach, outputs), and \
         CPU per event is the difference over the events. Median of {} runs, the builds' and modes' \
         runs interleaved (`--base-profiler PATH` adds an older build's rows).\n",
        args.nop_iters, args.repeat
    ));
    md.push_str(&format!(
        "\n### Many writers: {PINNED} threads pinned to {cpus} CPUs, flat out\n\n"
    ));
    let iters = (args.nop_iters / u64::from(PINNED)).max(1);
    let runs: Vec<_> = [
        ("per-cpu", None),
        ("shared", None),
        ("per-cpu", Some(RING)),
        ("shared", Some(RING * cpus)),
    ]
    .into_iter()
    .map(|(mode, ring)| {
        let load = rings::Load {
            threads: PINNED,
            iters,
            ring,
            pin: true,
        };
        let r = rings::flat(&crate::util::profiler_bin(), nop, mode, load, work);
        if let Ok(f) = &r {
            eprintln!("bench: rings pinned {mode} {ring:?}: {f:?}");
        }
        r
    })
    .collect();
    md.push_str(&rings::flat_rows(&runs));
    md.push_str(&format!(
        "\nNop fixture with {PINNED} threads of {iters} iterations each, thread t pinned to CPU t mod {cpus} \
         (`BENCH_PIN=1`), flat out: the probes of every thread on a CPU write to that CPU's ring, or \
         all of them to the shared one, whose lock the CPUs take in turn. Same command as above; \
         the 64 KiB rows give the shared ring the per-CPU rings' memory.\n"
    ));
    Ok(md)
}

fn header() -> String {
    let date = stdout_of("date", ["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let kernel = stdout_of("uname", ["-r"]).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let commit = stdout_of(
        "git",
        [
            "-C",
            &workspace_root().to_string_lossy(),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    )
    .unwrap_or_default();
    let tools = ["bpftrace --version", "uftrace --version", "gcc --version"]
        .iter()
        .filter_map(|c| {
            let mut it = c.split(' ');
            let out = Command::new(it.next()?).args(it).output().ok()?;
            Some(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .next()?
                    .to_string(),
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "# Bench results\n\n`cargo xtask bench` on {}, commit {}, kernel {}, {cpus} CPUs ({cpu}); {tools}.\n",
        date.trim(),
        commit.trim(),
        kernel.trim()
    )
}

/// Median of a non-empty list (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
