use std::path::PathBuf;

use serde_json::Value;

use super::*;

/// A fresh path in the temp dir, removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        Self(std::env::temp_dir().join(format!("profiler-trace-{pid}-{n}-{tag}.json")))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write(tag: &str, f: impl FnOnce(&mut TraceWriter)) -> (String, Value) {
    let path = TempPath::new(tag);
    let mut w = TraceWriter::create(File::create(&path.0).unwrap()).unwrap();
    f(&mut w);
    w.finish().unwrap();
    let text = std::fs::read_to_string(&path.0).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    (text, v)
}

#[test]
fn zero_events_is_valid_json() {
    let (_, v) = write("empty", |_| {});
    assert_eq!(v["traceEvents"].as_array().unwrap().len(), 0);
    assert_eq!(v["displayTimeUnit"], "ns");
}

#[test]
fn events_have_the_expected_shape() {
    let (_, v) = write("shape", |w| {
        w.process_name(42, "app").unwrap();
        w.thread_name(42, 43, "main").unwrap();
        w.begin(42, 43, "outer", 1_500).unwrap();
        w.end(42, 43, 2_000_001).unwrap();
        let args = [("verdict", "slow".to_string())];
        w.complete(42, 43, "dispatch", "dispatch", 1_000, 250, &args)
            .unwrap();
        w.instant(42, 43, "sample", 7, &[]).unwrap();
        assert_eq!(w.events(), 6);
    });
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev.len(), 6);
    assert_eq!(ev[0]["ph"], "M");
    assert_eq!(ev[0]["name"], "process_name");
    assert_eq!(ev[0]["args"]["name"], "app");
    assert_eq!(ev[1]["name"], "thread_name");
    assert_eq!(ev[1]["tid"], 43);
    assert_eq!(ev[1]["args"]["name"], "main");
    assert_eq!(ev[2]["ph"], "B");
    assert_eq!(ev[2]["name"], "outer");
    assert_eq!(ev[2]["ts"].as_f64(), Some(1.5));
    assert_eq!(ev[3]["ph"], "E");
    assert_eq!(ev[3]["ts"].as_f64(), Some(2000.001));
    assert_eq!(ev[4]["ph"], "X");
    assert_eq!(ev[4]["cat"], "dispatch");
    assert_eq!(ev[4]["ts"].as_f64(), Some(1.0));
    assert_eq!(ev[4]["dur"].as_f64(), Some(0.25));
    assert_eq!(ev[4]["args"]["verdict"], "slow");
    assert_eq!(ev[5]["ph"], "i");
    assert_eq!(ev[5]["s"], "t");
    assert_eq!(ev[5]["ts"].as_f64(), Some(0.007));
    for e in ev {
        assert_eq!(e["pid"], 42);
    }
}

#[test]
fn hostile_names_are_escaped() {
    let evil = "</script><b>\"q\"\\ & \u{0}\u{1}\n\t\u{7f} ü 🦀";
    let (text, v) = write("evil", |w| {
        w.thread_name(1, 2, evil).unwrap();
        w.begin(1, 2, evil, 0).unwrap();
        w.complete(1, 2, evil, evil, 0, 1, &[(evil, evil.to_string())])
            .unwrap();
        w.instant(1, 2, evil, 0, &[("k", evil.to_string())])
            .unwrap();
    });
    assert!(!text.contains("</script>"));
    assert!(!text.contains('<'));
    assert!(!text.contains('\u{0}'));
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev[0]["args"]["name"], evil);
    assert_eq!(ev[1]["name"], evil);
    assert_eq!(ev[2]["name"], evil);
    assert_eq!(ev[2]["cat"], evil);
    assert_eq!(ev[2]["args"][evil], evil);
    assert_eq!(ev[3]["args"]["k"], evil);
}

#[test]
fn dropped_writer_still_closes_the_json() {
    let path = TempPath::new("drop");
    {
        let mut w = TraceWriter::create(File::create(&path.0).unwrap()).unwrap();
        w.begin(1, 1, "a", 0).unwrap();
    }
    let text = std::fs::read_to_string(&path.0).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["traceEvents"].as_array().unwrap().len(), 1);
}

#[test]
fn call_events_take_a_pre_escaped_name() {
    let hostile = "op</script>\"&\u{1}";
    let name = json_name(hostile);
    let (text, v) = write("call", |w| w.call(1, 2, &name, 1_500, 2_250).unwrap());
    assert!(!text.contains("</script>"));
    let e = &v["traceEvents"][0];
    assert_eq!(e["name"], hostile);
    assert_eq!(
        (e["ph"].as_str(), e["cat"].as_str()),
        (Some("X"), Some("call"))
    );
    assert_eq!(
        (e["ts"].as_f64(), e["dur"].as_f64()),
        (Some(1.5), Some(2.25))
    );
}
