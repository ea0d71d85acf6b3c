//! Finds a shared library the way the target's dynamic loader (glibc's
//! `ld.so`) would, so `--lib` can probe it before it is mapped: a path is
//! used as is; a bare name is looked up in the executable's `DT_RPATH`
//! (when it has no `DT_RUNPATH`), `LD_LIBRARY_PATH`, `DT_RUNPATH`,
//! `/etc/ld.so.cache`, then the default directories. Everything is read
//! inside the target's root (`/proc/PID/root` for a running process), with
//! symlinks resolved against that root, not ours.
//!
//! Not modelled: `glibc-hwcaps` subdirectories (cache entries with a
//! hardware-capability mask are skipped), `$PLATFORM`, and the secure
//! (setuid) mode that ignores `LD_LIBRARY_PATH`.
use std::{
    ffi::OsString,
    fs,
    io::Read,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Component, Path, PathBuf},
};

use object::read::elf::{Dyn as _, ElfFile64};

/// Directories searched last (Debian's multiarch ones first).
pub const DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The loader cache, inside the target's root.
pub const CACHE: &str = "/etc/ld.so.cache";

/// What the loader of one process sees.
#[derive(Debug, Clone)]
pub struct Loader {
    /// The target's root as a path from here: `/`, or `/proc/PID/root`.
    pub root: PathBuf,
    /// The executable as the target sees it (for `$ORIGIN`).
    pub exe: PathBuf,
    /// The same file, openable from here (for its dynamic section).
    pub exe_open: PathBuf,
    /// The target's working directory as it sees it (for relative paths).
    pub cwd: PathBuf,
    /// The target's `LD_LIBRARY_PATH`, if set.
    pub ld_library_path: Option<OsString>,
}

/// A library found: where the target sees it and where we open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Canonical path inside the target's root.
    pub path: PathBuf,
    /// The same file from here (the root joined with `path`).
    pub open_path: PathBuf,
}

