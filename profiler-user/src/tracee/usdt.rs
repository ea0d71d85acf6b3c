//! USDT probes (SystemTap SDT notes, `.note.stapsdt`) of a binary, as
//! file offsets: where a probe's nop is, and its semaphore, which the
//! kernel raises while a uprobe with that `ref_ctr_offset` is attached
//! (the program only reaches its probe sites while it is non-zero).
//!
//! Used for CPython's `gc__start`/`gc__done`: one collection is one call of
//! a function named [`PYTHON_GC`], timed like any traced call.
use object::{Object, ObjectSection, ObjectSegment};

/// The name a garbage collection of CPython is shown under.
pub const PYTHON_GC: &str = "Python GC";

/// One probe: its provider and name, and the file offsets of its site and
/// its semaphore (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usdt {
    pub provider: String,
    pub name: String,
    pub offset: u64,
    pub semaphore: u64,
}

/// The file offset of virtual address `vaddr` (from the loadable
/// segments).
fn file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|s| {
        let (off, size) = s.file_range();
        (vaddr >= s.address() && vaddr < s.address() + size).then(|| vaddr - s.address() + off)
    })
}

/// The USDT probes of the ELF file `data` (none when it has no notes, or
/// they cannot be read).
pub fn probes(data: &[u8]) -> Vec<Usdt> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let Some(notes) = file
        .section_by_name(".note.stapsdt")
        .and_then(|s| s.data().ok())
    else {
        return Vec::new();
    };
    // Addresses in the notes are the link-time ones: `.stapsdt.base`
    // tells how far prelinking or relocation moved them.
    let base_now = file.section_by_name(".stapsdt.base").map(|s| s.address());
    let mut out = Vec::new();
    let mut at = 0usize;
    let u32_at = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(notes.get(i..i + 4)?.try_into().ok()?))
    };
    let u64_at = |d: &[u8], i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(d.get(i..i + 8)?.try_into().ok()?))
    };
    let align4 = |n: usize| (n + 3) & !3;
    while at + 12 <= notes.len() {
        let (Some(namesz), Some(descsz), Some(kind)) = (u32_at(at), u32_at(at + 4), u32_at(at + 8))
        else {
            break;
        };
        let name_at = at + 12;
        let desc_at = name_at + align4(namesz as usize);
        let next = desc_at + align4(descsz as usize);
        let (Some(owner), Some(desc)) = (
            notes.get(name_at..name_at + namesz as usize),
            notes.get(desc_at..desc_at + descsz as usize),
        ) else {
            break;
        };
        at = next;
        if kind != 3 || owner != b"stapsdt\0" {
            continue;
        }
        let (Some(pc), Some(base), Some(sem)) =
            (u64_at(desc, 0), u64_at(desc, 8), u64_at(desc, 16))
        else {
            continue;
        };
        let mut strings = desc.get(24..).unwrap_or_default().split(|&b| b == 0);
        let (Some(provider), Some(name)) = (strings.next(), strings.next()) else {
            continue;
        };
        let shift = base_now.map_or(0, |b| b.wrapping_sub(base));
        let Some(offset) = file_offset(&file, pc.wrapping_add(shift)) else {
            continue;
        };
        let semaphore = match sem {
            0 => 0,
            s => file_offset(&file, s.wrapping_add(shift)).unwrap_or(0),
        };
        out.push(Usdt {
            provider: String::from_utf8_lossy(provider).into_owned(),
            name: String::from_utf8_lossy(name).into_owned(),
            offset,
            semaphore,
        });
    }
    out
}

/// CPython's collection probes: (`gc__start`, `gc__done`), when the
/// binary has both.
pub fn python_gc(probes: &[Usdt]) -> Option<(&Usdt, &Usdt)> {
    let find = |n: &str| {
        probes
            .iter()
            .find(|p| p.provider == "python" && p.name == n)
    };
    Some((find("gc__start")?, find("gc__done")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_python_has_its_collection_probes_with_semaphores() {
        let Ok(data) = std::fs::read("/usr/bin/python3.11") else {
            return;
        };
        let found = probes(&data);
        let (start, done) = python_gc(&found).expect("gc__start and gc__done");
        assert!(start.offset > 0 && done.offset > start.offset, "{found:?}");
        assert!(start.semaphore > 0 && done.semaphore > 0, "{found:?}");
        assert_ne!(start.semaphore, done.semaphore);
        // Each site is the probe's nop.
        assert_eq!(data[start.offset as usize], 0x90);
        assert_eq!(data[done.offset as usize], 0x90);
        assert!(found.iter().any(|p| p.name == "function__entry"));
        assert!(probes(b"not an elf").is_empty());
    }
}
