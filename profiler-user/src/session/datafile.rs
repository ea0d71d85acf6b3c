//! `profile.data`: everything a `record` session saw, so `profiler report`
//! can render every output again offline, without root, with other
//! thresholds. The live pipeline is deterministic given this stream: the raw
//! ring records, plus a journal of what it learnt from outside them (hang
//! checks at tick times, threads found exited, thread names read from
//! /proc, symbolized addresses), plus the session's facts.
//!
//! Layout: `PROFDATA`, a little-endian `u32` format version, then frames of
//! `[u8 tag][u32 len][payload]`: one header (JSON), records, journal
//! entries, and one trailer (JSON) last.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"PROFDATA";
/// Format version written; files with a newer one are refused.
/// 2: Go entry/exit records (`GoEvent`), each function's exit mechanism
/// (`FuncInfo::exit`) and the header's `exit_rule`. Version 1 files still
/// read (the new fields default to empty).
/// 3: process records (`ProcEvent`: fork, exec, exit of traced processes),
/// agent records of functions probed after an exec (`KIND_PROBED`), the
/// thread's tgid in `CommEvent`, the header's `processes` and `follow`, the
/// trailer's `untraced_children` (`--follow`, several targets). Versions 1
/// and 2 still read.
pub const VERSION: u32 = 3;

const TAG_HEADER: u8 = 1;
const TAG_RECORD: u8 = 2;
const TAG_TICK: u8 = 3;
const TAG_REAP: u8 = 4;
const TAG_NAME: u8 = 5;
const TAG_TRAILER: u8 = 9;

/// A probed function.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FuncInfo {
    /// Demangled name.
    pub name: String,
    /// Index into [`Header::binaries`].
    pub binary: u32,
    /// File offset.
    pub offset: u64,
    /// A dispatch function.
    pub dispatch: bool,
    /// How its returns were observed (`ret`, `uretprobe`, `entry`).
    #[serde(default)]
    pub exit: String,
}

/// What is known when recording starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// Target PID.
    pub pid: u32,
    /// Target executable.
    pub exe: String,
    /// Binaries searched.
    pub binaries: Vec<String>,
    /// Probed functions, by cookie.
    pub funcs: Vec<FuncInfo>,
    /// How dispatches were recognised.
    pub dispatch_rule: String,
    /// No dispatch function was known.
    pub dispatch_fallback: bool,
    /// How returns were observed, in words.
    #[serde(default)]
    pub exit_rule: String,
    /// Watched thread and its name.
    pub watch_tid: u32,
    /// Watched thread's name.
    pub watch_name: String,
    /// CLOCK_MONOTONIC at the session start.
    pub session_start_ns: u64,
    /// Unix time at the session start.
    pub start_unix_ns: i64,
    /// In-dispatch sampling rate.
    pub dispatch_hz: u64,
    /// Launch mode: CLOCK_MONOTONIC at exec.
    pub exec_ns: Option<u64>,
    /// Launch mode.
    pub launch: bool,
    /// `--stage` specs.
    pub stages: Vec<String>,
    /// `--scenario` names.
    pub scenarios: Vec<String>,
    /// `--runs`.
    pub runs: Option<usize>,
    /// `--ready`.
    pub ready: Option<String>,
    /// `--startup-threshold`, ns.
    pub startup_threshold_ns: Option<u64>,
    /// `--threshold`, ns.
    pub threshold_ns: u64,
    /// `--hang`, ns.
    pub hang_ns: u64,
    /// `--frame-interval`, ns.
    pub frame_interval_ns: u64,
    /// `--full-tree`.
    pub full_tree: bool,
    /// `--trace-events`.
    pub trace_events: u64,
    /// Several processes traced (`--follow`, several `--pid`, `--pid-of`):
    /// the named targets. Empty: one target, `pid`.
    #[serde(default)]
    pub processes: Vec<TargetInfo>,
    /// `--follow`.
    #[serde(default)]
    pub follow: bool,
}

/// A process the session was told to trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TargetInfo {
    /// Its pid.
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// Its executable.
    pub exe: String,
    /// CLOCK_MONOTONIC when tracing it started.
    pub start_ns: u64,
}

