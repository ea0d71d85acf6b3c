//! `report.html` in headless Chromium: the `eventloop` fixture recorded with
//! its slow messages (CPU, blocked, a hang); the page, once its scripts
//! ran, must list every group of `dispatches.json`, open a group into its
//! worst instance's flame chart with the blocked time coloured, sort the
//! function table, draw something (not a blank screenshot), and load
//! nothing from the web.
use profiler_tests::browser::{self, Pixels};
use profiler_tests::*;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The colour of blocked time in the page (`.blocked` in page.css).
const BLOCKED_RGB: [u8; 3] = [0x4a, 0x90, 0xd9];

struct Recorded {
    dir: TempDir,
    d: Value,
    functions: Value,
    /// The group whose worst instance is mostly blocked (sleep_handler).
    blocked_key: String,
}

fn recorded() -> &'static Recorded {
    static R: OnceLock<Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let exe = build_c(
            "eventloop.c",
            "eventloop",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        );
        let dir = TempDir::new("html");
        let state = TempDir::new("html-state");
        let before = prof_prog_ids();
        let mut fx = Fixture::spawn(&exe, &[state.path().to_str().unwrap()]);
        let rec = Recording::start(
            fx.pid,
            dir.path(),
            &[
                "--dispatch",
                "dispatch_message",
                "--func",
                "handle_*",
                "--func",
                "step_*",
                "--func",
                "load_config",
                "--func",
                "parse_json",
                "--func",
                "save_state",
                "--func",
                "sleep_handler",
                "--func",
                "wait_for_event",
                "--threshold",
                "50ms",
                "--hang",
                "1s",
                "--sample",
                "--off-cpu",
            ],
        );
        fx.run();
        let profiler_pid = rec.pid();
        let fin = rec.stop(libc::SIGINT);
        assert!(fin.status.success(), "profiler failed: {fin:?}");
        assert_none_left_since(&before, &[profiler_pid]);
        fx.release();
        let d = read_json(dir.path(), "dispatches.json");
        let functions = read_json(dir.path(), "functions.json");
        let slow = d["slow"].as_array().expect("slow");
        let blocked_key = slow
            .iter()
            .filter(|s| num(s, "blocked_ns") * 2 > num(s, "duration_ns"))
            .max_by_key(|s| num(s, "blocked_ns"))
            .and_then(|s| s["key"].as_str())
            .unwrap_or_else(|| panic!("no mostly-blocked slow dispatch: {d}"))
            .to_string();
        Recorded {
            dir,
            d,
            functions,
            blocked_key,
        }
    })
}

fn page() -> PathBuf {
    browser::report_html(recorded().dir.path())
}

/// The DOM with the blocked group opened and the functions sorted by calls.
fn dom() -> &'static str {
    static DOM: OnceLock<String> = OnceLock::new();
    DOM.get_or_init(|| {
        let key = &recorded().blocked_key;
        browser::dump_dom(
            &page(),
            &format!("group={}&sort=calls", browser::encode(key)),
        )
    })
}

/// The text between `start` (first occurrence) and the next `end`.
fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let a = s
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in the page"));
    let rest = &s[a + start.len()..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// Values of `attr="…"` in `s`, in order.
fn attrs<'a>(s: &'a str, attr: &str) -> Vec<&'a str> {
    let pat = format!("{attr}=\"");
    s.match_indices(&pat)
        .map(|(i, _)| {
            let v = &s[i + pat.len()..];
            &v[..v.find('"').unwrap()]
        })
        .collect()
}

