//! `cargo xtask kernels`: the root integration tests inside virtual
//! machines booted with other kernels (Debian's 6.1 and 6.12 packages by
//! default, beside this machine's own), and KERNELS.md from the run.
//!
//! Each kernel boots with QEMU through virtme-ng (`vng --run`), which shares
//! the host's files read-only, `target/` read-write: the guest runs the
//! host's test binary and profiler, and writes its log into
//! `target/kernels/`. The CPU is emulated by one TCG thread (about 35 s
//! to boot; see `run_one` for why not several), or
//! virtualised with `--kvm`. Under emulation the tests get
//! `PROFILER_TEST_EMULATED=1`: timing assertions that emulation cannot
//! meet are relaxed, each printing a `RELAXED` line; behaviour assertions
//! are not.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::libtest::{Parser, Status};
use crate::util::workspace_root;
use crate::util::{build_profiler, cargo, find_program, is_root, profiler_bin, stdout_of};

/// The tests `--smoke` runs: one of each main feature.
pub const SMOKE: &[&str] = &[
    "check::",
    "tracing::tree_counts_durations_self_and_teardown",
    "dispatch::exactly_the_slow_messages_with_their_durations_splits_and_trees",
    "sampling::frame_pointer_chain_is_complete",
    "offcpu::",
    "waker::mutex_waker_is_worker_1_busy_in_compress_block",
    "event_loops::a_stripped_epoll_loop_is_timed_by_its_waits",
    "unwinding::cpp_exception_through_probed_frames_by_pid",
    "golang::go_goroutines_growing_stacks_are_traced_exactly",
    "follow::follow_by_pid_traces_children_made_after_attach",
    "teardown::sigkill_during_calls_leaves_target_unharmed",
];

#[derive(clap::Args)]
pub struct Args {
    /// A kernel to run the tests on: `host` (this machine's, no VM), a
    /// Debian kernel's version (`6.1`, `6.12`: the newest installed
    /// `/boot/vmlinuz-VERSION.*`, else installed with apt), or a vmlinuz
    /// path; `:smoke` after it runs only the smoke subset there
    /// (`--kernel 6.12:smoke`). Repeatable.
    #[arg(long = "kernel", default_values = ["host", "6.1", "6.12"])]
    pub kernels: Vec<String>,
    /// Only the smoke subset (SMOKE in xtask/src/kernels.rs).
    #[arg(long)]
    pub smoke: bool,
    /// Write the matrix here (default: KERNELS.md for a full run,
    /// target/kernels/KERNELS.md for a subset).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// vCPUs of each virtual machine.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Memory of each virtual machine (QEMU's syntax).
    #[arg(long, default_value = "3G")]
    pub memory: String,
    /// The profiler binary the tests run (default: the release build,
    /// built first), e.g. the static one from `cargo xtask dist`.
    #[arg(long, value_name = "PATH")]
    pub profiler: Option<PathBuf>,
    /// Boot with KVM instead of software emulation (about 10x faster;
    /// where KVM fails, as on the VM this was written on, with an MSR
    /// error, QEMU may hang instead of failing, so it is not tried by
    /// default).
    #[arg(long)]
    pub kvm: bool,
    /// Reuse a kernel's results from an earlier run (its
    /// `target/kernels/KERNEL.log` and reruns, whatever commit they ran
    /// at: the matrix says which) instead of running its tests again; a
    /// kernel with no log runs.
    #[arg(long)]
    pub reuse: bool,
    /// Run again, on each kernel, only the tests that failed in its last
    /// run and its reruns, and those none reached (a run cut short):
    /// `target/kernels/KERNEL.log` and `KERNEL.rerunN.log`, kept as they
    /// were; a kernel with no earlier run runs every test. The matrix
    /// takes each test's last result and lists the reruns with their
    /// commit: passed on rerun, or failed again.
    #[arg(long, conflicts_with_all = ["reuse", "smoke"])]
    pub rerun_failed: bool,
    /// With `--rerun-failed`: also run again the tests whose names contain
    /// this, whatever their last result (a test changed since, a skip that
    /// now runs). Repeatable.
    #[arg(long, value_name = "FILTER", requires = "rerun_failed")]
    pub again: Vec<String>,
    /// Only the tests whose names contain one of these (libtest filters).
    pub filters: Vec<String>,
}

/// Where one kernel's tests ran.
struct Kernel {
    /// What the user asked for (`host`, `6.1`, a path), without `:smoke`.
    asked: String,
    /// Only the smoke subset there.
    smoke: bool,
    /// The vmlinuz to boot; `None` for the host.
    image: Option<PathBuf>,
}

/// One kernel's results.
struct Run {
    asked: String,
    /// Only some of the tests ran there (filters, the smoke subset).
    subset: bool,
    /// `uname -r` inside it.
    release: String,
    /// `kvm`, `software emulation` or `none (host)`.
    machine: &'static str,
    /// `profiler check`'s output there.
    check: String,
    parser: Parser,
    /// The test binary's exit status, or why it gave none.
    exit: String,
    secs: u64,
    /// The commit the tree was at when it ran.
    commit: String,
    /// `--rerun-failed`, each time: the failed tests run again, and those
    /// no run had reached, in order.
    reruns: Vec<Run>,
    /// In a rerun: the tests that had no result before.
    not_run_before: Vec<String>,
}