/// What is known when recording ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Trailer {
    /// Wall time recorded.
    pub duration_ns: u64,
    /// Why it stopped.
    pub stop_reason: String,
    /// Functions with live probes.
    pub functions_probed: usize,
    /// Entry/exit events lost in the kernel.
    pub lost_events: u64,
    /// Scheduler/sample events lost.
    pub lost_sched: u64,
    /// Thread-name events lost.
    pub lost_comm: u64,
    /// Matched but not probed.
    pub capped: usize,
    /// Could not be probed.
    pub failed_probes: usize,
    /// Final thread names.
    pub thread_names: Vec<(u32, String)>,
    /// Symbolized addresses: (pid, address, frames).
    pub symbols: Vec<(u32, u64, Vec<String>)>,
    /// CPU profile and its rate.
    pub cpu: Option<(u64, crate::analyze::cpu_profile::CpuProfile)>,
    /// Off-CPU profile (ns).
    pub offcpu: Option<crate::analyze::cpu_profile::CpuProfile>,
    /// False when the stream was cut at `--data-limit`.
    pub complete: bool,
    /// One line per `--lib` never mapped during the session.
    #[serde(default)]
    pub never_mapped: Vec<String>,
    /// Processes the targets made that were not traced (no `--follow`).
    #[serde(default)]
    pub untraced_children: u64,
}

/// One journal entry or record, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A raw ring-buffer record.
    Record(Vec<u8>),
    /// A hang check at this CLOCK_MONOTONIC time.
    Tick(u64),
    /// Threads found exited; `true` when folded at once (the final reap).
    Reap(bool, Vec<u32>),
    /// A thread name read from /proc.
    Name(u32, String),
}

/// Streams `profile.data`.
pub struct DataWriter {
    w: BufWriter<File>,
    error: Option<io::Error>,
    written: u64,
    limit: u64,
    /// Records left out past the limit.
    pub cut: u64,
}

impl DataWriter {
    /// Starts the file with its header; records stop after `limit` bytes.
    pub fn create(file: File, header: &Header, limit: u64) -> io::Result<Self> {
        let mut w = BufWriter::with_capacity(256 << 10, file);
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        let mut d = DataWriter {
            w,
            error: None,
            written: 12,
            limit,
            cut: 0,
        };
        d.frame(TAG_HEADER, &serde_json::to_vec(header).expect("plain data"));
        Ok(d)
    }

