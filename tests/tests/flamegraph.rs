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
