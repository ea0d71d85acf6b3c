//! `profile.data`: everything a `record` session saw, so `profiler report`
//! can render every output again offline, without root, with other
//! thresholds. The live pipeline is deterministic given this stream: the raw
//! ring records, plus a journal of what it learnt from outside them (hang
//! checks at tick times, threads found exited, thread names read from
//! /proc, symbolized addresses), plus the session's facts.
//!
//! Format 3 (written since this version):
//!
//! ```text
//! "PROFDATA" | version u32 (3) | header block | entries blocks… | trailer block
//! ```
//!
//! Each block ([`block`]) carries its kind, its lengths and two CRC-32s
//! (of its frame and of its content), and zstd-compressed content: the
//! header and the trailer as JSON, entries packed by [`codec`] (about a
//! megabyte of entries, or a second's worth, per block). The trailer says
//! the recording closed cleanly, with its totals. A reader takes every
//! whole block up to the first damaged or unfinished one, and says where it
//! stopped ([`Damage`]); it never reads past damage as if it were whole.
//!
//! Formats 1 and 2 (`[u8 tag][u32 len][payload]` frames, no checksums) are
//! still read, whole or not at all ([`legacy`]).
mod block;
mod codec;
mod legacy;
mod writer;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use writer::{DataWriter, Written};

use crate::{Error, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"PROFDATA";
/// Format version written; files with a newer one are refused.
/// 3: checksummed, compressed blocks, a trailer with totals; process
/// records (`ProcEvent`: fork, exec, exit of traced processes), agent records
/// of functions probed after an exec and of the governor's detaches
/// (`KIND_PROBED`, `session/probed.rs`), the thread's tgid in
/// `CommEvent`, the header's `processes` and `follow`, the trailer's
/// `untraced_children` (`--follow`, several targets); waker records
/// (`WakerEvent`, kind `KIND_WAKER`) and samples of the target's other
/// threads while the watched one is blocked in a dispatch (`StackEvent`,
/// kind `KIND_PEER_SAMPLE`) among the raw records; the trailer's governor.
/// 2: Go entry/exit records (`GoEvent`), each function's exit mechanism
/// (`FuncInfo::exit`) and the header's `exit_rule`. Versions 1 and 2 still
/// read (the new fields default to empty).
pub const VERSION: u32 = 3;

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
    /// What its probe hits added to measured durations (zero in older
    /// recordings: their replays are not corrected).
    #[serde(default)]
    pub cost: crate::tracee::exits::ProbeCost,
    /// File offsets of the functions of its binary it tail-calls (the
    /// recording's tail-call exits are followed to them on replay).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tail_calls: Vec<u64>,
}

impl FuncInfo {
    /// How `profile.data` describes a probed function.
    pub fn of(f: &crate::tracee::select::Func) -> Self {
        let mut tail_calls: Vec<u64> = f.tails.iter().map(|&(_, callee)| callee).collect();
        tail_calls.sort_unstable();
        tail_calls.dedup();
        FuncInfo {
            name: f.name.clone(),
            binary: f.binary,
            offset: f.offset,
            dispatch: f.dispatch,
            exit: f.exit.kind().into(),
            cost: f.cost,
            tail_calls,
        }
    }

    /// The function as the pipeline describes it, for a replay.
    pub fn to_func(&self) -> crate::tracee::select::Func {
        crate::tracee::select::Func {
            name: self.name.clone(),
            binary: self.binary,
            offset: self.offset,
            dispatch: self.dispatch,
            exit: crate::tracee::exits::ExitProbe::from_kind(&self.exit),
            unprobed: None,
            cost: self.cost,
            semaphores: [0; 2],
            tails: self.tail_calls.iter().map(|&callee| (0, callee)).collect(),
            entry_shift: 0,
        }
    }
}

