//! `--profile-every`'s files: `profiles/PID-TIME.pb.gz`, one pprof per
//! watched process and window, written whole (a temporary file renamed,
//! so a shipper never reads half of one), and their bytes, oldest first,
//! for the journal's `--max-disk` (which deletes the oldest of them before
//! any report). A watcher started again on the directory counts the files
//! there.
use std::{
    collections::VecDeque,
    fs,
    path::{Path, PathBuf},
};

use crate::{
    analyze::{dispatch::Dispatcher, windows::Window},
    output::export::{labelled_cpu_pprof, LabelledStack},
    Result,
};

/// The folder of the profiles, in the output directory.
pub const PROFILES: &str = "profiles";
/// Their extension.
const EXT: &str = ".pb.gz";

/// The profiles on disk.
#[derive(Debug, Default)]
pub struct Profiles {
    /// Relative paths (`profiles/NAME`) and sizes, oldest first.
    kept: VecDeque<(String, u64)>,
}

/// A window's start as a compact UTC timestamp, safe in file names:
/// `20261202T031500123456Z`.
pub fn stamp(unix_ns: u64) -> String {
    crate::clock::rfc3339(unix_ns).replace([':', '.', '-'], "")
}

/// The frame of a window's samples whose stack was not kept (none was
/// walked, or the window had [`crate::analyze::windows::MAX_ENTRIES`]).
pub const NOT_KEPT: &str = "[stack not kept]";

/// A window's pprof: its stacks named by `d`, each labelled `labels` and
/// `stalled`; `unix_minus_mono_ns` puts it on the wall clock.
pub fn window_pprof(
    d: &mut Dispatcher,
    w: &Window,
    labels: &[(String, String)],
    period_ns: u64,
    unix_minus_mono_ns: u64,
) -> Vec<u8> {
    let mut stacks: Vec<LabelledStack> = w
        .decided
        .iter()
        .map(|((stack, stalled), v)| {
            let mut frames = d.name_user_stack(stack);
            frames.reverse();
            if frames.is_empty() {
                frames.push(NOT_KEPT.to_string());
            }
            let mut labels = labels.to_vec();
            labels.push(("stalled".into(), stalled.to_string()));
            LabelledStack {
                frames,
                labels,
                samples: v.samples as i64,
                cpu_ns: v.cpu_ns as i64,
            }
        })
        .collect();
    // The same bytes for the same window.
    stacks.sort_by(|a, b| (&a.labels, &a.frames).cmp(&(&b.labels, &b.frames)));
    labelled_cpu_pprof(
        &stacks,
        period_ns,
        w.end_ns.saturating_sub(w.start_ns),
        (w.start_ns + unix_minus_mono_ns) as i64,
    )
}

impl Profiles {
    /// The profiles `dir` holds already, oldest first (by the time in
    /// their names, then by name).
    pub fn open(dir: &Path) -> Self {
        let mut kept: Vec<(String, String, u64)> = fs::read_dir(dir.join(PROFILES))
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                let (_, time) = name.strip_suffix(EXT)?.split_once('-')?;
                let meta = e.metadata().ok()?;
                meta.is_file()
                    .then(|| (time.to_string(), format!("{PROFILES}/{name}"), meta.len()))
            })
            .collect();
        kept.sort();
        Profiles {
            kept: kept.into_iter().map(|(_, p, n)| (p, n)).collect(),
        }
    }

    /// Bytes of the profiles on disk.
    pub fn bytes(&self) -> u64 {
        self.kept.iter().map(|k| k.1).sum()
    }

    /// Writes process `pid`'s window that began at `unix_ns`: returns its
    /// path, relative to `dir`, and its size.
    pub fn write(
        &mut self,
        dir: &Path,
        pid: u32,
        unix_ns: u64,
        gz: &[u8],
    ) -> Result<(String, u64)> {
        let folder = super::files::subdir(dir, PROFILES)?;
        let base = format!("{pid}-{}", stamp(unix_ns));
        let mut name = format!("{base}{EXT}");
        let mut n = 1;
        while folder.join(&name).exists() {
            n += 1;
            name = format!("{base}-{n}{EXT}");
        }
        let tmp: PathBuf = folder.join(format!(".{name}.tmp"));
        super::files::write_new(&tmp, gz)?;
        let path = folder.join(&name);
        fs::rename(&tmp, &path).map_err(|e| super::files::out_err(&path, e))?;
        let rel = format!("{PROFILES}/{name}");
        self.kept.push_back((rel.clone(), gz.len() as u64));
        Ok((rel, gz.len() as u64))
    }

    /// Deletes the oldest profile: its bytes, and whether it was still
    /// there (a shipper may have sent and removed it); None if there is
    /// none.
    pub fn delete_oldest(&mut self, dir: &Path) -> Option<(u64, bool)> {
        let (rel, bytes) = self.kept.pop_front()?;
        Some((bytes, fs::remove_file(dir.join(rel)).is_ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_whole_counted_and_deleted_oldest_first() {
        let d = std::env::temp_dir().join(format!("profiler-profiles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let mut p = Profiles::open(&d);
        assert_eq!(p.bytes(), 0);
        let t = 1_764_644_100_000_000_000; // 2025-12-02T02:55:00Z
        let (a, _) = p.write(&d, 42, t + 60_000_000_000, b"second").unwrap();
        let (b, _) = p.write(&d, 7, t, b"first!!").unwrap();
        assert_eq!(a, "profiles/42-20251202T025600000000Z.pb.gz");
        assert!(d.join(&b).is_file());
        // The same window again gets a name of its own.
        let (c, _) = p.write(&d, 42, t + 60_000_000_000, b"x").unwrap();
        assert_eq!(c, "profiles/42-20251202T025600000000Z-2.pb.gz");
        // No temporary file is left.
        assert_eq!(fs::read_dir(d.join(PROFILES)).unwrap().count(), 3);
        // Opened again: by time, the earlier window first.
        let mut again = Profiles::open(&d);
        assert_eq!(again.bytes(), 6 + 7 + 1);
        assert_eq!(again.delete_oldest(&d), Some((7, true)));
        assert!(!d.join(&b).exists() && d.join(&a).exists());
        // One a shipper removed already is not counted as deleted.
        fs::remove_file(d.join(&a)).unwrap();
        assert_eq!(again.delete_oldest(&d), Some((6, false)));
        fs::remove_dir_all(&d).unwrap();
    }
}
