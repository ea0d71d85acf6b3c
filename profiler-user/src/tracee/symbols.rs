//! Function symbols of an ELF binary, read once with `object`: `.symtab`
//! and `.dynsym`, demangled (Rust legacy and v0, C++), with each address
//! converted to the file offset that uprobes attach to (PIE and ASLR need
//! nothing more: the kernel maps the offset in every process).
use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::{Error, Result};

/// A function defined in a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Demangled name for display and matching (Rust names without hash).
    pub name: String,
    /// The raw symbol name.
    pub raw: String,
    /// Virtual address in the ELF.
    pub addr: u64,
    /// Offset in the file: what a uprobe attaches to.
    pub offset: u64,
    /// Size in bytes (0 when unknown).
    pub size: u64,
}

/// Demangles a raw symbol: Rust (legacy and v0) without the hash, then C++,
/// else the raw name unchanged.
pub fn demangle(raw: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(raw) {
            if let Ok(s) = sym.demangle(&cpp_demangle::DemangleOptions::default()) {
                return s;
            }
        }
    }
    raw.to_string()
}

/// A binary's function symbols and the bytes they were read from (the
/// exit finder decodes the functions' code from them, so the file is read
/// once). Derefs to the symbols.
pub struct Functions {
    /// The whole ELF file.
    pub data: Vec<u8>,
    /// Its functions, sorted by address.
    pub symbols: Vec<Symbol>,
}

impl std::ops::Deref for Functions {
    type Target = [Symbol];
    fn deref(&self) -> &[Symbol] {
        &self.symbols
    }
}

/// Reads the function symbols of the ELF file at `path`. One symbol per
/// address (aliases collapse to the first name seen, `.symtab` first), sorted
/// by address.
#[cfg(test)]
pub fn read_functions(path: &Path) -> Result<Vec<Symbol>> {
    read_binary(path).map(|f| f.symbols)
}

/// The values of `obj`'s defined dynamic symbols whose names `keep`
/// accepts, by name. `.dynsym` and `.dynstr` are read whole, one read
/// each: `object`'s symbol iterator over a `ReadCache` seeks and reads for
/// every name on its own (node has 75,000), and on the 9p root of a
/// virtual machine the Python and V8 checks of node's binary held the
/// session's collector for longer than a 90-s recording, so that node's
/// JavaScript frames were never found.
pub fn dynamic_values<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    keep: impl Fn(&[u8]) -> bool,
) -> HashMap<Vec<u8>, u64> {
    let data = |name| obj.section_by_name(name).and_then(|s| s.data().ok());
    let (Some(syms), Some(names)) = (data(".dynsym"), data(".dynstr")) else {
        return HashMap::new();
    };
    let mut out = HashMap::new();
    // Elf64_Sym: st_name (4 bytes), st_info, st_other, st_shndx (2),
    // st_value (8), st_size (8); little-endian (x86-64 only).
    for sym in syms.chunks_exact(24) {
        let name_at = u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]]) as usize;
        let shndx = u16::from_le_bytes([sym[6], sym[7]]);
        if shndx == 0 {
            continue; // undefined: imported from another binary
        }
        let Some(rest) = names.get(name_at..) else {
            continue;
        };
        let name = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
        if keep(name) {
            let mut v = [0u8; 8];
            v.copy_from_slice(&sym[8..16]);
            out.insert(name.to_vec(), u64::from_le_bytes(v));
        }
    }
    out
}

/// `read_functions` (in tests), keeping the file's bytes.
pub fn read_binary(path: &Path) -> Result<Functions> {
    let bad = |reason: String| Error::BadElf {
        path: path.to_path_buf(),
        reason,
    };
    let data = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let file = object::File::parse(&*data).map_err(|e| bad(format!("not an ELF file ({e})")))?;
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .filter_map(|s| {
            let (off, fsize) = s.file_range();
            (fsize > 0).then_some((s.address(), fsize, off))
        })
        .collect();
    let to_offset = |addr: u64| {
        segments
            .iter()
            .find(|(vaddr, size, _)| addr >= *vaddr && addr < vaddr + size)
            .map(|(vaddr, _, off)| addr - vaddr + off)
    };
    let mut by_addr: BTreeMap<u64, Symbol> = BTreeMap::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(raw) = sym.name() else { continue };
        if raw.is_empty() || by_addr.contains_key(&sym.address()) {
            continue;
        }
        let Some(offset) = to_offset(sym.address()) else {
            continue;
        };
        let raw = raw.split('@').next().unwrap_or(raw).to_string();
        by_addr.insert(
            sym.address(),
            Symbol {
                name: demangle(&raw),
                raw,
                addr: sym.address(),
                offset,
                size: sym.size(),
            },
        );
    }
    drop(file);
    Ok(Functions {
        data,
        symbols: by_addr.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(demangle("_ZN4test4main17h0123456789abcdefE"), "test::main");
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(demangle("parse_json"), "parse_json");
    }

    /// As `object`'s own iterator gives them, for the defined ones.
    #[test]
    fn dynamic_values_are_the_defined_symbols_of_dynsym() {
        let libc = std::fs::File::open("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let data = object::ReadCache::new(libc);
        let obj = object::File::parse(&data).unwrap();
        let want: HashMap<Vec<u8>, u64> = obj
            .dynamic_symbols()
            .filter(|s| !s.is_undefined())
            .filter_map(|s| Some((s.name_bytes().ok()?.to_vec(), s.address())))
            .filter(|(n, _)| n.starts_with(b"mall"))
            .collect();
        let got = dynamic_values(&obj, |n| n.starts_with(b"mall"));
        assert!(got.contains_key(&b"malloc"[..]), "{got:?}");
        assert_eq!(got, want);
        // Our own executable imports malloc: undefined there, not listed.
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let data = object::ReadCache::new(exe);
        let obj = object::File::parse(&data).unwrap();
        assert!(!dynamic_values(&obj, |n| n == b"malloc").contains_key(&b"malloc"[..]));
    }

    #[test]
    fn reads_own_functions_with_offsets() {
        let syms = read_functions(Path::new("/proc/self/exe")).unwrap();
        assert!(syms.len() > 100);
        assert!(syms
            .iter()
            .any(|s| s.name.ends_with("reads_own_functions_with_offsets")));
        assert!(syms.iter().all(|s| s.offset > 0));
        let not_elf = read_functions(Path::new("/proc/self/status")).unwrap_err();
        assert!(not_elf.to_string().contains("not an ELF file"), "{not_elf}");
    }
}
