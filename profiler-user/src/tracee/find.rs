//! Processes by name (`--pid-of NAME`), and a process's parent.
use std::fs;

/// Every current process whose name (`comm`) or executable's file name is
/// `name`, in pid order; the agent itself and kernel threads excluded.
pub fn pids_named(name: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            // No executable: a kernel thread (or gone).
            let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) else {
                return false;
            };
            let base = exe
                .file_name()
                .map(|b| b.to_string_lossy().into_owned())
                .unwrap_or_default();
            let base = base.strip_suffix(" (deleted)").unwrap_or(&base);
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            base == name || comm.trim_end_matches('\n') == name
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The parent pid of `pid` (0 when it cannot be read).
pub fn parent_of(pid: u32) -> u32 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) state ppid ...`: the comm may hold spaces and parentheses.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_child_by_name_and_its_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let found = pids_named("sleep");
        let parent = parent_of(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found.contains(&pid), "{found:?} lacks {pid}");
        assert_eq!(parent, std::process::id());
        assert!(pids_named("no-such-process-name-xyz").is_empty());
    }
}