    fn frame(&mut self, tag: u8, payload: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if tag != TAG_TRAILER
            && tag != TAG_HEADER
            && self.written + 5 + payload.len() as u64 > self.limit
        {
            self.cut += 1;
            return;
        }
        self.written += 5 + payload.len() as u64;
        let r = self
            .w
            .write_all(&[tag])
            .and_then(|()| self.w.write_all(&(payload.len() as u32).to_le_bytes()))
            .and_then(|()| self.w.write_all(payload));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    /// A raw ring record.
    #[inline]
    pub fn record(&mut self, rec: &[u8]) {
        self.frame(TAG_RECORD, rec);
    }

    /// A hang check at `now_ns`.
    pub fn tick(&mut self, now_ns: u64) {
        self.frame(TAG_TICK, &now_ns.to_le_bytes());
    }

    /// Threads folded as exited.
    pub fn reap(&mut self, now: bool, tids: &[u32]) {
        let mut p = vec![u8::from(now)];
        for t in tids {
            p.extend_from_slice(&t.to_le_bytes());
        }
        self.frame(TAG_REAP, &p);
    }

    /// A thread name read from /proc.
    pub fn name(&mut self, tid: u32, name: &str) {
        let mut p = tid.to_le_bytes().to_vec();
        p.extend_from_slice(name.as_bytes());
        self.frame(TAG_NAME, &p);
    }

    /// Ends the file with its trailer. Returns the first write error.
    pub fn finish(mut self, trailer: &Trailer) -> io::Result<()> {
        let mut trailer = trailer.clone();
        trailer.complete = self.cut == 0;
        if self.cut > 0 {
            eprintln!(
                "profiler: note: profile.data reached --data-limit; {} records were left out, so it cannot be replayed",
                self.cut
            );
        }
        self.frame(
            TAG_TRAILER,
            &serde_json::to_vec(&trailer).expect("plain data"),
        );
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.w.flush()
    }
}

/// A whole `profile.data`, read back.
#[derive(Debug)]
pub struct Data {
    /// The header.
    pub header: Header,
    /// Records and journal entries, in order.
    pub entries: Vec<Entry>,
    /// The trailer.
    pub trailer: Trailer,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads `path`, refusing a file that is not one, is corrupt, or was written
/// by a newer profiler.
pub fn read(path: &Path) -> Result<Data> {
    let bad = |why: String| Error::Usage(format!("{}: {why}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(bad("not a profile.data file (bad magic)".into()));
    }
    let version = u32_at(&bytes, 8).unwrap_or(0);
    if version > VERSION {
        return Err(bad(format!(
            "written by a newer profiler (format {version}; this one reads up to {VERSION}): upgrade profiler"
        )));
    }
    let (mut header, mut trailer, mut entries) = (None, None, Vec::new());
    let mut at = 12;
    while at < bytes.len() {
        let corrupt = |at: usize| bad(format!("corrupt or truncated at byte {at}: record again"));
        let tag = bytes[at];
        let len = u32_at(&bytes, at + 1).ok_or_else(|| corrupt(at))? as usize;
        let p = bytes.get(at + 5..at + 5 + len).ok_or_else(|| corrupt(at))?;
        match tag {
            TAG_HEADER => header = Some(serde_json::from_slice(p).map_err(|_| corrupt(at))?),
            TAG_TRAILER => trailer = Some(serde_json::from_slice(p).map_err(|_| corrupt(at))?),
            TAG_RECORD => entries.push(Entry::Record(p.to_vec())),
            TAG_TICK => entries.push(Entry::Tick(u64::from_le_bytes(
                p.try_into().map_err(|_| corrupt(at))?,
            ))),
            TAG_REAP if !p.is_empty() => {
                let tids = p[1..]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                entries.push(Entry::Reap(p[0] != 0, tids));
            }
            TAG_NAME if p.len() >= 4 => entries.push(Entry::Name(
                u32_at(p, 0).unwrap(),
                String::from_utf8_lossy(&p[4..]).into_owned(),
            )),
            _ => return Err(corrupt(at)),
        }
        at += 5 + len;
    }
    let header = header.ok_or_else(|| bad("no header: record again".into()))?;
    let trailer: Trailer = trailer.ok_or_else(|| {
        bad("no trailer: the recording did not finish (killed?); nothing to replay".into())
    })?;
    if !trailer.complete {
        return Err(bad("the recording reached --data-limit, so the stream is incomplete: record again with a larger --data-limit".into()));
    }
    Ok(Data {
        header,
        entries,
        trailer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            pid: 7,
            exe: "/bin/x".into(),
            binaries: vec!["/bin/x".into()],
            funcs: vec![FuncInfo {
                name: "f".into(),
                binary: 0,
                offset: 16,
                dispatch: true,
                exit: "ret".into(),
            }],
            dispatch_rule: "r".into(),
            exit_rule: "x".into(),
            dispatch_fallback: false,
            watch_tid: 7,
            watch_name: "x".into(),
            session_start_ns: 5,
            start_unix_ns: 9,
            dispatch_hz: 997,
            exec_ns: None,
            launch: false,
            stages: vec![],
            scenarios: vec![],
            runs: None,
            ready: None,
            startup_threshold_ns: None,
            threshold_ns: 1,
            hang_ns: 2,
            frame_interval_ns: 3,
            full_tree: false,
            trace_events: 4,
            processes: vec![],
            follow: false,
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let path = std::env::temp_dir().join(format!("profiler-data-{}", std::process::id()));
        let mut w = DataWriter::create(File::create(&path).unwrap(), &header(), 1 << 20).unwrap();
        w.record(&[1, 2, 3]);
        w.tick(42);
        w.reap(true, &[10, 11]);
        w.name(10, "worker");
        let trailer = Trailer {
            duration_ns: 99,
            stop_reason: "signal".into(),
            complete: true,
            ..Trailer::default()
        };
        w.finish(&trailer).unwrap();
        let d = read(&path).unwrap();
        assert_eq!(d.header, header());
        assert_eq!(d.trailer, trailer);
        assert_eq!(
            d.entries,
            vec![
                Entry::Record(vec![1, 2, 3]),
                Entry::Tick(42),
                Entry::Reap(true, vec![10, 11]),
                Entry::Name(10, "worker".into())
            ]
        );
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] = 99;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read(&path)
            .unwrap_err()
            .to_string()
            .contains("newer profiler"));
        bytes[8] = 1;
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&path, &bytes).unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("truncated"));
        std::fs::write(&path, b"hello world, not it").unwrap();
        assert!(read(&path)
            .unwrap_err()
            .to_string()
            .contains("not a profile.data"));
        std::fs::remove_file(&path).unwrap();
    }
}
