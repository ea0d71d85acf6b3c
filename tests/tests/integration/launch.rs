//! Launch mode (`profiler record … -- COMMAND`): probes live before the
//! command's first instruction, its exit status passed through, the command
//! run as the sudo user, startup timing split at `main`, and bad input.
use profiler_tests::*;
use std::os::unix::fs::MetadataExt;

/// `profiler record --out OUT extra… -- stages 0` (no post-run sleep).
fn launch(out: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(profiler_bin());
    cmd.arg("record")
        .arg("--out")
        .arg(out)
        .args(extra)
        .arg("--")
        .arg(stages_exe())
        .arg("0");
    cmd
}

/// A `startup.json` time of the single launch.
fn per_launch(json: &serde_json::Value, key: &str) -> u64 {
    num(&json["per_launch"][0], key)
}

#[test]
fn first_call_counted_exit_status_and_startup() {
    require_root!();
    let out = TempDir::new("launch");
    let before = prof_prog_ids();
    let fin = Recording::spawn(launch(
        out.path(),
        &[
            "--func",
            "first_thing",
            "--ready",
            "app_ready",
            "--startup-threshold",
            "1ms",
        ],
    ))
    .wait();
    assert_none_left_since(&before, &[]);
    assert_eq!(
        fin.status.code(),
        Some(3),
        "the profiler exits with the command's status 3; stderr {:?}",
        fin.stderr
    );
    let truth = truth_line(&fin.stdout);
    let o = Outputs::load(out.path());
    assert_eq!(
        o.sum("first_thing", "calls"),
        1,
        "first_thing runs once at the very start of main: probes must be live before it"
    );
    assert_eq!(o.json["stop_reason"], "target exited", "stop_reason");
    assert_eq!(
        o.json["exe"].as_str(),
        stages_exe().to_str(),
        "exe is the launched binary"
    );

    // startup.txt: exec -> main -> ready (entry of app_ready).
    let text = read(out.path(), "startup.txt");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Startup: ")
            && first.ends_with(" from exec to ready (entry of app_ready)"),
        "startup.txt first line: {first:?}\n{text}"
    );
    let exec_main = text
        .lines()
        .position(|l| l.trim_start().starts_with("exec to main:"));
    let main_ready = text
        .lines()
        .position(|l| l.trim_start().starts_with("main to ready:"));
    assert!(
        matches!((exec_main, main_ready), (Some(a), Some(b)) if a < b),
        "startup.txt should show `exec to main:` then `main to ready:`:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("SLOW STARTUP: ") && l.contains("(threshold 1.00 ms)")),
        "--startup-threshold 1ms should add a SLOW STARTUP line:\n{text}"
    );
    assert!(
        fin.stderr.iter().any(|l| l.contains("slow startup")),
        "no `slow startup` on stderr: {:?}",
        fin.stderr
    );

    // startup.json: the split adds up, and main -> ready is the fixture's
    // 20 ms sleep (within 5 ms) as the fixture measured it.
    let json = read_json(out.path(), "startup.json");
    assert_eq!(json["launches"], 1, "launches: {json}");
    assert_eq!(json["not_ready"], 0, "not_ready: {json}");
    let total = per_launch(&json, "exec_to_ready_ns");
    let pre = per_launch(&json, "pre_main_ns");
    let main_ready_ns = per_launch(&json, "main_to_ready_ns");
    assert!(pre > 0, "exec to main must be measured separately: {json}");
    assert!(
        (pre + main_ready_ns).abs_diff(total) <= 1_000,
        "exec_to_ready {total} != pre_main {pre} + main_to_ready {main_ready_ns}"
    );
    let want = num(&truth, "main_to_ready_ns");
    // Under emulation the first probe hits map the out-of-line page and
    // translate code (18-46 ms in the VMs), and the fixture's own work
    // takes longer than its 20 ms sleep.
    let (tol, sleep) = match relaxed(
        "main to ready within 60 ms of the fixture's clock, not 5 ms, and not compared with the 20-ms sleep",
    ) {
        true => (60_000_000, None),
        false => (5_000_000, Some(("the 20 ms sleep", 20_000_000))),
    };
    assert!(
        main_ready_ns.abs_diff(want) <= tol,
        "main to ready {main_ready_ns} ns vs the fixture's own measurement {want} ns (tolerance {tol} ns)"
    );
    // The sleep is a floor only: on a busy host it overslept by 5 ms (CI,
    // with the fixture's clock agreeing with the profiler).
    if let Some((what, w)) = sleep {
        assert!(
            main_ready_ns + tol >= w,
            "main to ready {main_ready_ns} ns is shorter than {what} {w} ns (tolerance {tol} ns)"
        );
    }
    // The startup window's flame graph holds the calls completed before ready.
    let folded = read(out.path(), "startup.folded");
    assert!(
        folded.lines().any(|l| l.contains("first_thing")),
        "startup.folded lacks first_thing:\n{folded}"
    );
    let svg = read(out.path(), "startup.svg");
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(&svg, opts).expect("startup.svg is XML");
}

