//! `cargo xtask lint`'s layering check of `profiler-user/src`: the folders
//! are the pipeline's layers, in [`LAYERS`] order, and a module may import
//! only from its own layer or an earlier one; no modules may import each
//! other in a cycle.
//!
//! Imports are read from the source text: every path that starts with
//! `crate::`, `super::` or `self::` (in `use` trees and in code), resolved
//! to the module file it names. A `mod.rs` using its own submodules (a
//! folder's facade re-exporting what it chose) is containment, not an
//! import, and is left out of the cycle check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// The layers, first to last: the top-level modules (files or folders of
/// `profiler-user/src`) in each. A module may import from its own layer and
/// from the ones listed before it.
pub const LAYERS: &[(&str, &[&str])] = &[
    (
        "helpers",
        &[
            "error",
            "text",
            "clock",
            "cli",
            "untrusted",
            "heap",
            "linux",
        ],
    ),
    ("tracee", &["tracee"]),
    ("attach", &["attach"]),
    ("symbolize", &["symbolize"]),
    ("unwind", &["unwind"]),
    ("analyze", &["analyze"]),
    ("output", &["output"]),
    ("session", &["session"]),
    ("commands", &["commands"]),
    // Entry points of the fuzz targets (fuzz/): any layer's parsers.
    ("fuzzing", &["fuzzing"]),
];

/// A module of the crate, as its path from the crate root (`[]` is lib.rs).
type ModPath = Vec<String>;

/// Runs the check on `src` (a crate's `src/`, holding `lib.rs`).
pub fn check(src: &Path) -> Result<()> {
    let files = module_files(src)?;
    let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, file) in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let deps = imports(module, &text)
            .into_iter()
            .filter_map(|path| resolve(&modules, &path))
            .filter(|dep| dep != module)
            .collect();
        edges.insert(module.clone(), deps);
    }
    let problems = problems(&edges);
    if !problems.is_empty() {
        bail!(
            "layering of {}:\n  {}",
            src.display(),
            problems.join("\n  ")
        );
    }
    eprintln!(
        "lint: layering of {}: {} modules, layer order and no cycles",
        src.display(),
        modules.len()
    );
    Ok(())
}

/// Everything wrong with `edges` (module -> modules it imports): imports
/// from a later layer, modules in no layer, and cycles.
fn problems(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let mut out = Vec::new();
    for (from, deps) in edges {
        let Some(from_layer) = layer_of(from) else {
            if !from.is_empty() {
                out.push(format!(
                    "{} is in no layer: add it to LAYERS in xtask/src/layers.rs",
                    show(from)
                ));
            }
            continue;
        };
        for dep in deps {
            match layer_of(dep) {
                Some(s) if s > from_layer => out.push(format!(
                    "{} ({}) imports {} from a later layer ({})",
                    show(from),
                    LAYERS[from_layer].0,
                    show(dep),
                    LAYERS[s].0
                )),
                _ => {}
            }
        }
    }
    // Cycles among files; a folder's mod.rs using its own submodules is
    // containment, not an import.
    let files: BTreeMap<ModPath, BTreeSet<ModPath>> = edges
        .iter()
        .map(|(from, deps)| {
            let deps = deps
                .iter()
                .filter(|d| !(d.len() > from.len() && d.starts_with(from)))
                .cloned()
                .collect();
            (from.clone(), deps)
        })
        .collect();
    let file_cycles = cycles(&files);
    for cycle in &file_cycles {
        out.push(format!("import cycle: {}", cycle_text(cycle)));
    }
    // Cycles among the modules of a layer (`analyze::dispatch`, …),
    // whatever files they run through.
    let mut units: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, deps) in &files {
        let unit = |m: &ModPath| m.iter().take(2).cloned().collect::<ModPath>();
        let entry = units.entry(unit(from)).or_default();
        entry.extend(deps.iter().map(unit).filter(|d| *d != unit(from)));
    }
    for cycle in cycles(&units) {
        if !file_cycles.contains(&cycle) {
            out.push(format!(
                "import cycle between modules: {}",
                cycle_text(&cycle)
            ));
        }
    }
    out
}

