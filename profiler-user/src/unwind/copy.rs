//! Unwinding user stacks without frame pointers: the kernel copies the top
//! of the user stack and the registers of each user-mode sample
//! (`sample --dwarf`), and framehop walks it with each mapped binary's
//! `.eh_frame` / `.eh_frame_hdr`, the tables compilers emit for exceptions
//! and that distributions keep even when they drop frame pointers.
use std::{collections::HashSet, ops::Range, path::Path};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
};
use object::{Object, ObjectSection, ObjectSegment};

/// Deepest stack unwound.
const MAX_FRAMES: usize = 128;

/// Larger files are not read for their unwind tables.
const MAX_FILE: u64 = 2 << 30;

/// An unwinder for one process, with its executable mappings as modules.
pub struct DwarfUnwinder {
    pid: u32,
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
    loaded: HashSet<(u64, u64)>,
}

fn section(file: &object::File, name: &str) -> Option<(Range<u64>, Vec<u8>)> {
    let s = file.section_by_name(name)?;
    let data = s.uncompressed_data().ok()?.into_owned();
    Some((s.address()..s.address() + s.size(), data))
}

impl DwarfUnwinder {
    /// An unwinder for `pid`, loaded with its current mappings.
    pub fn new(pid: u32) -> Self {
        let mut u = DwarfUnwinder {
            pid,
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            loaded: HashSet::new(),
        };
        u.refresh();
        u
    }

    /// Adds the executable mappings that appeared since the last call
    /// (dlopen). Files are read through `/proc/PID/map_files`, which works
    /// for deleted binaries and other mount namespaces.
    pub fn refresh(&mut self) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else {
            return;
        };
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let path: String = f.skip(2).collect::<Vec<_>>().join(" ");
            if !perms.contains('x') || !path.starts_with('/') {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset)) = (
                u64::from_str_radix(a, 16),
                u64::from_str_radix(b, 16),
                u64::from_str_radix(off, 16),
            ) else {
                continue;
            };
            if !self.loaded.insert((start, end)) {
                continue;
            }
            let open = format!("/proc/{}/map_files/{a}-{b}", self.pid);
            if let Some(m) = module(&open, &path, start, end, offset) {
                self.unwinder.add_module(m);
            }
        }
    }

    /// Return addresses of a sample, innermost first (the instruction pointer
    /// first), from its registers and a copy of the stack starting at `sp`.
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Vec<u64> {
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames = Vec::new();
        let mut it = self.unwinder.iter_frames(
            ip,
            UnwindRegsX86_64::new(ip, sp, bp),
            &mut self.cache,
            &mut read,
        );
        while let Ok(Some(frame)) = it.next() {
            let addr = match frame {
                FrameAddress::InstructionPointer(a) => a,
                FrameAddress::ReturnAddress(a) => u64::from(a),
            };
            if addr == 0 || frames.len() >= MAX_FRAMES {
                break;
            }
            frames.push(addr);
        }
        frames
    }
}

/// The bytes of a mapped file: through `open` (its `/proc/PID/map_files`
/// link) or else by `path`, which the target's user may control: opened
/// without blocking or following a symlink, and only if it is a regular
/// file (a FIFO would block, `/dev/zero`, which can be mapped executable,
/// would never end) of at most [`MAX_FILE`] bytes.
fn read_mapped(open: &str, path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let (f, md) = crate::untrusted::open_regular(Path::new(open), true)
        .or_else(|_| crate::untrusted::open_regular(Path::new(path), false))
        .ok()?;
    if md.len() > MAX_FILE {
        return None;
    }
    let mut data = Vec::with_capacity(md.len() as usize);
    f.take(md.len()).read_to_end(&mut data).ok()?;
    Some(data)
}

/// A framehop module for one executable mapping `[start, end)` of `path`
/// at file `offset`, read from `open`.
fn module(open: &str, path: &str, start: u64, end: u64, offset: u64) -> Option<Module<Vec<u8>>> {
    let data = read_mapped(open, path)?;
    let file = object::File::parse(&*data).ok()?;
    // The load bias: where the segment holding `offset` landed.
    let seg = file.segments().find(|s| {
        let (o, len) = s.file_range();
        offset >= o && offset < o + len.max(1)
    })?;
    let (seg_off, _) = seg.file_range();
    let svma_at_offset = seg.address() + (offset - seg_off);
    let bias = start.wrapping_sub(svma_at_offset);
    let text = section(&file, ".text");
    let eh_frame = section(&file, ".eh_frame");
    let eh_frame_hdr = section(&file, ".eh_frame_hdr");
    let got = file
        .section_by_name(".got")
        .map(|s| s.address()..s.address() + s.size());
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text.as_ref().map(|t| t.0.clone()),
        text: text.map(|t| t.1),
        stubs_svma: None,
        stub_helper_svma: None,
        got_svma: got,
        unwind_info: None,
        eh_frame_svma: eh_frame.as_ref().map(|t| t.0.clone()),
        eh_frame: eh_frame.map(|t| t.1),
        eh_frame_hdr_svma: eh_frame_hdr.as_ref().map(|t| t.0.clone()),
        eh_frame_hdr: eh_frame_hdr.map(|t| t.1),
        debug_frame: None,
        text_segment_svma: None,
        text_segment: None,
    };
    Some(Module::new(path.to_string(), start..end, bias, info))
}