impl Run {
    /// Each test's last result: the last rerun's where it ran again.
    fn results(&self) -> BTreeMap<String, Status> {
        let mut r = self.parser.results.clone();
        for again in &self.reruns {
            r.extend(again.parser.results.clone());
        }
        r
    }

    /// Each `RELAXED` line of the tests' last runs.
    fn relaxed(&self) -> Vec<(String, String)> {
        let mut r = self.parser.relaxed.clone();
        for again in &self.reruns {
            r.retain(|(t, _)| !again.parser.results.contains_key(t));
            r.extend(again.parser.relaxed.iter().cloned());
        }
        r
    }
}

pub fn run(args: &Args) -> Result<()> {
    if !is_root() {
        bail!("the integration tests load eBPF programs and need root: re-run as root (`sudo -E cargo xtask kernels`)");
    }
    crate::setup::run(&crate::setup::Args {
        kernels: true,
        ..Default::default()
    })?;
    let kernels: Vec<Kernel> = args
        .kernels
        .iter()
        .map(|k| match k.strip_suffix(":smoke") {
            Some(k) => resolve(k).map(|r| Kernel { smoke: true, ..r }),
            None => resolve(k),
        })
        .collect::<Result<_>>()?;
    let profiler = match &args.profiler {
        Some(p) => std::fs::canonicalize(p)
            .with_context(|| format!("--profiler {}: no such binary", p.display()))?,
        None => {
            build_profiler()?;
            profiler_bin()
        }
    };
    let tests = test_binary()?;
    let dir = workspace_root().join("target/kernels");
    std::fs::create_dir_all(&dir)?;
    let mut filters: Vec<String> = args.filters.clone();
    if args.smoke {
        filters.extend(SMOKE.iter().map(|s| s.to_string()));
    }
    let mut runs = Vec::new();
    for k in &kernels {
        eprintln!("kernels: {} …", k.asked);
        let mut here = filters.clone();
        if k.smoke && !args.smoke {
            here.extend(SMOKE.iter().map(|s| s.to_string()));
        }
        let tag = k.asked.replace('/', "_");
        if (args.reuse || args.rerun_failed) && restore(&dir, &ledger(), &tag)? {
            eprintln!(
                "kernels: {}: no run in {}: starting from the one kept in {LEDGER}/",
                k.asked,
                dir.display()
            );
        }
        let run = run_one(k, (&tests, &profiler), &dir, &here, args)?;
        // Only what covers every test is kept: a subset (filters, the
        // smoke tests) would write over a whole run's record with a part.
        if here.is_empty() {
            save(&dir, &ledger(), &tag)?;
        }
        let c = &run.parser.counts;
        eprintln!(
            "kernels: {} ({}, {}): {} passed, {} failed, {} skipped, {} relaxed, in {} s",
            run.asked,
            run.release,
            run.machine,
            c.passed - c.skipped,
            c.failed,
            c.skipped,
            run.parser.relaxed.len(),
            run.secs
        );
        if let Some(again) = run.reruns.last() {
            let failed = again
                .parser
                .results
                .values()
                .filter(|s| **s == Status::Failed)
                .count();
            eprintln!(
                "kernels: {}: rerun of {} tests: {} passed, {} failed, in {} s",
                run.asked,
                again.parser.results.len(),
                again.parser.results.len() - failed,
                failed,
                again.secs
            );
        }
        runs.push(run);
    }
    let out = args.out.clone().unwrap_or_else(|| {
        if filters.is_empty() {
            workspace_root().join("KERNELS.md")
        } else {
            dir.join("KERNELS.md")
        }
    });
    std::fs::write(&out, matrix(&runs, &filters, &profiler))
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("kernels: wrote {}", out.display());
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| {
            r.results().values().any(|s| *s == Status::Failed) || r.parser.results.is_empty()
        })
        .map(|r| format!("{} ({})", r.asked, r.release))
        .collect();
    if !failed.is_empty() {
        bail!(
            "tests failed on {}; see {}",
            failed.join(", "),
            out.display()
        );
    }
    Ok(())
}

/// The vmlinuz for `asked`, installing Debian's package when none is
/// in /boot.
fn resolve(asked: &str) -> Result<Kernel> {
    if asked == "host" {
        return Ok(Kernel {
            asked: asked.into(),
            smoke: false,
            image: None,
        });
    }
    if asked.contains('/') {
        let p = PathBuf::from(asked);
        if !p.is_file() {
            bail!("no kernel image {asked}: give a vmlinuz path, a version such as 6.1, or host");
        }
        return Ok(Kernel {
            asked: asked.into(),
            smoke: false,
            image: Some(p),
        });
    }
    if let Some(p) = installed(asked) {
        return Ok(Kernel {
            asked: asked.into(),
            smoke: false,
            image: Some(p),
        });
    }
    // A new machine may have no package lists yet (setup updates them
    // only when it installs a tool).
    let pkg = match package_for(asked) {
        Ok(p) => p,
        Err(_) => {
            crate::setup::apt_get(&["update", "-q"])?;
            package_for(asked)?
        }
    };
    crate::setup::apt_install(&[&pkg])?;
    let image = installed(asked)
        .with_context(|| format!("apt installed {pkg}, but no /boot/vmlinuz-{asked}.* appeared"))?;
    Ok(Kernel {
        asked: asked.into(),
        smoke: false,
        image: Some(image),
    })
}