/// Index in [`LAYERS`] of a module's layer, by its first segment.
fn layer_of(module: &ModPath) -> Option<usize> {
    let first = module.first()?;
    LAYERS
        .iter()
        .position(|(_, mods)| mods.contains(&first.as_str()))
}

fn show(module: &ModPath) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

fn cycle_text(cycle: &[ModPath]) -> String {
    let mut names: Vec<String> = cycle.iter().map(show).collect();
    names.push(names[0].clone());
    names.join(" -> ")
}

/// Every `.rs` file under `src` by module path (`a/mod.rs` and `a.rs` are
/// module `a`). `main.rs` and build scripts are other crates and left out.
fn module_files(src: &Path) -> Result<BTreeMap<ModPath, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("below src");
            let mut module: ModPath = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match module.last().map(String::as_str) {
                Some("mod") => {
                    module.pop();
                }
                Some("lib") if module.len() == 1 => module.clear(),
                Some("main") if module.len() == 1 => continue,
                _ => {}
            }
            out.insert(module, path);
        }
    }
    Ok(out)
}

/// The module a path names: its longest prefix that is a module file.
fn resolve(modules: &BTreeSet<ModPath>, path: &ModPath) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

/// Rust source reduced to tokens: identifiers, `::`, and single
/// punctuation characters; comments, strings and char literals removed.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || (next == Some('#') && raw_string_at(&chars, i)))
        {
            // Raw string: r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime.
            if next == Some('\\') {
                // Past the backslash and the escaped character.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Whether `r#` at `i` opens a raw string (and is not a raw identifier).
fn raw_string_at(chars: &[char], i: usize) -> bool {
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    chars.get(j) == Some(&'"')
}

/// The paths that `text`, the source of `module`, uses from its own crate,
/// made absolute (`super::`, `self::` and inline `mod x { … }` resolved).
fn imports(module: &ModPath, text: &str) -> Vec<ModPath> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // Inline modules open around the current token: (name, brace depth inside).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if toks.get(i + 2).is_some_and(|b| b == "{") => {
                inline.push((toks[i + 1].clone(), depth + 1));
            }
            _ => {}
        }
        let starts_path = matches!(t, "crate" | "super" | "self")
            && toks.get(i + 1).is_some_and(|c| c == "::")
            && !(i > 0 && toks[i - 1] == "::");
        if starts_path {
            let mut here = module.clone();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            let (paths, end) = use_tree(&toks, i, &here);
            out.extend(paths);
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

/// Parses the path (or `use` tree) starting at `toks[i]`, relative to
/// module `here`; returns the absolute paths and the index after it.
fn use_tree(toks: &[String], mut i: usize, here: &ModPath) -> (Vec<ModPath>, usize) {
    let mut prefix: ModPath = Vec::new();
    // Still at the path's start: `crate`, `self` and `super` only.
    let mut leading = true;
    while let Some(t) = toks.get(i) {
        match t.as_str() {
            "crate" if leading => prefix.clear(),
            "self" if leading => prefix = here.clone(),
            "super" if leading => {
                if i == 0 || toks[i - 1] != "::" {
                    prefix = here.clone();
                }
                prefix.pop();
            }
            "{" => {
                let mut paths = Vec::new();
                i += 1;
                while i < toks.len() && toks[i] != "}" {
                    if toks[i] == "," {
                        i += 1;
                        continue;
                    }
                    let (sub, end) = subtree(toks, i, &prefix);
                    paths.extend(sub);
                    i = end.max(i + 1);
                }
                return (paths, i + 1);
            }
            // `a::{self, b}` names `a` itself.
            "self" => {}
            name if is_ident(name) => {
                leading = false;
                prefix.push(name.to_string());
            }
            _ => break,
        }
        i += 1;
        if toks.get(i).is_some_and(|c| c == "::") {
            i += 1;
        } else {
            break;
        }
    }
    (vec![prefix], i)
}

/// A subtree of a `use` group: `name`, `name::…`, `{…}`, `self`, `*`, or
/// `name as alias`, under `prefix`.
fn subtree(toks: &[String], i: usize, prefix: &ModPath) -> (Vec<ModPath>, usize) {
    match toks[i].as_str() {
        "*" => (vec![prefix.clone()], i + 1),
        "self" => (vec![prefix.clone()], i + 1),
        _ => {
            let mut toks2: Vec<String> = Vec::new();
            // Re-root the subtree: parse it as a path under `prefix`.
            toks2.push("crate".into());
            toks2.push("::".into());
            let mut j = i;
            let mut nest = 0usize;
            while j < toks.len() {
                let t = &toks[j];
                if nest == 0 && (t == "," || t == "}") {
                    break;
                }
                if t == "{" {
                    nest += 1;
                } else if t == "}" {
                    nest -= 1;
                }
                toks2.push(t.clone());
                j += 1;
            }
            let (paths, _) = use_tree(&toks2, 0, &Vec::new());
            let paths = paths
                .into_iter()
                .map(|p| prefix.iter().cloned().chain(p).collect())
                .collect();
            (paths, j)
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Cycles in `graph`: every strongly connected component of two or more
/// nodes, each as its nodes in order.
fn cycles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Tarjan's algorithm, iteratively.
    let nodes: Vec<&ModPath> = graph
        .keys()
        .chain(graph.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let id: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| graph.get(*n).into_iter().flatten().map(|d| id[d]).collect())
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&(v, k)) = work.last() {
            if k == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(k) {
                work.last_mut().expect("not empty").1 += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut scc = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    scc.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.reverse();
                    out.push(scc);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> ModPath {
        if s.is_empty() {
            Vec::new()
        } else {
            s.split("::").map(str::to_string).collect()
        }
    }

    #[test]
    fn reads_use_trees_and_inline_paths() {
        let src = r#"
            //! Docs naming crate::output::x are not imports.
            use std::fmt::Write;
            let (quote, backslash) = ('\'', '\\');
            use crate::{analyze::{stacks::Stacks, dispatch::{self, Dispatcher}}, Error};
            use super::sibling::Thing;
            use self::child::*;
            fn f() { let _ = crate::text::fmt_ns(1); let s = "crate::output::y"; }
            fn g<'a>(x: &'a str) -> &'a str { let _ = r"crate::output::z"; x }
            mod tests { use super::*; use super::super::up::X; }
        "#;
        let got = imports(&m("session::collector"), src);
        let want: Vec<ModPath> = [
            "analyze::stacks::Stacks",
            "analyze::dispatch",
            "analyze::dispatch::Dispatcher",
            "Error",
            "session::sibling::Thing",
            "session::collector::child",
            "text::fmt_ns",
            "session::collector",
            "session::up::X",
        ]
        .iter()
        .map(|s| m(s))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn resolves_to_the_longest_module() {
        let modules: BTreeSet<ModPath> = ["", "analyze", "analyze::stacks"]
            .iter()
            .map(|s| m(s))
            .collect();
        assert_eq!(
            resolve(&modules, &m("analyze::stacks::Stacks")),
            Some(m("analyze::stacks"))
        );
        assert_eq!(resolve(&modules, &m("Error")), Some(m("")));
    }

    #[test]
    fn finds_later_stages_and_cycles() {
        let edges: BTreeMap<ModPath, BTreeSet<ModPath>> = [
            ("analyze::a", vec!["output::w", "analyze::b"]),
            ("analyze::b", vec!["analyze::a"]),
            ("analyze", vec!["analyze::a"]),
            ("output::w", vec!["analyze"]),
            ("nowhere", vec![]),
        ]
        .into_iter()
        .map(|(k, v)| (m(k), v.into_iter().map(m).collect()))
        .collect();
        let p = problems(&edges);
        assert!(
            p.iter().any(|l| l
                .contains("analyze::a (analyze) imports output::w from a later layer (output)")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|l| l == "import cycle: analyze::a -> analyze::b -> analyze::a"),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.starts_with("nowhere is in no layer")),
            "{p:?}"
        );
        // analyze (mod.rs) -> analyze::a is containment, not part of a cycle.
        assert!(!p.iter().any(|l| l.contains("-> analyze ->")), "{p:?}");
    }
}
