//! Turns addresses into names with blazesym: user addresses of a process
//! (ELF symbols, DWARF with inlined functions and file:line, debug files
//! under /usr/lib/debug; demangled) and kernel addresses (kallsyms).
//! Results are cached per address; a frame that cannot be resolved is kept
//! as `[unknown] 0x…`, never dropped.
use std::collections::HashMap;

use std::path::PathBuf;

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Process, Source},
        Input, Symbolized, Symbolizer as Blaze,
    },
    Pid,
};

/// Largest cache before it is cleared, to keep memory flat.
const CACHE_CAP: usize = 200_000;

/// Frames of one address, outermost first: the function, then the
/// functions inlined into it at that address (suffixed `_[i]`).
pub type Frames = Vec<String>;

/// One executable file mapping of a process: what it takes to symbolize
/// its addresses after the process is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExecMap {
    start: u64,
    end: u64,
    offset: u64,
    path: PathBuf,
}

/// The vDSO's name in `/proc/PID/maps`. Every process maps the same kernel
/// vDSO image, so its addresses are symbolized through our own mapping.
const VDSO: &str = "[vdso]";

/// Executable file mappings from the text of `/proc/PID/maps`.
fn parse_exec_maps(text: &str) -> Vec<ExecMap> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            if !perms.contains('x') || !(path.starts_with('/') || path == VDSO) {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some(ExecMap {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path: PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(&path)),
            })
        })
        .collect()
}

/// Address-to-name resolution, with a cache.
pub struct Symbolizer {
    blaze: Blaze,
    pid: u32,
    cache: HashMap<(u32, u64), Frames>,
    maps: HashMap<u32, Vec<ExecMap>>,
    /// Every address resolved, kept for `profile.data` (or, offline, the
    /// only source of names).
    journal: HashMap<(u32, u64), Frames>,
    offline: bool,
}

/// Pseudo-pid under which kernel addresses are cached.
const KERNEL: u32 = 0;

impl Symbolizer {
    /// A symbolizer whose default process is `pid`.
    pub fn new(pid: u32) -> Self {
        let mut s = Symbolizer {
            blaze: Blaze::new(),
            pid,
            cache: HashMap::new(),
            maps: HashMap::new(),
            journal: HashMap::new(),
            offline: false,
        };
        s.remember_maps(pid);
        s
    }

