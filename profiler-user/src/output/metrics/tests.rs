use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// One sample of a parsed exposition.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A strict reader of the text format 0.0.4 as the registry must write
/// it, failing on anything a Prometheus server would refuse or read
/// differently: each family's HELP then TYPE once, before its samples,
/// which are contiguous; names and label names valid; label values
/// quoted with only `\\`, `\"` and `\n` escapes; no duplicate series; a
/// value Go's ParseFloat reads; the text ends with a line feed.
fn parse(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "no final line feed");
    let valid_name = |s: &str, colon: bool| {
        let mut cs = s.chars();
        cs.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    };
    let mut samples = Vec::new();
    let mut helped = BTreeSet::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').expect("HELP has text");
            assert!(valid_name(name, true), "{line}");
            assert!(helped.insert(name.to_owned()), "second HELP: {line}");
            assert!(!typed.contains_key(name), "HELP after TYPE: {line}");
            if let Some(c) = current.replace(name.to_owned()) {
                done.insert(c);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert_eq!(current.as_deref(), Some(name), "TYPE of another family");
            assert!(typed.insert(name.to_owned(), kind.to_owned()).is_none());
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
        // name, then {labels}, then a space and the value.
        let name_end = line.find(['{', ' ']).expect("a value");
        let name = &line[..name_end];
        assert!(valid_name(name, true), "{line}");
        let family = current.clone().expect("a sample before any TYPE");
        let kind = &typed[&family];
        let base = match kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name),
            _ => name,
        };
        assert_eq!(base, family, "sample {name} outside its family");
        assert!(!done.contains(base), "family {base} not contiguous");
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let end;
            loop {
                let (start, c) = chars.next().expect("unclosed {");
                if c == '}' {
                    end = Some(start + 1);
                    break;
                }
                let eq = r[start..].find('=').expect("label=") + start;
                let lname = &r[start..eq];
                assert!(valid_name(lname, false), "label name {lname:?} in {line}");
                while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                    chars.next();
                }
                assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line}");
                let mut value = String::new();
                loop {
                    match chars.next().expect("unclosed value").1 {
                        '\\' => match chars.next().expect("escape").1 {
                            '\\' => value.push('\\'),
                            '"' => value.push('"'),
                            'n' => value.push('\n'),
                            c => panic!("bad escape \\{c} in {line}"),
                        },
                        '"' => break,
                        '\n' => panic!("raw line feed"),
                        c => value.push(c),
                    }
                }
                assert!(
                    labels.insert(lname.to_owned(), value).is_none(),
                    "label twice: {line}"
                );
                match chars.next().expect("after a value").1 {
                    ',' => continue,
                    '}' => {
                        end = chars.peek().map(|&(i, _)| i).or(Some(r.len()));
                        break;
                    }
                    c => panic!("{c:?} after a label value in {line}"),
                }
            }
            rest = &r[end.unwrap()..];
        }
        let value = rest.strip_prefix(' ').expect("space before the value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("value {v:?}")),
        };
        assert!(
            seen.insert((name.to_owned(), format!("{labels:?}"))),
            "duplicate series: {line}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found = find(samples, name, labels);
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0].value
}

const MS: Duration = Duration::from_millis(1);

