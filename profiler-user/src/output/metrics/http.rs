//! `--metrics ADDR`: `GET /metrics` answered on a std thread of its own,
//! with a hand-written HTTP/1.1 responder (no server crate): the request
//! head is read within [`HEAD_TIMEOUT`] and [`HEAD_LIMIT`] bytes, the
//! answer written, the connection closed. One connection at a time: a
//! client that sends nothing holds the next one back [`HEAD_TIMEOUT`] at
//! most, and a scrape is answered from memory in microseconds.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Metrics;
use crate::{Error, Result};

/// How long a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest request head read; a longer one is answered 431.
pub const HEAD_LIMIT: usize = 8 * 1024;

/// How long writing an answer may take before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The address `--metrics` names: a bare port listens on loopback only
/// (`9464` is `127.0.0.1:9464`), `HOST:PORT` there (`0.0.0.0:9464`,
/// `[::]:9464`, `localhost:9464`). The error is one line saying what to
/// give.
pub fn parse_addr(spec: &str) -> std::result::Result<SocketAddr, String> {
    let spec = spec.trim();
    let bad = |why: &str| {
        format!(
            "--metrics {spec:?}: {why}; give a port (9464, loopback only) or HOST:PORT \
             (0.0.0.0:9464 to listen on every address)"
        )
    };
    if spec.is_empty() {
        return Err(bad("empty"));
    }
    if spec.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = spec.parse().map_err(|_| bad("a port is at most 65535"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = spec.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    if host.is_empty() || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("not HOST:PORT"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("a port is at most 65535"))?;
    // A host name: the first address it resolves to.
    match spec.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| bad(&format!("{host:?} resolves to no address"))),
        Err(e) => Err(bad(&format!("cannot resolve {host:?} ({e})"))),
    }
}

/// The running listener; dropping it stops the thread.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Where it listens (the port chosen when `:0` was given).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; it sees `stop` and returns.
        let wake = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.addr.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), self.addr.port())
            }
            _ => self.addr,
        };
        let woke = TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.thread.take() {
            if woke {
                let _ = t.join();
            }
        }
    }
}

/// Parses `spec` ([`parse_addr`]), binds it and serves `metrics` on a
/// thread named `metrics-http` until the [`Server`] is dropped. Call it
/// before attaching: an address that cannot be bound is one error line.
pub fn serve(spec: &str, metrics: Arc<Mutex<Metrics>>) -> Result<Server> {
    let addr = parse_addr(spec).map_err(Error::Usage)?;
    let listener = TcpListener::bind(addr).map_err(|e| {
        Error::Usage(format!(
            "cannot listen on {addr} for --metrics: {e}; choose another port, or stop what holds this one"
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the --metrics listener's address", e))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || accept_loop(&listener, &metrics, &stop))
            .map_err(|e| Error::io("starting the --metrics thread", e))?
    };
    Ok(Server {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(listener: &TcpListener, metrics: &Mutex<Metrics>, stop: &AtomicBool) {
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok((stream, _)) => answer(stream, metrics),
            // Out of descriptors and the like: wait instead of spinning.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Reads one request head and answers it. Errors end the connection: a
/// client that vanished needs no answer.
fn answer(mut stream: TcpStream, metrics: &Mutex<Metrics>) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let head = match read_head(&mut stream) {
        Head::Complete(head) => head,
        Head::TooLarge => {
            let _ = respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                "request head too large\n",
                true,
            );
            return;
        }
        Head::Incomplete => return,
    };
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let body_wanted = method != "HEAD";
    let _ = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = metrics
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .render();
            respond(&mut stream, "200 OK", CONTENT_TYPE, &body, body_wanted)
        }
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n",
            body_wanted,
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD\n",
            true,
        ),
    };
}

enum Head {
    Complete(Vec<u8>),
    TooLarge,
    Incomplete,
}

/// The request up to its blank line, within [`HEAD_TIMEOUT`] in all and
/// [`HEAD_LIMIT`] bytes.
fn read_head(stream: &mut TcpStream) -> Head {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Head::Incomplete;
        }
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Head::Incomplete,
            Ok(n) => n,
        };
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find_blank_line(&head) {
            head.truncate(end);
            return Head::Complete(head);
        }
        if head.len() > HEAD_LIMIT {
            return Head::TooLarge;
        }
    }
}

/// Where the head ends (`\r\n\r\n`, or a bare `\n\n`).
fn find_blank_line(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    with_body: bool,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !content_type.is_empty() {
        out.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if with_body {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}
