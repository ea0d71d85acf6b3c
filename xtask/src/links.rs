//! The docs' links (part of `cargo xtask lint`): every relative link in
//! the repository's Markdown (README.md, docs/, the top-level reports,
//! tests/README.md) must name a file that exists, and a `#fragment` a
//! heading of that file (GitHub's anchors). Links inside fenced code and
//! to other sites are not checked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// GitHub's anchor of a heading: lower case, punctuation dropped (but `-`
/// and `_`), spaces as `-`.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors of a Markdown file's headings (duplicates get `-1`, `-2`).
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for l in prose(text) {
        let Some(h) = l.strip_prefix('#') else {
            continue;
        };
        let h = h.trim_start_matches('#');
        if !h.starts_with(' ') {
            continue;
        }
        let base = slug(h);
        let mut s = base.clone();
        let mut n = 0;
        while !out.insert(s.clone()) {
            n += 1;
            s = format!("{base}-{n}");
        }
    }
    out
}

/// The link targets `](target)` of one line.
fn targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(&after[..end]);
        rest = &after[end..];
    }
    out
}

/// Every broken link of `files`, as `file: target (why)`.
pub fn broken(files: &[PathBuf]) -> Vec<String> {
    let mut bad = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let dir = file.parent().unwrap_or(Path::new("."));
        for line in prose(&text) {
            for t in targets(line) {
                let t = t.split_whitespace().next().unwrap_or_default();
                if t.is_empty() || t.contains("://") || t.starts_with("mailto:") {
                    continue;
                }
                let (path, frag) = t.split_once('#').unwrap_or((t, ""));
                let target = if path.is_empty() {
                    file.clone()
                } else {
                    dir.join(path)
                };
                if !target.exists() {
                    bad.push(format!("{}: {t} (no such file)", file.display()));
                    continue;
                }
                if !frag.is_empty() {
                    let other = std::fs::read_to_string(&target).unwrap_or_default();
                    if !anchors(&other).contains(frag) {
                        bad.push(format!("{}: {t} (no such heading)", file.display()));
                    }
                }
            }
        }
    }
    bad
}

/// Checks the repository's Markdown files under `root`.
pub fn check(root: &Path) -> Result<usize> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
        "CHANGELOG.md",
        "tests/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        files.extend(
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
    }
    let bad = broken(&files);
    if !bad.is_empty() {
        bail!("broken links in the docs:\n{}", bad.join("\n"));
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(
            slug("`report.html`: one page to look at"),
            "reporthtml-one-page-to-look-at"
        );
        assert_eq!(
            slug("Stages over several runs (after Pury)"),
            "stages-over-several-runs-after-pury"
        );
        assert_eq!(targets("see [a](b.md#c) and [d](e)"), vec!["b.md#c", "e"]);
    }

    #[test]
    fn broken_links_are_found() {
        let dir = std::env::temp_dir().join(format!("xtask-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.md"), "# Top\n\n## Part two\n\n[ok](#part-two) [bad](#nope) [gone](x.md)\n```\n[in code](y.md)\n```\n").unwrap();
        let bad = broken(&[dir.join("a.md")]);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(
            bad[0].contains("#nope") && bad[1].contains("x.md"),
            "{bad:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