/// A recorded binary path as the pipeline describes it, for a replay.
pub fn replayed_binary(path: &str) -> crate::tracee::select::Binary {
    crate::tracee::select::Binary {
        path: path.into(),
        open_path: path.into(),
        go: false,
        unmapped: None,
    }
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
    /// Dispatches were event-loop iterations bounded by wait syscalls (or,
    /// with a preset's functions and `dispatch_fallback` false, the waits
    /// were watched for the preset's fallback to them).
    #[serde(default)]
    pub wait_loop: bool,
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
    /// `--no-wakers`: who woke the watched thread was not recorded.
    #[serde(default)]
    pub no_wakers: bool,
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
    /// Durations leave out the probes' cost (each function's in `funcs`):
    /// how much the calibration varied from round to round, in %.
    #[serde(default)]
    pub cost_spread_pct: Option<f64>,
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

/// A format-3 recording's totals, in its trailer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Totals {
    /// Ring records.
    pub records: u64,
    /// Entry/exit events among them.
    pub events: u64,
    /// Blocks, header and trailer included.
    pub blocks: u64,
    /// Entries' content before compression.
    pub content_bytes: u64,
    /// What the same stream takes in format 2.
    pub format2_bytes: u64,
    /// Entries left out past `--data-limit`.
    pub cut_entries: u64,
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
    /// Format 3: what the file holds.
    #[serde(default)]
    pub totals: Option<Totals>,
    /// What the overhead governor did (None: it was off).
    #[serde(default)]
    pub governor: Option<crate::analyze::overhead::GovernorReport>,
    /// CLOCK_MONOTONIC when the session decided to stop (0 in recordings
    /// made before it was kept): no dispatch begins after it, as the probes
    /// are being detached then (see `Dispatcher::stop_at`).
    #[serde(default)]
    pub stop_ns: u64,
    /// Durations leave out the probes' cost: how much more (or less, < 0)
    /// the traced calls' hits cost when calibrated again at the end, in %
    /// of what was taken out (None: not calibrated again).
    #[serde(default)]
    pub cost_drift_pct: Option<f64>,
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
    /// The kernel's loss counters so far (entry/exit, scheduler/sample,
    /// thread-name events), journaled once a second so that a recording
    /// cut short still tells its losses. Not replayed.
    Lost(u64, u64, u64),
}

/// Why a recording holds less than its session saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file ends inside a block, or after a whole block without the
    /// trailer: the agent was killed, or the disk filled.
    CutShort {
        /// Where reading stopped.
        at: u64,
        /// Bytes from there to the end (an unfinished block).
        unread: u64,
    },
    /// A block is damaged (checksum, length, zstd data or its entries).
    Corrupt {
        /// Where the damaged block starts.
        at: u64,
        /// Bytes from there to the end, not read.
        unread: u64,
        /// What was wrong.
        why: String,
    },
    /// The recording reached `--data-limit`: the last entries were left out.
    DataLimit {
        /// Entries left out.
        entries: u64,
    },
}

impl Damage {
    /// One line: what is missing and where.
    pub fn message(&self) -> String {
        let what = match self {
            Damage::CutShort { at, unread: 0 } => format!(
                "the recording was cut short: it ends at byte {at} without its trailer (the agent was killed, or the disk filled)"
            ),
            Damage::CutShort { at, unread } => format!(
                "the recording was cut short: {unread} bytes at byte {at} (an unfinished block) could not be read, and it has no trailer (the agent was killed, or the disk filled)"
            ),
            Damage::Corrupt { at, unread, why } => format!(
                "the recording is damaged at byte {at} ({why}): the {unread} bytes from there on were not read"
            ),
            Damage::DataLimit { entries } => format!(
                "the recording reached --data-limit: its last {entries} entries were left out"
            ),
        };
        format!("{what}; the figures cover only the part before")
    }
}

/// A `profile.data`, read back.
#[derive(Debug)]
pub struct Data {
    /// Its format version.
    pub version: u32,
    /// The header.
    pub header: Header,
    /// Records and journal entries, in order.
    pub entries: Vec<Entry>,
    /// The trailer; when the file has none, one made up from the header and
    /// the entries (`stop_reason` says so, nothing is known of losses).
    pub trailer: Trailer,
    /// The trailer was read from the file.
    pub has_trailer: bool,
    /// What is missing, if anything: the figures then cover only the part
    /// before.
    pub damage: Option<Damage>,
    /// Bytes after the trailer, ignored: (where, how many).
    pub trailing: Option<(u64, u64)>,
}

