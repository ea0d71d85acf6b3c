//! Resources (rows 32, 33): the agent under a tight memory limit and
//! starved of CPU, at a high event rate.
use super::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A cgroup v2 directory made for one test, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    /// `profiler-test-PID` under the cgroup v2 mount, with `memory.max` =
    /// `max`, or why not (no cgroup v2 with the memory controller here).
    fn with_memory_max(max: &str) -> Result<Cgroup, String> {
        // cgroup v2 alone, or beside v1 hierarchies (hybrid: `unified`).
        let roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"].map(Path::new);
        let Some(root) = roots
            .into_iter()
            .find(|r| r.join("cgroup.controllers").exists())
        else {
            return Err("no cgroup v2 mounted (/sys/fs/cgroup holds v1 hierarchies)".into());
        };
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
            .map_err(|e| format!("{}/cgroup.controllers: {e}", root.display()))?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!(
                "the cgroup v2 at {} has no memory controller (it is bound to a v1 \
                 hierarchy here), so there is no memory.max",
                root.display()
            ));
        }
        let subtree = root.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&subtree).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "memory") {
            std::fs::write(&subtree, "+memory")
                .map_err(|e| format!("cannot enable the memory controller: {e}"))?;
        }
        let dir = root.join(format!("profiler-test-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = Cgroup(dir);
        std::fs::write(cg.0.join("memory.max"), max).map_err(|e| format!("memory.max: {e}"))?;
        let _ = std::fs::write(cg.0.join("memory.swap.max"), "0");
        Ok(cg)
    }

    /// The `oom_kill` count of memory.events.
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.events"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Row 32: the agent in a cgroup with `memory.max` 128M (its 16 MiB ring
/// included) while two threads emit events at full speed: it is not
/// OOM-killed, drops are counted, the accounting holds.
#[test]
fn row32_agent_under_memory_max_is_not_oom_killed() {
    require_root!();
    let cg = match Cgroup::with_memory_max("128M") {
        Ok(cg) => cg,
        Err(why) => super::skip_row!(32, "{why}"),
    };
    let out = TempDir::new("row32");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["tburst", "2", "2000"]);
    let teardown = Teardown::begin();
    let line = format!(
        "echo $$ > {}/cgroup.procs && exec {} record --pid {} --out {} -f burst_work --max-overhead 0",
        cg.0.display(),
        profiler_bin().display(),
        fx.pid,
        out.path().display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &line]);
    let rec = Recording::spawn(cmd);
    let agent = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert_eq!(cg.oom_kills(), 0, "the agent was OOM-killed: {fin:?}");
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    teardown.check(&[agent], Some((fx.pid, &fx.exe)));
    fx.release();
    let o = Outputs::load(out.path());
    assert_accounting(&o, "burst_work", num(&truth, "burst_work"));
    eprintln!(
        "row32: {} events, {} lost under memory.max 128M",
        o.get("events"),
        o.get("lost_events")
    );
}

/// Row 33: the agent pinned (taskset) to CPU 0 at nice 19, beside two CPU
/// burners pinned to the same CPU, while the target's threads emit events
/// at full speed on CPU 1. No hang; every loss counted; the final outputs
/// complete.
#[test]
fn row33_agent_starved_of_cpu_counts_losses_and_finishes() {
    require_root!();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        super::skip_row!(33, "needs 2 CPUs (one to starve the agent on)");
    }
    let burn = build_c(
        "burn.c",
        "burn_fp",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let mut burners: Vec<_> = (0..2)
        .map(|_| {
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(&burn)
                .args(["6", "chain"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("taskset")
        })
        .collect();
    let out = TempDir::new("row33");
    let mut fx = Fixture::spawn(lifecycle_exe(), &["tburst", "2", "2000"]);
    let pin = Command::new("taskset")
        .args(["-pc", "1"])
        .arg(fx.pid.to_string())
        .output()
        .unwrap();
    assert!(pin.status.success(), "taskset -p: {pin:?}");
    let teardown = Teardown::begin();
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0", "nice", "-n", "19"])
        .arg(profiler_bin())
        .args(["record", "--pid", &fx.pid.to_string(), "--out"])
        .arg(out.path())
        .args([
            "-f",
            "burst_work",
            "--ring-size",
            "64K",
            "--max-overhead",
            "0",
        ]);
    let rec = Recording::spawn(cmd);
    let agent = rec.pid();
    let truth = fx.run();
    let fin = rec.stop(libc::SIGINT);
    for b in &mut burners {
        let _ = b.kill();
        let _ = b.wait();
    }
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    teardown.check(&[agent], Some((fx.pid, &fx.exe)));
    fx.release();
    let o = Outputs::load(out.path());
    assert_accounting(&o, "burst_work", num(&truth, "burst_work"));
    let lost = o.get("lost_events");
    assert!(o.report.contains(&lost.to_string()), "report lacks {lost}");
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(&o.svg, opts).expect("flamegraph.svg is XML");
    eprintln!(
        "row33: starved agent saw {} events, lost {lost}",
        o.get("events")
    );
}
