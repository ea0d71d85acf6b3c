//! Which functions to probe: `--func`/`--exclude` globs over demangled and
//! raw names, the binaries searched (`--lib`), default excludes and the cap.
use std::path::PathBuf;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::{cli::SelectArgs, symbols, target::Target, Error, Result};

/// Runtime and startup internals left out when no `--func` is given: they
/// are not the program's own work, and some never return.
pub const DEFAULT_EXCLUDES: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "__*",
    "_GLOBAL_*",
    "_dl_*",
    "deregister_tm_clones",
    "register_tm_clones",
    "frame_dummy",
    "std::*",
    "core::*",
    "alloc::*",
    "<std::*",
    "<core::*",
    "<alloc::*",
    "<&*",
    "rust_begin_unwind",
    "rust_panic",
    "__gnu_cxx::*",
    "_Unwind_*",
];

/// A compiled set of globs.
#[derive(Debug, Clone)]
pub struct Patterns {
    set: GlobSet,
}

impl Patterns {
    /// Compiles `patterns`, failing with [`Error::BadPattern`] on the first
    /// that does not parse.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            let p = p.as_ref();
            let glob = GlobBuilder::new(p)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .map_err(|e| Error::BadPattern {
                    pattern: p.to_string(),
                    reason: e.kind().to_string(),
                })?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| Error::BadPattern {
            pattern: String::new(),
            reason: e.to_string(),
        })?;
        Ok(Patterns { set })
    }

    /// True when `sym`'s demangled or raw name matches.
    pub fn matches(&self, sym: &symbols::Symbol) -> bool {
        self.set.is_match(&sym.name) || self.set.is_match(&sym.raw)
    }

    /// Number of patterns.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A function chosen for probing.
#[derive(Debug, Clone)]
pub struct Func {
    /// Demangled name.
    pub name: String,
    /// Index into [`Selection::binaries`].
    pub binary: u32,
    /// File offset to attach at.
    pub offset: u64,
}

/// A binary searched for functions.
#[derive(Debug, Clone)]
pub struct Binary {
    /// Path as the target sees it (reported to the user).
    pub path: PathBuf,
    /// Path that opens the same file from here (for reading and attaching).
    pub open_path: PathBuf,
}

/// The outcome of selection.
#[derive(Debug, Default)]
pub struct Selection {
    /// Binaries searched, main executable first.
    pub binaries: Vec<Binary>,
    /// Functions to probe; a function's index here is its probe cookie.
    pub funcs: Vec<Func>,
    /// Functions that matched but were left out by `--max-funcs`.
    pub capped: usize,
}

/// Compiles the patterns in `args` (so a bad one fails before anything
/// else happens).
pub fn compile(args: &SelectArgs) -> Result<(Option<Patterns>, Patterns)> {
    let include = if args.funcs.is_empty() {
        None
    } else {
        Some(Patterns::new(&args.funcs)?)
    };
    let mut excludes: Vec<&str> = args.excludes.iter().map(String::as_str).collect();
    if include.is_none() {
        excludes.extend_from_slice(DEFAULT_EXCLUDES);
    }
    Ok((include, Patterns::new(&excludes)?))
}

/// Chooses the functions to probe in `target`.
pub fn select(target: &Target, args: &SelectArgs) -> Result<Selection> {
    let (include, exclude) = compile(args)?;
    let mut binaries = vec![Binary {
        path: target.exe.clone(),
        open_path: target.exe_open_path(),
    }];
    for lib in &args.libs {
        let m = target.find_library(lib)?;
        if !binaries.iter().any(|b| b.path == m.path) {
            binaries.push(Binary {
                open_path: m.open_path(target.pid),
                path: m.path,
            });
        }
    }
    let mut sel = Selection {
        binaries,
        ..Default::default()
    };
    for (bi, bin) in sel.binaries.iter().enumerate() {
        for sym in symbols::read_functions(&bin.open_path)? {
            let wanted =
                include.as_ref().is_none_or(|inc| inc.matches(&sym)) && !exclude.matches(&sym);
            if !wanted {
                continue;
            }
            if sel.funcs.len() >= args.max_funcs {
                sel.capped += 1;
                continue;
            }
            sel.funcs.push(Func {
                name: sym.name,
                binary: bi as u32,
                offset: sym.offset,
            });
        }
    }
    if sel.funcs.is_empty() {
        let what = if args.funcs.is_empty() {
            "the default selection (all functions minus runtime internals)".to_string()
        } else {
            args.funcs
                .iter()
                .map(|f| format!("--func {f:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let where_ = sel
            .binaries
            .iter()
            .map(|b| b.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::NoMatch {
            what,
            where_,
            pid: target.pid,
        });
    }
    Ok(sel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, raw: &str) -> symbols::Symbol {
        symbols::Symbol {
            name: name.into(),
            raw: raw.into(),
            addr: 1,
            offset: 1,
            size: 1,
        }
    }

    #[test]
    fn globs_match_demangled_or_raw() {
        let p = Patterns::new(&["parse_*", "app::net::*"]).unwrap();
        assert!(p.matches(&sym("parse_json", "parse_json")));
        assert!(p.matches(&sym(
            "app::net::send",
            "_ZN3app3net4send17h0000000000000000E"
        )));
        assert!(!p.matches(&sym("render", "render")));
        let raw = Patterns::new(&["_ZN3app*"]).unwrap();
        assert!(raw.matches(&sym(
            "app::net::send",
            "_ZN3app3net4send17h0000000000000000E"
        )));
    }

    #[test]
    fn bad_pattern_is_reported() {
        let err = Patterns::new(&["a[b"]).unwrap_err().to_string();
        assert!(err.starts_with("bad pattern \"a[b\""), "{err}");
    }

    #[test]
    fn default_excludes_cover_runtime_internals() {
        let args = SelectArgs::default();
        let (inc, exc) = compile(&args).unwrap();
        assert!(inc.is_none());
        assert!(exc.matches(&sym("_start", "_start")));
        assert!(exc.matches(&sym("std::rt::lang_start", "x")));
        assert!(exc.matches(&sym("__libc_csu_init", "__libc_csu_init")));
        assert!(!exc.matches(&sym("parse_json", "parse_json")));
    }
}