#[test]
fn runs_as_sudo_user_and_chowns_outputs() {
    require_root!();
    let out = TempDir::new("launch-sudo");
    let before = prof_prog_ids();
    let mut cmd = launch(
        out.path(),
        &["--ready", "app_ready", "--startup-threshold", "10s"],
    );
    cmd.env("SUDO_UID", "65534").env("SUDO_GID", "65534");
    let fin = Recording::spawn(cmd).wait();
    assert_none_left_since(&before, &[]);
    assert_eq!(
        fin.status.code(),
        Some(3),
        "exit status; stderr {:?}",
        fin.stderr
    );
    assert!(
        fin.stdout.lines().any(|l| l == "euid 65534"),
        "the command should run as SUDO_UID 65534; its output:\n{}",
        fin.stdout
    );
    for name in [
        "functions.json",
        "startup.txt",
        "startup.json",
        "report.txt",
    ] {
        let md = std::fs::metadata(out.join(name)).expect(name);
        assert_eq!((md.uid(), md.gid()), (65534, 65534), "owner of {name}");
    }
    let text = read(out.path(), "startup.txt");
    assert!(
        !text.contains("SLOW STARTUP"),
        "a 10 s threshold is not crossed:\n{text}"
    );
}

#[test]
fn pid_and_command_conflict() {
    require_root!();
    let out = TempDir::new("launch-conflict");
    let o = out.path().to_str().unwrap();
    let fin = profiler(&["record", "--pid", "2", "--out", o, "--", "ls"]);
    assert_error(&fin, "give one or the other", true);
    let fin = profiler(&["record", "--pid-of", "init", "--out", o, "--", "ls"]);
    assert_error(&fin, "give one or the other", true);
    assert!(
        std::fs::read_dir(out.path()).unwrap().next().is_none(),
        "nothing written to --out"
    );
}

#[test]
fn missing_command_is_one_error() {
    require_root!();
    let out = TempDir::new("launch-missing");
    let before = prof_prog_ids();
    let o = out.path().to_str().unwrap();
    let fin = profiler(&[
        "record",
        "--out",
        o,
        "--func",
        "main",
        "--",
        "/nonexistent/prog",
    ]);
    assert_error(&fin, "/nonexistent/prog", false);
    assert_none_left_since(&before, &[]);
}

/// How long the profiler gives a command to exit after SIGTERM (launch.rs's
/// `STOP_GRACE`).
const GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Under emulation, more time for a session's outputs (symbols read and
/// files written: 3-8 s more in the 6.1 and 6.12 VMs); none on the host.
fn outputs_slack() -> std::time::Duration {
    match relaxed("a session's outputs may take 15 s more after its stop") {
        true => std::time::Duration::from_secs(15),
        false => std::time::Duration::ZERO,
    }
}

/// How long a launched profiler may take to attach, or to exit: 30 s, or
/// 120 s under emulation (its programs verified and its calibration run
/// ten times slower, beside a second VM).
fn patience() -> std::time::Duration {
    std::time::Duration::from_secs(if emulated() { 120 } else { 30 })
}