#[test]
fn hostile_process_names_are_escaped_and_read_back() {
    let mut m = Metrics::new(DEFAULT_GROUP_CAP);
    m.add_process(7, b"a\"b\n{c}", Some(Origin::Exe(b"/opt/x\\y \"z\"/bin")));
    m.add_process(
        8,
        b"py\xffthon\xc3",
        Some(Origin::Unit(b"redis-server.service")),
    );
    m.add_process(9, b"plain", Some(Origin::Cgroup(b"/system.slice/a\nb")));
    m.stall(7, "g\"1\n}", 120 * MS);
    m.stall(8, "g2", 3 * MS);
    m.hang(9);
    let text = m.render();
    // The exact escaped forms.
    assert!(
        text.contains(r#"comm="a\"b\n{c}",exe="/opt/x\\y \"z\"/bin""#),
        "{text}"
    );
    assert!(text.contains(r#"group="g\"1\n}""#), "{text}");
    assert!(text.contains("comm=\"py\u{FFFD}thon\u{FFFD}\",unit=\"redis-server.service\""));
    // Every line is one sample or comment: no raw line feed got in.
    let samples = parse(&text);
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[
                ("pid", "7"),
                ("comm", "a\"b\n{c}"),
                ("exe", "/opt/x\\y \"z\"/bin"),
                ("group", "g\"1\n}")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[
                ("comm", "py\u{FFFD}thon\u{FFFD}"),
                ("unit", "redis-server.service")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "profiler_hangs_total",
            &[("pid", "9"), ("cgroup", "/system.slice/a\nb")]
        ),
        1.0
    );
    assert_eq!(value(&samples, "profiler_watched_processes", &[]), 3.0);
}

#[test]
fn groups_past_the_cap_fold_into_other() {
    let mut m = Metrics::new(3);
    m.add_process(1, b"one", Some(Origin::Exe(b"/bin/one")));
    m.add_process(2, b"two", Some(Origin::Exe(b"/bin/two")));
    // g0..g2 take the three slots; g3..g6 fold, g0 keeps its own after.
    for (i, g) in ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g0"]
        .iter()
        .enumerate()
    {
        m.stall(1 + (i as u32 % 2), g, 10 * MS * (i as u32 + 1));
    }
    let samples = parse(&m.render());
    let groups: BTreeSet<&str> = find(&samples, "profiler_stalls_total", &[])
        .iter()
        .map(|s| s.labels["group"].as_str())
        .collect();
    assert_eq!(groups, BTreeSet::from(["g0", "g1", "g2", "other"]));
    for metric in ["profiler_stall_seconds_count", "profiler_stall_seconds_sum"] {
        let groups: BTreeSet<&str> = find(&samples, metric, &[])
            .iter()
            .map(|s| s.labels["group"].as_str())
            .collect();
        assert_eq!(groups.len(), 4, "{metric}: {groups:?}");
    }
    // Stall i went to pid 1 + i % 2: g3 (i 3) and g5 (i 5) to pid 2, g4 and
    // g6 (i 4, 6) to pid 1: two "other" stalls each.
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "1"), ("group", "other")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "2"), ("group", "other")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "1"), ("group", "g0")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "2"), ("group", "g0")]
        ),
        1.0
    );
    let total: f64 = find(&samples, "profiler_stalls_total", &[])
        .iter()
        .map(|s| s.value)
        .sum();
    assert_eq!(total, 8.0, "every stall counted");
    // Durations: pid 1's other stalls lasted 50 and 70 ms.
    let sum = value(
        &samples,
        "profiler_stall_seconds_sum",
        &[("pid", "1"), ("group", "other")],
    );
    assert!((sum - 0.12).abs() < 1e-9, "{sum}");

    // A cap of 0 counts everything under other.
    let mut none = Metrics::new(0);
    none.stall(5, "g", MS);
    let samples = parse(&none.render());
    assert_eq!(
        value(&samples, "profiler_stalls_total", &[("group", "other")]),
        1.0
    );
}

#[test]
fn histogram_buckets_are_cumulative() {
    let mut m = Metrics::new(DEFAULT_GROUP_CAP);
    m.add_process(3, b"h", None);
    // 0.05 exactly falls in le="0.05" (le is "less or equal").
    for ms in [10, 50, 70, 300, 3_000, 20_000] {
        m.stall(3, "g", ms * MS);
    }
    let samples = parse(&m.render());
    let want = [
        ("0.05", 2.0),
        ("0.1", 3.0),
        ("0.25", 3.0),
        ("0.5", 4.0),
        ("1", 4.0),
        ("2.5", 4.0),
        ("5", 5.0),
        ("10", 5.0),
        ("+Inf", 6.0),
    ];
    let buckets = find(&samples, "profiler_stall_seconds_bucket", &[("pid", "3")]);
    let got: Vec<(&str, f64)> = buckets
        .iter()
        .map(|s| (s.labels["le"].as_str(), s.value))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        value(&samples, "profiler_stall_seconds_count", &[("pid", "3")]),
        6.0
    );
    let sum = value(&samples, "profiler_stall_seconds_sum", &[("pid", "3")]);
    assert!((sum - 23.43).abs() < 1e-9, "{sum}");
}

