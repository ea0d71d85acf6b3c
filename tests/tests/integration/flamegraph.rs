//! trace.folded holds the call chains with self times; flamegraph.svg is valid
//! XML showing the same frames.
use profiler_tests::*;

#[test]
fn folded_and_svg_show_the_call_tree() {
    require_root!();
    let out = TempDir::new("flame");
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "tree_*"]);
    fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    fx.release();
    let o = Outputs::load(out.path());

    let lines: Vec<&str> = o.folded.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted, "trace.folded is sorted");
    let mut self_by_leaf = std::collections::HashMap::<&str, u64>::new();
    for l in &lines {
        let (stack, n) = l
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {l:?}"));
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("bad count in {l:?}"));
        let frames: Vec<&str> = stack.split(';').collect();
        assert_eq!(frames[0], "calls", "root frame is the thread's comm: {l:?}");
        *self_by_leaf.entry(frames[frames.len() - 1]).or_default() += n;
    }
    for chain in [
        "calls;tree_top ",
        "calls;tree_top;tree_mid ",
        "calls;tree_top;tree_mid;tree_leaf ",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(chain)),
            "no {chain:?} in:\n{}",
            o.folded
        );
    }
    for name in ["tree_top", "tree_mid", "tree_leaf"] {
        let (got, want) = (self_by_leaf[name], o.sum(name, "self_ns"));
        assert!(
            got.abs_diff(want) <= want / 100,
            "folded self of {name} {got} vs json {want}"
        );
    }

    // inferno writes a <!DOCTYPE svg PUBLIC …> line: allow the DTD.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&o.svg, opts).expect("SVG is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for name in ["calls", "tree_top", "tree_mid", "tree_leaf"] {
        assert!(
            titles.iter().any(|t| t.starts_with(name)),
            "no frame {name} in SVG: {titles:?}"
        );
    }
}

/// reliability.md #17: a symbol named `evil</script>&amp;<g>` is escaped, not
/// injected: the SVG stays valid XML and shows the name verbatim.
#[test]
fn hostile_symbol_name_is_escaped() {
    require_root!();
    const EVIL: &str = "evil</script>&amp;<g>";
    let out = TempDir::new("hostile");
    let mut fx = Fixture::spawn(calls_exe(), &["hostile"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "evil*"]);
    let truth = fx.run();
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let o = Outputs::load(out.path());
    o.assert_matches_truth(&truth, true);
    assert_eq!(
        o.sum(EVIL, "calls"),
        10,
        "functions.json keeps the exact name"
    );
    // `;` separates frames in trace.folded, so the frame may be sanitized,
    // but the name must not split the stack: one line `calls;FRAME N`.
    let frame = o
        .folded
        .lines()
        .find_map(|l| l.strip_prefix("calls;evil</script>&amp"))
        .and_then(|rest| rest.rsplit_once(' '))
        .map(|(tail, _)| format!("evil</script>&amp{tail}"))
        .unwrap_or_else(|| panic!("no evil frame in trace.folded:\n{}", o.folded));
    assert!(
        !frame.contains(';') && frame.ends_with("<g>"),
        "frame {frame:?}"
    );
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&o.svg, opts).expect("SVG is XML");
    let scripts = doc
        .descendants()
        .filter(|n| n.has_tag_name("script"))
        .count();
    assert!(
        scripts <= 1,
        "{scripts} <script> elements: was the name injected?"
    );
    let shown = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .any(|t| t.starts_with(&frame));
    assert!(shown, "no frame titled {frame:?} in the SVG");
}
