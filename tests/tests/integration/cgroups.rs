//! `sample --all --cgroup PATH`: system-wide sampling limited to one
//! cgroup v2 subtree, in the kernel; each process labelled with its cgroup
//! in cpu.txt; a cgroup that does not exist refused in one line.
use profiler_tests::*;
use std::path::Path;

/// How long the burners run (they are killed when the test ends): the
/// profiler takes tens of seconds to load under software emulation (6.1
/// in `cargo xtask kernels`), where 30 s burners were gone before the
/// first sample.
const BURN_SECS: &str = "600";

#[test]
fn only_the_cgroups_processes_are_sampled() {
    require_root!();
    let burn = build_c(
        "burn.c",
        "burn_fp",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let tag = std::process::id() % 100_000;
    let (in_comm, out_comm) = (format!("pin{tag}"), format!("pout{tag}"));
    let name = format!("profiler-test-{tag}");
    let cg = Cgroup::new(&name);
    let inside = Fixture::spawn(&burn, &[BURN_SECS, "chain", &in_comm]);
    let outside = Fixture::spawn(&burn, &[BURN_SECS, "chain", &out_comm]);
    cg.add(inside.pid);
    let out = TempDir::new("sample-cgroup");
    let before = prof_prog_ids();
    // Relative to the v2 root, as /proc/PID/cgroup shows it.
    let fin = profiler(&[
        "sample",
        "--all",
        "--cgroup",
        &format!("/{name}"),
        "--hz",
        "199",
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    assert_none_left_since(&before, &[]);
    let stacks = folded(&read(out.path(), "cpu.folded"));
    let by_comm = |comm: &str| -> u64 {
        stacks
            .iter()
            .filter(|(s, _)| s[0] == comm)
            .map(|(_, n)| n)
            .sum()
    };
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let (n_in, n_out) = (by_comm(&in_comm), by_comm(&out_comm));
    // A full CPU for 2 s at 199 Hz is ~400 samples; a loaded machine
    // (other builds on both CPUs) gives far fewer.
    assert!(n_in >= 10, "the burner in the cgroup got {n_in} samples");
    assert_eq!(n_out, 0, "the burner outside the cgroup was sampled");
    assert_eq!(n_in, total, "only the cgroup's process: {stacks:?}");
    let txt = read(out.path(), "cpu.txt");
    assert!(
        txt.contains(&format!("in cgroup /{name}")),
        "cpu.txt names the cgroup:\n{txt}"
    );
    drop((inside, outside));
}

#[test]
fn a_subtree_is_sampled_and_each_process_labelled_with_its_cgroup() {
    require_root!();
    let burn = build_c(
        "burn.c",
        "burn_fp",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let tag = std::process::id() % 100_000;
    let name = format!("profiler-tree-{tag}");
    let parent = Cgroup::new(&name);
    let (x, y) = (
        Cgroup::new(&format!("{name}/x")),
        Cgroup::new(&format!("{name}/y")),
    );
    let a = Fixture::spawn(&burn, &[BURN_SECS, "chain", &format!("pxa{tag}")]);
    let b = Fixture::spawn(&burn, &[BURN_SECS, "chain", &format!("pyb{tag}")]);
    let outside = Fixture::spawn(&burn, &[BURN_SECS, "chain", &format!("pno{tag}")]);
    x.add(a.pid);
    y.add(b.pid);
    let out = TempDir::new("sample-subtree");
    let fin = profiler(&[
        "sample",
        "--all",
        "--cgroup",
        parent.0.to_str().unwrap(),
        "--hz",
        "199",
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    let txt = read(out.path(), "cpu.txt");
    // Both descendants' processes, each on a row with its own cgroup; the
    // one outside, nowhere.
    for (pid, cg) in [(a.pid, "x"), (b.pid, "y")] {
        let row = txt
            .lines()
            .find(|l| l.ends_with(&format!("  PID {pid}")))
            .unwrap_or_else(|| panic!("no row for PID {pid}:\n{txt}"));
        assert!(row.contains(&format!(" /{name}/{cg} ")), "{row}");
    }
    assert!(!txt.contains(&format!("PID {}", outside.pid)), "{txt}");
    let rows = txt.lines().filter(|l| l.contains("  PID ")).count();
    assert_eq!(rows, 2, "{txt}");
    // profile.pb.gz carries them as `cgroup` labels (strings of its table).
    let pb = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -dc {}/profile.pb.gz", out.path().display()))
        .output()
        .unwrap()
        .stdout;
    let has = |s: &str| pb.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(has("cgroup"), "no cgroup label key in profile.pb.gz");
    for cg in ["x", "y"] {
        assert!(has(&format!("/{name}/{cg}")), "no label /{name}/{cg}");
    }
    drop((a, b, outside));
    drop((x, y));
}

#[test]
fn nonexistent_cgroup_is_refused() {
    require_root!();
    let before = prof_prog_ids();
    let out = TempDir::new("sample-nocg");
    let fin = profiler(&[
        "sample",
        "--all",
        "--cgroup",
        "no-such-cgroup-xyz",
        "--duration",
        "1s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let want = cgroup2_mount().join("no-such-cgroup-xyz");
    assert_error(
        &fin,
        &format!("no cgroup v2 directory {}", want.display()),
        true,
    );
    assert!(!Path::new(&want).exists());
    assert_none_left_since(&before, &[]);
}
