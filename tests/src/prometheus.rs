//! A real Prometheus server (Debian's `prometheus`, installed by `cargo
//! xtask setup`) scraping targets the test names every second, and its
//! query API: what `profiler watch --metrics` serves, read by what a team
//! would read it with.
//!
//! [`Prometheus::start`] writes a config into a temporary directory, starts
//! the server on a free loopback port with its storage there, and waits
//! until `/-/ready` answers (a few seconds; [`STARTUP`] at most). Dropping
//! it kills the server and removes the directory. [`Prometheus::query`]
//! runs an instant PromQL query (`/api/v1/query`); [`Prometheus::wait_for`]
//! repeats one until the scrapes have brought a result.
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TempDir;

/// Debian's binary.
pub const BINARY: &str = "/usr/bin/prometheus";

/// The longest the server may take to be ready.
pub const STARTUP: Duration = Duration::from_secs(60);

/// The binary, or `None` after printing `SKIP what: …` when it is not
/// installed.
pub fn binary_or_skip(what: &str) -> Option<PathBuf> {
    let bin = PathBuf::from(BINARY);
    if bin.is_file() {
        Some(bin)
    } else {
        eprintln!(
            "SKIP {what}: {BINARY} is missing; run `cargo xtask setup` (Debian package prometheus)"
        );
        None
    }
}

/// One series of a query's answer: its labels (`__name__` included) and
/// value.
#[derive(Clone, Debug)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A running server; killed on drop.
pub struct Prometheus {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Prometheus {
    /// Starts a server scraping `targets` (job `profiler`) every second.
    pub fn start(targets: &[SocketAddr]) -> Prometheus {
        let bin = PathBuf::from(BINARY);
        let dir = TempDir::new("prometheus");
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: profiler\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus.log");
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1h")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut server = Prometheus { child, port, dir };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "prometheus exited ({status}) at start:\n{}",
                    server.log_tail()
                );
            }
            if server.get("/-/ready").is_ok_and(|(code, _)| code == 200) {
                eprintln!(
                    "prometheus ready on 127.0.0.1:{port} in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return server;
            }
            if started.elapsed() > STARTUP {
                panic!(
                    "prometheus not ready after {} s:\n{}",
                    STARTUP.as_secs(),
                    server.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Where the server listens.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// An instant query's vector (`/api/v1/query?query=…`); a query the
    /// server refuses panics with its error.
    pub fn query(&self, promql: &str) -> Vec<Series> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let (code, body) = self
            .get(&path)
            .unwrap_or_else(|e| panic!("querying {promql}: {e}"));
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("query {promql}: HTTP {code}, not JSON ({e}): {body}"));
        assert_eq!(json["status"], "success", "query {promql}: {body}");
        let data = &json["data"];
        let result = match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => {
                return vec![Series {
                    labels: BTreeMap::new(),
                    value: number(&data["result"][1]),
                }]
            }
            other => panic!("query {promql}: result type {other:?}: {body}"),
        };
        result
            .iter()
            .map(|r| Series {
                labels: r["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default(),
                value: number(&r["value"][1]),
            })
            .collect()
    }

    /// The query's single value, or `None` while its vector is empty.
    pub fn value(&self, promql: &str) -> Option<f64> {
        let found = self.query(promql);
        assert!(
            found.len() <= 1,
            "{promql}: more than one series: {found:?}"
        );
        found.first().map(|s| s.value)
    }

    /// Repeats `promql` until `done` holds for its answer (the scrapes
    /// bring data every second), for `timeout` at most; returns the last
    /// answer, or panics with it and the server's log.
    pub fn wait_for(
        &self,
        promql: &str,
        timeout: Duration,
        done: impl Fn(&[Series]) -> bool,
    ) -> Vec<Series> {
        let started = Instant::now();
        loop {
            let found = self.query(promql);
            if done(&found) {
                return found;
            }
            if started.elapsed() > timeout {
                let targets = self
                    .get("/api/v1/targets")
                    .map(|(_, b)| b)
                    .unwrap_or_default();
                panic!(
                    "{promql}: still {found:?} after {} s; targets: {targets}\n{}",
                    timeout.as_secs(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// An HTTP/1.0 GET of the server (so the answer is never chunked):
    /// status code and body.
    fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_owned()))
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A sample value as the API gives it (a string: `"1"`, `"+Inf"`, `"NaN"`).
fn number(v: &serde_json::Value) -> f64 {
    match v.as_str() {
        Some("+Inf") => f64::INFINITY,
        Some("-Inf") => f64::NEG_INFINITY,
        Some(s) => s.parse().unwrap_or(f64::NAN),
        None => f64::NAN,
    }
}

/// Percent-encodes a query parameter.
fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