/// The newest `/boot/vmlinuz-VERSION.*` or `-VERSION-*` (so that `6.1`
/// does not take 6.12).
fn installed(version: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/boot")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.strip_prefix("vmlinuz-")
                .and_then(|r| r.strip_prefix(version))
                .is_some_and(|rest| rest.starts_with(['.', '-']))
        })
        .collect();
    found.sort_by_key(|p| release_key(p));
    found.pop()
}

/// Sort key of a vmlinuz's release: its numbers in order.
fn release_key(p: &Path) -> Vec<u64> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// Debian's package of the newest `linux-image-VERSION…-amd64`: the
/// meta-package when there is one (6.12), else the highest ABI (6.1).
fn package_for(version: &str) -> Result<String> {
    let names = stdout_of("apt-cache", ["pkgnames", "linux-image-"]).unwrap_or_default();
    let meta = format!("linux-image-{version}-amd64");
    let mut candidates: Vec<&str> = names
        .lines()
        .filter(|n| {
            n.strip_prefix("linux-image-")
                .and_then(|r| r.strip_prefix(version))
                .and_then(|r| r.strip_suffix("-amd64"))
                .is_some_and(|mid| {
                    mid.is_empty()
                        || (mid.starts_with('.')
                            && mid[1..]
                                .chars()
                                .all(|c| c.is_ascii_digit() || c == '-' || c == '.'))
                })
        })
        .collect();
    if candidates.contains(&meta.as_str()) {
        return Ok(meta);
    }
    candidates.sort_by_key(|n| release_key(Path::new(n)));
    candidates
        .pop()
        .map(str::to_string)
        .with_context(|| format!("no Debian package linux-image-{version}*-amd64 in apt's lists, and no /boot/vmlinuz-{version}.*: give a vmlinuz path instead"))
}