    /// Snapshots `pid`'s executable mappings, so its addresses can still be
    /// symbolized (from the files, by offset) after it exits. Call it again
    /// from time to time to catch `dlopen`.
    pub fn remember_maps(&mut self, pid: u32) {
        if pid == KERNEL {
            return;
        }
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            let maps = parse_exec_maps(&text);
            if !maps.is_empty() {
                self.maps.insert(pid, maps);
            }
        }
    }

    /// A symbolizer that only answers from a journal (offline replay).
    pub fn offline(pid: u32, journal: impl IntoIterator<Item = (u32, u64, Frames)>) -> Self {
        let journal = journal.into_iter().map(|(p, a, f)| ((p, a), f)).collect();
        Symbolizer {
            blaze: Blaze::new(),
            pid,
            cache: HashMap::new(),
            maps: HashMap::new(),
            journal,
            offline: true,
        }
    }

    /// Every address resolved so far, for `profile.data`.
    pub fn journal(&self) -> Vec<(u32, u64, Frames)> {
        let mut v: Vec<_> = self
            .journal
            .iter()
            .map(|(&(p, a), f)| (p, a, f.clone()))
            .collect();
        v.sort();
        v
    }

    /// `file:line` of the instruction at `addr` in process `pid`, from DWARF,
    /// when the binary has it (innermost, i.e. inside inlined code).
    pub fn location(&self, pid: u32, addr: u64) -> Option<String> {
        if self.offline {
            return None;
        }
        let src = Source::Process(Process::new(Pid::from(pid)));
        let syms = self.blaze.symbolize(&src, Input::AbsAddr(&[addr])).ok()?;
        let Symbolized::Sym(sym) = syms.first()? else {
            return None;
        };
        let ci = sym
            .inlined
            .last()
            .and_then(|i| i.code_info.as_ref())
            .or(sym.code_info.as_deref())?;
        let file = std::path::Path::new(&ci.file)
            .file_name()?
            .to_string_lossy()
            .into_owned();
        Some(match ci.line {
            Some(line) => format!("{file}:{line}"),
            None => file,
        })
    }

    /// True once `pid`'s mappings were remembered.
    pub fn knows(&self, pid: u32) -> bool {
        self.maps.contains_key(&pid)
    }

    /// Innermost names for a user stack of the default process (innermost
    /// first), without inlined frames: for matching against traced calls.
    pub fn user_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(self.pid, addrs)
            .into_iter()
            .map(|mut f| f.swap_remove(0))
            .collect()
    }

    /// Names for a kernel stack (innermost first), suffixed `_[k]`.
    pub fn kernel_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(KERNEL, addrs)
            .into_iter()
            .map(|mut f| format!("{}_[k]", f.swap_remove(0)))
            .collect()
    }

    /// Frames for every address of a stack (innermost first) of process
    /// `pid` (0: the kernel). Return addresses past the first are moved back
    /// one byte so they land inside the call instruction.
    pub fn frames(&mut self, pid: u32, addrs: &[u64]) -> Vec<Frames> {
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
            .collect();
        let missing: Vec<u64> = lookup
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&(pid, *a)))
            .collect();
        if self.offline {
            return lookup
                .iter()
                .map(|a| {
                    self.journal
                        .get(&(pid, *a))
                        .cloned()
                        .unwrap_or_else(|| unknown(*a))
                })
                .collect();
        }
        if !missing.is_empty() {
            if self.cache.len() + missing.len() > CACHE_CAP {
                self.cache.clear();
            }
            let resolved: Vec<Frames> = if pid == KERNEL {
                let src = Source::Kernel(Kernel {
                    debug_syms: false,
                    ..Kernel::default()
                });
                to_frames(
                    self.blaze.symbolize(&src, Input::AbsAddr(&missing)).ok(),
                    &missing,
                )
            } else {
                // Live process first; what it cannot resolve (it exited, or
                // is a zombie with empty maps) from the remembered mappings.
                let src = Source::Process(Process::new(Pid::from(pid)));
                let mut frames = to_frames(
                    self.blaze.symbolize(&src, Input::AbsAddr(&missing)).ok(),
                    &missing,
                );
                let unresolved: Vec<usize> = (0..frames.len())
                    .filter(|&i| frames[i][0].starts_with("[unknown]"))
                    .collect();
                if !unresolved.is_empty() {
                    let addrs: Vec<u64> = unresolved.iter().map(|&i| missing[i]).collect();
                    for (i, f) in unresolved
                        .into_iter()
                        .zip(self.resolve_from_files(pid, &addrs))
                    {
                        frames[i] = f;
                    }
                }
                frames
            };
            let resolved: Vec<Frames> = resolved
                .into_iter()
                .zip(&missing)
                .map(|(f, &a)| {
                    if f[0].starts_with("[unknown]") {
                        self.unknown_in_binary(pid, a).unwrap_or(f)
                    } else {
                        f
                    }
                })
                .collect();
            for (a, f) in missing.into_iter().zip(resolved) {
                if self.journal.len() < CACHE_CAP {
                    self.journal.insert((pid, a), f.clone());
                }
                self.cache.insert((pid, a), f);
            }
        }
        lookup
            .iter()
            .map(|a| self.cache[&(pid, *a)].clone())
            .collect()
    }
}

impl Symbolizer {
    /// `[unknown] binary+0xoffset` for an address no symbol covers, when a
    /// remembered mapping does.
    fn unknown_in_binary(&mut self, pid: u32, addr: u64) -> Option<Frames> {
        if pid == KERNEL {
            return None;
        }
        if !self.maps.contains_key(&pid) {
            self.remember_maps(pid);
        }
        let m = self
            .maps
            .get(&pid)?
            .iter()
            .find(|m| addr >= m.start && addr < m.end)?;
        let name = m
            .path
            .file_name()
            .map_or_else(|| m.path.to_string_lossy(), |n| n.to_string_lossy());
        Some(vec![format!(
            "[unknown] {name}+{:#x}",
            addr - m.start + m.offset
        )])
    }

