//! Self-tests of the harness, with no profiler involved: the fixtures' ground
//! truth is what the tests assume, and the teardown checks can fail.
use profiler_tests::*;
use std::os::unix::fs::FileExt;

#[test]
fn fixture_truth_is_as_designed() {
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let truth = fx.run();
    fx.release();
    for (name, calls) in [("tree_top", 20), ("tree_mid", 40), ("tree_leaf", 120)] {
        let f = truth_fn(&truth, name);
        assert_eq!(num(f, "calls"), calls, "{name}");
        assert!(num(f, "total_ns") > calls * 250_000, "{name} takes time");
    }
    let mut fx = Fixture::spawn(calls_exe(), &["threads"]);
    let truth = fx.run();
    fx.release();
    let mut names: Vec<&str> = truth["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["calls", "worker-1", "worker-2", "worker-3"]);
    assert_eq!(
        num(truth_fn(&truth, "thr_work"), "calls"),
        10 + 20 + 40 + 60
    );
    for m in [Mangling::Legacy, Mangling::V0] {
        let mut fx = Fixture::spawn(rust_fixture_exe(m), &[]);
        let truth = fx.run();
        fx.release();
        assert_eq!(
            num(truth_fn(&truth, "rust_fixture::work::render"), "calls"),
            60
        );
    }
}

#[test]
fn text_check_detects_a_patched_byte() {
    require_root!();
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    text_unchanged(fx.pid, &fx.exe).expect("unprobed fixture equals its ELF");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", fx.pid)).unwrap();
    let exe = fx.exe.to_str().unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with(exe) && l.contains("r-xp"))
        .unwrap();
    let start = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/mem", fx.pid))
        .unwrap();
    let mut b = [0u8; 1];
    mem.read_exact_at(&mut b, start + 16).unwrap();
    mem.write_all_at(&[!b[0]], start + 16).unwrap();
    let err = text_unchanged(fx.pid, &fx.exe).expect_err("a patched byte must be seen");
    assert!(err.to_string().contains("text differs"), "{err:#}");
}

#[test]
fn nothing_attached_without_a_profiler() {
    require_root!();
    assert_nothing_attached();
}
