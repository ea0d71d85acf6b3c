//! A small keep-alive HTTP load for part q (no `wrk` or `ab` needed):
//! `conns` connections to 127.0.0.1, each on a thread of its own, each
//! sending `GET /` and reading the whole response before the next, for a
//! bounded time and count.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// Responses one connection reads at most in a run.
const MAX_PER_CONN: u64 = 10_000_000;

/// Puts the calling thread on CPU `cpu` only.
fn pin_thread(cpu: usize) {
    // SAFETY: sched_setaffinity on the calling thread (pid 0) with a
    // stack-local, zero-initialised set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

/// The length of the complete `200` response at the start of `buf`, once
/// all of it is there (headers and a `Content-Length` body).
pub fn response_len(buf: &[u8]) -> Result<Option<usize>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).context("response headers are not UTF-8")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("unexpected response: {head}");
    }
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .with_context(|| format!("no Content-Length in: {head}"))?;
    let total = end + 4 + len;
    Ok((buf.len() >= total).then_some(total))
}

/// One connection's requests until `deadline`.
fn connection(port: u16, deadline: Instant, cpu: Option<usize>) -> Result<u64> {
    if let Some(cpu) = cpu {
        pin_thread(cpu);
    }
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let (mut buf, mut chunk) = (Vec::with_capacity(4096), [0u8; 4096]);
    let mut n = 0;
    while n < MAX_PER_CONN && Instant::now() < deadline {
        s.write_all(req.as_bytes())?;
        loop {
            if let Some(len) = response_len(&buf)? {
                buf.drain(..len);
                break;
            }
            let k = s.read(&mut chunk).context("reading a response")?;
            if k == 0 {
                bail!("the server closed the connection after {n} responses");
            }
            buf.extend_from_slice(&chunk[..k]);
        }
        n += 1;
    }
    Ok(n)
}

/// Keep-alive `GET /` on `conns` connections to 127.0.0.1:`port` for
/// `dur`, the threads on CPU `cpu` if given: (responses, seconds).
pub fn run(port: u16, conns: usize, dur: Duration, cpu: Option<usize>) -> Result<(u64, f64)> {
    let start = Instant::now();
    let deadline = start + dur;
    let threads: Vec<_> = (0..conns)
        .map(|_| std::thread::spawn(move || connection(port, deadline, cpu)))
        .collect();
    let mut total = 0;
    let mut failed = None;
    for t in threads {
        match t.join().map_err(|_| anyhow!("a load thread panicked"))? {
            Ok(n) => total += n,
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok((total, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_whole_responses() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ncontent-length: 3\r\n\r\nok\n";
        assert_eq!(response_len(r).unwrap(), Some(r.len()));
        assert_eq!(response_len(&r[..r.len() - 1]).unwrap(), None);
        assert_eq!(response_len(&r[..10]).unwrap(), None);
        let mut two = r.to_vec();
        two.extend_from_slice(r);
        assert_eq!(response_len(&two).unwrap(), Some(r.len()));
        assert!(response_len(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n").is_err());
        assert!(response_len(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }
}
