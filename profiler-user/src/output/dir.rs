//! The output directory: created and checked before anything is attached,
//! never written through a symlink, and handed to the invoking user when
//! run under sudo.
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::{Error, Result};

/// A checked output directory.
#[derive(Debug)]
pub struct OutDir {
    dir: PathBuf,
    owner: Option<(u32, u32)>,
}

/// The user to hand files to: `SUDO_UID`/`SUDO_GID` when running as root.
fn invoking_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    Some((uid, gid))
}

fn chown(path: &Path, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        let _ = std::os::unix::fs::lchown(path, Some(uid), Some(gid));
    }
}

impl OutDir {
    /// Creates `dir` if needed and checks that each of `files` can be
    /// written there. Refuses symlinks, for the directory and the files.
    pub fn prepare(dir: &Path, files: &[&str]) -> Result<Self> {
        let out_err = |reason: String| Error::Output {
            path: dir.to_path_buf(),
            reason,
        };
        let owner = invoking_user();
        match fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => return Err(Error::Symlink(dir.to_path_buf())),
            Ok(m) if !m.is_dir() => return Err(out_err("it exists and is not a directory".into())),
            Ok(_) => {}
            Err(_) => {
                fs::create_dir_all(dir).map_err(|e| out_err(e.to_string()))?;
                let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o755));
                chown(dir, owner);
            }
        }
        let out = OutDir {
            dir: dir.to_path_buf(),
            owner,
        };
        for name in files {
            let path = dir.join(name);
            if let Ok(m) = fs::symlink_metadata(&path) {
                if m.file_type().is_symlink() {
                    return Err(Error::Symlink(path));
                }
            }
        }
        let probe = dir.join(format!(".profiler-write-test-{}", std::process::id()));
        File::create(&probe).map_err(|e| out_err(e.to_string()))?;
        let _ = fs::remove_file(&probe);
        Ok(out)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Opens `name` for writing (truncating), refusing a symlink.
    pub fn create(&self, name: &str) -> Result<File> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => Error::Symlink(path.clone()),
                _ => Error::Output {
                    path: path.clone(),
                    reason: e.to_string(),
                },
            })?;
        chown(&path, self.owner);
        Ok(file)
    }

    /// Writes `bytes` to `name`.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let mut f = self.create(name)?;
        f.write_all(bytes).map_err(|e| Error::Output {
            path: self.dir.join(name),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("profiler-out-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn creates_and_writes() {
        let d = tmp("ok");
        let out = OutDir::prepare(&d.join("sub"), &["a.txt"]).unwrap();
        out.write("a.txt", b"hi").unwrap();
        assert_eq!(fs::read(d.join("sub/a.txt")).unwrap(), b"hi");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_symlinks() {
        let d = tmp("link");
        fs::create_dir_all(&d).unwrap();
        let victim = d.join("victim");
        fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("report.txt")).unwrap();
        let err = OutDir::prepare(&d, &["report.txt"]).unwrap_err();
        assert!(matches!(err, Error::Symlink(_)), "{err}");
        std::os::unix::fs::symlink(&d, d.join("dirlink")).unwrap();
        let err = OutDir::prepare(&d.join("dirlink"), &[]).unwrap_err();
        assert!(matches!(err, Error::Symlink(_)), "{err}");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_a_file_as_directory() {
        let d = tmp("file");
        fs::write(&d, b"x").unwrap();
        let err = OutDir::prepare(&d, &[]).unwrap_err().to_string();
        assert!(err.starts_with("cannot write"), "{err}");
        fs::remove_file(&d).unwrap();
    }
}
