//! `--lib` for libraries not mapped yet: found as the target's dynamic
//! loader would (path, DT_RUNPATH with $ORIGIN, LD_LIBRARY_PATH, the
//! ld.so.cache), probed on the file so the probes fire once it is mapped,
//! in launch mode and for a dlopen after attaching; a library never mapped
//! is reported; an unknown one is refused before anything is attached.
use profiler_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Records `plugin_main PLUGIN_ARG DELAY_MS` by PID with `--lib LIB -f
/// plugin_fn`, attached before the dlopen; returns the plugin's own count,
/// the outputs and the profiler's stderr.
fn record_plugin(plugin_arg: &str, delay_ms: &str, lib: &str) -> (u64, Outputs, Vec<String>) {
    let (main, _) = plugin_exes();
    let out = TempDir::new("plugin");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(main, &[plugin_arg, delay_ms]);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", fx.pid)).unwrap();
    assert!(!maps.contains("libplugin_fx"), "mapped before the dlopen");
    let rec = Recording::start(fx.pid, out.path(), &["--lib", lib, "-f", "plugin_fn"]);
    let rec_pid = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[rec_pid]);
    fx.release();
    (
        num(&truth, "plugin_fn"),
        Outputs::load(out.path()),
        fin.stderr,
    )
}

#[test]
fn plugin_dlopened_after_attach_is_counted_exactly() {
    require_root!();
    let (_, lib) = plugin_exes();
    let lib = lib.to_str().unwrap();
    let (truth, o, stderr) = record_plugin(lib, "2000", lib);
    assert_eq!(truth, 1000, "the fixture's own count");
    assert_eq!(o.sum("plugin_fn", "calls"), truth, "calls of plugin_fn");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("is not mapped by PID") && l.contains("libplugin_fx.so")),
        "no `not mapped yet` line: {stderr:?}"
    );
    assert!(
        !stderr.iter().any(|l| l.contains("never seen mapped")),
        "{stderr:?}"
    );
    assert!(
        o.json["libraries_never_mapped"]
            .as_array()
            .is_some_and(|a| a.is_empty()),
        "{}",
        o.json["libraries_never_mapped"]
    );
}

#[test]
fn plugin_named_is_found_through_the_runpath() {
    require_root!();
    // dlopen("libplugin_fx.so") finds it through plugin_main's
    // RUNPATH=$ORIGIN; so must --lib by the same bare name.
    let (truth, o, _) = record_plugin("libplugin_fx.so", "500", "libplugin_fx.so");
    assert_eq!(truth, 1000);
    assert_eq!(o.sum("plugin_fn", "calls"), truth, "calls of plugin_fn");
    let (_, lib) = plugin_exes();
    let binary = o.functions("plugin_fn")[0]["binary"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(Path::new(&binary), lib.canonicalize().unwrap(), "binary");
}

#[test]
fn library_never_mapped_is_reported() {
    require_root!();
    // Found only through the target's LD_LIBRARY_PATH (read from
    // /proc/PID/environ), and never dlopen'd: the fixture is not told to go.
    let (main, lib) = plugin_exes();
    let dir = TempDir::new("ldpath");
    std::fs::copy(lib, dir.join("libplugin_env.so")).unwrap();
    let ld_path = dir.path().to_str().unwrap();
    let fx = Fixture::spawn_env(main, &["libplugin_env.so"], &[("LD_LIBRARY_PATH", ld_path)]);
    let out = TempDir::new("nevermapped");
    let before = prof_prog_ids();
    let rec = Recording::start(
        fx.pid,
        out.path(),
        &[
            "--lib",
            "libplugin_env.so",
            "-f",
            "plugin_fn",
            "--duration",
            "1s",
        ],
    );
    let rec_pid = rec.pid();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[rec_pid]);
    let path = dir.path().canonicalize().unwrap().join("libplugin_env.so");
    let want = format!("{}: never seen mapped by PID {}", path.display(), fx.pid);
    let lines: Vec<&String> = fin.stderr.iter().filter(|l| l.contains(&want)).collect();
    assert_eq!(lines.len(), 1, "one stderr line {want:?}: {:?}", fin.stderr);
    assert!(lines[0].contains("probes saw nothing"), "{lines:?}");
    let report = read(out.path(), "report.txt");
    assert!(report.contains(&format!("note: {want}")), "{report}");
    let o = Outputs::load(out.path());
    assert_eq!(
        o.json["libraries_never_mapped"].as_array().map(Vec::len),
        Some(1),
        "{}",
        o.json
    );
}