/// Reads `path` (see [`parse`]); errors name the file.
pub fn read(path: &Path) -> Result<Data> {
    let bad = |why: String| Error::Usage(format!("{}: {why}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    parse(&bytes).map_err(bad)
}

/// Reads a `profile.data` held in memory. A file that is not one, was
/// written by a newer profiler, or whose header is damaged is refused with
/// one line (naming the byte where it can). A format-3 file is read up to its
/// first damaged or unfinished block, which [`Data::damage`] names. Never
/// panics; memory stays within the file's size decompressed, each block at
/// most 256 MiB.
pub fn parse(bytes: &[u8]) -> std::result::Result<Data, String> {
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err("not a profile.data file (bad magic in its first 12 bytes)".into());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    match version {
        1 | 2 => legacy::parse(bytes, version),
        VERSION => parse_blocks(bytes),
        0 => Err("bad format version 0 at byte 8: the file is damaged".into()),
        v => Err(format!(
            "written by a newer profiler (format {v} at byte 8; this one reads up to {VERSION}): upgrade profiler"
        )),
    }
}

fn parse_blocks(bytes: &[u8]) -> std::result::Result<Data, String> {
    let mut at = 12usize;
    let header: Header = match block::open(&bytes[at..]) {
        Ok(b) if b.kind == block::KIND_HEADER => {
            at += b.len;
            serde_json::from_slice(&b.content)
                .map_err(|e| format!("the header at byte 12 does not parse ({e}): record again"))?
        }
        Ok(_) => return Err("no header block at byte 12: the file is damaged".into()),
        Err(block::Problem::Truncated) => {
            return Err(
                "the file ends inside its header block (byte 12): nothing was recorded".into(),
            )
        }
        Err(block::Problem::Corrupt(why)) => {
            return Err(format!(
                "the header block at byte 12 is damaged ({why}): nothing to replay"
            ))
        }
    };
    let (mut entries, mut trailer, mut damage, mut trailing) = (Vec::new(), None, None, None);
    let left = |at: usize| (bytes.len() - at) as u64;
    while at < bytes.len() {
        let b = match block::open(&bytes[at..]) {
            Ok(b) => b,
            Err(block::Problem::Truncated) => {
                damage = Some(Damage::CutShort {
                    at: at as u64,
                    unread: left(at),
                });
                break;
            }
            Err(block::Problem::Corrupt(why)) => {
                damage = Some(Damage::Corrupt {
                    at: at as u64,
                    unread: left(at),
                    why,
                });
                break;
            }
        };
        let bad = |why: String| Damage::Corrupt {
            at: at as u64,
            unread: left(at),
            why,
        };
        match b.kind {
            block::KIND_ENTRIES => {
                if let Err(e) = codec::decode(&b.content, &mut entries) {
                    damage = Some(bad(format!("{} at byte {} of its content", e.why, e.at)));
                    break;
                }
            }
            block::KIND_TRAILER => {
                match serde_json::from_slice::<Trailer>(&b.content) {
                    Ok(t) => trailer = Some(t),
                    Err(e) => damage = Some(bad(format!("its trailer does not parse: {e}"))),
                }
                at += b.len;
                if damage.is_none() && at < bytes.len() {
                    trailing = Some((at as u64, left(at)));
                }
                break;
            }
            _ => {
                damage = Some(bad("a second header block".into()));
                break;
            }
        }
        at += b.len;
    }
    let has_trailer = trailer.is_some();
    let trailer = match trailer {
        Some(t) => {
            if !t.complete && damage.is_none() {
                let entries = t.totals.as_ref().map_or(0, |t| t.cut_entries);
                damage = Some(Damage::DataLimit { entries });
            }
            t
        }
        None => {
            if damage.is_none() {
                damage = Some(Damage::CutShort {
                    at: at as u64,
                    unread: 0,
                });
            }
            made_up_trailer(&header, &entries)
        }
    };
    Ok(Data {
        version: VERSION,
        header,
        entries,
        trailer,
        has_trailer,
        damage,
        trailing,
    })
}

/// A trailer for a recording that has none: the duration up to its last
/// timestamp, the probed functions from the header, the last loss counters
/// journaled.
fn made_up_trailer(header: &Header, entries: &[Entry]) -> Trailer {
    let (lost_events, lost_sched, lost_comm) = entries
        .iter()
        .rev()
        .find_map(|e| match e {
            Entry::Lost(a, b, c) => Some((*a, *b, *c)),
            _ => None,
        })
        .unwrap_or_default();
    let last = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Record(r) => Some(u64::from_le_bytes(r.get(..8)?.try_into().ok()?)),
            Entry::Tick(t) => Some(*t),
            _ => None,
        })
        .max()
        .unwrap_or(header.session_start_ns);
    Trailer {
        duration_ns: last.saturating_sub(header.session_start_ns),
        stop_reason: "recording cut short".into(),
        functions_probed: header.funcs.len(),
        lost_events,
        lost_sched,
        lost_comm,
        complete: false,
        ..Trailer::default()
    }
}

#[cfg(test)]
mod tests;
