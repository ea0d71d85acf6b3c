//! A target in its own PID and mount namespaces (`unshare --pid --mount
//! --fork`), attached by its host PID, whose binaries exist only in its
//! own mount namespace: a tmpfs mounted there over an empty host directory,
//! the host copies deleted before attaching. The profiler reads them
//! through `/proc/PID/exe` and `/proc/PID/root`.
use profiler_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Starts `files` (copied into a tmpfs mounted, in a new PID and mount
/// namespace, over the empty directory `mnt`) by running `mnt/<run>`, and
/// deletes the host copies once it is ready. Returns the fixture (by host
/// PID) and the path it runs from, which does not exist here.
fn in_container(files: &[&Path], mnt: &TempDir, run: &str) -> (Fixture, PathBuf) {
    let stage = TempDir::new("ct-stage");
    let mut script = format!("mount -t tmpfs none {0} && ", mnt.path().display());
    for f in files {
        let copy = stage.join(f.file_name().unwrap().to_str().unwrap());
        std::fs::copy(f, &copy).unwrap();
        script.push_str(&format!(
            "cp {} {}/ && ",
            copy.display(),
            mnt.path().display()
        ));
    }
    let inside = mnt.join(run.split(' ').next().unwrap());
    script.push_str(&format!("exec {}/{run}", mnt.path().display()));
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--mount",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]);
    let fx = Fixture::spawn_cmd(cmd, &inside);
    drop(stage);
    assert!(!inside.exists(), "{} is visible here", inside.display());
    let nspid = std::fs::read_to_string(format!("/proc/{}/status", fx.pid)).unwrap();
    assert!(
        nspid
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "not PID 1 of a new namespace: {nspid}"
    );
    (fx, inside)
}

#[test]
fn target_in_its_own_pid_and_mount_namespace_is_traced_exactly() {
    require_root!();
    let mnt = TempDir::new("ct-root");
    let (mut fx, inside) = in_container(&[calls_exe()], &mnt, "calls tree");
    let out = TempDir::new("ct-out");
    let before = prof_prog_ids();
    let rec = Recording::start(fx.pid, out.path(), &["--func", "tree_*"]);
    let rec_pid = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[rec_pid]);
    fx.release();
    let o = Outputs::load(out.path());
    o.assert_matches_truth(&truth, false);
    assert_eq!(
        o.json["exe"].as_str().map(Path::new),
        Some(inside.as_path()),
        "the executable as the target sees it"
    );
}

#[test]
fn library_only_in_the_container_is_probed_before_its_dlopen() {
    require_root!();
    let (main, lib) = plugin_exes();
    let mnt = TempDir::new("ct-root");
    let (mut fx, _) = in_container(
        &[main.as_path(), lib.as_path()],
        &mnt,
        "plugin_main libplugin_fx.so 500",
    );
    let out = TempDir::new("ct-plugin");
    let before = prof_prog_ids();
    // By name: found through plugin_main's RUNPATH=$ORIGIN, inside the
    // target's root (/proc/PID/root), not mapped yet.
    let rec = Recording::start(
        fx.pid,
        out.path(),
        // The governor is off: 1,000 calls in a tight loop, each a
        // single-stepped entry (its endbr64) here, are over its 10% and it
        // would detach plugin_fn part way (805 of 1,000 counted), which is
        // not what this test is about.
        &[
            "--lib",
            "libplugin_fx.so",
            "-f",
            "plugin_fn",
            "--max-overhead",
            "0",
        ],
    );
    let rec_pid = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[rec_pid]);
    fx.release();
    assert_eq!(num(&truth, "plugin_fn"), 1000);
    let o = Outputs::load(out.path());
    assert_eq!(o.sum("plugin_fn", "calls"), 1000, "calls of plugin_fn");
    let binary = o.functions("plugin_fn")[0]["binary"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        Path::new(&binary),
        mnt.join("libplugin_fx.so"),
        "the library as the target sees it"
    );
}
