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
    for (what, w) in [
        ("fixture's own measurement", want),
        ("the 20 ms sleep", 20_000_000),
    ] {
        assert!(
            main_ready_ns.abs_diff(w) <= 5_000_000,
            "main to ready {main_ready_ns} ns vs {what} {w} ns (tolerance 5 ms)"
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
