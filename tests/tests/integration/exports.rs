//! Exports of a `record` on the `calls` tree: trace.json (Chrome Trace Event
//! format), profile.pb.gz (gzipped pprof), the `--sample` CPU outputs, and
//! `profiler diff` of two recordings.
use flate2::read::GzDecoder;
use profiler_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

const TREE: [&str; 3] = ["tree_top", "tree_mid", "tree_leaf"];

/// Records the `calls tree` workload with `extra`; returns the fixture's PID.
fn record_tree(out: &Path, extra: &[&str]) -> u32 {
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(calls_exe(), &["tree"]);
    let rec = Recording::start(fx.pid, out, extra);
    fx.run();
    let fin = rec.stop(libc::SIGINT);
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[]);
    fx.release();
    fx.pid
}

fn gunzip(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut out = Vec::new();
    GzDecoder::new(&raw[..])
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{} does not gunzip: {e}", path.display()));
    assert!(
        !out.is_empty(),
        "{} is empty once decompressed",
        path.display()
    );
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn parse_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, opts)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
}

#[test]
fn trace_json_and_pprof_of_a_recording() {
    require_root!();
    let out = TempDir::new("exports");
    let pid = record_tree(out.path(), &["--func", "tree_*"]);
    let o = Outputs::load(out.path());

    // trace.json: one "X" call event per completed call, thread names.
    let trace = read_json(out.path(), "trace.json");
    let events = trace["traceEvents"]
        .as_array()
        .expect("trace.json: {\"traceEvents\": [...]}");
    let mut calls: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    let mut call_tids = BTreeSet::new();
    let mut named_tids = BTreeSet::new();
    for e in events {
        match (e["ph"].as_str(), e["cat"].as_str()) {
            (Some("X"), Some("call")) => {
                let name = e["name"].as_str().expect("X event name");
                let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("no dur in {e}"));
                assert!(e["ts"].as_f64().is_some(), "no ts in {e}");
                assert_eq!(e["pid"].as_u64(), Some(u64::from(pid)), "pid of {e}");
                let c = calls.entry(name).or_default();
                c.0 += 1;
                c.1 += dur;
                call_tids.insert(e["tid"].as_u64().expect("tid"));
            }
            (Some("M"), _) if e["name"] == "thread_name" => {
                assert!(e["args"]["name"].as_str().is_some(), "thread name in {e}");
                named_tids.insert(e["tid"].as_u64().expect("tid"));
            }
            _ => {}
        }
    }
    for name in TREE {
        let want = o.sum(name, "calls");
        let (got, dur_us) = calls.get(name).copied().unwrap_or_default();
        assert_eq!(
            got, want,
            "trace.json X events of {name} vs functions.json calls"
        );
        // Durations agree with functions.json's inclusive total (µs with
        // fractions; allow 1 % and 1 µs per call of rounding).
        let total_us = o.sum(name, "total_ns") as f64 / 1e3;
        assert!(
            (dur_us - total_us).abs() <= total_us / 100.0 + want as f64,
            "{name}: sum of dur {dur_us} µs vs total_ns {total_us} µs"
        );
    }
    assert!(
        call_tids.contains(&u64::from(pid)),
        "calls on the main thread"
    );
    assert!(
        call_tids.is_subset(&named_tids),
        "every thread with calls has a thread_name: calls on {call_tids:?}, named {named_tids:?}"
    );

    // profile.pb.gz: gzipped protobuf holding the traced functions' names.
    let pb = gunzip(&out.join("profile.pb.gz"));
    for name in TREE {
        assert!(contains(&pb, name), "profile.pb.gz lacks {name}");
    }
}

#[test]
fn record_sample_writes_cpu_outputs() {
    require_root!();
    let out = TempDir::new("exports-sample");
    record_tree(out.path(), &["--func", "tree_*", "--sample"]);
    for name in ["cpu.folded", "cpu.svg", "cpu.txt", "cpu.pb.gz"] {
        assert!(out.join(name).exists(), "--sample should write {name}");
    }
    let folded_text = read(out.path(), "cpu.folded");
    assert!(
        folded(&folded_text)
            .iter()
            .any(|(s, _)| s.iter().any(|f| f.starts_with("tree_"))),
        "the tree's spinning functions are sampled:\n{folded_text}"
    );
    let txt = read(out.path(), "cpu.txt");
    assert!(txt.starts_with("CPU samples of "), "cpu.txt: {txt}");
    parse_svg(&out.join("cpu.svg"));
    let pb = gunzip(&out.join("cpu.pb.gz"));
    assert!(contains(&pb, "tree_leaf"), "cpu.pb.gz lacks tree_leaf");
}

#[test]
fn diff_of_two_recordings_is_xml() {
    require_root!();
    let a = TempDir::new("diff-a");
    let b = TempDir::new("diff-b");
    record_tree(a.path(), &["--func", "tree_*"]);
    record_tree(b.path(), &["--func", "tree_*", "--exclude", "tree_mid"]);
    let svg = a.join("diff.svg");
    let fin = profiler(&[
        "diff",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "profiler diff failed: {fin:?}");
    parse_svg(&svg);
    // Frames are sized by the `after` recording (difffolded.pl): tree_mid,
    // excluded there, is gone, and tree_leaf, now directly under tree_top,
    // is a new path (a `+` change in its tooltip).
    let text = std::fs::read_to_string(&svg).unwrap();
    let titles: Vec<&str> = text
        .split("<title>")
        .skip(1)
        .filter_map(|t| t.split('<').next())
        .collect();
    for name in ["calls", "tree_top", "tree_leaf"] {
        assert!(
            titles.iter().any(|t| t.starts_with(&format!("{name} "))),
            "diff.svg lacks frame {name}: {titles:?}"
        );
    }
    assert!(
        !titles.iter().any(|t| t.starts_with("tree_mid ")),
        "tree_mid is not in the `after` recording: {titles:?}"
    );
    assert!(
        titles
            .iter()
            .any(|t| t.starts_with("tree_leaf ") && t.contains("; +")),
        "tree_leaf's new path should show growth: {titles:?}"
    );
}
