//! Prometheus metrics (issue 43): a real Prometheus server scrapes what it
//! is given every second, and its query API returns it (`src/prometheus.rs`,
//! the helper `profiler watch --metrics`'s tests use).
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use profiler_tests::prometheus::{binary_or_skip, Prometheus};

/// A fixed exposition served on a loopback port from a thread of the
/// test, counting the scrapes; stops on drop.
struct Exposition {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    scrapes: Arc<AtomicU64>,
}

impl Exposition {
    fn serve(body: &'static str) -> Exposition {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let scrapes = Arc::new(AtomicU64::new(0));
        let (s, n) = (Arc::clone(&stop), Arc::clone(&scrapes));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                n.fetch_add(1, Ordering::SeqCst);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Exposition {
            addr,
            stop,
            scrapes,
        }
    }
}

impl Drop for Exposition {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(self.addr);
    }
}

/// What `profiler watch` would serve for a process named `a"b\n{c}`
/// (escaped as the format says: `\"` and `\n`), with 7 stalls in one group
/// and 3 folded into `other`.
const HOSTILE: &str = r#"# HELP profiler_stalls_total Stalls of the watched thread, by group.
# TYPE profiler_stalls_total counter
profiler_stalls_total{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1"} 7
profiler_stalls_total{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="other"} 3
# HELP profiler_stall_seconds Durations of the watched thread's stalls, by group.
# TYPE profiler_stall_seconds histogram
profiler_stall_seconds_bucket{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1",le="0.1"} 2
profiler_stall_seconds_bucket{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1",le="1"} 6
profiler_stall_seconds_bucket{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1",le="+Inf"} 7
profiler_stall_seconds_sum{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1"} 4.25
profiler_stall_seconds_count{pid="4242",comm="a\"b\n{c}",exe="/usr/bin/x",group="g1"} 7
# HELP profiler_watched_processes Processes profiler watch is watching now.
# TYPE profiler_watched_processes gauge
profiler_watched_processes 1
"#;

/// The same name written raw, as an unescaping exporter would: the line
/// feed splits the sample, and the scrape must fail.
const BROKEN: &str = "# TYPE profiler_stalls_total counter\n\
profiler_stalls_total{pid=\"4243\",comm=\"a\"b\n{c}\"} 1\n";

#[test]
fn a_real_prometheus_scrapes_a_hostile_name() {
    if binary_or_skip("metrics::a_real_prometheus_scrapes_a_hostile_name").is_none() {
        return;
    }
    let good = Exposition::serve(HOSTILE);
    let broken = Exposition::serve(BROKEN);
    let prom = Prometheus::start(&[good.addr, broken.addr]);
    let wait = Duration::from_secs(30);

    let ups = prom.wait_for("up", wait, |s| s.len() == 2);
    let up = |addr: SocketAddr| {
        ups.iter()
            .find(|s| s.labels["instance"] == addr.to_string())
            .map(|s| s.value)
    };
    assert_eq!(up(good.addr), Some(1.0), "{ups:?}");
    assert_eq!(
        up(broken.addr),
        Some(0.0),
        "the control scrape must fail: {ups:?}"
    );

    let sum = prom.wait_for(r#"sum(profiler_stalls_total{pid="4242"})"#, wait, |s| {
        !s.is_empty()
    });
    assert_eq!(sum[0].value, 10.0);
    // The label comes back decoded, and matches as PromQL spells it.
    let g1 = prom.query(r#"profiler_stalls_total{group="g1"}"#);
    assert_eq!(g1.len(), 1, "{g1:?}");
    assert_eq!(g1[0].labels["comm"], "a\"b\n{c}");
    assert_eq!(g1[0].labels["exe"], "/usr/bin/x");
    assert_eq!(g1[0].value, 7.0);
    assert_eq!(
        prom.value(r#"sum(profiler_stalls_total{comm="a\"b\n{c}"})"#),
        Some(10.0)
    );
    assert_eq!(
        prom.value(r#"profiler_stall_seconds_count{group="g1"}"#),
        Some(7.0)
    );
    // le="1" holds 6 of 7: the median is inside (0.1, 1].
    let median = prom
        .value("histogram_quantile(0.5, profiler_stall_seconds_bucket)")
        .expect("a quantile");
    assert!(median > 0.1 && median <= 1.0, "{median}");
    assert_eq!(prom.value("profiler_watched_processes"), Some(1.0));
    // The broken target's series never got in.
    assert!(prom
        .query(r#"profiler_stalls_total{pid="4243"}"#)
        .is_empty());
    assert!(good.scrapes.load(Ordering::SeqCst) >= 1);
    assert!(broken.scrapes.load(Ordering::SeqCst) >= 1);
}

/// The registry `profiler watch` feeds (`profiler::metrics`), served by its
/// own `--metrics` listener, scraped every second by a real server: counts
/// exact, hostile and non-UTF-8 names intact, the group cap folding, and
/// later changes picked up.
#[test]
fn a_real_prometheus_scrapes_the_registry() {
    use profiler::metrics::{serve, Metrics, Origin};
    if binary_or_skip("metrics::a_real_prometheus_scrapes_the_registry").is_none() {
        return;
    }
    let ms = Duration::from_millis;
    let metrics = Arc::new(Mutex::new(Metrics::new(2)));
    {
        let mut m = metrics.lock().unwrap();
        m.add_process(4301, b"a\"b\n{c}", Some(Origin::Exe(b"/usr/bin/x")));
        m.add_process(
            4302,
            b"py\xffthon",
            Some(Origin::Unit(b"redis-server.service")),
        );
        // A cap of 2: g3 is counted under other.
        for (pid, group, d) in [
            (4301, "g1", 60),
            (4301, "g1", 300),
            (4301, "g2", 1200),
            (4301, "g3", 80),
            (4302, "g1", 20),
        ] {
            m.stall(pid, group, ms(d));
        }
        m.hang(4301);
        m.set_busy_ratio(4301, 0.75);
        m.set_probe_overhead(4301, 0.004);
        m.set_lost(12);
    }
    let server = serve("127.0.0.1:0", Arc::clone(&metrics)).expect("--metrics listener");
    let prom = Prometheus::start(&[server.local_addr()]);
    let wait = Duration::from_secs(30);
    let up = prom.wait_for("up", wait, |s| !s.is_empty());
    assert_eq!(up[0].value, 1.0, "{up:?}");

    let sum = prom.wait_for(r#"sum(profiler_stalls_total{pid="4301"})"#, wait, |s| {
        !s.is_empty()
    });
    assert_eq!(sum[0].value, 4.0);
    let by_group = prom.query(r#"profiler_stalls_total{pid="4301"}"#);
    let mut groups: Vec<(&str, f64)> = by_group
        .iter()
        .map(|s| (s.labels["group"].as_str(), s.value))
        .collect();
    groups.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(groups, [("g1", 2.0), ("g2", 1.0), ("other", 1.0)]);
    for s in &by_group {
        assert_eq!(s.labels["comm"], "a\"b\n{c}");
        assert_eq!(s.labels["exe"], "/usr/bin/x");
    }
    let py = prom.query(r#"profiler_stalls_total{pid="4302"}"#);
    assert_eq!(py.len(), 1, "{py:?}");
    assert_eq!(py[0].labels["comm"], "py\u{FFFD}thon");
    assert_eq!(py[0].labels["unit"], "redis-server.service");
    // g1's 60 and 300 ms stalls: one at or under 0.1 s, both under 0.5 s.
    let bucket = |le: &str| {
        prom.value(&format!(
            r#"profiler_stall_seconds_bucket{{pid="4301",group="g1",le="{le}"}}"#
        ))
    };
    assert_eq!(bucket("0.05"), Some(0.0));
    assert_eq!(bucket("0.1"), Some(1.0));
    assert_eq!(bucket("0.5"), Some(2.0));
    assert_eq!(bucket("+Inf"), Some(2.0));
    let sum_s = prom
        .value(r#"profiler_stall_seconds_sum{pid="4301",group="g1"}"#)
        .unwrap();
    assert!((sum_s - 0.36).abs() < 1e-9, "{sum_s}");
    assert_eq!(prom.value(r#"profiler_hangs_total{pid="4301"}"#), Some(1.0));
    assert_eq!(prom.value(r#"profiler_hangs_total{pid="4302"}"#), Some(0.0));
    assert_eq!(
        prom.value(r#"profiler_loop_busy_ratio{pid="4301"}"#),
        Some(0.75)
    );
    assert_eq!(
        prom.value(r#"profiler_probe_overhead_ratio{pid="4301"}"#),
        Some(0.004)
    );
    assert_eq!(prom.value("profiler_lost_events_total"), Some(12.0));
    assert_eq!(prom.value("profiler_watched_processes"), Some(2.0));

    // Later changes reach the server with the next scrapes.
    {
        let mut m = metrics.lock().unwrap();
        m.stall(4301, "g2", ms(150));
        m.remove_process(4302);
    }
    prom.wait_for(r#"sum(profiler_stalls_total{pid="4301"})"#, wait, |s| {
        s.first().is_some_and(|s| s.value == 5.0)
    });
    prom.wait_for("profiler_watched_processes", wait, |s| {
        s.first().is_some_and(|s| s.value == 1.0)
    });
    // The gone process's gauges went at once; its counts stay for now.
    assert_eq!(
        prom.value(r#"profiler_stalls_total{pid="4302"}"#),
        Some(1.0)
    );
    drop(prom);
    drop(server);
}