#[test]
fn removed_processes_lose_gauges_at_once_and_counters_after_the_linger() {
    let mut m = Metrics::new(1);
    m.add_process(10, b"gone", Some(Origin::Exe(b"/bin/gone")));
    m.add_process(11, b"stays", Some(Origin::Exe(b"/bin/stays")));
    m.stall(10, "ga", 100 * MS);
    m.set_busy_ratio(10, 0.25);
    m.set_probe_overhead(10, 0.01);
    m.set_busy_ratio(11, 0.5);
    m.remove_process(10);
    // Gauges after removal are not taken.
    m.set_busy_ratio(10, 0.9);
    let samples = parse(&m.render());
    assert_eq!(value(&samples, "profiler_watched_processes", &[]), 1.0);
    assert!(find(&samples, "profiler_loop_busy_ratio", &[("pid", "10")]).is_empty());
    assert!(find(&samples, "profiler_probe_overhead_ratio", &[("pid", "10")]).is_empty());
    assert_eq!(
        value(&samples, "profiler_loop_busy_ratio", &[("pid", "11")]),
        0.5
    );
    // The stall counted just before the exit is still there.
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "10"), ("group", "ga")]
        ),
        1.0
    );
    // ga holds the only slot while its series lingers.
    m.stall(11, "gb", MS);
    let samples = parse(&m.render());
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "11"), ("group", "other")]
        ),
        1.0
    );

    // Past the linger the series go, and so does ga's slot.
    m.set_linger(Duration::ZERO);
    let samples = parse(&m.render());
    assert!(find(&samples, "profiler_stalls_total", &[("pid", "10")]).is_empty());
    assert!(find(&samples, "profiler_hangs_total", &[("pid", "10")]).is_empty());
    m.stall(11, "gb", MS);
    let samples = parse(&m.render());
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "11"), ("group", "gb")]
        ),
        1.0
    );

    // A PID reused while lingering: the old series are replaced, not doubled.
    m.set_linger(LINGER);
    m.stall(11, "gb", MS);
    m.remove_process(11);
    m.add_process(11, b"stays", Some(Origin::Exe(b"/bin/stays")));
    let samples = parse(&m.render());
    assert!(find(&samples, "profiler_stalls_total", &[("pid", "11")]).is_empty());
    assert_eq!(
        value(&samples, "profiler_hangs_total", &[("pid", "11")]),
        0.0
    );
    assert_eq!(value(&samples, "profiler_watched_processes", &[]), 1.0);
}

#[test]
fn unknown_pids_lost_events_and_numbers() {
    let mut m = Metrics::new(DEFAULT_GROUP_CAP);
    // Never added: counted under the PID with an empty comm.
    m.stall(42, "g", MS);
    m.hang(42);
    m.set_lost(10);
    m.set_lost(4); // a counter never goes down
    m.add_process(43, b"n", None);
    m.set_busy_ratio(43, f64::NAN);
    m.set_probe_overhead(43, f64::INFINITY);
    let text = m.render();
    let samples = parse(&text);
    assert_eq!(
        value(
            &samples,
            "profiler_stalls_total",
            &[("pid", "42"), ("comm", "")]
        ),
        1.0
    );
    assert_eq!(
        value(&samples, "profiler_hangs_total", &[("pid", "42")]),
        1.0
    );
    assert_eq!(value(&samples, "profiler_lost_events_total", &[]), 10.0);
    assert_eq!(value(&samples, "profiler_watched_processes", &[]), 2.0);
    assert!(value(&samples, "profiler_loop_busy_ratio", &[("pid", "43")]).is_nan());
    assert!(
        text.contains("profiler_probe_overhead_ratio{pid=\"43\",comm=\"n\"} +Inf\n"),
        "{text}"
    );
    assert_eq!(text::number(0.1), "0.1");
    assert_eq!(text::number(1e-7).parse::<f64>().unwrap(), 1e-7);
    assert_eq!(text::number(2.0), "2");
    assert_eq!(text::number(f64::NEG_INFINITY), "-Inf");
}

