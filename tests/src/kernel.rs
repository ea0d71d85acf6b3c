//! Kernel-side teardown checks (reliability.md): no programs or links of ours
//! left behind (all of them, or only those a test loaded), and the target's
//! text equal to its ELF file.
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Names of the profiler's BPF programs (profiler-common `PROG_ENTRY`/`PROG_EXIT`/`PROG_RET`).
pub const PROG_NAMES: [&str; 3] = ["prof_entry", "prof_exit", "prof_ret"];

/// Whether the effective user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn bpftool(what: &str) -> Result<Value> {
    let out = Command::new("bpftool")
        .args(["-j", what, "list"])
        .output()
        .context("running bpftool (is it installed?)")?;
    ensure!(
        out.status.success(),
        "bpftool {what} list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return Ok(Value::Array(vec![]));
    }
    serde_json::from_str(&text).with_context(|| format!("bpftool {what} list JSON"))
}

/// The programs of ours still loaded (not held only by a running
/// `profiler`, that is by another session on this machine), with a
/// description of them and their links.
fn leftovers() -> Result<(BTreeSet<u64>, String)> {
    let progs = bpftool("prog")?;
    let named: Vec<&Value> = progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| PROG_NAMES.contains(&n)))
        .collect();
    let all: Vec<u64> = named.iter().filter_map(|p| p["id"].as_u64()).collect();
    let holders = prog_holders(&all);
    let others = |id: u64| {
        holders
            .get(&id)
            .is_some_and(|pids| pids.iter().all(|p| is_profiler(*p)))
    };
    let ours: Vec<&Value> = named
        .into_iter()
        .filter(|p| p["id"].as_u64().is_some_and(|id| !others(id)))
        .collect();
    let ids: BTreeSet<u64> = ours.iter().filter_map(|p| p["id"].as_u64()).collect();
    let links = bpftool("link")?;
    let our_links: Vec<&Value> = links
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["prog_id"].as_u64().is_some_and(|id| ids.contains(&id)))
        .collect();
    let held: Vec<String> = ids
        .iter()
        .map(|id| format!("{id} held by {:?}", holders.get(id)))
        .collect();
    Ok((
        ids,
        format!("programs: {held:?} {ours:?}; links: {our_links:?}"),
    ))
}

/// Asserts that no `prof_entry`/`prof_exit`/`prof_ret` program or link is
/// loaded, other than those held by a running `profiler` (another session on
/// this machine: call it once the test's own profiler has exited). The
/// kernel frees programs asynchronously after their last fd closes, and
/// other sessions starting and stopping load and free programs all the
/// time, so this polls for up to 3 s and fails only on programs that stayed
/// loaded, unheld by any other profiler, the whole time.
pub fn assert_nothing_attached() {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut stayed: Option<BTreeSet<u64>> = None;
    loop {
        let (now, what) = leftovers().expect("query bpftool");
        let still: BTreeSet<u64> = match &stayed {
            None => now,
            Some(before) => before.intersection(&now).copied().collect(),
        };
        if still.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("left attached: {still:?}: {what}");
        }
        stayed = Some(still);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Compares every executable mapping of `exe` in process `pid` with the bytes
/// of the ELF file at the same offsets. A uprobe left behind (an int3, or the
/// call of an optimized uprobe) makes them differ.
pub fn text_unchanged(pid: u32, exe: &Path) -> Result<()> {
    let exe = exe.canonicalize()?;
    let file = std::fs::File::open(&exe)?;
    let file_len = file.metadata()?.len();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).context("open /proc/PID/mem")?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut checked = 0u64;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != exe {
            continue;
        }
        let (start, end) = f[0].split_once('-').context("maps range")?;
        let start = u64::from_str_radix(start, 16)?;
        let end = u64::from_str_radix(end, 16)?;
        let off = u64::from_str_radix(f[2], 16)?;
        let len = (end - start).min(file_len.saturating_sub(off)) as usize;
        let (mut want, mut got) = (vec![0u8; len], vec![0u8; len]);
        file.read_exact_at(&mut want, off)?;
        mem.read_exact_at(&mut got, start)
            .context("read /proc/PID/mem")?;
        if let Some(i) = want.iter().zip(&got).position(|(a, b)| a != b) {
            bail!(
                "text differs at {:#x} (file offset {:#x}): file {:02x?}, memory {:02x?}",
                start + i as u64,
                off + i as u64,
                &want[i..(i + 8).min(len)],
                &got[i..(i + 8).min(len)]
            );
        }
        checked += len as u64;
    }
    ensure!(
        checked > 0,
        "no executable mapping of {} in PID {pid}",
        exe.display()
    );
    Ok(())
}

/// Panics unless [`text_unchanged`] holds.
pub fn assert_text_unchanged(pid: u32, exe: &Path) {
    if let Err(e) = text_unchanged(pid, exe) {
        panic!("target text after detach: {e:#}");
    }
}

/// IDs of the loaded BPF programs named like ours (`prof_*`).
pub fn prof_prog_ids() -> BTreeSet<u64> {
    let progs = bpftool("prog").expect("query bpftool");
    progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("prof_")))
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// PIDs holding an fd of each of `ids` (BPF program ids), from
/// /proc/*/fdinfo (`prog_id:` lines of program and link fds).
fn prog_holders(ids: &[u64]) -> BTreeMap<u64, BTreeSet<u32>> {
    let mut out = BTreeMap::new();
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
                out.entry(id).or_insert_with(BTreeSet::new).insert(pid);
            }
        }
    }
    out
}

/// Whether `pid` runs a `profiler` binary: also a copy named `profiler-…`
/// (a benchmark comparing two builds) and one rebuilt since it started
/// (`/proc/PID/exe` then ends in ` (deleted)`).
fn is_profiler(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| {
        e.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("profiler"))
    })
}

/// Like `assert_nothing_attached`, but only about programs loaded since
/// `before` (a [`prof_prog_ids`] snapshot) and not held solely by another
/// profiler process that is not in `ours`: other sessions profiling on this
/// machine (another engineer's tests or benchmarks) do not make it fail,
/// while a program held by our own profiler, by our target (an inherited
/// fd), or by nobody (pinned) does. Polls for up to 3 s, as the kernel frees
/// programs asynchronously.
pub fn assert_none_left_since(before: &BTreeSet<u64>, ours: &[u32]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    // Only programs that stay left for the whole wait count: another
    // session's programs pass through "held by nobody" as it exits.
    let mut stayed: Option<BTreeSet<u64>> = None;
    loop {
        let mut new: Vec<u64> = prof_prog_ids().difference(before).copied().collect();
        if let Some(s) = &stayed {
            new.retain(|id| s.contains(id));
        }
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
        stayed = Some(
            left.iter()
                .filter_map(|l| l.split(' ').next()?.parse().ok())
                .collect(),
        );
        assert!(
            std::time::Instant::now() < deadline,
            "BPF programs loaded by this test's profiler are still loaded: {left:?}: \
             left attached"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
