//! `profiler sample`: stacks of a known call chain with and without frame
//! pointers, the system-wide CPU split between two processes, and a Debian
//! binary built without frame pointers.
use profiler_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

fn burn_fp() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "burn.c",
            "burn_fp",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

fn burn_nofp() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "burn.c",
            "burn_nofp",
            &["-O2", "-g", "-fomit-frame-pointer"],
        )
    })
}

/// `profiler sample args… --out DIR`, asserting success.
fn sample(out: &Path, args: &[&str]) -> Finished {
    let mut all: Vec<&str> = vec!["sample"];
    all.extend_from_slice(args);
    all.extend(["--out", out.to_str().unwrap()]);
    let fin = profiler(&all);
    assert!(fin.status.success(), "profiler sample failed: {fin:?}");
    fin
}

/// Whether `want` occurs as consecutive frames of `stack`.
fn has_chain(stack: &[String], want: &[&str]) -> bool {
    stack
        .windows(want.len())
        .any(|w| w.iter().zip(want).all(|(a, b)| a == b))
}

#[test]
fn frame_pointer_chain_is_complete() {
    require_root!();
    let out = TempDir::new("sample-fp");
    // Attaching took 9 s of the fixture's 10 under emulation; the fixture
    // is killed when the test ends.
    let fx = Fixture::spawn(burn_fp(), &[&lifetime(10), "chain"]);
    sample(
        out.path(),
        &["--pid", &fx.pid.to_string(), "--duration", "1500ms"],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let chain: u64 = stacks
        .iter()
        .filter(|(s, _)| has_chain(s, &["a1", "b1", "c1"]))
        .map(|(_, n)| n)
        .sum();
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(
        chain > 0,
        "no stack holds a1;b1;c1 in cpu.folded:\n{folded_text}"
    );
    assert!(
        chain * 10 >= total * 9,
        "a1;b1;c1 in only {chain} of {total} samples"
    );
    let txt = read(out.path(), "cpu.txt");
    let share = complete_share(&txt);
    eprintln!("frame pointers: complete stacks {share:.1}% ({chain}/{total} samples a1;b1;c1)");
    assert!(
        share >= 90.0,
        "complete stacks {share}% < 90% with frame pointers:\n{txt}"
    );
    for name in ["cpu.svg", "profile.pb.gz", "report.html"] {
        assert!(out.join(name).exists(), "no {name}");
    }
    // `sample` writes the page too: its CPU flame graph, nothing fetched.
    let html = read(out.path(), "report.html");
    assert!(
        html.contains("\"id\":\"cpu\""),
        "no CPU flame graph in report.html"
    );
    let refs = browser::web_references(&html);
    assert!(refs.is_empty(), "report.html loads from the web: {refs:?}");
}

#[test]
fn no_frame_pointer_leaf_is_seen() {
    require_root!();
    let out = TempDir::new("sample-nofp");
    let fx = Fixture::spawn(burn_nofp(), &[&lifetime(10), "chain"]);
    sample(
        out.path(),
        &["--pid", &fx.pid.to_string(), "--duration", "1s"],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let leaf_c1: u64 = stacks
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|f| f == "c1"))
        .map(|(_, n)| n)
        .sum();
    let chain: u64 = stacks
        .iter()
        .filter(|(s, _)| has_chain(s, &["a1", "b1", "c1"]))
        .map(|(_, n)| n)
        .sum();
    let share = complete_share(&read(out.path(), "cpu.txt"));
    // No floor: unwinding is frame-pointer only (no DWARF/eh_frame), so
    // only the leaf is reliable here. Print what it gives.
    eprintln!(
        "no frame pointers (-O2 -fomit-frame-pointer): complete stacks {share:.1}%, \
         c1 as leaf in {leaf_c1} samples, full a1;b1;c1 in {chain}"
    );
    assert!(
        stacks.iter().any(|(s, _)| s.iter().any(|f| f == "c1")),
        "c1 never sampled:\n{folded_text}"
    );
}