impl Loader {
    /// The loader of a running process: its root, cwd and environment
    /// through `/proc/PID`.
    pub fn of_process(pid: u32, exe: &Path) -> Loader {
        let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let ld_library_path = environ
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(b"LD_LIBRARY_PATH="))
            .map(|v| OsString::from_vec(v.to_vec()));
        Loader {
            root: PathBuf::from(format!("/proc/{pid}/root")),
            exe: exe.to_path_buf(),
            exe_open: PathBuf::from(format!("/proc/{pid}/exe")),
            cwd: fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| "/".into()),
            ld_library_path,
        }
    }

    /// The loader of a command we launch: our root, cwd and environment.
    pub fn of_launch(program: &Path) -> Loader {
        Loader {
            root: PathBuf::from("/"),
            exe: fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf()),
            exe_open: program.to_path_buf(),
            cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH"),
        }
    }

    /// `p` (a path inside the target's root) as a path from here.
    pub fn host(&self, p: &Path) -> PathBuf {
        match p.strip_prefix("/") {
            Ok(rel) if self.root != Path::new("/") => self.root.join(rel),
            _ => p.to_path_buf(),
        }
    }

    /// `p` with every symlink resolved inside the target's root (an
    /// absolute link target restarts at that root, `..` stops at it).
    /// `None` when some component does not exist.
    pub fn canonical(&self, p: &Path) -> Option<PathBuf> {
        let mut out = PathBuf::from("/");
        let mut todo: Vec<OsString> = Vec::new();
        let push = |todo: &mut Vec<OsString>, p: &Path| {
            for c in p.components().rev() {
                match c {
                    Component::Normal(n) => todo.push(n.to_os_string()),
                    Component::ParentDir => todo.push("..".into()),
                    _ => {}
                }
            }
        };
        push(&mut todo, p);
        let mut links = 0;
        while let Some(c) = todo.pop() {
            if c == ".." {
                out.pop();
                continue;
            }
            let cand = out.join(&c);
            let meta = fs::symlink_metadata(self.host(&cand)).ok()?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = fs::read_link(self.host(&cand)).ok()?;
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                push(&mut todo, &target);
            } else {
                out = cand;
            }
        }
        Some(out)
    }

    /// `p` if it is a 64-bit x86-64 ELF file inside the root (what this
    /// loader would accept), canonical.
    fn accept(&self, p: &Path) -> Option<Found> {
        let path = self.canonical(p)?;
        let open_path = self.host(&path);
        let mut head = [0u8; 20];
        let mut f = fs::File::open(&open_path).ok()?;
        if !f.metadata().ok()?.is_file() {
            return None;
        }
        f.read_exact(&mut head).ok()?;
        let elf64_x86 = head[..4] == *b"\x7fELF"
            && head[4] == 2
            && u16::from_le_bytes([head[18], head[19]]) == 62;
        elf64_x86.then_some(Found { path, open_path })
    }

    /// The executable's `DT_RPATH` and `DT_RUNPATH` directories, with
    /// `$ORIGIN` (and `$LIB`) expanded; directories naming other tokens
    /// are dropped.
    fn search_paths(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let Ok(data) = fs::read(&self.exe_open) else {
            return (Vec::new(), Vec::new());
        };
        let (rpath, runpath) = dynamic_paths(&data);
        let origin = self.exe.parent().unwrap_or(Path::new("/"));
        let expand = |list: Option<Vec<u8>>| -> Vec<PathBuf> {
            let Some(list) = list else {
                return Vec::new();
            };
            list.split(|&b| b == b':')
                .filter(|d| !d.is_empty())
                .filter_map(|d| {
                    let d = String::from_utf8_lossy(d)
                        .replace("${ORIGIN}", &origin.to_string_lossy())
                        .replace("$ORIGIN", &origin.to_string_lossy())
                        .replace("${LIB}", "lib/x86_64-linux-gnu")
                        .replace("$LIB", "lib/x86_64-linux-gnu");
                    (!d.contains('$')).then(|| PathBuf::from(d))
                })
                .collect()
        };
        (expand(rpath), expand(runpath))
    }

    /// Finds `name` (a path, or a bare file name looked up as the loader
    /// would). On failure, returns where it looked, in words.
    pub fn find(&self, name: &str) -> std::result::Result<Found, Vec<String>> {
        if name.contains('/') {
            // A path is taken as is: reading it tells what is wrong with it.
            let p = self.cwd.join(name);
            return match self.canonical(&p) {
                Some(path) => Ok(Found {
                    open_path: self.host(&path),
                    path,
                }),
                None => Err(vec![format!("{} (no such file)", self.host(&p).display())]),
            };
        }
        let mut looked = Vec::new();
        let try_dirs = |looked: &mut Vec<String>, what: &str, dirs: &[PathBuf]| {
            if dirs.is_empty() {
                return None;
            }
            looked.push(format!(
                "{what} ({})",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            ));
            dirs.iter().find_map(|d| self.accept(&d.join(name)))
        };
        let (rpath, runpath) = self.search_paths();
        if runpath.is_empty() {
            if let Some(f) = try_dirs(&mut looked, "DT_RPATH", &rpath) {
                return Ok(f);
            }
        }
        let env: Vec<PathBuf> = self
            .ld_library_path
            .as_ref()
            .map(|v| {
                v.as_bytes()
                    .split(|&b| b == b':' || b == b';')
                    .filter(|d| !d.is_empty())
                    .map(|d| self.cwd.join(std::ffi::OsStr::from_bytes(d)))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(f) = try_dirs(&mut looked, "LD_LIBRARY_PATH", &env) {
            return Ok(f);
        }
        if let Some(f) = try_dirs(&mut looked, "DT_RUNPATH", &runpath) {
            return Ok(f);
        }
        let cache = fs::read(self.host(Path::new(CACHE))).unwrap_or_default();
        looked.push(CACHE.to_string());
        let entries = parse_cache(&cache);
        // The exact name first; else `libfoo` finds `libfoo.so.1`.
        let hit = entries
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| {
                entries.iter().find(|(k, _)| {
                    k.strip_prefix(name)
                        .is_some_and(|r| r.starts_with('.') || r.starts_with('-'))
                })
            })
            .and_then(|(_, v)| self.accept(Path::new(v)));
        if let Some(f) = hit {
            return Ok(f);
        }
        let defaults: Vec<PathBuf> = DEFAULT_DIRS.iter().map(PathBuf::from).collect();
        if let Some(f) = try_dirs(&mut looked, "the default directories", &defaults) {
            return Ok(f);
        }
        Err(looked)
    }
}

