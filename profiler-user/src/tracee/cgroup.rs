//! `sample --all --cgroup PATH`: the cgroup v2 whose subtree alone is
//! sampled, found where the v2 hierarchy is mounted (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` on hybrid systems), and the cgroup of a process
//! (the label system-wide outputs carry).
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Component, Path, PathBuf},
};

use crate::{Error, Result};

/// Where the cgroup v2 hierarchy is usually mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// Where the cgroup v2 hierarchy is mounted here (the first `cgroup2` line
/// of `/proc/self/mounts`).
pub fn mount_point() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_ascii_whitespace();
        let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// A cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// Its path in the hierarchy (`/` for the root), as `/proc/PID/cgroup`
    /// shows it.
    pub name: String,
    /// Its id: the directory's inode number, what
    /// `bpf_get_current_ancestor_cgroup_id` returns.
    pub id: u64,
    /// Its depth below the root (the root is 0).
    pub level: u32,
}

/// Finds the cgroup `arg` names: a path under `/sys/fs/cgroup`, or relative
/// to it (`user.slice/x`, or `/user.slice/x` as `/proc/PID/cgroup` shows it).
pub fn resolve(arg: &Path) -> Result<Cgroup> {
    let Some(root) = mount_point() else {
        return Err(Error::Usage(
            "--cgroup needs the cgroup v2 hierarchy, which is not mounted here \
             (mount -t cgroup2 none /sys/fs/cgroup/unified)"
                .into(),
        ));
    };
    let rel = arg
        .strip_prefix(&root)
        .or_else(|_| arg.strip_prefix(ROOT))
        .or_else(|_| arg.strip_prefix("/"))
        .unwrap_or(arg);
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => {
                return Err(Error::Usage(format!(
                    "--cgroup {}: use a path under {} without `..`",
                    arg.display(),
                    root.display()
                )))
            }
        }
    }
    let dir: PathBuf = parts.iter().fold(root.clone(), |d, p| d.join(p));
    let is_cgroup = dir.join("cgroup.procs").is_file() && !dir.join("tasks").exists();
    let meta = fs::metadata(&dir).ok().filter(|m| m.is_dir() && is_cgroup);
    let Some(meta) = meta else {
        return Err(Error::Usage(format!(
            "--cgroup {}: no cgroup v2 directory {}; give a directory under {} \
             (a process's is on the 0:: line of /proc/PID/cgroup)",
            arg.display(),
            dir.display(),
            root.display()
        )));
    };
    Ok(Cgroup {
        name: format!("/{}", parts.join("/")),
        id: meta.ino(),
        level: parts.len() as u32,
    })
}

impl Cgroup {
    /// True when process `pid` is in this cgroup or a descendant.
    pub fn contains(&self, pid: u32) -> bool {
        of_process(pid).is_some_and(|cg| {
            self.name == "/"
                || cg == self.name
                || cg
                    .strip_prefix(self.name.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        })
    }
}

/// The cgroup v2 path of process `pid` (the `0::` line of
/// `/proc/PID/cgroup`), if it can be read.
pub fn of_process(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_missing_cgroups() {
        let Some(mount) = mount_point() else {
            return; // no cgroup v2 here
        };
        let root = resolve(&mount).unwrap();
        assert_eq!((root.name.as_str(), root.level), ("/", 0));
        assert_eq!(resolve(Path::new("/")).unwrap(), root);
        let err = resolve(Path::new("no-such-cgroup-xyz"))
            .unwrap_err()
            .to_string();
        let want = mount.join("no-such-cgroup-xyz");
        assert!(err.contains(&*want.to_string_lossy()), "{err}");
        assert!(resolve(Path::new("a/../b")).is_err());
        assert!(of_process(std::process::id()).is_some_and(|c| c.starts_with('/')));
        let me = std::process::id();
        assert!(root.contains(me));
        let mine = of_process(me).unwrap();
        let other = Cgroup {
            name: format!("{}-not", mine.trim_end_matches('/')),
            id: 0,
            level: 1,
        };
        assert!(!other.contains(me) || mine == "/");
    }
}
