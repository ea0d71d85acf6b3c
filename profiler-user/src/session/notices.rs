//! Telling what the dispatcher noticed, as it happens: one stderr line per
//! slow dispatch and per hang, and each hang's line appended to `hangs.log`
//! too, so that a hang is on disk while the target is still stuck in it.
use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use crate::{
    analyze::dispatch::{hang_stack_text, Notice},
    text::fmt_ns,
};

/// The line a notice is told with.
pub fn line(notice: &Notice) -> String {
    match notice {
        Notice::Slow {
            duration_ns,
            key,
            verdict,
        } => format!(
            "profiler: slow dispatch {} [{key}] {verdict}",
            fmt_ns(*duration_ns)
        ),
        Notice::Excluded {
            duration_ns,
            reason,
            ..
        } => format!(
            "profiler: not a stall of the program: an iteration of {} while {reason}",
            fmt_ns(*duration_ns)
        ),
        Notice::Note(line) => line.clone(),
        Notice::Hang {
            index,
            tid,
            running_ns,
            stack,
        } => format!(
            "profiler: HANG: dispatch #{index} on thread {tid} running for {} and not finished: {}",
            fmt_ns(*running_ns),
            hang_stack_text(stack)
        ),
    }
}

/// Prints each notice on stderr, and appends the hangs to `hang_log`.
pub fn tell(notices: &[Notice], hang_log: Option<&Path>) {
    for n in notices {
        let line = line(n);
        eprintln!("{line}");
        if let (Notice::Hang { .. }, Some(path)) = (n, hang_log) {
            append_line(path, &line);
        }
    }
}

/// Appends `line` to `path` (created if missing, never through a symlink);
/// a failure loses the log line, not the session.
fn append_line(path: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_the_hang_log() {
        let slow = Notice::Slow {
            duration_ns: 170_000_000,
            key: "parse_json <- load_config".into(),
            verdict: "98% on-CPU in parse_json".into(),
        };
        assert_eq!(
            line(&slow),
            "profiler: slow dispatch 170.00 ms [parse_json <- load_config] 98% on-CPU in parse_json"
        );
        let hang = Notice::Hang {
            index: 7,
            tid: 42,
            running_ns: 1_020_000_000,
            stack: vec!["step_a3".into(), "handle_trap".into()],
        };
        assert_eq!(
            line(&hang),
            "profiler: HANG: dispatch #7 on thread 42 running for 1.02 s and not finished: \
             step_a3 <- handle_trap"
        );
        let dir = std::env::temp_dir().join(format!("profiler-notices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("hangs.log");
        tell(&[slow, hang.clone(), hang], Some(&log));
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().count(), 2, "only hangs are logged: {text}");
        assert!(text
            .lines()
            .all(|l| l.starts_with("profiler: HANG: dispatch #7")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
