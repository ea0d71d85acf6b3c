//! Helpers shared by stages.rs, launch.rs, sampling.rs and exports.rs:
//! building extra C fixtures, and small readers of the profiler's outputs.
#![allow(dead_code)]
use profiler_tests::workspace;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `fixtures/SRC` with gcc and `flags` into `dir/name` (to a
/// temporary name, then renamed, so a running copy is never overwritten).
fn gcc(src: &str, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(src);
    let res = Command::new("gcc")
        .args(flags)
        .args(["-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        res.status.success(),
        "building {} failed:\n{}",
        out.display(),
        String::from_utf8_lossy(&res.stderr)
    );
    std::fs::rename(&tmp, &out).expect("rename fixture into place");
    out
}

/// `target/fixtures/NAME`, built from `fixtures/SRC` with `flags`.
pub fn build_c(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("fixtures");
    std::fs::create_dir_all(&dir).expect("create target/fixtures");
    gcc(src, &dir.canonicalize().unwrap(), name, flags)
}

/// Like [`build_c`], into `/tmp/profiler-tests-fixtures-<pid>/` with mode
/// 755 on the directory and the binary, so that an unprivileged user
/// (`nobody`, for the SUDO_UID tests) can execute it: /root is not
/// accessible to nobody.
pub fn build_c_world(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(format!(
        "/tmp/profiler-tests-fixtures-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create world-readable fixture dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = gcc(src, &dir, name, flags);
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// The stages/launch fixture (`fixtures/stages.c`), built world-executable.
pub fn stages_exe() -> &'static Path {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        build_c_world(
            "stages.c",
            "stages",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

/// The `TRUTH {json}` line the stages fixture prints on stdout.
pub fn truth_line(stdout: &str) -> Value {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TRUTH "))
        .unwrap_or_else(|| panic!("no TRUTH line from the fixture in stdout:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad truth line {line:?}: {e}"))
}

/// A list of u64 in `v[key]`.
pub fn u64s(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no array {key:?} in {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("{key}: {x} not u64")))
        .collect()
}

/// Reads `dir/name` as text.
pub fn read(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Reads and parses `dir/name` as JSON.
pub fn read_json(dir: &Path, name: &str) -> Value {
    let text = read(dir, name);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// `cpu.folded` (or any folded file) as (frames, count) pairs.
pub fn folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, n) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {l:?}"));
            let n = n
                .parse()
                .unwrap_or_else(|_| panic!("folded line count: {l:?}"));
            (stack.split(';').map(str::to_string).collect(), n)
        })
        .collect()
}

/// The "complete stacks X%" share of cpu.txt's first line, in percent.
pub fn complete_share(cpu_txt: &str) -> f64 {
    let first = cpu_txt.lines().next().unwrap_or_default();
    let pct = first
        .split("complete stacks ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .unwrap_or_else(|| panic!("no `complete stacks N%` in cpu.txt's first line {first:?}"));
    pct.parse()
        .unwrap_or_else(|_| panic!("bad share {pct:?} in {first:?}"))
}

/// IDs of the loaded BPF programs named like ours (`prof_*`).
pub fn prof_prog_ids() -> std::collections::BTreeSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "list"])
        .output()
        .expect("run bpftool (is it installed?)");
    assert!(out.status.success(), "bpftool prog list failed");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(vec![]));
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("prof_")))
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// PIDs holding an fd of each of `ids` (BPF program ids), from
/// /proc/*/fdinfo (`prog_id:` lines of program and link fds).
fn prog_holders(ids: &[u64]) -> std::collections::BTreeMap<u64, std::collections::BTreeSet<u32>> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(info) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            let id = info.lines().find_map(|l| {
                l.strip_prefix("prog_id:")
                    .and_then(|v| v.trim().parse::<u64>().ok())
            });
            if let Some(id) = id.filter(|id| ids.contains(id)) {
                out.entry(id)
                    .or_insert_with(std::collections::BTreeSet::new)
                    .insert(pid);
            }
        }
    }
    out
}

/// Whether `pid` runs a `profiler` binary.
fn is_profiler(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|e| e.file_name().is_some_and(|n| n == "profiler"))
}

/// Like `assert_nothing_attached`, but only about programs loaded since
/// `before` (a [`prof_prog_ids`] snapshot) and not held solely by another
/// profiler process that is not in `ours`: other sessions profiling on this
/// machine (another engineer's tests or benchmarks) do not make it fail,
/// while a program held by our own profiler, by our target (an inherited
/// fd), or by nobody (pinned) does. Polls for up to 3 s, as the kernel frees
/// programs asynchronously.
pub fn assert_none_left_since(before: &std::collections::BTreeSet<u64>, ours: &[u32]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let new: Vec<u64> = prof_prog_ids().difference(before).copied().collect();
        let holders = prog_holders(&new);
        let left: Vec<String> = new
            .iter()
            .filter(|id| match holders.get(id) {
                None => true,
                Some(pids) => pids.iter().any(|p| ours.contains(p) || !is_profiler(*p)),
            })
            .map(|id| format!("{id} (held by {:?})", holders.get(id)))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "BPF programs loaded by this test's profiler are still loaded: {left:?}: \
             left attached"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
