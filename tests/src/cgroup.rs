//! Fresh cgroup v2 groups for tests that sample system-wide, so their
//! fixtures' processes are told apart from everything else the machine runs.
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid systems).
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// A fresh cgroup (a child of the v2 root, `name` relative to it), removed
/// on drop once empty.
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        let dir = cgroup2_mount().join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).expect("create a cgroup");
        Cgroup(dir)
    }

    /// Moves a running process in.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }

    /// Makes `cmd`'s process join the group before it execs, so all it
    /// runs is counted there. The returned descriptor must outlive the
    /// spawn.
    pub fn join_on_spawn(&self, cmd: &mut Command) -> OwnedFd {
        let procs: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open(self.0.join("cgroup.procs"))
            .expect("open cgroup.procs")
            .into();
        let fd = procs.as_raw_fd();
        // SAFETY: the hook only calls write(2) (async-signal-safe) on a
        // descriptor that stays open until after the spawn.
        unsafe {
            cmd.pre_exec(move || {
                // "0": the writing process itself.
                match libc::write(fd, b"0".as_ptr().cast(), 1) {
                    1 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        procs
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