#[test]
fn page_is_one_file_that_loads_nothing_from_the_web() {
    require_root!();
    let html = std::fs::read_to_string(page()).unwrap();
    let refs = browser::web_references(&html);
    assert!(refs.is_empty(), "report.html loads from the web: {refs:?}");
    assert!(
        html.contains("Content-Security-Policy") && html.contains("default-src 'none'"),
        "no CSP forbidding fetches"
    );
    // The scanner does catch a reference, escaped in JSON or not.
    for bad in [
        "<img src=\"https://x.example/a.png\">",
        "{\"svg\":\"<image href=\\\"http://x.example/i\\\"/>\"}",
        "body { background: url(https://x.example/b.png) }",
    ] {
        assert_eq!(browser::web_references(bad).len(), 1, "missed in {bad}");
    }
    // The three flame graphs are in the page, as SVG.
    for id in ["\"id\":\"wall\"", "\"id\":\"cpu\"", "\"id\":\"offcpu\""] {
        assert!(html.contains(id), "flame graph {id} missing");
    }
}

#[test]
fn every_group_key_is_on_the_page() {
    require_root!();
    let groups = recorded().d["groups"].as_array().unwrap();
    assert!(groups.len() >= 3, "eventloop has several slow causes");
    let dom = dom();
    assert!(
        dom.contains("data-load-ms=\""),
        "the page's script did not finish"
    );
    let table = between(dom, "<table id=\"groups\"", "</table>");
    for g in groups {
        let key = g["key"].as_str().unwrap();
        let cell = format!("<td class=\"key\">{}</td>", browser::html_escaped(key));
        assert!(table.contains(&cell), "group [{key}] not listed");
    }
    assert_eq!(table.matches("<tr data-rank=").count(), groups.len());
}

#[test]
fn opening_a_group_shows_its_flame_chart_with_blocked_time() {
    require_root!();
    let r = recorded();
    let dom = dom();
    let detail = between(dom, "<div id=\"detail\"", "</section>");
    assert!(
        detail.starts_with(&format!(
            " data-key=\"{}\"",
            browser::html_escaped(&r.blocked_key)
        )),
        "group [{}] not opened: {detail:.300}",
        r.blocked_key
    );
    let chart = between(detail, "<div class=\"fchart\"", "<h3>");
    assert!(
        chart.contains(">dispatch_message</div>"),
        "the chart starts at the dispatch function: {chart:.400}"
    );
    // The blocked frames are drawn as such and cover most of the dispatch
    // (the worst instance is more than half blocked).
    let blocked: Vec<f64> = chart
        .split("<div class=\"fc blocked\"")
        .skip(1)
        .map(|d| between(d, "width:", "%").parse().unwrap())
        .collect();
    assert!(!blocked.is_empty(), "no blocked frame in the chart");
    let widest = blocked.iter().cloned().fold(0.0, f64::max);
    assert!(widest > 40.0, "blocked frames only {widest}% wide");
    // And in colour: a screenshot of the opened group shows the blocked
    // colour over a sizeable area, and is not blank.
    let shot = r.dir.join("shot.png");
    if !browser::screenshot(
        &page(),
        &format!("group={}", browser::encode(&r.blocked_key)),
        1280,
        1400,
        &shot,
    ) {
        return;
    }
    let px = Pixels::load(&shot);
    assert_eq!((px.width, px.height), (1280, 1400));
    let colours = px.colours();
    let ink = px.ink();
    let blue = px.count_near(BLOCKED_RGB, 8);
    eprintln!(
        "screenshot: {colours} colours, {:.0}% ink, {blue} blocked-colour pixels",
        ink * 100.0
    );
    assert!(colours >= 50, "screenshot nearly blank: {colours} colours");
    assert!(
        ink >= 0.08,
        "screenshot nearly blank: {:.1}% ink",
        ink * 100.0
    );
    assert!(blue >= 2_000, "blocked time not coloured: {blue} pixels");
}

#[test]
fn function_table_sorts_by_calls() {
    require_root!();
    let funcs = recorded().functions["functions"].as_array().unwrap();
    let max_calls = funcs.iter().map(|f| num(f, "calls")).max().unwrap();
    let table = between(dom(), "<table id=\"functions\"", "</table>");
    let calls: Vec<u64> = attrs(table, "data-calls")
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    assert!(
        calls.len() >= funcs.len().min(10),
        "too few rows: {calls:?}"
    );
    assert_eq!(calls[0], max_calls, "first row is not the most called");
    assert!(
        calls.windows(2).all(|w| w[0] >= w[1]),
        "not sorted by calls: {calls:?}"
    );
    assert!(table.contains("<th data-k=\"calls\" class=\"num desc\">"));
}