#[test]
fn an_empty_registry_renders_every_family() {
    let samples = parse(&Metrics::new(DEFAULT_GROUP_CAP).render());
    assert_eq!(value(&samples, "profiler_watched_processes", &[]), 0.0);
    assert_eq!(value(&samples, "profiler_lost_events_total", &[]), 0.0);
    let text = Metrics::new(1).render();
    for name in [
        "profiler_stalls_total counter",
        "profiler_stall_seconds histogram",
        "profiler_loop_busy_ratio gauge",
        "profiler_hangs_total counter",
        "profiler_lost_events_total counter",
        "profiler_probe_overhead_ratio gauge",
        "profiler_watched_processes gauge",
    ] {
        assert!(text.contains(&format!("# TYPE {name}\n")), "{name}");
    }
}

#[test]
fn addresses() {
    assert_eq!(parse_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
    assert_eq!(
        parse_addr("0.0.0.0:9464").unwrap().to_string(),
        "0.0.0.0:9464"
    );
    assert_eq!(parse_addr("[::1]:9464").unwrap().to_string(), "[::1]:9464");
    assert!(parse_addr("localhost:9464").unwrap().ip().is_loopback());
    for bad in [
        "",
        "70000",
        "host",
        "host:",
        ":9464x",
        "1.2.3.4:99999",
        "-1",
    ] {
        let e = parse_addr(bad).unwrap_err();
        assert!(
            e.starts_with("--metrics ") && e.contains("give a port") && !e.contains('\n'),
            "{bad}: {e}"
        );
    }
}

/// Sends `request` and returns the whole answer.
fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn the_listener_serves_metrics_and_nothing_else() {
    let metrics = Arc::new(Mutex::new(Metrics::new(DEFAULT_GROUP_CAP)));
    metrics.lock().unwrap().add_process(5, b"a\"b\n{c}", None);
    metrics.lock().unwrap().stall(5, "g", 2 * MS);
    let server = serve("127.0.0.1:0", Arc::clone(&metrics)).unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);

    let ok = ask(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
    );
    let (head, body) = ok.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
    assert!(
        head.contains(&format!("Content-Length: {}\r\n", body.len())),
        "{head}"
    );
    let samples = parse(body);
    assert_eq!(
        value(&samples, "profiler_stalls_total", &[("comm", "a\"b\n{c}")]),
        1.0
    );
    // A query string is the same page; the head can end in bare LFs.
    assert!(ask(addr, b"GET /metrics?x=1 HTTP/1.0\n\n").starts_with("HTTP/1.1 200 OK"));
    let head_only = ask(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(head_only.starts_with("HTTP/1.1 200 OK") && head_only.ends_with("\r\n\r\n"));
    assert!(ask(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found"));
    assert!(ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.resize(http::HEAD_LIMIT + 100, b'a');
    assert!(ask(addr, &big).starts_with("HTTP/1.1 431 "));
    // A client that sends nothing is dropped after the head timeout, and
    // the next one is answered.
    let silent = TcpStream::connect(addr).unwrap();
    let started = std::time::Instant::now();
    assert!(ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
    assert!(started.elapsed() < http::HEAD_TIMEOUT + Duration::from_secs(3));
    drop(silent);

    // The port is taken: one line naming it.
    let e = serve(&addr.to_string(), Arc::clone(&metrics)).unwrap_err();
    let line = crate::error::chain(&e);
    assert!(
        line.contains(&format!("cannot listen on {addr} for --metrics")) && !line.contains('\n'),
        "{line}"
    );
    // Dropping the server stops it and frees the port.
    drop(server);
    assert!(std::net::TcpListener::bind(addr).is_ok());
}
