//! Offline replay: `profiler report DIR` renders every output again from
//! `profile.data`, without root, byte for byte; other thresholds change the
//! dispatch analysis; a corrupt or too-new file is refused with one line.
use profiler_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Every output file of `a` other than profile.data must equal `b`'s.
pub(crate) fn assert_same_outputs(a: &Path, b: &Path) {
    let mut compared = 0;
    for entry in std::fs::read_dir(a).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name == "profile.data" {
            continue;
        }
        let (x, y) = (
            std::fs::read(a.join(&name)).unwrap(),
            std::fs::read(b.join(&name)),
        );
        let y = y.unwrap_or_else(|e| panic!("replay did not write {name}: {e}"));
        assert!(
            x == y,
            "{name} differs between the recording and its replay"
        );
        compared += 1;
    }
    assert!(compared >= 8, "only {compared} outputs compared");
}

fn open_up(p: &Path) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn replay_reproduces_every_output_without_root() {
    require_root!();
    let live = TempDir::new("replay-live");
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let rec = Recording::start(
        fx.pid,
        live.path(),
        &["--func", "tree_*", "--threshold", "1ms", "--sample"],
    );
    fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "record failed: {fin:?}");
    fx.release();

    // Offline, as an unprivileged user.
    let again = TempDir::new("replay-again");
    for d in [live.path(), again.path()] {
        open_up(d);
        for e in std::fs::read_dir(d).unwrap() {
            open_up(&e.unwrap().path());
        }
    }
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let args = [
        "report",
        live.path().to_str().unwrap(),
        "--out",
        again.path().to_str().unwrap(),
    ];
    let rep = profiler_wrapped(&nobody, &args);
    assert!(rep.status.success(), "replay as nobody failed: {rep:?}");
    assert_same_outputs(live.path(), again.path());
    assert_eq!(rep.stdout, fin.stdout, "the printed report differs");

    // Another threshold changes the analysis, offline.
    let loose = TempDir::new("replay-loose");
    let rep = profiler(&[
        "report",
        live.path().to_str().unwrap(),
        "--out",
        loose.path().to_str().unwrap(),
        "--threshold",
        "1h",
    ]);
    assert!(rep.status.success(), "replay failed: {rep:?}");
    let strict = read_json_file(&live.join("dispatches.json"));
    let none = read_json_file(&loose.join("dispatches.json"));
    assert!(
        !strict["slow"].as_array().unwrap().is_empty(),
        "no slow dispatch at 1 ms"
    );
    assert!(
        none["slow"].as_array().unwrap().is_empty(),
        "slow dispatches at 1 h"
    );
    assert_eq!(strict["dispatches"], none["dispatches"]);
}

fn read_json_file(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn corrupt_or_newer_data_is_refused() {
    let dir = TempDir::new("replay-bad");
    let data = dir.join("profile.data");
    std::fs::write(&data, b"not a profile at all").unwrap();
    let fin = profiler(&["report", dir.path().to_str().unwrap()]);
    assert_error(&fin, "not a profile.data file", true);

    let mut bytes = b"PROFDATA".to_vec();
    bytes.extend_from_slice(&9u32.to_le_bytes());
    std::fs::write(&data, &bytes).unwrap();
    let fin = profiler(&["report", dir.path().to_str().unwrap()]);
    assert_error(&fin, "written by a newer profiler", true);

    let mut bytes = b"PROFDATA".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&[2, 200, 0, 0, 0, 1, 2]);
    std::fs::write(&data, &bytes).unwrap();
    let fin = profiler(&["report", dir.path().to_str().unwrap()]);
    assert_error(&fin, "corrupt or truncated", true);
}

/// Every dispatch slow (`--threshold 1us`): the 300 dispatches of the
/// `eventloop` fixture outgrow what is kept in detail (the 10 longest of
/// each group and the 100 most recent). The rest are counted in
/// `slow_not_detailed` and said in dispatches.txt, every slow dispatch keeps
/// its slice in trace.json, and the replay, letting the same ones go at the
/// same points, writes the same bytes.
#[test]
fn slow_dispatches_beyond_detail_are_counted_and_replay_the_same() {
    require_root!();
    let exe = build_c(
        "eventloop.c",
        "eventloop",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let live = TempDir::new("replay-many-slow");
    let state = TempDir::new("replay-many-slow-state");
    let mut fx = Fixture::spawn(&exe, &[state.path().to_str().unwrap()]);
    let rec = Recording::start(
        fx.pid,
        live.path(),
        &[
            "--dispatch",
            "dispatch_message",
            "--func",
            "handle_*",
            "--func",
            "step_*",
            "--threshold",
            "1us",
            "--hang",
            "1h",
        ],
    );
    fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "record failed: {fin:?}");
    fx.release();

    let d = read_json_file(&live.join("dispatches.json"));
    let detailed = d["slow"].as_array().unwrap().len() as u64;
    let not_detailed = d["slow_not_detailed"].as_u64().unwrap();
    let groups = d["groups"].as_array().unwrap();
    let slow: u64 = groups.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    assert_eq!(
        d["dispatches"].as_u64(),
        Some(300),
        "every message dispatched"
    );
    assert!(slow >= 290, "nearly every dispatch is over 1 µs: {slow}");
    assert!(not_detailed > 0, "300 slow dispatches all kept in detail");
    assert_eq!(detailed + not_detailed, slow, "every slow dispatch counted");
    assert!(
        detailed <= 10 * groups.len() as u64 + 100,
        "{detailed} in detail for {} groups",
        groups.len()
    );
    let txt = std::fs::read_to_string(live.join("dispatches.txt")).unwrap();
    let line = format!("slow dispatches in detail: {detailed} of {slow} ");
    assert!(txt.contains(&line), "no {line:?} in dispatches.txt:\n{txt}");
    let trace = std::fs::read_to_string(live.join("trace.json")).unwrap();
    assert_eq!(
        trace.matches("\"slow dispatch: ").count() as u64,
        slow,
        "one trace.json slice per slow dispatch"
    );

    let again = replay(live.path(), "replay-many-slow-again");
    assert_same_outputs(live.path(), again.path());
}