/// The waker chain (issue 13) shows when `dispatches.json` has `wakers`:
/// the recorded page with wakers written into its data, hostile names
/// included, opened at the blocked group.
#[test]
fn wakers_are_shown_when_the_data_has_them() {
    require_root!();
    let r = recorded();
    let html = std::fs::read_to_string(page()).unwrap();
    let open = "<script type=\"application/json\" id=\"data\">";
    let (head, rest) = html.split_once(open).expect("data element");
    let (data, tail) = rest.split_once("</script>").unwrap();
    let mut v: Value = serde_json::from_str(data).unwrap();
    let mut patched = 0;
    for s in v["dispatches"]["slow"].as_array_mut().unwrap() {
        if s["key"] == r.blocked_key.as_str() {
            s["wakers"] = serde_json::json!([{
                "tid": 77, "pid": 76, "comm": "io</td><b>worker", "kind": "thread",
                "label": "I/O completion", "function": "complete_io",
                "blocked_ns": 1_234_567, "stack": ["complete_io", "worker_main"],
                "waker_on_cpu_ns": 2_000_000
            }, {
                "tid": 0, "pid": 0, "comm": "", "kind": "irq", "label": "timer",
                "function": "", "blocked_ns": 5_000, "stack": [], "waker_on_cpu_ns": 0
            }]);
            patched += 1;
        }
    }
    assert!(patched > 0);
    let data = serde_json::to_string(&v)
        .unwrap()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let with = r.dir.join("wakers.html");
    std::fs::write(&with, format!("{head}{open}{data}</script>{tail}")).unwrap();
    let dom = browser::dump_dom(&with, &format!("group={}", browser::encode(&r.blocked_key)));
    let detail = between(&dom, "<div id=\"detail\"", "</section>");
    let table = between(detail, "<table class=\"wakers\">", "</table>");
    assert!(
        table.contains(
            "<td>io&lt;/td&gt;&lt;b&gt;worker (tid 77, pid 76)</td>\
             <td>thread, I/O completion in complete_io</td>"
        ),
        "waker not shown: {table}"
    );
    assert!(
        table.contains("1.23 ms") && table.contains("2.00 ms"),
        "{table}"
    );
    assert!(table.contains("complete_io &lt;- worker_main"), "{table}");
    assert!(
        table.contains("<td>interrupt</td><td>irq, timer</td>"),
        "{table}"
    );
}

/// reliability.md #17 in the page: a function named `evil</script>&amp;<g>`
/// is shown as that text in the function table, and the page's script,
/// whose data holds the name, still runs to the end.
#[test]
fn hostile_names_are_text_not_markup() {
    require_root!();
    let out = TempDir::new("html-hostile");
    let before = prof_prog_ids();
    let mut fx = Fixture::spawn(calls_exe(), &["hostile"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "evil*"]);
    let profiler_pid = rec.pid();
    fx.run();
    fx.release();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    assert_none_left_since(&before, &[profiler_pid]);
    let page = browser::report_html(out.path());
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(
        html.matches("</script>").count(),
        2,
        "only the page's own scripts end"
    );
    let dom = browser::dump_dom(&page, "");
    assert!(
        dom.contains("data-load-ms=\""),
        "the page's script did not finish"
    );
    let table = between(&dom, "<table id=\"functions\"", "</table>");
    assert_eq!(
        table
            .matches(">evil&lt;/script&gt;&amp;amp;&lt;g&gt;</td>")
            .count(),
        1,
        "the name is not one text cell: {table}"
    );
    // No element made of the name (attribute values aside, which some
    // Chromium versions serialize with a raw `<`).
    let outside_attrs: String = table.split('"').step_by(2).collect::<Vec<_>>().join("\"\"");
    assert!(!outside_attrs.contains("<g>"), "markup injected: {table}");
}
