//! `report.html`: one self-contained page over a session's outputs. The
//! writers hand it what they already computed (dispatches.json,
//! stages.json, the function aggregates, the flame graph SVGs); it keeps
//! them as one JSON document inside the page, which the hand-written
//! script (`page.js`) renders in the browser, lazily for what is off
//! screen. Nothing is fetched: a Content-Security-Policy of
//! `default-src 'none'` forbids it, and the data is escaped so that names
//! from the target's binaries cannot end the script element.
mod escape;

use serde::Serialize;
use serde_json::Value;

use crate::{
    analyze::dispatch::{tree::FlatNode, Dispatcher},
    output::report::Report,
    output::OutDir,
    Result,
};

pub use escape::{html_text, script_json};

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// One row of the function table: name, binary, calls, total, self, min,
/// avg, max (ns), unfinished frames.
type FunctionRow = (String, String, u64, u64, u64, u64, u64, u64, u64);

/// A flame graph to embed: inferno's SVG, with its own zoom/search script.
#[derive(Serialize)]
struct Flame {
    id: &'static str,
    title: String,
    svg: String,
}

/// What the page shows, filled by the writers as they go.
#[derive(Default, Serialize)]
pub struct Page {
    title: String,
    duration_ns: u64,
    summary: Vec<(String, String)>,
    notes: Vec<String>,
    warnings: Vec<String>,
    dispatches: Option<Value>,
    group_trees: Vec<Vec<FlatNode>>,
    functions: Vec<FunctionRow>,
    stages: Option<Value>,
    stage_runs: Vec<Vec<u64>>,
    flames: Vec<Flame>,
}

impl Page {
    /// An empty page titled `title`, for a session of `duration_ns`.
    pub fn new(title: &str, duration_ns: u64) -> Self {
        Page {
            title: title.to_string(),
            duration_ns,
            ..Default::default()
        }
    }

    /// A line of the summary.
    pub fn fact(&mut self, label: &str, value: impl ToString) {
        self.summary.push((label.to_string(), value.to_string()));
    }

    /// A note shown under the summary (unwinding quality and the like).
    pub fn note(&mut self, text: &str) {
        self.notes
            .extend(text.lines().filter(|l| !l.is_empty()).map(String::from));
    }

    /// A warning shown in the summary.
    pub fn warn(&mut self, text: impl ToString) {
        self.warnings.push(text.to_string());
    }

    /// `dispatches.json` as written, and each group's worst tree (in the
    /// order of its `groups`), for instances not kept in `slow`.
    pub fn dispatches(&mut self, json: &str, group_trees: Vec<Vec<FlatNode>>) {
        self.dispatches = serde_json::from_str(json).ok();
        self.group_trees = group_trees;
    }

    /// `stages.json` as written, and each scenario's run starts since the
    /// session began.
    pub fn stages(&mut self, json: &str, run_starts_ns: Vec<Vec<u64>>) {
        self.stages = serde_json::from_str(json).ok();
        self.stage_runs = run_starts_ns;
    }

    /// The function table, from the rebuilt stacks.
    pub fn functions(&mut self, report: &Report) {
        self.functions = report
            .active_funcs()
            .into_iter()
            .map(|(i, st)| {
                let f = &report.funcs[i];
                (
                    f.name.clone(),
                    report.binaries[f.binary as usize]
                        .path
                        .display()
                        .to_string(),
                    st.calls,
                    st.total_ns,
                    st.self_ns,
                    st.min_ns,
                    st.avg_ns(),
                    st.max_ns,
                    st.unfinished,
                )
            })
            .collect();
    }

    /// A flame graph (`wall`, `cpu` or `offcpu`), from inferno's SVG.
    pub fn flame(&mut self, id: &'static str, title: &str, svg: &[u8]) {
        self.flames.push(Flame {
            id,
            title: title.to_string(),
            svg: embeddable_svg(&String::from_utf8_lossy(svg)),
        });
    }

    /// The page's bytes.
    pub fn render(&self) -> String {
        let data = serde_json::to_string(self).expect("plain data serializes");
        let title = html_text(&self.title);
        let data = script_json(&data);
        // One pass over the template, so that no value is searched for
        // placeholders (a name may contain `{{STYLE}}`).
        let mut out =
            String::with_capacity(TEMPLATE.len() + STYLE.len() + SCRIPT.len() + data.len());
        let mut rest = TEMPLATE;
        while let Some(at) = rest.find("{{") {
            out.push_str(&rest[..at]);
            let Some(len) = rest[at..].find("}}") else {
                break;
            };
            out.push_str(match &rest[at + 2..at + len] {
                "TITLE" => &title,
                "STYLE" => STYLE,
                "SCRIPT" => SCRIPT,
                "DATA" => &data,
                other => unreachable!("unknown placeholder {other} in page.html"),
            });
            rest = &rest[at + len + 2..];
        }
        out.push_str(rest);
        out
    }

    /// Writes `report.html`.
    pub fn write(&self, out: &OutDir) -> Result<()> {
        out.write("report.html", self.render().as_bytes())
    }
}

/// Each group's worst tree, in the order of `dispatches.json`'s groups,
/// where `slow` does not hold that instance (details beyond the limit are
/// dropped); empty where it does, as the page finds it there.
pub fn group_trees(d: &Dispatcher) -> Vec<Vec<FlatNode>> {
    d.sorted_groups()
        .iter()
        .map(|g| {
            let max = g.max_ns();
            let kept = d
                .slow
                .iter()
                .any(|s| s.key == g.key && s.duration_ns == max);
            if kept {
                Vec::new()
            } else {
                g.worst_tree.clone()
            }
        })
        .collect()
}

/// inferno's SVG without the XML prolog, DOCTYPE and leading comments
/// (which name web pages): it starts at `<svg`.
fn embeddable_svg(svg: &str) -> String {
    let Some(start) = svg.find("<svg") else {
        return String::new();
    };
    let mut s = svg[start..].to_string();
    // Drop the comments that point at web pages; the rest is the graph.
    while let Some(a) = s.find("<!--") {
        let Some(len) = s[a..].find("-->") else { break };
        s.replace_range(a..a + len + 3, "");
    }
    s
}

#[cfg(test)]
mod tests;
