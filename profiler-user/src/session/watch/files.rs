//! The files `watch` writes into its directory: opened and created never
//! through a symlink, errors naming the path. Shared by the journal and
//! the profiles.
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use crate::{Error, Result};

/// An output error on `path`.
pub(super) fn out_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Output {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Opens `path` to append, never through a symlink.
pub(super) fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::Symlink(path.to_path_buf()),
            _ => out_err(path, e),
        })
}

/// Writes `bytes` to `path` (a new file, never through a symlink).
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| out_err(path, e))?;
    f.write_all(bytes).map_err(|e| out_err(path, e))
}

/// A directory of ours under `dir`, refused if something planted a
/// symlink there.
pub(super) fn subdir(dir: &Path, rel: &str) -> Result<PathBuf> {
    let path = dir.join(rel);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Symlink(path)),
        Ok(_) => Ok(path),
        Err(_) => {
            fs::create_dir_all(&path).map_err(|e| out_err(&path, e))?;
            Ok(path)
        }
    }
}
