//! Input (rows 15, 30): bad values refused before anything is attached;
//! a verifier rejection, provoked with a program every kernel refuses.
use super::*;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;

/// Runs the profiler with `args` and asserts a one-line `profiler: error:`
/// naming `needle`, a non-zero exit, and nothing loaded.
fn refused(args: &[OsString], needle: &str) {
    let teardown = Teardown::begin();
    let out = Command::new(profiler_bin())
        .args(args)
        .output()
        .expect("run profiler");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!out.status.success(), "{args:?} accepted: {stderr}");
    assert_eq!(lines.len(), 1, "{args:?}: one line: {stderr}");
    assert!(
        lines[0].starts_with("profiler: error: ") && lines[0].contains(needle),
        "{args:?}: {:?} should name {needle:?}",
        lines[0]
    );
    teardown.check(&[], None);
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Row 30: zero, negative and huge numbers, `--hz 0`, a non-UTF-8 pattern,
/// the agent's own PID, PID 1 and a kernel thread: one error line each,
/// before anything is attached.
#[test]
fn row30_bad_values_are_refused_before_attaching() {
    require_root!();
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    let tmp = TempDir::new("row30");
    let o = tmp.path().to_str().unwrap();
    let rec = |extra: &[&str]| {
        let mut v = vec!["record", "--pid", &pid, "-f", "tree_*", "--out", o];
        v.extend_from_slice(extra);
        os(&v)
    };
    let cases: Vec<(Vec<OsString>, &str)> = vec![
        (os(&["record", "--pid", "0", "--out", o]), "not a PID"),
        (os(&["record", "--pid=-5", "--out", o]), "not a PID"),
        (
            os(&["record", "--pid", "99999999999", "--out", o]),
            "not a PID",
        ),
        (os(&["record", "--pid", "1", "--out", o]), "PID 1 is init"),
        (os(&["record", "--pid", "2", "--out", o]), "kernel thread"),
        (rec(&["--duration", "0"]), "duration"),
        (rec(&["--duration=-1s"]), "duration"),
        (rec(&["--duration", "99999999999999999999h"]), "duration"),
        (rec(&["--threshold", "99999999999999999999h"]), "duration"),
        (rec(&["--ring-size", "0"]), "power of two"),
        (rec(&["--ring-size", "64G"]), "power of two"),
        (rec(&["--data-limit", "99999999999G"]), "size"),
        (rec(&["--max-funcs", "0"]), "--max-funcs 0"),
        (rec(&["--sample", "0"]), "--hz 0"),
        (
            os(&["sample", "--pid", &pid, "--hz", "0", "--out", o]),
            "--hz 0",
        ),
        (
            os(&["sample", "--pid", &pid, "--hz", "1000000000", "--out", o]),
            "out of range",
        ),
    ];
    for (args, needle) in &cases {
        refused(args, needle);
    }
    // A pattern that is not UTF-8.
    let mut bad = rec(&[]);
    bad.extend([
        OsString::from("-f"),
        OsString::from_vec(b"tree_\xff*".to_vec()),
    ]);
    refused(&bad, "UTF-8");
    // The agent's own PID: the shell's PID becomes the profiler's at exec.
    let teardown = Teardown::begin();
    let line = format!(
        "exec {} record --pid $$ -f '*' --out {o} --duration 1s",
        profiler_bin().display()
    );
    let own = Command::new("sh").args(["-c", &line]).output().unwrap();
    let stderr = String::from_utf8_lossy(&own.stderr);
    assert!(!own.status.success(), "own PID accepted: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("this profiler itself"), "{stderr}");
    teardown.check(&[], None);
    assert!(
        std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "nothing written to --out"
    );
}

/// Row 15: a verifier rejection is one line naming the program and the
/// verifier's reason, followed by the verifier's log's last lines, and
/// `profiler check --verbose` shows the verifier's log. The shipped
/// programs pass the verifier (Debian's 6.1 refused one before 64331bc:
/// KERNELS.md), so the test provokes one: `PROFILER_TEST_REFUSED` makes the
/// agent load `prof_test_refused` too, a program that reads past its
/// context, which every kernel's verifier refuses.
#[test]
fn row15_verifier_rejection_shows_the_log() {
    require_root!();
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    let tmp = TempDir::new("row15");
    let o = tmp.path().to_str().unwrap();
    let needle = "refused the eBPF program prof_test_refused";
    for args in [
        vec!["record", "--pid", &pid, "-f", "tree_*", "--out", o],
        vec!["sample", "--pid", &pid, "--duration", "1s", "--out", o],
    ] {
        let teardown = Teardown::begin();
        let out = Command::new(profiler_bin())
            .args(&args)
            .env("PROFILER_TEST_REFUSED", "1")
            .output()
            .expect("run profiler");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} went on: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(
            lines[0].starts_with("profiler: error: ")
                && lines[0].contains(needle)
                && lines[0].contains("invalid bpf_context access"),
            "{args:?}: {:?} names the program and the verifier's reason",
            lines[0]
        );
        // Then the log's tail, each line marked as the verifier's.
        assert!(
            lines.len() > 1 && lines.len() <= 21,
            "{args:?}: the log's last lines: {stderr}"
        );
        assert!(
            lines[1..].iter().all(|l| l.starts_with("  verifier: ")),
            "{stderr}"
        );
        assert!(
            lines[1..]
                .iter()
                .any(|l| l.contains("invalid bpf_context access")),
            "{stderr}"
        );
        teardown.check(&[], None);
    }
    assert!(
        std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "nothing written to --out"
    );
    assert!(fx.alive(), "the target was left running");
    // `profiler check --verbose`: the program refused, with the log.
    let check = Command::new(profiler_bin())
        .args(["check", "--verbose"])
        .env("PROFILER_TEST_REFUSED", "1")
        .output()
        .expect("run profiler check");
    let text = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(
        text.lines()
            .any(|l| l.contains("prof_test_refused") && l.contains("refused by the verifier")),
        "check names the refused program: {text}"
    );
    assert!(
        text.contains("invalid bpf_context access"),
        "check --verbose prints the verifier's log: {text}"
    );
    // Without the variable the program is not there at all.
    let plain = Command::new(profiler_bin())
        .args(["check", "--verbose"])
        .output()
        .expect("run profiler check");
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("prof_test_refused"),
        "check without the variable lists the test program"
    );
}