#[test]
fn unknown_library_is_refused_before_attaching() {
    require_root!();
    let before = prof_prog_ids();
    let fx = Fixture::spawn(calls_exe(), &["tree"]);
    let out = TempDir::new("nolib");
    let o = out.path().to_str().unwrap();
    let pid = fx.pid.to_string();
    let fin = profiler(&[
        "record",
        "--pid",
        &pid,
        "--lib",
        "libnosuch_xyz.so.9",
        "-f",
        "x",
        "--out",
        o,
    ]);
    assert_error(&fin, "no library \"libnosuch_xyz.so.9\"", true);
    assert!(
        fin.stderr[0].contains("/etc/ld.so.cache"),
        "{:?}",
        fin.stderr
    );
    let fin = profiler(&[
        "record",
        "--lib",
        "libnosuch_xyz.so.9",
        "-f",
        "x",
        "--out",
        o,
        "--",
        "/bin/true",
    ]);
    assert_error(&fin, "no library \"libnosuch_xyz.so.9\"", true);
    let fin = profiler(&[
        "record",
        "--pid",
        &pid,
        "--lib",
        "/nonexistent/libx.so",
        "-f",
        "x",
        "--out",
        o,
    ]);
    assert_error(&fin, "/nonexistent/libx.so (no such file)", true);
    assert_none_left_since(&before, &[]);
}

/// A SQL script with a known number of statements.
fn sql_script(dir: &TempDir) -> PathBuf {
    let mut sql = String::from("CREATE TABLE t(a INTEGER, b TEXT);\n");
    for i in 0..40 {
        sql.push_str(&format!("INSERT INTO t VALUES ({i}, 'row {i}');\n"));
    }
    sql.push_str("SELECT count(*), sum(a) FROM t;\nSELECT b FROM t WHERE a % 7 = 0;\n");
    let path = dir.join("script.sql");
    std::fs::write(&path, sql).unwrap();
    path
}

/// The file `ldconfig -p` gives for `soname`.
fn ldconfig(soname: &str) -> PathBuf {
    let out = Command::new("/sbin/ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{soname} ")) && l.contains("x86-64"))
        .unwrap_or_else(|| panic!("{soname} not in ldconfig -p (setup installs libsqlite3-0)"));
    PathBuf::from(line.rsplit(" => ").next().unwrap().trim())
}

/// Counts of each of `names` in `cmd`, from perf probes placed on the
/// exported symbols' addresses (not by name: that also probes PLT stubs).
fn perf_counts(lib: &Path, names: &[&str], cmd: &[&str]) -> BTreeMap<String, u64> {
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils)");
    let nm = String::from_utf8_lossy(&nm.stdout);
    let group = format!("proftest{}", std::process::id());
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("perf")
                .args(["probe", "-q", "-d", &format!("{}:*", self.0)])
                .output();
        }
    }
    let _cleanup = Cleanup(group.clone());
    let mut events = Vec::new();
    for name in names {
        let addr = nm
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[1] == "T" && f[2] == *name).then(|| f[0].to_string())
            })
            .unwrap_or_else(|| panic!("{name} not exported by {}", lib.display()));
        let event = format!("{group}:{name}");
        let probe = Command::new("perf")
            .args(["probe", "-q", "-x"])
            .arg(lib)
            .args(["-a", &format!("{event}=0x{addr}")])
            .output()
            .expect("perf (setup installs linux-perf)");
        assert!(
            probe.status.success(),
            "perf probe: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        events.push(event);
    }
    let mut stat = Command::new("perf");
    stat.args(["stat", "-x", ","]);
    for e in &events {
        stat.args(["-e", e]);
    }
    let res = stat.arg("--").args(cmd).output().expect("perf stat");
    assert!(res.status.success(), "perf stat: {res:?}");
    let err = String::from_utf8_lossy(&res.stderr);
    names
        .iter()
        .map(|name| {
            let event = format!("{group}:{name}");
            let n = err
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split(',').collect();
                    (f.len() > 2 && f[2] == event).then(|| f[0].parse::<u64>().ok())
                })
                .flatten()
                .unwrap_or_else(|| panic!("no count for {event} in {err}"));
            (name.to_string(), n)
        })
        .collect()
}

#[test]
fn launch_with_lib_counts_equal_perf_probes_by_address() {
    require_root!();
    let dir = TempDir::new("sqlite");
    let script = sql_script(&dir);
    let read = format!(".read {}", script.display());
    let cmd = ["sqlite3", ":memory:", read.as_str()];
    let names = ["sqlite3_step", "sqlite3_prepare_v2"];
    let lib = ldconfig("libsqlite3.so.0");
    let want = perf_counts(&lib, &names, &cmd);
    // 42 statements stepped at least once each (the SELECT steps once per row).
    assert!(want["sqlite3_step"] >= 42, "{want:?}");
    let out = TempDir::new("sqlite-out");
    let before = prof_prog_ids();
    let mut args = vec![
        "record",
        "--lib",
        "libsqlite3.so.0",
        "-f",
        "sqlite3_step",
        "-f",
        "sqlite3_prepare_v2",
        "--out",
        out.path().to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(&cmd);
    let fin = profiler(&args);
    assert!(fin.status.success(), "{fin:?}");
    assert_none_left_since(&before, &[]);
    let o = Outputs::load(out.path());
    for name in names {
        assert_eq!(o.sum(name, "calls"), want[name], "calls of {name}");
    }
}
