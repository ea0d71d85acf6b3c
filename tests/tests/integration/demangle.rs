//! `--func` globs match demangled Rust names, legacy and v0 mangling alike.
use profiler_tests::*;

const FUNCS: [&str; 3] = [
    "rust_fixture::work::process",
    "rust_fixture::work::parse_config",
    "rust_fixture::work::render",
];

fn check(mangling: Mangling) {
    let exe = rust_fixture_exe(mangling);
    let out = TempDir::new("demangle");
    let mut fx = Fixture::spawn(exe, &[]);
    let pid = fx.pid.to_string();

    let list = profiler(&["list", "--pid", &pid, "--func", "rust_fixture::work::*"]);
    assert!(list.status.success(), "list failed: {list:?}");
    let names: Vec<&str> = list
        .stdout
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        4,
        "process, parse_config, render x2: {names:?}"
    );
    for f in FUNCS {
        assert!(
            names
                .iter()
                .any(|n| *n == f || n.starts_with(&format!("{f}::<"))),
            "{f}"
        );
    }
    assert!(
        names
            .iter()
            .all(|n| !n.contains("17h") && !n.starts_with("_")),
        "{names:?}"
    );

    let rec = Recording::start(fx.pid, out.path(), &["--func", "rust_fixture::work::*"]);
    let truth = fx.run();
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_nothing_attached();
    let o = Outputs::load(out.path());
    assert_eq!(o.get("functions_probed"), 4);
    o.assert_matches_truth(&truth, false);
    let process = o.sum(FUNCS[0], "total_ns");
    let children = o.sum(FUNCS[1], "total_ns") + o.sum(FUNCS[2], "total_ns");
    let got = o.sum(FUNCS[0], "self_ns");
    assert!(
        got.abs_diff(process - children) <= process / 100,
        "self of process: {got}"
    );
}

#[test]
fn legacy_mangling() {
    require_root!();
    check(Mangling::Legacy);
}

#[test]
fn v0_mangling() {
    require_root!();
    check(Mangling::V0);
}

#[test]
fn raw_symbol_name_matches() {
    require_root!();
    let fx = Fixture::spawn(rust_fixture_exe(Mangling::V0), &[]);
    let pid = fx.pid.to_string();
    let list = profiler(&["list", "--pid", &pid, "--func", "_RNvNtCs*12parse_config"]);
    assert!(list.status.success(), "list failed: {list:?}");
    assert_eq!(list.stdout.lines().count(), 1, "{}", list.stdout);
    assert!(list.stdout.contains("parse_config"), "{}", list.stdout);
}
