//! Which processes `profiler watch` watches: the PIDs it was given, every
//! process running an executable (`--exe`), every process in a cgroup
//! (`--cgroup`, `--unit`), now and later. Found by scanning `/proc`, which
//! costs about a millisecond for a few hundred processes.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{tracee::process::FileId, Error, Result};

/// An executable to match, by path and by the file's identity (a process
/// started before the file was replaced by an upgrade still runs the old
/// inode, under the same path).
#[derive(Debug, Clone)]
struct Exe {
    path: PathBuf,
    id: Option<FileId>,
}

/// What `watch` matches processes against.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    pids: Vec<u32>,
    exes: Vec<Exe>,
    /// A cgroup v2 path as `/proc/PID/cgroup` shows it (`/system.slice/x.service`).
    cgroup: Option<String>,
}

impl Matcher {
    /// `--pid`s, `--exe`s and `--cgroup` or `--unit`. An `--exe` must be
    /// an existing file; a cgroup may not exist yet (a unit not started).
    pub fn new(
        pids: &[u32],
        exes: &[PathBuf],
        cgroup: Option<&Path>,
        unit: Option<&str>,
    ) -> Result<Self> {
        let mut m = Matcher {
            pids: pids.to_vec(),
            ..Self::default()
        };
        for e in exes {
            let path = fs::canonicalize(e).map_err(|err| {
                Error::Usage(format!(
                    "--exe {}: {err}; give the path of the program's executable (as `readlink /proc/PID/exe` shows it)",
                    e.display()
                ))
            })?;
            if !path.is_file() {
                return Err(Error::Usage(format!(
                    "--exe {}: not a file; give the path of the program's executable",
                    e.display()
                )));
            }
            m.exes.push(Exe {
                id: FileId::of(&path),
                path,
            });
        }
        m.cgroup = match (cgroup, unit) {
            (Some(c), _) => Some(crate::tracee::cgroup::resolve(c)?.name),
            (None, Some(u)) => Some(unit_cgroup(u)?),
            (None, None) => None,
        };
        if m.pids.is_empty() && m.exes.is_empty() && m.cgroup.is_none() {
            return Err(Error::Usage(
                "nothing to watch: give --pid PID, --exe PATH, --cgroup PATH or --unit NAME.service"
                    .into(),
            ));
        }
        Ok(m)
    }

    /// True when only `--pid`s were given: once they have all exited there
    /// is nothing left to wait for.
    pub fn pids_only(&self) -> bool {
        self.exes.is_empty() && self.cgroup.is_none()
    }

    /// The cgroup watched, as `/proc/PID/cgroup` shows it.
    pub fn cgroup(&self) -> Option<&str> {
        self.cgroup.as_deref()
    }

    /// Every running process that matches, in PID order (the agent itself
    /// and kernel threads never).
    pub fn scan(&mut self) -> Vec<u32> {
        for e in &mut self.exes {
            // Replaced since (an upgrade): new processes run the new file.
            e.id = FileId::of(&e.path).or(e.id);
        }
        let me = std::process::id();
        if self.pids_only() {
            // Nothing new can match: no need to read every process.
            let mut pids: Vec<u32> = self
                .pids
                .iter()
                .copied()
                .filter(|&p| p != me && Path::new(&format!("/proc/{p}/exe")).exists())
                .collect();
            pids.sort_unstable();
            pids.dedup();
            return pids;
        }
        let Ok(dir) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me && pid != 1 && self.matches(pid))
            .collect();
        pids.sort_unstable();
        pids
    }

    /// True when process `pid` is one to watch.
    pub fn matches(&self, pid: u32) -> bool {
        if self.pids.contains(&pid) {
            return true;
        }
        if !self.exes.is_empty() {
            let link = format!("/proc/{pid}/exe");
            if let Ok(target) = fs::read_link(&link) {
                let s = target.to_string_lossy();
                let path = Path::new(s.strip_suffix(" (deleted)").unwrap_or(&s));
                let id = FileId::of(Path::new(&link));
                if self
                    .exes
                    .iter()
                    .any(|e| e.path == path || (id.is_some() && e.id == id))
                {
                    return true;
                }
            }
        }
        match &self.cgroup {
            Some(want) => process_cgroup(pid).is_some_and(|c| in_cgroup(&c, want)),
            None => false,
        }
    }
}

/// The cgroup v2 path of a systemd unit's processes: services under
/// `system.slice`, the name given a `.service` suffix when it has none.
fn unit_cgroup(unit: &str) -> Result<String> {
    if unit.is_empty() || unit.contains('/') || unit.starts_with('.') {
        return Err(Error::Usage(format!(
            "--unit {unit:?}: give a unit's name, e.g. redis-server.service"
        )));
    }
    let name = match unit.contains('.') {
        true => unit.to_string(),
        false => format!("{unit}.service"),
    };
    let slice = match name.ends_with(".slice") {
        true => String::new(),
        false => "/system.slice".into(),
    };
    Ok(format!("{slice}/{name}"))
}

/// The cgroup v2 path of process `pid` (its `0::` line).
fn process_cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// True when cgroup `c` is `want` or below it.
fn in_cgroup(c: &str, want: &str) -> bool {
    let want = want.trim_end_matches('/');
    want.is_empty() || c == want || c.strip_prefix(want).is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_holds_its_subtree_and_not_its_namesakes() {
        assert!(in_cgroup(
            "/system.slice/redis.service",
            "/system.slice/redis.service"
        ));
        assert!(in_cgroup(
            "/system.slice/redis.service/x",
            "/system.slice/redis.service"
        ));
        assert!(!in_cgroup(
            "/system.slice/redis.service2",
            "/system.slice/redis.service"
        ));
        assert!(in_cgroup("/user.slice", "/"));
    }

    #[test]
    fn units_are_services_of_the_system_slice() {
        assert_eq!(
            unit_cgroup("redis-server").unwrap(),
            "/system.slice/redis-server.service"
        );
        assert_eq!(unit_cgroup("a.service").unwrap(), "/system.slice/a.service");
        assert_eq!(unit_cgroup("machine.slice").unwrap(), "/machine.slice");
        assert!(unit_cgroup("../x").is_err());
    }

    #[test]
    fn this_process_matches_its_executable_and_a_scan_leaves_it_out() {
        let me = std::process::id();
        let exe = fs::read_link("/proc/self/exe").unwrap();
        let mut m = Matcher::new(&[], &[exe], None, None).unwrap();
        assert!(m.matches(me));
        assert!(!m.scan().contains(&me));
        assert!(Matcher::new(&[], &[], None, None).is_err());
        assert!(Matcher::new(&[], &["/nonexistent/x".into()], None, None).is_err());
    }
}
