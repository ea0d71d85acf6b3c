//! Opening files that the target's user may control, as root, without
//! blocking and without following a planted link: FIFOs, devices and
//! symlinks are refused before a byte is read. Used for perf maps
//! (`perfmap.rs`), for deciding which binaries blazesym may look beside for
//! debug files (`symbolize.rs`) and for the `--dwarf` unwinder's files.
use std::{
    collections::VecDeque,
    ffi::{CString, OsString},
    fs::File,
    io,
    os::{
        fd::FromRawFd,
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::{Component, Path, PathBuf},
};

/// Opens `path` read-only with `O_NONBLOCK` (a FIFO opens at once instead
/// of waiting for a writer), `O_CLOEXEC` and, unless `follow`, `O_NOFOLLOW`
/// (a symlink as the last component fails with `ELOOP`). Nothing is read.
pub fn open_nonblocking(path: &Path, follow: bool) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let mut flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: a valid NUL-terminated path; the fd is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// What kind of file `mode` (`st_mode`) is, in words.
pub fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// Opens `path` as [`open_nonblocking`] does and requires a regular file.
pub fn open_regular(path: &Path, follow: bool) -> io::Result<(File, std::fs::Metadata)> {
    let f = open_nonblocking(path, follow)?;
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {}", path.display(), kind_of(md.mode())),
        ));
    }
    Ok((f, md))
}

/// Whether every directory looked up while resolving `path` (symlinks
/// followed, at most 40) is owned by root and writable by nobody else, and
/// the file it names is a regular file owned by root and writable by nobody
/// else. Then no other user can plant anything beside it (a `.debug` or
/// `.dwp` file, a FIFO) nor swap it. Only `lstat`/`readlink` are used.
pub fn root_controlled(path: &Path) -> bool {
    fn locked(md: &std::fs::Metadata) -> bool {
        md.uid() == 0 && md.mode() & 0o022 == 0
    }
    if !path.is_absolute() {
        return false;
    }
    let mut todo: VecDeque<OsString> = VecDeque::new();
    let push_front = |todo: &mut VecDeque<OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push_front(n.to_os_string()),
                Component::ParentDir => todo.push_front("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
    };
    push_front(&mut todo, path);
    let mut dir = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        // The lookup of `name` happens in `dir`: it must be root's alone.
        match std::fs::symlink_metadata(&dir) {
            Ok(md) if md.is_dir() && locked(&md) => {}
            _ => return false,
        }
        if name == ".." {
            dir.pop();
            continue;
        }
        let next = dir.join(&name);
        let Ok(md) = std::fs::symlink_metadata(&next) else {
            return false;
        };
        if md.file_type().is_symlink() {
            links += 1;
            let Ok(target) = std::fs::read_link(&next) else {
                return false;
            };
            if links > 40 {
                return false;
            }
            if target.is_absolute() {
                dir = PathBuf::from("/");
            }
            push_front(&mut todo, &target);
        } else if todo.is_empty() {
            return md.is_file() && locked(&md);
        } else if md.is_dir() {
            dir = next;
        } else {
            return false;
        }
    }
    false
}

/// Whether the ELF file `f` has a section that makes blazesym look for
/// another file by name: `.gnu_debuglink`, `.gnu_debugaltlink` or
/// `.debug_sup`. Reads only the section headers and their names. A file
/// that does not parse counts as having one (the cautious answer).
pub fn has_debug_links(f: &File) -> bool {
    use object::read::elf::{FileHeader, SectionHeader};
    let cache = object::ReadCache::new(f);
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(&cache) else {
        return true;
    };
    let Ok(endian) = header.endian() else {
        return true;
    };
    let Ok(sections) = header.sections(endian, &cache) else {
        return true;
    };
    sections.iter().any(|s| {
        sections
            .section_name(endian, s)
            .is_ok_and(|n| matches!(n, b".gnu_debuglink" | b".gnu_debugaltlink" | b".debug_sup"))
            && s.sh_type(endian) != object::elf::SHT_NOBITS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("profiler-untrusted-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn fifo_opens_without_blocking_and_is_refused() {
        let d = tmp("fifo");
        let p = d.join("f");
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = open_regular(&p, false).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlink_is_refused_unless_followed() {
        let d = tmp("link");
        std::fs::write(d.join("real"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        let err = open_regular(&d.join("link"), false).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert!(open_regular(&d.join("link"), true).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn root_controlled_paths() {
        // System files are root's (when the tests run as root or not).
        assert!(root_controlled(Path::new("/bin/sh")) || !Path::new("/bin/sh").exists());
        assert!(!root_controlled(Path::new("relative")));
        assert!(!root_controlled(Path::new("/nonexistent/file")));
        // /tmp is writable by everyone.
        let d = tmp("rc");
        std::fs::write(d.join("f"), b"x").unwrap();
        assert!(!root_controlled(&d.join("f")));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!root_controlled(&d.join("f")), "parent /tmp is 1777");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn debug_links_are_seen() {
        let me = File::open("/proc/self/exe").unwrap();
        // Test binaries are not split: no debug link.
        assert!(!has_debug_links(&me));
        let d = tmp("links");
        std::fs::write(d.join("junk"), b"not an ELF file").unwrap();
        assert!(has_debug_links(&File::open(d.join("junk")).unwrap()));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