/// Builds the integration tests and returns their binary.
fn test_binary() -> Result<PathBuf> {
    let out = cargo()
        .args([
            "test",
            "--release",
            "-p",
            "profiler-tests",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!(
            "building the integration tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == "integration" {
            if let Some(exe) = v["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo built no `integration` test binary")
}

/// One run's files in `target/kernels/`: `{tag}{suffix}.log` and its
/// neighbours.
struct Files {
    log: PathBuf,
    check: PathBuf,
    release: PathBuf,
    rc: PathBuf,
    commit: PathBuf,
    script: PathBuf,
    console: PathBuf,
    /// The outputs the failed tests left in the guest's `/tmp` (a
    /// passing test removes its own), copied out.
    kept: PathBuf,
}

impl Files {
    fn new(dir: &Path, tag: &str, suffix: &str) -> Files {
        let f = |ext: &str| dir.join(format!("{tag}{suffix}.{ext}"));
        Files {
            log: f("log"),
            check: f("check"),
            release: f("release"),
            rc: f("rc"),
            commit: f("commit"),
            script: f("sh"),
            console: f("console"),
            kept: dir.join(format!("{tag}{suffix}.kept")),
        }
    }

    /// What a run leaves that the matrix reads, the log first.
    fn data(&self) -> [&Path; 5] {
        [
            &self.log,
            &self.check,
            &self.release,
            &self.rc,
            &self.commit,
        ]
    }

    fn clear(&self) {
        for f in self.data() {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Where each kernel's results are kept in the repository, as
/// `TAG[.rerunN].{log,check,release,rc,commit}`: the log as a digest (what
/// [`Parser`] reads, and the tail of each failure's output), the rest as
/// they were. `target/` goes with its clone, and a full run takes hours
/// a kernel: `--reuse` and `--rerun-failed` start from these where
/// `target/kernels/` has no run, and every run writes its own here.
const LEDGER: &str = "tests/kernel-runs";

fn ledger() -> PathBuf {
    workspace_root().join(LEDGER)
}

/// The lines of each failed test's output a digest keeps: the last ones,
/// where its panic message is.
const FAILURE_TAIL: usize = 80;

/// The longest line a digest keeps, in bytes.
const LINE_MAX: usize = 600;

/// `log` without the captured output of passing tests (but their SKIP and
/// RELAXED lines, and the headers that name them), and with only the last
/// [`FAILURE_TAIL`] lines of each failure's: what [`Parser`] reads from
/// it is the same.
fn digest(log: &str) -> String {
    fn push(out: &mut String, line: &str) {
        let mut end = line.len().min(LINE_MAX);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&line[..end]);
        out.push('\n');
    }
    #[derive(PartialEq)]
    enum In {
        Running,
        Successes,
        Failures,
    }
    let mut section = In::Running;
    let mut out = String::new();
    // The last lines of the failure whose output is being read.
    let mut tail: Option<VecDeque<&str>> = None;
    for line in log.lines() {
        let header = line.starts_with("---- ") && line.ends_with(" stdout ----");
        let next = match line {
            "successes:" => Some(In::Successes),
            "failures:" => Some(In::Failures),
            l if l.starts_with("test result: ") => Some(In::Running),
            _ => None,
        };
        if header || next.is_some() {
            for l in tail.take().into_iter().flatten() {
                push(&mut out, l);
            }
            push(&mut out, line);
            if let Some(next) = next {
                section = next;
            }
            if header && section == In::Failures {
                tail = Some(VecDeque::new());
            }
            continue;
        }
        match (&section, tail.as_mut()) {
            // A result, or a test's RELAXED and SKIP lines: what the
            // parser reads.
            _ if line.starts_with("RELAXED ") || line.starts_with("SKIP ") => push(&mut out, line),
            (In::Running, _) if line.starts_with("test ") => push(&mut out, line),
            (In::Failures, Some(lines)) => {
                if lines.len() == FAILURE_TAIL {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
            (In::Failures, None) if !line.trim().is_empty() => push(&mut out, line),
            _ => {}
        }
    }
    for l in tail.take().into_iter().flatten() {
        push(&mut out, l);
    }
    out
}

/// The file suffix of run `n` of a kernel: none for the first, then
/// `.rerunN`.
fn suffix(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(".rerun{n}"),
    }
}

/// Each run of `tag` in `dir`: the first, then its reruns.
fn runs_of(dir: &Path, tag: &str) -> Vec<Files> {
    (0..)
        .map(|n| Files::new(dir, tag, &suffix(n)))
        .take_while(|f| f.log.exists())
        .collect()
}

/// Copies `tag`'s runs from `ledger` into `dir`, if `dir` has none.
/// Returns whether it did.
fn restore(dir: &Path, ledger: &Path, tag: &str) -> Result<bool> {
    if Files::new(dir, tag, "").log.exists() {
        return Ok(false);
    }
    let kept = runs_of(ledger, tag);
    for (n, from) in kept.iter().enumerate() {
        let to = Files::new(dir, tag, &suffix(n));
        for (f, t) in from.data().into_iter().zip(to.data()) {
            if f.exists() {
                std::fs::copy(f, t).with_context(|| format!("copying {}", f.display()))?;
            }
        }
    }
    Ok(!kept.is_empty())
}

/// Writes `tag`'s runs in `dir` into `ledger`, in place of those it had.
fn save(dir: &Path, ledger: &Path, tag: &str) -> Result<()> {
    let runs = runs_of(dir, tag);
    if runs.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(ledger)?;
    for old in runs_of(ledger, tag) {
        for f in old.data() {
            let _ = std::fs::remove_file(f);
        }
    }
    for (n, from) in runs.iter().enumerate() {
        let to = Files::new(ledger, tag, &suffix(n));
        std::fs::write(&to.log, digest(&read(&from.log)))?;
        for (f, t) in from.data().into_iter().zip(to.data()).skip(1) {
            if f.exists() {
                std::fs::copy(f, t).with_context(|| format!("copying {}", f.display()))?;
            }
        }
    }
    Ok(())
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn parse(log: &Path) -> Parser {
    let mut parser = Parser::default();
    for line in read(log).lines() {
        parser.feed(line);
    }
    parser
}

/// The commit the tree is at, `-dirty` when it has changes.
fn commit() -> String {
    let head = stdout_of("git", ["rev-parse", "--short", "HEAD"]).unwrap_or_default();
    let dirty = stdout_of("git", ["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.trim().is_empty());
    format!("{}{}", head.trim(), if dirty { "-dirty" } else { "" })
}

fn run_one(
    k: &Kernel,
    (tests, profiler): (&Path, &Path),
    dir: &Path,
    filters: &[String],
    args: &Args,
) -> Result<Run> {
    let tag = k.asked.replace('/', "_");
    let files = Files::new(dir, &tag, "");
    let (machine, emulated) = match &k.image {
        None => ("none (host)", false),
        Some(_) if args.kvm => ("KVM", false),
        Some(_) => ("software emulation (one TCG thread)", true),
    };
    // `--rerun-failed` with an earlier run: it stays as it was, and so do
    // the reruns after it; what failed last, or was never reached, runs.
    if args.rerun_failed && files.log.exists() {
        let mut run = with_reruns(k, dir, &tag, machine, filters);
        let results = run.results();
        let failed: Vec<String> = results
            .iter()
            .filter(|(t, st)| {
                **st == Status::Failed || args.again.iter().any(|a| t.contains(a.as_str()))
            })
            .map(|(t, _)| t.clone())
            .collect();
        // A run cut short (the machine stopped, or it was killed) is
        // finished too: the tests it did not reach.
        let not_run: Vec<String> = listed(tests, filters)?
            .into_iter()
            .filter(|t| !results.contains_key(t))
            .collect();
        if failed.is_empty() && not_run.is_empty() {
            eprintln!(
                "kernels: {}: nothing failed or was left in {}",
                k.asked,
                files.log.display()
            );
            return Ok(run);
        }
        eprintln!(
            "kernels: {}: running the {} tests that failed (or --again names) and the {} that did not run",
            k.asked,
            failed.len(),
            not_run.len()
        );
        let again = Files::new(dir, &tag, &suffix(run.reruns.len() + 1));
        let names: Vec<String> = failed.iter().chain(&not_run).cloned().collect();
        let (status, secs) = execute(k, (tests, profiler), &again, &names, true, args, emulated)?;
        let mut rerun = finish(k, &again, machine, &names, secs, status, false);
        rerun.not_run_before = not_run;
        run.reruns.push(rerun);
        return Ok(run);
    }
    // Reused whatever the tree is now: a full run takes hours, and the
    // matrix says at which commit each run and rerun was.
    if args.reuse && files.log.exists() {
        let at = std::fs::read_to_string(&files.commit).unwrap_or_default();
        eprintln!(
            "kernels: {}: reusing {} (commit {}) and its reruns",
            k.asked,
            files.log.display(),
            match at.trim() {
                "" => "not recorded",
                c => c,
            }
        );
        return Ok(with_reruns(k, dir, &tag, machine, filters));
    }
    // A new run: the reruns of the last one go with it.
    for n in 1.. {
        let f = Files::new(dir, &tag, &suffix(n));
        if !f.log.exists() {
            break;
        }
        f.clear();
    }
    let (status, secs) = execute(k, (tests, profiler), &files, filters, false, args, emulated)?;
    Ok(finish(k, &files, machine, filters, secs, status, false))
}

/// The last run on `tag`, with the reruns after it (`KERNEL.rerunN.log`).
fn with_reruns(
    k: &Kernel,
    dir: &Path,
    tag: &str,
    machine: &'static str,
    filters: &[String],
) -> Run {
    let files = Files::new(dir, tag, "");
    let mut run = finish(k, &files, machine, filters, 0, "reused".into(), true);
    for n in 1.. {
        let f = Files::new(dir, tag, &suffix(n));
        if !f.log.exists() {
            break;
        }
        let mut again = finish(k, &f, machine, filters, 0, "reused".into(), true);
        // The tests it ran that no run before it had a result for.
        let before = run.results();
        again.not_run_before = again
            .parser
            .results
            .keys()
            .filter(|t| !before.contains_key(*t))
            .cloned()
            .collect();
        run.reruns.push(again);
    }
    if run.release.is_empty() {
        // A run stopped before it wrote `uname -r`.
        if let Some(r) = run.reruns.iter().rev().find(|r| !r.release.is_empty()) {
            run.release = r.release.clone();
        }
    }
    run
}

/// The names of the tests `filters` select (all without filters).
fn listed(tests: &Path, filters: &[String]) -> Result<Vec<String>> {
    let out = Command::new(tests)
        .args(["--list", "--format", "terse"])
        .args(filters)
        .output()
        .with_context(|| format!("listing the tests of {}", tests.display()))?;
    if !out.status.success() {
        bail!("{} --list failed", tests.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// Runs the tests (`filters`, `exact` names or libtest filters) on `k`,
/// into `files`. Returns how the machine ended and the seconds it took.
fn execute(
    k: &Kernel,
    (tests, profiler): (&Path, &Path),
    files: &Files,
    filters: &[String],
    exact: bool,
    args: &Args,
    emulated: bool,
) -> Result<(String, u64)> {
    files.clear();
    std::fs::write(&files.commit, format!("{}\n", commit()))?;
    // One test binary run per test, each appending to the log: a run cut
    // short (a session's end, the machine stopped) keeps the messages of
    // the tests that failed before, and their recordings, which libtest
    // would only print at the end.
    let names = if exact {
        filters.to_vec()
    } else {
        listed(tests, filters)?
    };
    let quoted: String = names
        .iter()
        .map(|t| format!(" '{}'", t.replace('\'', "")))
        .collect();
    // The guest's /tmp goes with it: what a failed test left there (each
    // passing test removes its own) is copied out, under the test's name.
    // Not on the host, whose /tmp other runs share.
    let (clear_kept, clear_tmp, keep) = match &k.image {
        Some(_) => (
            format!(" rm -rf {kept}; mkdir -p {kept};", kept = files.kept.display()),
            "rm -rf /tmp/profiler-tests-[0-9]*; ",
            format!(
                " mkdir -p \"{kept}/$t\"; cp -r /tmp/profiler-tests-[0-9]* \"{kept}/$t/\" 2>/dev/null;",
                kept = files.kept.display()
            ),
        ),
        None => (String::new(), "", String::new()),
    };
    // The host's PATH: rustc and go (fixtures) may live outside the
    // guest's default one.
    let script = format!(
        "export PATH='{path}'; uname -r > {release}; {profiler} check > {check} 2>&1; \
         : > {log}; rc=0;{clear_kept}\n\
         for t in{quoted}; do\n\
         {clear_tmp}\
         PROFILER_BIN={profiler} {emu} {tests} --test-threads=1 --show-output --exact \"$t\" \
         >> {log} 2>&1 || {{ rc=101;{keep} }}\n\
         done\n\
         echo $rc > {rc}",
        path = std::env::var("PATH").unwrap_or_default().replace('\'', ""),
        release = files.release.display(),
        profiler = profiler.display(),
        check = files.check.display(),
        emu = if emulated {
            "PROFILER_TEST_EMULATED=1"
        } else {
            ""
        },
        tests = tests.display(),
        log = files.log.display(),
        rc = files.rc.display(),
    );
    // The guest runs it from a file: vng passes its command on the
    // kernel's command line, and one over 2 KiB panics Linux at boot.
    std::fs::write(&files.script, format!("{script}\n"))?;
    let started = Instant::now();
    let status = match &k.image {
        None => Command::new("sh")
            .args(["-c", &script])
            .current_dir(workspace_root().join("tests"))
            .status(),
        Some(image) => {
            let vng = find_program("vng").context("vng not found (cargo xtask setup --kernels)")?;
            let mut cmd = Command::new(vng);
            // Not cargo's environment: QEMU hung at boot under it.
            for (key, _) in std::env::vars_os() {
                let k = key.to_string_lossy();
                if k.starts_with("CARGO") || k.starts_with("RUST") || k == "LD_LIBRARY_PATH" {
                    cmd.env_remove(&key);
                }
            }
            cmd.arg("--verbose").arg("--run").arg(image);
            if emulated {
                // One host thread for every vCPU: under QEMU 7.2's
                // multi-threaded TCG a thread stepping a probed instruction
                // out of line sometimes ran another probe's copy and
                // resumed at a wrong address, crashing a Go program with
                // plain tracefs uprobes (EMULATION_NOTE).
                cmd.arg("--disable-kvm")
                    .arg("--qemu-opts=-accel tcg,thread=single");
            }
            cmd.args(["--cpus", &args.cpus.to_string(), "--memory", &args.memory])
                .arg("--rwdir")
                .arg(workspace_root().join("target"))
                .arg("--cwd")
                .arg(workspace_root().join("tests"))
                .arg("--")
                .arg(format!("sh {}", files.script.display()));
            eprintln!("$ {}", crate::util::display(&cmd));
            // The guest's console goes to a file: vng's QEMU takes over (and
            // truncates) a redirected stdout otherwise.
            let console = std::fs::File::create(&files.console)?;
            cmd.stdin(std::process::Stdio::null())
                .stdout(console.try_clone()?)
                .stderr(console);
            cmd.status()
        }
    };
    let secs = started.elapsed().as_secs();
    let status = status.context("starting the tests")?;
    Ok((status.to_string(), secs))
}

/// The results in `files`.
fn finish(
    k: &Kernel,
    files: &Files,
    machine: &'static str,
    filters: &[String],
    secs: u64,
    status: String,
    reused: bool,
) -> Run {
    let exit = match read(&files.rc).trim() {
        "" if reused => "no exit status: that run was cut short".to_string(),
        "" => format!("no exit status: the machine stopped first ({status})"),
        rc => format!("exit status {rc}"),
    };
    Run {
        asked: k.asked.clone(),
        subset: !filters.is_empty(),
        release: read(&files.release).trim().to_string(),
        machine,
        check: read(&files.check),
        parser: parse(&files.log),
        exit,
        secs,
        commit: match read(&files.commit).trim() {
            "" => "not recorded".to_string(),
            c => c.to_string(),
        },
        reruns: Vec::new(),
        not_run_before: Vec::new(),
    }
}

/// The feature a test belongs to: its module (`tracing`, `reliability`).
fn feature(test: &str) -> &str {
    test.split("::").next().unwrap_or(test)
}

/// KERNELS.md.
/// What KERNELS.md says about software emulation, when a kernel ran so.
const EMULATION_NOTE: &str = "Software emulation runs every vCPU on one QEMU \
TCG thread (`-accel tcg,thread=single`). With QEMU 7.2's multi-threaded TCG, \
a thread stepping a probed instruction out of line sometimes ran another \
probe's instruction and resumed at a wrong address. Plain tracefs uprobes, \
without the profiler, on two Go prologues (`main.grow` and `main.leaf` of \
the `gostack` fixture) crashed it in 5 runs of 5 on 6.12 and 2 of 2 on \
6.19, in 0 of 3 with one TCG thread, and in 0 of 4 on the host; the \
golang test crashed the same way on 6.1 and 6.12. Probe hits cost 30-40 µs \
under emulation against about 1 µs on the host, so timing assertions are \
relaxed (listed below); behaviour assertions are not.";

fn matrix(runs: &[Run], filters: &[String], profiler: &Path) -> String {
    let mut s = String::new();
    let commit = stdout_of("git", ["rev-parse", "--short", "HEAD"]).unwrap_or_default();
    let _ = writeln!(
        s,
        "# Kernels\n\n\
         Generated by `cargo xtask kernels{}` at commit {}: the root integration \
         tests ({}) on each kernel, one at a time, inside a virtual machine booted \
         with QEMU and virtme-ng for the kernels other than the host's, with \
         the profiler binary `{}`. Do not edit by hand.\n",
        if filters.is_empty() {
            String::new()
        } else {
            format!(" {}", filters.join(" "))
        },
        commit.trim(),
        if filters.is_empty() {
            "all of them".to_string()
        } else {
            "a subset".to_string()
        },
        profiler
            .strip_prefix(workspace_root())
            .unwrap_or(profiler)
            .display()
    );
    let _ = writeln!(
        s,
        "| kernel | machine | passed | failed | skipped | timings relaxed | minutes |"
    );
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for r in runs {
        // From each test's result, so that a run cut short still counts.
        let results = r.results();
        let n = |want: fn(&Status) -> bool| results.values().filter(|s| want(s)).count();
        let _ = writeln!(
            s,
            "| {} ({}{}) | {} | {} | {} | {} | {} | {} |",
            r.release,
            r.asked,
            if r.subset { ", a subset" } else { "" },
            r.machine,
            // libtest's totals where the run ended (a child's output can
            // split a `test … ok` line), else each result seen.
            match r.parser.counts {
                ref c if c.passed + c.failed > 0 && r.reruns.is_empty() => {
                    (c.passed - c.skipped) as usize
                }
                _ => n(|s| *s == Status::Ok),
            },
            match r.parser.counts {
                ref c if c.passed + c.failed > 0 && r.reruns.is_empty() => c.failed as usize,
                _ => n(|s| *s == Status::Failed),
            },
            n(|s| matches!(s, Status::Skipped(_))),
            r.relaxed().len(),
            // Reused: the time the tests said they ran.
            match r.secs {
                0 => r.parser.counts.secs.div_ceil(60),
                s => s.div_ceil(60),
            }
        );
    }
    if runs.iter().any(|r| r.machine.starts_with("software")) {
        let _ = writeln!(s, "\n{EMULATION_NOTE}");
    }
    // Feature × kernel.
    let mut features: BTreeMap<&str, ()> = BTreeMap::new();
    for r in runs {
        for t in r.parser.results.keys() {
            features.insert(feature(t), ());
        }
    }
    let _ = writeln!(s, "\n## By feature\n");
    let _ = write!(s, "| feature (test module) |");
    for r in runs {
        let _ = write!(s, " {} |", r.release);
    }
    let _ = write!(s, "\n| --- |");
    for _ in runs {
        let _ = write!(s, " --- |");
    }
    s.push('\n');
    for f in features.keys() {
        let _ = write!(s, "| {f} |");
        for r in runs {
            let mut n = [0u32; 4];
            for (t, st) in &r.results() {
                if feature(t) != *f {
                    continue;
                }
                n[match st {
                    Status::Ok => 0,
                    Status::Failed => 1,
                    Status::Skipped(_) => 2,
                    Status::Ignored(_) => 3,
                }] += 1;
            }
            let total: u32 = n.iter().sum();
            let cell = if total == 0 {
                "not run".to_string()
            } else if n[1] > 0 {
                format!("**{} of {} failed**", n[1], total)
            } else {
                let mut c = format!("{} pass", n[0]);
                if n[2] > 0 {
                    c += &format!(", {} skipped", n[2]);
                }
                if n[3] > 0 {
                    c += &format!(", {} ignored", n[3]);
                }
                c
            };
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    for r in runs {
        let _ = writeln!(s, "\n## {} ({})\n", r.release, r.machine);
        let _ = writeln!(
            s,
            "Ran at commit {}; the test binary ended with {}.\n",
            r.commit, r.exit
        );
        for again in &r.reruns {
            let first = |t: &String| again.not_run_before.contains(t);
            let ran = again.parser.results.len();
            let _ = writeln!(
                s,
                "`--rerun-failed` ran at commit {} ({}) the {} tests that failed \
                 there (or `--again` named) and the {} it did not reach:\n",
                again.commit,
                again.exit,
                again.parser.results.keys().filter(|t| !first(t)).count(),
                again.not_run_before.len(),
            );
            for (t, st) in &again.parser.results {
                let what = match (first(t), *st == Status::Failed) {
                    (false, false) => "passed on rerun",
                    (false, true) => "failed again",
                    (true, false) => continue,
                    (true, true) => "failed (first run)",
                };
                let _ = writeln!(s, "- {what}: `{t}`");
            }
            let missing = again
                .not_run_before
                .iter()
                .filter(|t| !again.parser.results.contains_key(*t))
                .count();
            if missing > 0 {
                let _ = writeln!(s, "- did not run again either: {missing} tests");
            }
            let _ = writeln!(
                s,
                "\n({ran} results; the tests not listed ran for the first time and passed.)\n"
            );
        }
        let results = r.results();
        let failed: Vec<&String> = results
            .iter()
            .filter(|(_, st)| **st == Status::Failed)
            .map(|(t, _)| t)
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(s, "Failed:\n");
            for t in failed {
                let _ = writeln!(s, "- `{t}`");
            }
            s.push('\n');
        }
        let skipped: Vec<(&String, &String)> = results
            .iter()
            .filter_map(|(t, st)| match st {
                Status::Skipped(why) => Some((t, why)),
                _ => None,
            })
            .collect();
        if !skipped.is_empty() {
            let _ = writeln!(s, "Skipped, with the reason each printed:\n");
            for (t, why) in skipped {
                let _ = writeln!(s, "- `{t}`: {why}");
            }
            s.push('\n');
        }
        let relaxed = r.relaxed();
        if !relaxed.is_empty() {
            let _ = writeln!(
                s,
                "Timing assertions relaxed under software emulation (the behaviour \
                 assertions of these tests ran as written):\n"
            );
            for (t, line) in &relaxed {
                let _ = writeln!(s, "- `{t}`: {line}");
            }
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "`profiler check` there:\n\n```\n{}```",
            if r.check.is_empty() {
                "(no output)\n"
            } else {
                &r.check
            }
        );
    }
    s.push_str(PAPER);
    s
}

/// Kernels that Debian 12 cannot install here, on paper.
const PAPER: &str = "
## Kernels not run here, on paper

What the profiler uses, the kernel that added it, and what happens without it.
`profiler check` prints the same for the kernel it runs on.

| feature | since | without it |
| --- | --- | --- |
| BPF ring buffer | 5.8 | nothing works: `profiler check` and every command say the kernel is too old |
| BTF (`/sys/kernel/btf/vmlinux`) | 5.4 (distribution kernels: 5.x with `CONFIG_DEBUG_INFO_BTF`) | nothing works: one line names it |
| `bpf_get_attach_cookie` for uprobes | 5.15 | nothing works: one line names it |
| `bpf_loop` | 5.17 | the programs fail to load: one line names the kernel (tracing and sampling need it) |
| uprobe_multi links | 6.6 | one perf event per probe: attaching and detaching thousands of functions is slower (detaching with expedited RCU grace periods); USDT probes with semaphores (CPython's GC) get a perf event of their own with the semaphore (`ref_ctr_offset`, 4.20) |
| uprobe_multi's PID filter fix | 6.10 | uprobe_multi is not used on kernels before 6.10 |
| uretprobe syscall | 6.11 | return uprobes cost a trap each (the calibration measures it) |
| 5-byte-nop uprobes as calls | 6.18 | nop entries are single-stepped (the calibration measures it) |
| fentry on syscalls | 5.5 (and a kernel that allows it) | event-loop waits through kprobes, else the `sys_enter`/`sys_exit` tracepoints, said on stderr |

So Ubuntu 22.04 (5.15) and RHEL 9 (5.14) lack `bpf_loop`: the programs do
not load there, and the profiler says which kernel it needs. Ubuntu 24.04
(6.8) has everything but the uprobe_multi fix and the cheaper exits.
";

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
running 1 test
test a::one ... ok

successes:

---- a::one stdout ----
[profiler] noise that passing tests print
RELAXED a duration: 30% instead of 5%

successes:
    a::one

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 189 filtered out; finished in 3.20s

running 1 test
a child's line on the terminal
test b::two ... FAILED

failures:

---- b::two stdout ----
[profiler] line 1
[profiler] line 2
SKIP not here
thread 'b::two' panicked at tests/b.rs:1:1:
count 3 != 4

failures:
    b::two

test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 189 filtered out; finished in 9.90s
";

    fn parsed(log: &str) -> Parser {
        let mut p = Parser::default();
        for l in log.lines() {
            p.feed(l);
        }
        p
    }

    #[test]
    fn a_digest_parses_as_its_log_does() {
        let d = digest(LOG);
        let (full, short) = (parsed(LOG), parsed(&d));
        assert_eq!(full.results, short.results);
        assert_eq!(full.relaxed, short.relaxed);
        assert_eq!(full.counts, short.counts);
        assert_eq!(full.skip_lines, short.skip_lines);
        assert!(!d.contains("noise"), "{d}");
        assert!(!d.contains("child"), "{d}");
        assert!(d.contains("count 3 != 4"), "{d}");
    }

    #[test]
    fn a_digest_keeps_the_tail_of_a_long_failure() {
        let mut log = String::from("failures:\n\n---- t::x stdout ----\n");
        for i in 0..1000 {
            log.push_str(&format!("line {i}\n"));
        }
        log.push_str("panicked: the end\n\nfailures:\n    t::x\n");
        let d = digest(&log);
        assert!(d.contains("panicked: the end"), "{d}");
        assert!(!d.contains("line 900\n"), "{d}");
        assert!(d.contains("line 999\n"), "{d}");
        assert_eq!(parsed(&d).results, parsed(&log).results);
    }

    #[test]
    fn runs_are_kept_and_restored_with_their_reruns() {
        let root = std::env::temp_dir().join(format!("xtask-ledger-{}", std::process::id()));
        let (dir, ledger, again) = (root.join("t"), root.join("l"), root.join("t2"));
        for d in [&dir, &again] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(dir.join("6.1.log"), LOG).unwrap();
        std::fs::write(dir.join("6.1.commit"), "abc1234\n").unwrap();
        std::fs::write(dir.join("6.1.rerun1.log"), "test b::two ... ok\n").unwrap();
        std::fs::write(dir.join("6.12.log"), "test c::three ... ok\n").unwrap();
        save(&dir, &ledger, "6.1").unwrap();
        // A stale rerun in the ledger goes when a run is saved again.
        std::fs::write(ledger.join("6.1.rerun2.log"), "test z ... FAILED\n").unwrap();
        save(&dir, &ledger, "6.1").unwrap();
        assert!(!ledger.join("6.1.rerun2.log").exists());
        assert!(!ledger.join("6.12.log").exists(), "only the tag asked");
        assert!(restore(&again, &ledger, "6.1").unwrap());
        assert_eq!(read(&again.join("6.1.commit")), "abc1234\n");
        assert_eq!(read(&again.join("6.1.rerun1.log")), "test b::two ... ok\n");
        assert_eq!(
            parsed(&read(&again.join("6.1.log"))).results,
            parsed(LOG).results
        );
        // A run already there is not written over.
        assert!(!restore(&dir, &ledger, "6.1").unwrap());
        let _ = std::fs::remove_dir_all(&root);
    }
}
