//! Libraries named by `--lib` that the target had not mapped when the
//! probes went on: their probes sit on the file's inode and fire once it is
//! mapped. Polled while recording so the session can say when that
//! happens, and the report whether it never did.
use std::path::PathBuf;

use super::process::{maps_file, FileId};

/// One library waited for.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// Index of its binary in the selection.
    pub binary: u32,
    /// Its path as the target sees it.
    pub path: PathBuf,
    /// The file's identity.
    pub id: FileId,
    /// Seen in `/proc/PID/maps`.
    pub seen: bool,
}

/// The libraries of one process not seen mapped yet.
#[derive(Debug, Default)]
pub struct LibWatch {
    pid: u32,
    /// Every library waited for, seen or not.
    pub libs: Vec<Waiting>,
}

impl LibWatch {
    /// Watches `libs` (binary index, path, identity) in process `pid`.
    pub fn new(pid: u32, libs: impl IntoIterator<Item = (u32, PathBuf, FileId)>) -> Self {
        LibWatch {
            pid,
            libs: libs
                .into_iter()
                .map(|(binary, path, id)| Waiting {
                    binary,
                    path,
                    id,
                    seen: false,
                })
                .collect(),
        }
    }

    /// True while some library has not been seen mapped.
    pub fn waiting(&self) -> bool {
        self.libs.iter().any(|l| !l.seen)
    }

    /// Reads the target's mappings; returns the libraries seen for the
    /// first time.
    pub fn poll(&mut self) -> Vec<Waiting> {
        let mut now = Vec::new();
        for l in self.libs.iter_mut().filter(|l| !l.seen) {
            if maps_file(self.pid, l.id, &l.path) {
                l.seen = true;
                now.push(l.clone());
            }
        }
        now
    }
}