    /// Start of this process's own vDSO mapping.
    fn own_vdso_start(&self) -> u64 {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        parse_exec_maps(&text)
            .into_iter()
            .find(|m| m.path.as_os_str() == VDSO)
            .map_or(0, |m| m.start)
    }

    /// Symbolizes addresses of an exited process from its remembered
    /// mappings: each address becomes a file offset in its binary.
    fn resolve_from_files(&self, pid: u32, addrs: &[u64]) -> Vec<Frames> {
        let mut out: Vec<Frames> = addrs.iter().map(|a| unknown(*a)).collect();
        let Some(maps) = self.maps.get(&pid) else {
            return out;
        };
        let mut by_file: HashMap<&PathBuf, Vec<(usize, u64)>> = HashMap::new();
        for (i, &a) in addrs.iter().enumerate() {
            if let Some(m) = maps.iter().find(|m| a >= m.start && a < m.end) {
                by_file
                    .entry(&m.path)
                    .or_default()
                    .push((i, a - m.start + m.offset));
            }
        }
        for (path, items) in by_file {
            let offsets: Vec<u64> = items.iter().map(|&(_, o)| o).collect();
            if path.as_os_str() == VDSO {
                let own = self.own_vdso_start();
                let addrs: Vec<u64> = offsets.iter().map(|o| o + own).collect();
                let src = Source::Process(Process::new(Pid::Slf));
                let frames = to_frames(
                    self.blaze.symbolize(&src, Input::AbsAddr(&addrs)).ok(),
                    &addrs,
                );
                for ((i, _), f) in items.into_iter().zip(frames) {
                    out[i] = f;
                }
                continue;
            }
            let src = Source::Elf(Elf::new(path.clone()));
            let frames = to_frames(
                self.blaze.symbolize(&src, Input::FileOffset(&offsets)).ok(),
                &offsets,
            );
            for ((i, _), f) in items.into_iter().zip(frames) {
                if !f[0].starts_with("[unknown]") {
                    out[i] = f;
                }
            }
        }
        out
    }
}

fn unknown(a: u64) -> Frames {
    vec![format!("[unknown] {a:#x}")]
}

fn to_frames(syms: Option<Vec<Symbolized<'_>>>, addrs: &[u64]) -> Vec<Frames> {
    match syms {
        Some(syms) => syms
            .iter()
            .zip(addrs)
            .map(|(s, a)| match s {
                Symbolized::Sym(sym) => {
                    let mut f = vec![sym.name.to_string()];
                    f.extend(sym.inlined.iter().map(|i| format!("{}_[i]", i.name)));
                    f
                }
                Symbolized::Unknown(_) => unknown(*a),
            })
            .collect(),
        None => addrs.iter().map(|a| unknown(*a)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolizer() -> u64 {
        marker_function_for_symbolizer as *const () as u64
    }

    #[test]
    fn resolves_own_function_and_keeps_unknowns() {
        let mut s = Symbolizer::new(std::process::id());
        let names = s.user_stack(&[marker_function_for_symbolizer(), 0x10]);
        assert!(
            names[0].ends_with("marker_function_for_symbolizer"),
            "{names:?}"
        );
        assert!(names[1].starts_with("[unknown]"), "{names:?}");
    }

    #[test]
    fn symbolizes_from_remembered_maps_by_file_offset() {
        let me = std::process::id();
        let s = Symbolizer::new(me);
        let addr = marker_function_for_symbolizer();
        let frames = s.resolve_from_files(me, &[addr]);
        assert!(
            frames[0][0].ends_with("marker_function_for_symbolizer"),
            "{frames:?}"
        );
        let maps = parse_exec_maps("55d4c0a01000-55d4c0a02000 r-xp 00001000 fe:01 123 /usr/bin/my app\n7f-80 rw-p 0 0:0 0 [heap]\n");
        assert_eq!(
            maps,
            vec![ExecMap {
                start: 0x55d4c0a01000,
                end: 0x55d4c0a02000,
                offset: 0x1000,
                path: "/usr/bin/my app".into()
            }]
        );
    }
}