/// Writes an executable script `name` with `text` into `dir`.
fn script(dir: &TempDir, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// `profiler record --out OUT extra… -- command…`.
fn launch_cmd(
    out: &std::path::Path,
    extra: &[&str],
    command: &[&std::ffi::OsStr],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(profiler_bin());
    cmd.arg("record")
        .arg("--out")
        .arg(out)
        .args(extra)
        .arg("--")
        .args(command);
    cmd
}

/// The PID in a stderr line `…NAME (PID N)…`.
fn pid_in(line: &str) -> u32 {
    let at = line.find("(PID ").expect("a PID") + 5;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no PID in {line:?}"))
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not reaped yet) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// The per-function counts the stages fixture makes by itself: exact.
fn assert_stage_counts(o: &Outputs) {
    for (f, n) in [("first_thing", 1), ("open_document", 5), ("load_file", 5)] {
        assert_eq!(o.sum(f, "calls"), n, "{f} calls");
    }
}

/// The dispatcher and report name the watched thread as the program.
fn assert_thread_named(out: &std::path::Path, name: &str) {
    let d = read_json(out, "dispatches.json");
    assert_eq!(
        d["thread"]["name"], name,
        "dispatches.json thread: {}",
        d["thread"]
    );
    assert_eq!(d["dispatches"], 5, "one dispatch per open_document");
    let text = read(out, "dispatches.txt");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!("({name}): 5 in")),
        "dispatches.txt: {first:?}"
    );
    let html = read(out, "report.html");
    assert!(
        html.contains(&format!(r#""thread":{{"name":"{name}""#)),
        "report.html names the thread {name}"
    );
}

const STAGE_FUNCS: &[&str] = &[
    "--func",
    "first_thing",
    "--func",
    "open_document",
    "--func",
    "load_file",
    "--dispatch",
    "open_document",
    "--threshold",
    "1ms",
];

#[test]
fn duration_stops_a_command_that_would_keep_running() {
    require_root!();
    let out = TempDir::new("launch-duration");
    let before = prof_prog_ids();
    // The fixture's runs take 0.3 s; then it sleeps 10 minutes, a server
    // that never exits by itself.
    let mut extra = STAGE_FUNCS.to_vec();
    extra.extend(["--duration", "2s"]);
    let stages = stages_exe().as_os_str();
    let rec = Recording::spawn(launch_cmd(out.path(), &extra, &[stages, "600000".as_ref()]));
    let t0 = std::time::Instant::now();
    let fin = rec.wait();
    let took = t0.elapsed();
    assert_none_left_since(&before, &[]);
    assert_eq!(
        fin.status.code(),
        Some(0),
        "stopped at --duration, as asked: exit 0; stderr {:?}",
        fin.stderr
    );
    let stopping = fin.stderr_line("profiler: stopping stages (PID ");
    assert!(
        stopping.ends_with("): SIGTERM; SIGKILL in 3 s if it does not exit"),
        "{stopping:?}"
    );
    let pid = pid_in(stopping);
    assert!(
        fin.stderr
            .iter()
            .any(|l| l == &format!("profiler: stages (PID {pid}) was killed by SIGTERM")),
        "{:?}",
        fin.stderr
    );
    assert!(!alive(pid), "PID {pid} still runs");
    assert!(
        !fin.stderr.iter().any(|l| l.contains("waiting for")),
        "{:?}",
        fin.stderr
    );
    // From the attach: the 2 s, the stop (at once: SIGTERM kills it) and
    // the outputs; never the grace period on top.
    assert!(
        took >= std::time::Duration::from_secs(2)
            && took < std::time::Duration::from_secs(2) + GRACE + outputs_slack(),
        "the session took {took:?} after attaching"
    );
    let o = Outputs::load(out.path());
    assert_eq!(o.json["stop_reason"], "duration");
    assert_stage_counts(&o);
    assert_thread_named(out.path(), "stages");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    require_root!();
    let out = TempDir::new("launch-sigkill");
    let dir = TempDir::new("launch-sigkill-script");
    // SIG_IGN survives exec: the fixture ignores SIGTERM.
    let s = script(
        &dir,
        "stubborn",
        &format!(
            "#!/bin/sh\ntrap '' TERM\nexec {} \"$@\"\n",
            stages_exe().display()
        ),
    );
    let before = prof_prog_ids();
    let mut extra = STAGE_FUNCS.to_vec();
    extra.extend(["--duration", "1s"]);
    let rec = Recording::spawn(launch_cmd(
        out.path(),
        &extra,
        &[s.as_os_str(), "600000".as_ref()],
    ));
    let t0 = std::time::Instant::now();
    let fin = rec.wait();
    let took = t0.elapsed();
    assert_none_left_since(&before, &[]);
    assert_eq!(fin.status.code(), Some(0), "stderr {:?}", fin.stderr);
    let pid = pid_in(fin.stderr_line("profiler: stopping stages (PID "));
    for want in [
        format!("profiler: stages (PID {pid}) did not exit within 3 s: SIGKILL"),
        format!("profiler: stages (PID {pid}) was killed by SIGKILL"),
    ] {
        assert!(
            fin.stderr.contains(&want),
            "no {want:?} in {:?}",
            fin.stderr
        );
    }
    assert!(!alive(pid), "PID {pid} still runs");
    let secs = std::time::Duration::from_secs;
    assert!(
        took >= secs(1) + GRACE && took < secs(1) + GRACE + secs(2) + outputs_slack(),
        "the session took {took:?} after attaching: 1 s, the 3 s grace, the outputs"
    );
    let o = Outputs::load(out.path());
    assert_stage_counts(&o);
}

#[test]
fn keep_running_leaves_the_command_running_with_nothing_attached() {
    require_root!();
    let out = TempDir::new("launch-keep");
    let before = prof_prog_ids();
    let mut extra = STAGE_FUNCS.to_vec();
    extra.extend(["--duration", "1s", "--keep-running"]);
    let mut cmd = launch_cmd(
        out.path(),
        &extra,
        &[stages_exe().as_os_str(), "600000".as_ref()],
    );
    // Files, not pipes: the command keeps the profiler's stdout and stderr
    // open after the profiler exits.
    let (so, se) = (
        out.join("../launch-keep.stdout"),
        out.join("../launch-keep.stderr"),
    );
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap());
    let mut prof = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + patience();
    let status = loop {
        if let Some(s) = prof.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the profiler did not exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&se).unwrap();
    let _ = std::fs::remove_file(&se);
    let _ = std::fs::remove_file(&so);
    let left = stderr
        .lines()
        .find(|l| l.starts_with("profiler: left stages (PID "))
        .unwrap_or_else(|| panic!("no `left … running` line:\n{stderr}"));
    let pid = pid_in(left);
    let kill = || {
        // SAFETY: kill(2) of the fixture this test launched.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    };
    let checks = std::panic::catch_unwind(|| {
        assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
        assert!(
            left.ends_with("running, every probe removed (--keep-running)"),
            "{left:?}"
        );
        assert!(!stderr.contains("stopping"), "{stderr}");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(alive(pid), "PID {pid} should still run");
        // Nothing of the profiler on it: its text equals the ELF (no
        // uprobe left) and it holds no BPF descriptor.
        assert_text_unchanged(pid, stages_exe());
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            let link = std::fs::read_link(fd.path()).unwrap_or_default();
            assert!(
                !link.to_string_lossy().contains("bpf"),
                "PID {pid} holds {}",
                link.display()
            );
        }
        assert_none_left_since(&before, &[]);
        let o = Outputs::load(out.path());
        assert_stage_counts(&o);
        assert_thread_named(out.path(), "stages");
    });
    kill();
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive(pid) && std::time::Instant::now() < gone {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if let Err(e) = checks {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_script_is_followed_to_the_program_it_execs() {
    require_root!();
    let out = TempDir::new("launch-script");
    let dir = TempDir::new("launch-script-chain");
    // Like a pyenv shim: `env sh` runs a script that execs another script,
    // which execs the program.
    let inner = script(
        &dir,
        "inner",
        &format!("#!/bin/sh\nexec {} \"$@\"\n", stages_exe().display()),
    );
    let outer = script(
        &dir,
        "outer",
        &format!("#!/usr/bin/env sh\nexec {} \"$@\"\n", inner.display()),
    );
    let before = prof_prog_ids();
    let fin = Recording::spawn(launch_cmd(
        out.path(),
        STAGE_FUNCS,
        &[outer.as_os_str(), "0".as_ref()],
    ))
    .wait();
    assert_none_left_since(&before, &[]);
    assert_eq!(
        fin.status.code(),
        Some(3),
        "the program's own exit status 3; stderr {:?}",
        fin.stderr
    );
    let followed = fin.stderr_line("profiler: followed ");
    let stages = stages_exe().canonicalize().unwrap();
    assert!(
        followed.contains(&format!(
            " through its execs to {} (passing ",
            stages.display()
        )),
        "{followed:?}"
    );
    let o = Outputs::load(out.path());
    assert_eq!(
        o.json["exe"].as_str(),
        stages.to_str(),
        "the program is probed"
    );
    // first_thing is the program's first call: probes live before it.
    assert_stage_counts(&o);
    assert_eq!(o.json["stop_reason"], "target exited");
    assert_thread_named(out.path(), "stages");
}

#[test]
fn a_pyenv_shim_is_followed_to_python() {
    require_root!();
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let shim = std::path::Path::new(&home).join(".pyenv/shims/python3");
    if !shim.exists() {
        println!(
            "SKIP a_pyenv_shim_is_followed_to_python: no {}",
            shim.display()
        );
        return;
    }
    let out = TempDir::new("launch-pyenv");
    let before = prof_prog_ids();
    let fin = Recording::spawn(launch_cmd(
        out.path(),
        &["--func", "main"],
        &[
            shim.as_os_str(),
            "-c".as_ref(),
            "import sys; sys.exit(5)".as_ref(),
        ],
    ))
    .wait();
    assert_none_left_since(&before, &[]);
    assert_eq!(
        fin.status.code(),
        Some(5),
        "python's status; stderr {:?}",
        fin.stderr
    );
    let o = Outputs::load(out.path());
    let exe = o.json["exe"].as_str().unwrap_or_default();
    assert!(
        exe.contains("/.pyenv/versions/") && !exe.contains("/shims/"),
        "the interpreter pyenv chose is probed, not the shim: {exe}"
    );
    // Entered once, from its start. pyenv's python's `main` tail-calls
    // `Py_BytesMain`, which exits the process: seen returning at its tail
    // jump with return sites, unfinished with a return uprobe (the plain
    // C default), which fires only when the callee returns.
    assert_eq!(
        o.sum("main", "calls") + o.sum("main", "unfinished"),
        1,
        "python's main, from its start"
    );
    let d = read_json(out.path(), "dispatches.json");
    assert_eq!(d["thread"]["name"], "python3", "{}", d["thread"]);
}

/// Runs `cmd` as the session leader of a new terminal (a pty), presses
/// Ctrl-C on it once `attached` is printed, and returns the exit status and
/// everything the terminal showed.
fn ctrl_c_on_a_terminal(mut cmd: std::process::Command) -> (std::process::ExitStatus, String) {
    use std::io::{Read, Write};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills in two new descriptors; no name, termios or size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just made and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for set in [0, 1, 2] {
        let fd = slave.try_clone().unwrap();
        match set {
            0 => cmd.stdin(fd),
            1 => cmd.stdout(fd),
            _ => cmd.stderr(fd),
        };
    }
    // SAFETY: setsid, ioctl and signal are async-signal-safe; the new
    // session's controlling terminal is the pty on stdin, its foreground
    // group ours. SIGINT back to its default, as a login shell's terminal
    // gives it: a shell's background job (`cargo xtask test &`) ignores it,
    // and the profiler rightly passes an ignored SIGINT on to the command.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let mut writer = std::fs::File::from(master.try_clone().unwrap());
    let shown = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = shown.clone();
    std::thread::spawn(move || {
        let mut r = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        // EIO once every holder of the terminal has exited.
        while let Ok(n @ 1..) = r.read(&mut buf) {
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let text = || String::from_utf8_lossy(&shown.lock().unwrap()).into_owned();
    let deadline = std::time::Instant::now() + patience();
    while !text().contains("attached") {
        assert!(
            std::time::Instant::now() < deadline,
            "never attached:\n{}",
            text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    writer.write_all(b"\x03").unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the profiler did not exit after Ctrl-C:\n{}", text());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    (status, text())
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_and_is_not_sent_again() {
    require_root!();
    // The command dies of the terminal's SIGINT by itself: its status is
    // passed on, nothing else is sent to it.
    let out = TempDir::new("launch-ctrl-c");
    let before = prof_prog_ids();
    let (status, shown) = ctrl_c_on_a_terminal(launch_cmd(
        out.path(),
        STAGE_FUNCS,
        &[stages_exe().as_os_str(), "600000".as_ref()],
    ));
    assert_none_left_since(&before, &[]);
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{shown}");
    assert!(
        !shown.contains("profiler: stopping") && !shown.contains("SIGKILL"),
        "the command got the terminal's SIGINT, nothing more:\n{shown}"
    );
    assert_stage_counts(&Outputs::load(out.path()));

    // A command that ignores SIGINT gets SIGKILL 3 s later (no SIGTERM: it
    // was asked to stop once already).
    let out = TempDir::new("launch-ctrl-c-ignored");
    let dir = TempDir::new("launch-ctrl-c-script");
    let s = script(
        &dir,
        "deaf",
        &format!(
            "#!/bin/sh\ntrap '' INT\nexec {} \"$@\"\n",
            stages_exe().display()
        ),
    );
    let t0 = std::time::Instant::now();
    let (status, shown) = ctrl_c_on_a_terminal(launch_cmd(
        out.path(),
        STAGE_FUNCS,
        &[s.as_os_str(), "600000".as_ref()],
    ));
    assert_none_left_since(&before, &[]);
    assert!(t0.elapsed() >= GRACE, "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(128 + libc::SIGKILL), "{shown}");
    for want in [
        "got the terminal's SIGINT too; SIGKILL in 3 s if it does not exit",
        "did not exit within 3 s: SIGKILL",
    ] {
        assert!(shown.contains(want), "no {want:?} in:\n{shown}");
    }
    assert!(!shown.contains("SIGTERM"), "{shown}");
    assert_stage_counts(&Outputs::load(out.path()));
}