/// The raw `DT_RPATH` and `DT_RUNPATH` strings of an ELF file.
fn dynamic_paths(data: &[u8]) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let Ok(file) = ElfFile64::<object::Endianness>::parse(data) else {
        return (None, None);
    };
    let endian = file.endian();
    let table = file.elf_section_table();
    let Ok(Some((dynamic, link))) = table.dynamic(endian, data) else {
        return (None, None);
    };
    let Ok(strings) = table.strings(endian, data, link) else {
        return (None, None);
    };
    let (mut rpath, mut runpath) = (None, None);
    for d in dynamic {
        let slot = match d.tag32(endian) {
            Some(object::elf::DT_RPATH) => &mut rpath,
            Some(object::elf::DT_RUNPATH) => &mut runpath,
            _ => continue,
        };
        if let Ok(s) = d.string(endian, strings) {
            *slot = Some(s.to_vec());
        }
    }
    (rpath, runpath)
}

/// Magic of glibc's cache format (the only one glibc 2.32+ writes; older
/// files put it after a table in the old format, which is skipped).
const CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Header: magic and version (20), nlibs, len_strings (4 each), flags and
/// padding (4), extension offset (4), unused (12).
const CACHE_HEADER: usize = 48;
/// Entry: flags, key, value, osversion (4 each), hwcap (8).
const CACHE_ENTRY: usize = 24;
/// `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`: an x86-64 glibc library.
const FLAG_X86_64_LIBC6: u32 = 0x0303;

