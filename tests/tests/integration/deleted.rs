//! A target whose binary was deleted after it started (an upgrade in place):
//! tracing attaches through /proc/PID/exe and sampling symbolizes through
//! /proc/PID/map_files, so both still work (reliability.md #18).
use profiler_tests::*;

/// Copies the calls fixture to a temporary path, starts it, then deletes
/// the file.
fn deleted_copy(tag: &str) -> (TempDir, Fixture) {
    let dir = TempDir::new(tag);
    let exe = dir.join("calls-deleted");
    std::fs::copy(calls_exe(), &exe).expect("copy fixture");
    let fx = Fixture::spawn(&exe, &["tree"]);
    std::fs::remove_file(&exe).expect("delete the running binary");
    let link = std::fs::read_link(format!("/proc/{}/exe", fx.pid)).unwrap();
    assert!(link.to_string_lossy().ends_with(" (deleted)"), "{link:?}");
    (dir, fx)
}

#[test]
fn deleted_binary_is_traced_exactly() {
    require_root!();
    let out = TempDir::new("deleted-trace");
    let (_dir, mut fx) = deleted_copy("deleted-bin");
    let rec = Recording::start(fx.pid, out.path(), &["--func", "tree_*"]);
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    fx.release();
    let o = Outputs::load(out.path());
    assert_eq!(o.get("lost_events"), 0);
    o.assert_matches_truth(&truth, true);
}
