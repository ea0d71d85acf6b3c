//! `trace.folded` and `flamegraph.svg`: a wall-clock flame graph of the
//! rebuilt call paths. Each path is weighted by its self time; the root
//! frame is the thread's name. Rendered with inferno.
use std::collections::BTreeMap;

use inferno::flamegraph::{self, Options};

use super::Report;
use crate::text::folded_frame;

/// Folded lines, `root;outer;inner self_ns`, sorted.
pub fn folded(r: &Report) -> Vec<String> {
    let mut paths: BTreeMap<String, u64> = BTreeMap::new();
    for t in r.stacks.threads() {
        let root = folded_frame(&r.name_of(t));
        for (id, node) in t.tree.nodes().iter().enumerate().skip(1) {
            if node.self_ns == 0 {
                continue;
            }
            let mut line = root.clone();
            for f in t.tree.path(id as u32) {
                line.push(';');
                line.push_str(&folded_frame(&r.funcs[f as usize].name));
            }
            *paths.entry(line).or_default() += node.self_ns;
        }
    }
    paths
        .into_iter()
        .map(|(path, ns)| format!("{path} {ns}"))
        .collect()
}

/// Renders folded lines as an SVG flame graph.
pub fn svg(lines: &[String], title: &str) -> Result<Vec<u8>, String> {
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.count_name = "ns".to_string();
    opts.name_type = "Function:".to_string();
    let mut out = Vec::new();
    if lines.is_empty() {
        // inferno refuses empty input; say so in a valid, empty graph.
        let empty = ["no completed calls 1".to_string()];
        flamegraph::from_lines(&mut opts, empty.iter().map(String::as_str), &mut out)
    } else {
        flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out)
    }
    .map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_escapes_markup() {
        let lines = vec!["main;</script>&<b> 10".to_string(), "main;ok 5".to_string()];
        let svg = String::from_utf8(svg(&lines, "t").unwrap()).unwrap();
        assert!(!svg.contains("</script>&<b>"));
        assert!(svg.contains("&lt;/script&gt;&amp;&lt;b&gt;"));
    }
}