/// Time process `pid` has spent on a CPU, in ns (/proc/PID/schedstat).
fn cpu_ns(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
    s.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn system_wide_split_follows_cpu_time() {
    require_root!();
    let out = TempDir::new("sample-all");
    // Two processes: one spinning all the time, one 5 ms on / 5 ms off.
    // Named apart (PR_SET_NAME), so their stacks' first frames differ.
    let tag = std::process::id() % 100_000;
    let (full_comm, half_comm) = (format!("pfull{tag}"), format!("phalf{tag}"));
    let full = Fixture::spawn(burn_fp(), &[&lifetime(20), "chain", &full_comm]);
    let half = Fixture::spawn(burn_fp(), &[&lifetime(20), "half", &half_comm]);
    let before = (cpu_ns(full.pid), cpu_ns(half.pid));
    // 499 Hz rather than the default 99: five times the samples, and a
    // period (2 ms) shorter than the half-busy process's bursts, so the
    // sampler cannot alias with them.
    sample(out.path(), &["--all", "--hz", "499", "--duration", "3s"]);
    let after = (cpu_ns(full.pid), cpu_ns(half.pid));
    // Ground truth: the CPU time each really got around the sampling window.
    // Both run steadily, so the ratio of rates holds within the window; on a
    // loaded machine it is no longer 2:1, which is why it is measured.
    let (cf, ch) = (after.0 - before.0, after.1 - before.1);
    let want = cf as f64 / ch.max(1) as f64;

    let folded_text = read(out.path(), "cpu.folded");
    let by_comm = |comm: &str| -> u64 {
        folded(&folded_text)
            .iter()
            .filter(|(s, _)| s[0] == comm)
            .map(|(_, n)| n)
            .sum()
    };
    let (sf, sh) = (by_comm(&full_comm), by_comm(&half_comm));
    let txt = read(out.path(), "cpu.txt");
    eprintln!(
        "system-wide: samples {sf}:{sh}, CPU time {:.0}:{:.0} ms (ratio {:.2} vs {:.2})\n{}",
        cf as f64 / 1e6,
        ch as f64 / 1e6,
        sf as f64 / sh.max(1) as f64,
        want,
        txt.lines().take(14).collect::<Vec<_>>().join("\n")
    );
    assert!(sf > 0 && sh > 0, "both processes sampled: {sf}, {sh}");
    for pid in [full.pid, half.pid] {
        assert!(
            txt.contains(&format!("PID {pid}\n")),
            "PID {pid} not among cpu.txt's top processes:\n{txt}"
        );
    }
    // 499 Hz x 3 s gives ~1500 and ~750 samples: the sampling error of the
    // ratio alone is a few %, so allow 10 % or 3 sigma of that, whichever
    // is larger (the second only matters when the machine is busy and our
    // processes get few samples).
    let got = sf as f64 / sh as f64;
    let sigma = (1.0 / sf as f64 + 1.0 / sh as f64).sqrt();
    let tol = 0.10f64.max(3.0 * sigma);
    assert!(
        (got / want - 1.0).abs() <= tol,
        "sample ratio {got:.3} vs CPU-time ratio {want:.3} (tolerance {:.0}%)",
        tol * 100.0
    );
}

/// Kills and reaps a child on drop.
/// `profiler sample --all --hz 499 --duration D --out OUT`, started and
/// attached (its sampler line read), killed if the test fails.
struct SampleAll {
    prof: Kill,
    err: std::io::BufReader<std::process::ChildStderr>,
    seen: String,
}

impl SampleAll {
    fn start(out: &Path, duration: &str) -> SampleAll {
        let mut cmd = Command::new(profiler_bin());
        cmd.args([
            "sample",
            "--all",
            "--hz",
            "499",
            "--duration",
            duration,
            "--out",
        ])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut prof = Kill(cmd.spawn().expect("spawn profiler"));
        let mut err = std::io::BufReader::new(prof.0.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
            assert!(n > 0, "the profiler ended before attaching:\n{seen}");
            seen.push_str(&line);
            if line.contains("sampler at") {
                return SampleAll { prof, err, seen };
            }
        }
    }

    /// Waits for the session's end; it must succeed.
    fn finish(mut self) {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.err, &mut rest);
        let status = self.prof.0.wait().expect("wait profiler");
        assert!(
            status.success(),
            "profiler sample failed: {}{rest}",
            self.seen
        );
    }
}