/// The `(name, path)` entries of an `ld.so.cache` for x86-64 libraries
/// (no hardware-capability variants), in the file's order, which is the
/// loader's order of preference. Anything malformed ends the list.
pub fn parse_cache(data: &[u8]) -> Vec<(String, String)> {
    let Some(start) = data
        .windows(CACHE_MAGIC.len())
        .position(|w| w == CACHE_MAGIC)
    else {
        return Vec::new();
    };
    let d = &data[start..];
    let u32_at = |o: usize| {
        d.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |o: usize| {
        d.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    // Byte 28: 0 unknown, 2 little-endian, 3 big-endian.
    let (Some(nlibs), Some(&endian)) = (u32_at(20), d.get(28)) else {
        return Vec::new();
    };
    if endian == 3 {
        return Vec::new();
    }
    // Strings are offsets from the start of this header.
    let string = |o: u32| -> Option<String> {
        let s = d.get(o as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&s[..end]).into_owned())
    };
    let mut out = Vec::new();
    for i in 0..nlibs as usize {
        let e = CACHE_HEADER + i * CACHE_ENTRY;
        let (Some(flags), Some(key), Some(value), Some(hwcap)) =
            (u32_at(e), u32_at(e + 4), u32_at(e + 8), u64_at(e + 16))
        else {
            break;
        };
        if flags != FLAG_X86_64_LIBC6 || hwcap != 0 {
            continue;
        }
        if let (Some(k), Some(v)) = (string(key), string(value)) {
            out.push((k, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache in glibc's format with `entries` (flags, name, path, hwcap).
    fn cache(entries: &[(u32, &str, &str, u64)]) -> Vec<u8> {
        let strings_at = CACHE_HEADER + entries.len() * CACHE_ENTRY;
        let mut strings = Vec::new();
        let mut table = Vec::new();
        for &(flags, k, v, hwcap) in entries {
            let ko = (strings_at + strings.len()) as u32;
            strings.extend_from_slice(k.as_bytes());
            strings.push(0);
            let vo = (strings_at + strings.len()) as u32;
            strings.extend_from_slice(v.as_bytes());
            strings.push(0);
            for x in [flags, ko, vo, 0] {
                table.extend_from_slice(&x.to_le_bytes());
            }
            table.extend_from_slice(&hwcap.to_le_bytes());
        }
        let mut out = CACHE_MAGIC.to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&[2, 0, 0, 0]);
        out.extend_from_slice(&[0; 16]);
        assert_eq!(out.len(), CACHE_HEADER);
        out.extend(table);
        out.extend(strings);
        out
    }

    #[test]
    fn cache_entries_for_x86_64_in_order() {
        let data = cache(&[
            (0x0303, "libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", 0),
            (0x0803, "libz.so.1", "/libx32/libz.so.1", 0),
            (0x0303, "libz.so.1", "/hw/libz.so.1", 1 << 62),
            (0x0303, "libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", 0),
        ]);
        assert_eq!(
            parse_cache(&data),
            vec![
                (
                    "libz.so.1".to_string(),
                    "/lib/x86_64-linux-gnu/libz.so.1".to_string()
                ),
                (
                    "libm.so.6".to_string(),
                    "/lib/x86_64-linux-gnu/libm.so.6".to_string()
                ),
            ]
        );
    }

    #[test]
    fn malformed_caches_give_what_is_whole() {
        assert!(parse_cache(b"").is_empty());
        assert!(parse_cache(b"ld.so-1.7.0 not a cache").is_empty());
        let data = cache(&[(0x0303, "liba.so", "/a/liba.so", 0)]);
        // Cut inside the entry table: nothing; inside the strings: nothing.
        assert!(parse_cache(&data[..CACHE_HEADER + 10]).is_empty());
        assert!(parse_cache(&data[..data.len() - 3]).is_empty());
        let mut big = data.clone();
        big[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_cache(&big).len(), 1);
    }

    #[test]
    fn this_machines_cache_finds_libc() {
        let Ok(data) = fs::read(CACHE) else {
            return;
        };
        let entries = parse_cache(&data);
        assert!(entries.iter().any(|(k, _)| k == "libc.so.6"), "{entries:?}");
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let dir = std::env::temp_dir().join(format!("ldso-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("usr/lib")).unwrap();
        fs::write(dir.join("usr/lib/libx.so.1.2"), b"x").unwrap();
        std::os::unix::fs::symlink("libx.so.1.2", dir.join("usr/lib/libx.so.1")).unwrap();
        // Absolute: must restart at the root, not at ours.
        std::os::unix::fs::symlink("/usr/lib", dir.join("lib")).unwrap();
        let loader = Loader {
            root: dir.clone(),
            exe: "/bin/app".into(),
            exe_open: "/nonexistent".into(),
            cwd: "/".into(),
            ld_library_path: None,
        };
        assert_eq!(
            loader.canonical(Path::new("/lib/libx.so.1")),
            Some(PathBuf::from("/usr/lib/libx.so.1.2"))
        );
        assert_eq!(
            loader.host(Path::new("/usr/lib/libx.so.1.2")),
            dir.join("usr/lib/libx.so.1.2")
        );
        assert_eq!(loader.canonical(Path::new("/lib/nope.so")), None);
        // Not an ELF file: refused by name, taken as a path.
        assert!(loader.find("libx.so.1").is_err());
        assert_eq!(
            loader.find("/lib/libx.so.1").map(|f| f.path),
            Ok(PathBuf::from("/usr/lib/libx.so.1.2"))
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_libc_by_name_and_by_prefix() {
        let loader = Loader::of_launch(Path::new("/bin/sh"));
        let Ok(libc) = loader.find("libc.so.6") else {
            return; // not a glibc system
        };
        assert!(libc.path.is_absolute(), "{libc:?}");
        assert_eq!(loader.find("libc").map(|f| f.path), Ok(libc.path));
        let err = loader.find("libnosuchlib-xyz.so.9").unwrap_err();
        assert!(err.iter().any(|l| l == CACHE), "{err:?}");
    }
}
