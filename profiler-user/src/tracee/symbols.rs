//! Function symbols of an ELF binary, read once with `object`: `.symtab`
//! and `.dynsym`, demangled (Rust legacy and v0, C++), with each address
//! converted to the file offset that uprobes attach to (PIE and ASLR need
//! nothing more: the kernel maps the offset in every process).
use std::{collections::BTreeMap, path::Path};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

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