/// 95% of the `total` samples of burners `comm` are named a1;b1;c1.
/// Under emulation a burner spends much of its life starting (from its
/// fork, in the parent's code, to its exec; then the dynamic loader reads
/// its libraries over 9p) and exiting: those samples are named in ld.so
/// and libc instead, and the ones between fork and exec, in the test
/// harness's code, cannot be (the 6.1 VM: 6.3% of them). There, 90% of
/// the samples outside a1;b1;c1 have every frame named.
fn assert_burners_named(folded_text: &str, comm: &str, total: u64, named: u64, what: &str) {
    if named as f64 >= 0.95 * total as f64
        || !relaxed(&format!(
            "{named} of {total} samples of the {what} named a1;b1;c1: the others are their \
             start and exit, slow under emulation; 90% with every frame named allowed"
        ))
    {
        assert!(
            named as f64 >= 0.95 * total as f64,
            "only {named} of {total} samples of the {what} are named a1;b1;c1:\n{folded_text}"
        );
        return;
    }
    let unnamed = folded(folded_text)
        .iter()
        .filter(|(s, _)| s[0] == comm && !has_chain(s, &["a1", "b1", "c1"]))
        .filter(|(s, _)| s.iter().any(|f| f.starts_with("[unknown]")))
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(
        unnamed as f64 <= 0.10 * total as f64,
        "{unnamed} of {total} samples of the {what} have an unnamed frame outside \
         a1;b1;c1:\n{folded_text}"
    );
}

/// The rate `cpu.txt` says the samples were taken at (`… at N Hz …`).
fn sampled_hz(txt: &str) -> f64 {
    txt.split(" at ")
        .skip(1)
        .find_map(|rest| rest.split_once(" Hz")?.0.parse().ok())
        .unwrap_or_else(|| panic!("no rate in cpu.txt:\n{txt}"))
}

