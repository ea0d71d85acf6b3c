//! Bad input and missing privileges: exit 1, one `profiler: error:` line that
//! says what is wrong, and nothing left attached (reliability.md #13, #14, #16).
use profiler_tests::*;
use std::os::unix::fs::PermissionsExt;

/// Runs `profiler record --pid <live fixture> extra…` and checks the error.
fn record_error(extra: &[&str], needle: &str, only_line: bool) -> Finished {
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    let mut args = vec!["record", "--pid", &pid, "--duration", "2s"];
    args.extend_from_slice(extra);
    let fin = profiler(&args);
    assert_error(&fin, needle, only_line);
    assert_nothing_attached();
    fin
}

#[test]
fn nonexistent_pid() {
    require_root!();
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(32768);
    let pid = (2..max)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
    let pid = pid.expect("a free PID").to_string();
    let out = TempDir::new("nopid");
    let o = out.path().to_str().unwrap();
    let fin = profiler(&[
        "record",
        "--pid",
        &pid,
        "--func",
        "*",
        "--out",
        o,
        "--duration",
        "1s",
    ]);
    assert_error(&fin, "no process with PID", true);
    let fin = profiler(&["list", "--pid", &pid, "--func", "*"]);
    assert_error(&fin, "no process with PID", true);
    assert_nothing_attached();
}

#[test]
fn not_root() {
    require_root!();
    let out = TempDir::new("nobody");
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    let o = out.path().to_str().unwrap();
    let wrapper = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let args = [
        "record",
        "--pid",
        &pid,
        "--func",
        "tree_*",
        "--out",
        o,
        "--duration",
        "2s",
    ];
    let fin = profiler_wrapped(&wrapper, &args);
    assert_error(&fin, "sudo", true);
    let line = &fin.stderr[0];
    let caps = ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"];
    assert!(
        caps.iter().any(|c| line.contains(c)),
        "no capability named in {line:?}"
    );
    assert_nothing_attached();
}

#[test]
fn missing_cap_sys_admin() {
    require_root!();
    let out = TempDir::new("nocap");
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    let o = out.path().to_str().unwrap();
    let wrapper = [
        "setpriv",
        "--bounding-set",
        "-sys_admin",
        "--inh-caps=-sys_admin",
    ];
    let args = [
        "record",
        "--pid",
        &pid,
        "--func",
        "tree_*",
        "--out",
        o,
        "--duration",
        "2s",
    ];
    let fin = profiler_wrapped(&wrapper, &args);
    assert_error(&fin, "CAP_SYS_ADMIN", true);
    assert_nothing_attached();
}

#[test]
fn no_function_matches() {
    require_root!();
    let out = TempDir::new("nomatch");
    let o = out.path().to_str().unwrap();
    record_error(
        &["--func", "no_such_function_*", "--out", o],
        "no function matches",
        true,
    );
    record_error(
        &["--func", "tree_*", "--exclude", "tree*", "--out", o],
        "no function matches",
        true,
    );
}

#[test]
fn bad_pattern() {
    require_root!();
    let out = TempDir::new("badpat");
    let o = out.path().to_str().unwrap();
    record_error(&["--func", "a[b", "--out", o], "bad pattern", true);
    record_error(
        &["--func", "tree_*", "--exclude", "a[b", "--out", o],
        "bad pattern",
        true,
    );
}

/// A bad `--ring-size` is rejected by the argument parser (clap's usage
/// error: exit 2, `error: invalid value …`), so only a non-zero exit and a
/// message naming the rule are required here.
#[test]
fn bad_ring_size() {
    require_root!();
    let out = TempDir::new("badring");
    let o = out.path().to_str().unwrap();
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let pid = fx.pid.to_string();
    for size in ["5000", "2048", "3K"] {
        let args = [
            "record",
            "--pid",
            &pid,
            "--func",
            "tree_*",
            "--ring-size",
            size,
            "--out",
            o,
        ];
        let fin = profiler(&args);
        assert!(
            !fin.status.success(),
            "--ring-size {size} accepted: {fin:?}"
        );
        assert!(
            !fin.stderr.iter().any(|l| l.contains("attached")),
            "{size}: attached"
        );
        let text = fin.stderr.join("\n");
        assert!(text.contains("power of two"), "--ring-size {size}: {text}");
        assert_nothing_attached();
    }
}

#[test]
fn non_elf_library() {
    require_root!();
    let out = TempDir::new("nonelf");
    let o = out.path().to_str().unwrap();
    record_error(
        &["--func", "*", "--lib", "/etc/hostname", "--out", o],
        "/etc/hostname",
        true,
    );
}

#[test]
fn output_not_writable() {
    require_root!();
    record_error(
        &["--func", "tree_*", "--out", "/proc/1/nope"],
        "cannot write",
        true,
    );
    let tmp = TempDir::new("unwritable");
    std::fs::write(tmp.join("file"), "x").unwrap();
    let sub = tmp.join("file").join("sub");
    record_error(
        &["--func", "tree_*", "--out", sub.to_str().unwrap()],
        "cannot write",
        true,
    );
}

#[test]
fn output_dir_is_symlink() {
    require_root!();
    let tmp = TempDir::new("symdir");
    let target = tmp.join("victim");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    record_error(
        &["--func", "tree_*", "--out", link.to_str().unwrap()],
        "symlink",
        true,
    );
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        0,
        "link target was written"
    );
}

#[test]
fn output_file_is_symlink() {
    require_root!();
    let tmp = TempDir::new("symfile");
    let victim = tmp.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let out = tmp.join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("report.txt")).unwrap();
    // Refusing before attaching or when writing are both fine: a planted
    // link can appear mid-recording, so only one error line is required.
    record_error(
        &["--func", "tree_*", "--out", out.to_str().unwrap()],
        "symlink",
        false,
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "link target changed"
    );
}

#[test]
fn kernel_thread_is_named_as_such() {
    require_root!();
    let out = TempDir::new("kthread");
    let o = out.path().to_str().unwrap();
    // PID 2 is kthreadd on Linux.
    let fin = profiler(&["record", "--pid", "2", "--out", o, "--duration", "1s"]);
    assert_error(&fin, "PID 2 is a kernel thread (kthreadd)", true);
    assert_nothing_attached();
}

#[test]
fn zero_max_funcs_is_refused_by_name() {
    let fin = profiler(&["record", "--pid", "2", "--max-funcs", "0"]);
    assert_eq!(fin.status.code(), Some(2), "{fin:?}");
    assert_eq!(fin.stderr.len(), 1, "{fin:?}");
    assert!(
        fin.stderr[0].starts_with("profiler: error: ")
            && fin.stderr[0].contains("--max-funcs 0 would probe nothing"),
        "{fin:?}"
    );
}
