//! Differential flame graph of two folded files (`a;b;c 123` lines), as in
//! Brendan Gregg's difffolded.pl + flamegraph.pl: frames are sized by the
//! `after` profile and colored by the change, red for growth, blue for
//! shrinkage. Built with inferno's `differential` and `flamegraph` modules.
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use inferno::{
    differential,
    flamegraph::{self, Options},
};

/// Folded files in a session directory, in order of preference.
pub const FOLDED_FILES: [&str; 2] = ["cpu.folded", "trace.folded"];

/// The folded file to compare for `dir`: `dir` itself when it is a file,
/// else `cpu.folded` in it if present, else `trace.folded`, else `None`.
pub fn resolve_folded(dir: &Path) -> Option<PathBuf> {
    if dir.is_file() {
        return Some(dir.to_path_buf());
    }
    FOLDED_FILES
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

/// Renders the differential flame graph of `before` → `after` (absolute
/// counts, not normalized) as SVG.
#[cfg(test)]
pub fn diff_svg(before: &Path, after: &Path, title: &str) -> Result<Vec<u8>, String> {
    diff_svg_with(before, after, title, false)
}

/// Like `diff_svg` (in tests); with `normalize`, `before` is scaled to `after`'s
/// total first, so runs of different lengths compare by share of time.
pub fn diff_svg_with(
    before: &Path,
    after: &Path,
    title: &str,
    normalize: bool,
) -> Result<Vec<u8>, String> {
    let open = |p: &Path| {
        File::open(p)
            .map(BufReader::new)
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut diffed = Vec::new();
    let opts = differential::Options {
        normalize,
        strip_hex: false,
    };
    differential::from_readers(opts, open(before)?, open(after)?, &mut diffed)
        .map_err(|e| format!("diffing {} and {}: {e}", before.display(), after.display()))?;

    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(format!(
        "{} → {} (red: grew, blue: shrank)",
        before.display(),
        after.display()
    ));
    opts.count_name = count_name(after).to_string();
    opts.name_type = "Function:".to_string();
    let mut out = Vec::new();
    if diffed.iter().all(u8::is_ascii_whitespace) {
        // inferno refuses empty input; say so in a valid, empty graph.
        flamegraph::from_lines(&mut opts, ["no samples in either profile 1 1"], &mut out)
    } else {
        flamegraph::from_reader(&mut opts, diffed.as_slice(), &mut out)
    }
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Unit of a folded file's counts: `trace.folded` holds nanoseconds of
/// self time, sampled profiles hold sample counts.
fn count_name(path: &Path) -> &'static str {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("trace.folded") => "ns",
        _ => "samples",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("profiler-diff-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn parse(svg: &[u8]) -> String {
        let text = String::from_utf8(svg.to_vec()).unwrap();
        assert!(text.starts_with("<?xml"), "{}", &text[..80.min(text.len())]);
        let opts = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&text, opts).unwrap();
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        text
    }

    #[test]
    fn two_profiles_make_a_differential_svg() {
        let d = TempDir::new("two");
        std::fs::create_dir_all(d.0.join("a")).unwrap();
        std::fs::create_dir_all(d.0.join("b")).unwrap();
        let before = d.0.join("a/trace.folded");
        let after = d.0.join("b/cpu.folded");
        std::fs::write(&before, "main;parse 100\nmain;render 50\n").unwrap();
        std::fs::write(&after, "main;parse 30\nmain;render 50\nmain;<evil> 20\n").unwrap();
        std::fs::write(d.0.join("b/trace.folded"), "ignored 1\n").unwrap();

        assert_eq!(resolve_folded(&d.0.join("a")), Some(before.clone()));
        assert_eq!(resolve_folded(&d.0.join("b")), Some(after.clone()));
        assert_eq!(resolve_folded(&after), Some(after.clone()));
        assert_eq!(resolve_folded(&d.0.join("missing")), None);

        let svg = parse(&diff_svg(&before, &after, "before vs after").unwrap());
        for name in ["parse", "render", "main", "before vs after", "&lt;evil&gt;"] {
            assert!(svg.contains(name), "no {name} in SVG");
        }
        // Differential colors: parse shrank (blue), evil is new (red).
        assert!(svg.contains("rgb(255,"), "no red frame");
        assert!(svg.contains(",255)"), "no blue frame");
        assert!(diff_svg_with(&before, &after, "n", true).is_ok());
    }

    #[test]
    fn empty_and_missing_inputs() {
        let d = TempDir::new("empty");
        let empty = d.0.join("cpu.folded");
        std::fs::write(&empty, "").unwrap();
        parse(&diff_svg(&empty, &empty, "t").unwrap());
        let err = diff_svg(&d.0.join("nope"), &empty, "t").unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }
}