/// Samples of processes named `comm` in a cpu.folded, and how many of them
/// hold the frames `chain` in a row.
fn samples_of(folded_text: &str, comm: &str, chain: &[&str]) -> (u64, u64) {
    let stacks = folded(folded_text);
    let mine = stacks.iter().filter(|(s, _)| s[0] == comm);
    let total = mine.clone().map(|(_, n)| n).sum();
    let named = mine
        .filter(|(s, _)| has_chain(s, chain))
        .map(|(_, n)| n)
        .sum();
    (total, named)
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// With `--dwarf`, user stacks are unwound with `.eh_frame`, which Debian
/// keeps in binaries built without frame pointers.
#[test]
fn debian_binary_without_frame_pointers_has_multi_frame_stacks() {
    require_root!();
    let out = TempDir::new("sample-debian");
    // Debian's python3 exports its interpreter functions (symbolizable from
    // .dynsym) and, like the rest of Debian, is built without frame pointers.
    let py = Kill(
        Command::new("/usr/bin/python3")
            .args(["-c", "while True: pass"])
            .stdout(Stdio::null())
            .spawn()
            .expect("run /usr/bin/python3"),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    sample(
        out.path(),
        &[
            "--pid",
            &py.0.id().to_string(),
            "--duration",
            "1s",
            "--dwarf",
        ],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    // Frames after the comm that are symbolized (not `[unknown] 0x…`).
    let multi: u64 = stacks
        .iter()
        .filter(|(s, _)| {
            s[1..]
                .iter()
                .filter(|f| !f.starts_with("[unknown]"))
                .count()
                >= 2
        })
        .map(|(_, n)| n)
        .sum();
    let mut top: Vec<_> = stacks.iter().collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    eprintln!(
        "Debian python3 (no frame pointers): {multi} of {total} samples have >= 2 symbolized \
         frames; complete stacks {:.1}%; top stacks:",
        complete_share(&read(out.path(), "cpu.txt"))
    );
    for (s, n) in top.iter().take(3) {
        eprintln!("  {n:>5}  {}", s.join(";"));
    }
    assert!(
        multi * 2 >= total && total > 0,
        "only {multi} of {total} samples of python3 have >= 2 symbolized frames"
    );
}

/// `--dwarf` samples taken in the kernel (a syscall, an interrupt) unwind
/// the user stack from the registers saved at the kernel's entry: the
/// whole chain under the kernel frames. Before, those samples walked frame
/// pointers, and a binary without them lost every caller (24.5% of a
/// syscall-heavy program's stacks complete on this host, 76% of the
/// `chain` burner's in the 6.1 VM, whose clock reads are syscalls).
#[test]
fn dwarf_unwinding_completes_stacks_taken_in_the_kernel() {
    require_root!();
    let out = TempDir::new("sample-dwarf-kernel");
    let fx = Fixture::spawn(burn_nofp(), &[&lifetime(10), "kernel"]);
    sample(
        out.path(),
        &["--pid", &fx.pid.to_string(), "--duration", "1s", "--dwarf"],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let in_kernel = |s: &[String]| s.iter().any(|f| f.ends_with("_[k]"));
    let kernel: u64 = stacks
        .iter()
        .filter(|(s, _)| in_kernel(s))
        .map(|(_, n)| n)
        .sum();
    let kernel_chain: u64 = stacks
        .iter()
        .filter(|(s, _)| in_kernel(s) && has_chain(s, &["main", "a1", "b1", "c1"]))
        .map(|(_, n)| n)
        .sum();
    eprintln!("--dwarf in syscalls: {kernel} of {total} samples in the kernel, {kernel_chain} of them under main;a1;b1;c1");
    // What share of its time the fixture spends in getppid depends on the
    // machine (a fifth to a third here, 17% on a later host build): the
    // check needs enough kernel samples to judge, not a share.
    assert!(
        kernel >= 50,
        "the fixture should spend a tenth of its time in the kernel, but only {kernel} of {total} samples are there\n{folded_text}"
    );
    assert!(
        kernel_chain * 10 >= kernel * 9,
        "main;a1;b1;c1 under only {kernel_chain} of {kernel} samples in the kernel:\n{folded_text}"
    );
}

#[test]
fn dwarf_unwinding_completes_stacks_without_frame_pointers() {
    require_root!();
    let out = TempDir::new("sample-dwarf");
    let fx = Fixture::spawn(burn_nofp(), &[&lifetime(10), "chain"]);
    sample(
        out.path(),
        &["--pid", &fx.pid.to_string(), "--duration", "1s", "--dwarf"],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let chain: u64 = stacks
        .iter()
        .filter(|(s, _)| has_chain(s, &["main", "a1", "b1", "c1"]))
        .map(|(_, n)| n)
        .sum();
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let share = complete_share(&read(out.path(), "cpu.txt"));
    eprintln!("--dwarf, no frame pointers: main;a1;b1;c1 in {chain}/{total}, complete {share:.1}%");
    assert!(
        chain * 10 >= total * 9,
        "main;a1;b1;c1 in only {chain} of {total}:\n{folded_text}"
    );
    assert!(share >= 90.0, "complete stacks {share}% < 90% with --dwarf");
}

/// A target that starts a short-lived thread every 50 ms (soak.c): the
/// agent moves exited threads' counts out of the kernel's map every 10 s
/// (`fold_exited`). Their samples must survive the move, under the
/// process's thread name, and the map must not fill.
#[test]
fn exited_threads_samples_survive_folding() {
    require_root!();
    let exe = build_c("soak.c", "soak", &["-O1", "-g", "-fno-omit-frame-pointer"]);
    let out = TempDir::new("sample-exited-threads");
    let fx = Fixture::spawn(&exe, &[]);
    // Over 10 s: at least one fold happens while sampling.
    sample(
        out.path(),
        &["--pid", &fx.pid.to_string(), "--duration", "13s"],
    );
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let workers: Vec<&(Vec<String>, u64)> = stacks
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f == "worker_task"))
        .collect();
    let worker_samples: u64 = workers.iter().map(|(_, n)| n).sum();
    eprintln!("worker_task (threads of about 1 ms each): {worker_samples} samples");
    assert!(
        worker_samples > 0,
        "no sample of the short-lived threads' worker_task:\n{folded_text}"
    );
    assert!(
        workers.iter().all(|(s, _)| s[0] == "soak"),
        "exited threads are not under their name:\n{folded_text}"
    );
    let txt = read(out.path(), "cpu.txt");
    assert!(
        txt.contains("0 samples not counted (map full)"),
        "samples lost to a full map:\n{txt}"
    );
}

/// System-wide, processes that exit during the session are folded as they
/// go (named at once, then forgotten, so the agent does not grow with every
/// process that ever ran): a sequence of short-lived burners, each seen
/// alive at a tick, keeps its samples, named, in the right amount, counted
/// under the first of them (the lowest PID folded at the first fold).
#[test]
fn exited_processes_are_folded_as_they_go() {
    require_root!();
    let out = TempDir::new("sample-exited-procs");
    let comm = format!("pexit{}", std::process::id() % 100_000);
    let session = SampleAll::start(out.path(), "14s");
    // Six burners of 1.5 s each, one after the other (each alive at one
    // of the sampler's 1-s ticks at least, where its mappings are read);
    // their CPU time is the ground truth.
    // In a cgroup of their own: the folded processes are counted under
    // the first of their cgroup, and the root cgroup has other processes
    // exiting (a build, the harness).
    let cg = Cgroup::new(&format!("profiler-test-{comm}"));
    let (mut pids, mut cpu_ns) = (Vec::new(), 0u64);
    for _ in 0..6 {
        let mut burner = Command::new(burn_fp());
        burner.args(["1.5", "chain", &comm]).stdout(Stdio::null());
        let _procs = cg.join_on_spawn(&mut burner);
        let child = burner.spawn().expect("spawn burner");
        let pid = child.id();
        pids.push(pid);
        // SAFETY: plain data filled by wait4.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut status = 0;
        // SAFETY: waits for our own child, writing into our locals.
        let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
        assert_eq!(r, pid as i32, "wait4");
        std::mem::forget(child);
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        cpu_ns += tv(ru.ru_utime) + tv(ru.ru_stime);
    }
    session.finish();
    let folded_text = read(out.path(), "cpu.folded");
    let (total, named) = samples_of(&folded_text, &comm, &["a1", "b1", "c1"]);
    // At the rate the profiler says it sampled at: 499 Hz, or the tick
    // where the kernel's timers are low-resolution (250 Hz in the VMs).
    let txt = read(out.path(), "cpu.txt");
    let want = cpu_ns as f64 * sampled_hz(&txt) / 1e9;
    eprintln!(
        "exited burners {pids:?}: {total} samples ({named} with a1;b1;c1), {want:.0} expected from their CPU time\n{}",
        txt.lines().take(16).collect::<Vec<_>>().join("\n")
    );
    // 9 s of CPU at 499 Hz is about 4,500 samples: 15% covers a busy
    // machine's timer slack.
    let ratio = total as f64 / want;
    let low = match ratio < 0.85
        && relaxed(&format!(
            "{total} samples of the exited burners against {want:.0} from their CPU time: 35% \
             allowed (an emulated vCPU is not run while the other is, and the timer's \
             periods missed meanwhile give no sample; the 6.1 VM: 51%)"
        )) {
        true => 0.35,
        false => 0.85,
    };
    assert!(
        (low..=1.15).contains(&ratio),
        "{total} samples of the exited burners, {want:.0} expected"
    );
    assert_burners_named(&folded_text, &comm, total, named, "exited burners");
    // Those that exited before the 10-s fold are counted under the first.
    // (The last ones exit after it and are shown on their own.)
    let line = txt
        .lines()
        .find(|l| l.contains(&format!("PID {} and ", pids[0])))
        .unwrap_or_else(|| panic!("PID {} not shown with the others folded:\n{txt}", pids[0]));
    assert!(
        line.contains("more exited processes of its cgroup"),
        "{line}"
    );
    // All under their own cgroup: a burner whose first sample came
    // between its fork and its exec (still in the harness's cgroup) was
    // once grouped with the root's processes.
    let in_cgroup: u64 = txt
        .lines()
        .filter(|l| l.contains(&format!("/profiler-test-{comm} ")))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .replace(',', "")
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        in_cgroup as f64 >= 0.98 * total as f64,
        "{in_cgroup} of the burners' {total} samples are under their cgroup:\n{txt}"
    );
    drop(cg);
}

/// System-wide, a process that lives less than the 1-s scan is still
/// named: the kernel tells the agent of each process at its first sample,
/// and the agent reads its mappings (and builds its unwind tables) within
/// 20 ms. Twelve burners of 0.3 s each, one after the other: before the
/// notices, only those alive at a scan were named (about a quarter).
#[test]
fn short_lived_processes_are_named_from_their_first_samples() {
    require_root!();
    let out = TempDir::new("sample-short-procs");
    let comm = format!("pshort{}", std::process::id() % 100_000);
    // Under emulation the agent reads a process's mappings seconds after
    // its first sample, not milliseconds: a 0.3-s burner had exited by then
    // (the 6.12 VM: 29% of their samples unnamed). Short-lived there is
    // ten times as long.
    let (life, session) = match relaxed(
        "burners of 3 s, not 0.3 s: the agent reads mappings seconds late under emulation",
    ) {
        true => ("3", format!("{}s", lifetime(8))),
        false => ("0.3", "8s".to_string()),
    };
    let session = SampleAll::start(out.path(), &session);
    for _ in 0..12 {
        let status = Command::new(burn_fp())
            .args([life, "chain", &comm])
            .stdout(Stdio::null())
            .status()
            .expect("run burner");
        assert!(status.success());
    }
    session.finish();
    let folded_text = read(out.path(), "cpu.folded");
    let (total, named) = samples_of(&folded_text, &comm, &["a1", "b1", "c1"]);
    eprintln!("short-lived burners: {total} samples, {named} named a1;b1;c1");
    // 3.6 s of CPU at 499 Hz is about 1,800 samples; a busy machine gives
    // the burners less CPU, never none.
    assert!(
        total >= 300,
        "{total} samples of the burners:\n{folded_text}"
    );
    assert_burners_named(&folded_text, &comm, total, named, "short-lived burners");
}

/// System-wide, a process whose mappings change after its first sample is
/// read again at once, not at the next scan (nor never, for the names): one
/// that execs after being sampled as python3, and one that `dlopen`s a
/// library after being sampled in its main program. Both live about a
/// second; their samples after the change must be named, with complete
/// stacks (the tables of the new mappings in place within a tick). The
/// Python frames from before the exec must be named too: their code
/// objects are read while Python runs, not at the end.
#[test]
fn new_mappings_of_a_sampled_process_are_read_at_once() {
    require_root!();
    let out = TempDir::new("sample-remapped");
    let comm = format!("pexec{}", std::process::id() % 100_000);
    let lib = build_c(
        "dlopen_lib.c",
        "libburn_late.so",
        &["-O1", "-g", "-fPIC", "-shared"],
    );
    let late = build_c("dlopen_main.c", "dlopen_late", &["-O1", "-g", "-ldl"]);
    // Under emulation Python takes seconds to start (its modules read over
    // 9p): a 5-s session had ended before the burner it execs ran (the 6.1
    // VM: 0 samples after the exec).
    let session = SampleAll::start(out.path(), &format!("{}s", lifetime(8)));
    // The agent's first seconds go to every process already running, each
    // new to it, and their unwind tables: a process that starts and execs
    // meanwhile may exit before its notice is read, its frames unnamed (a
    // loaded machine: 0 of 200 samples named, with the build of 50d47e3
    // too; CI once). What is checked here is a process that starts later,
    // once the agent keeps up.
    std::thread::sleep(std::time::Duration::from_secs(3));
    // Under emulation the agent reads the new mappings seconds after the
    // change (the 6.1 and 6.12 VMs: 6 and 0 of about 700 samples of a
    // 1-s burner complete): ten times as long, and half of the samples.
    // Python's own start takes seconds there too, and outweighed a 0.3-s
    // spin (6.1: 147 of 281 Python samples in it): it spins ten times as
    // long.
    let (burn, share, spin) = match relaxed("the burners after the exec and the dlopen run 10 s, Python spins 3 s, and half of the burners' samples are complete: the agent reads new mappings seconds late under emulation") {
        true => ("10", 0.5, "3"),
        false => ("1", 0.95, "0.3"),
    };
    // Python spins (sampled: the agent reads its mappings), then execs
    // the burner.
    let spin_then_exec = format!(
        "import os, sys, time\n\
         t = time.time()\n\
         while time.time() - t < {spin}: pass\n\
         os.execv(sys.argv[1], sys.argv[1:])"
    );
    let status = Command::new("/usr/bin/python3")
        .args(["-c", &spin_then_exec])
        .arg(burn_fp())
        .args([burn, "chain", &comm])
        .stdout(Stdio::null())
        .status()
        .expect("run python3");
    assert!(status.success());
    // Spins 0.3 s in its own code, then dlopens the library and burns 1 s
    // in it.
    let mut fx = Fixture::spawn(&late, &[lib.to_str().unwrap(), burn, "0.3"]);
    fx.run();
    session.finish();
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    // Samples of `comm` after the change (those with no frame containing
    // one of `before`): how many, and how many have `chain` from `_start`.
    // (Python's own frames: named `Py*`, `py:`, or unnamed in `python3.11`,
    // as its first samples are, before the agent built its tables.)
    // (Samples from before the exec are shown under the name the thread
    // had last, as all its samples are.)
    let count = |comm: &str, before: &[&str], chain: &[&str]| {
        let mine = stacks.iter().filter(|(s, _)| {
            s[0] == comm && !s.iter().any(|f| before.iter().any(|b| f.contains(b)))
        });
        let total: u64 = mine.clone().map(|(_, n)| n).sum();
        let good: u64 = mine
            .filter(|(s, _)| s[1] == "_start" && has_chain(s, chain))
            .map(|(_, n)| n)
            .sum();
        (total, good)
    };
    for (what, (total, good)) in [
        (
            "after exec",
            count(
                &comm,
                &["Py", "py:", "python3"],
                &["main", "a1", "b1", "c1"],
            ),
        ),
        (
            "after dlopen",
            count(
                "dlopen_late",
                &["spin_before_dlopen"],
                &["main", "lib_burn"],
            ),
        ),
    ] {
        eprintln!("{what}: {total} samples, {good} named and complete");
        // 1 s of CPU at 499 Hz is about 500 samples.
        assert!(total >= 100, "{what}: {total} samples:\n{folded_text}");
        assert!(
            good as f64 >= share * total as f64,
            "{what}: only {good} of {total} samples named and complete:\n{folded_text}"
        );
    }
    // Before the exec: the Python frames of the spin loop, named from code
    // objects read while Python ran (its memory went with the exec). Most
    // in the loop, the rest in the interpreter's start or the exec's line.
    // Nearly none unnamed: a module's top-level code object is freed when
    // its import ends, and `site` execs each `.pth` line as code of its
    // own, so a sample there can find its code object gone (or its memory
    // reused) before any reader gets to it, py-spy's too. Those say so
    // (`py:[freed code object]`, `py:[unreadable code object …]`); a few
    // are allowed, in the interpreter's start only.
    let python = |frame: &str| -> u64 {
        stacks
            .iter()
            .filter(|(s, _)| s[0] == comm && s.iter().any(|f| f.starts_with(frame)))
            .map(|(_, n)| n)
            .sum()
    };
    let (with_py, spin, unnamed) = (
        python("py:"),
        python("py:<module> (<string>:3)"),
        python("py:["),
    );
    eprintln!(
        "before exec: {with_py} samples with Python frames, {spin} in the loop, {unnamed} unnamed"
    );
    // 0.3 s at 499 Hz is about 150 samples; the first ones come before the
    // agent found CPython in the process.
    assert!(
        with_py >= 30,
        "{with_py} samples with Python frames:\n{folded_text}"
    );
    assert!(
        unnamed as f64 <= (0.03 * with_py as f64).max(2.0),
        "{unnamed} of {with_py} samples with Python frames unnamed:\n{folded_text}"
    );
    let in_loop_unnamed: u64 = stacks
        .iter()
        .filter(|(s, _)| {
            s[0] == comm
                && s.iter().any(|f| f.starts_with("py:["))
                && s.iter().any(|f| f.starts_with("py:<module> (<string>"))
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        in_loop_unnamed, 0,
        "Python frames unnamed under the script's own code:\n{folded_text}"
    );
    assert!(
        spin as f64 >= 0.8 * with_py as f64,
        "only {spin} of {with_py} in the loop:\n{folded_text}"
    );
}
