//! The records the agent adds to the stream (kind `KIND_PROBED`, an
//! [`Event`] header then JSON):
//! - [`ProbedRecord`]: a traced process exec'd (`--follow`): the new
//!   program, and the functions of it that were probed then, with the
//!   binaries they are in;
//! - [`DetachRecord`]: the overhead governor detached functions: their
//!   frames still open can never see a return, and close there.
//!
//! `record` applies each at its point of the stream and journals it in
//! `profile.data`; `report` applies it at the same point of the replay, so
//! both grow the same aggregates.
use profiler_common::{Event, KIND_PROBED};
use serde::{Deserialize, Serialize};

use crate::{
    session::datafile::{replayed_binary, FuncInfo},
    tracee::select::{Binary, Func},
};

/// Functions probed after an exec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbedRecord {
    /// The process that exec'd.
    pub pid: u32,
    /// CLOCK_MONOTONIC when the probes were in place.
    pub ts_ns: u64,
    /// Its new program.
    pub exe: String,
    /// Binaries added to the session (appended to its list).
    pub binaries: Vec<String>,
    /// Functions added (appended; `binary` indexes the whole list).
    pub funcs: Vec<FuncInfo>,
}

impl ProbedRecord {
    /// What is recorded of `funcs` (indices into the session's binaries),
    /// and the binaries new to the session.
    pub fn new(pid: u32, ts_ns: u64, exe: String, binaries: &[Binary], funcs: &[Func]) -> Self {
        ProbedRecord {
            pid,
            ts_ns,
            exe,
            binaries: binaries
                .iter()
                .map(|b| b.path.display().to_string())
                .collect(),
            funcs: funcs.iter().map(FuncInfo::of).collect(),
        }
    }

    /// The ring-record bytes: an [`Event`] header, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let header = Event {
            ts_ns: self.ts_ns,
            tid: self.pid,
            word: Event::pack(KIND_PROBED, self.funcs.len() as u32),
            sp: 0,
        };
        // SAFETY: viewing a repr(C) record of plain integers as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&header as *const Event).cast::<u8>(), size_of::<Event>())
        };
        let mut out = bytes.to_vec();
        out.extend(serde_json::to_vec(self).expect("plain data"));
        out
    }

    /// Reads one back; None when it is not one.
    pub fn decode(rec: &[u8]) -> Option<Self> {
        serde_json::from_slice(rec.get(size_of::<Event>()..)?).ok()
    }

    /// The functions, as the pipeline describes them.
    pub fn funcs(&self) -> Vec<Func> {
        self.funcs.iter().map(FuncInfo::to_func).collect()
    }

    /// The binaries, as the pipeline describes them.
    pub fn binaries(&self) -> Vec<Binary> {
        self.binaries.iter().map(|p| replayed_binary(p)).collect()
    }

    /// Adds a later record's functions and binaries to these.
    pub fn absorb(&mut self, later: ProbedRecord) {
        self.binaries.extend(later.binaries);
        self.funcs.extend(later.funcs);
    }
}

/// Functions the overhead governor detached. Applied once every event
/// up to `ts_ns` has been read (`Sinks::detach_later`): from then on none
/// of their probes can fire, so their frames still open are closed, at
/// `ts_ns`, marked *detached*.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DetachRecord {
    /// CLOCK_MONOTONIC once the last of their probes was gone.
    pub ts_ns: u64,
    /// CLOCK_MONOTONIC when the governor chose them (their returns from
    /// then on, without an entry, are not orphans).
    pub decided_ns: u64,
    /// The functions, by index.
    pub funcs: Vec<u32>,
}

/// A [`DetachRecord`] in JSON: `{"detached": {...}}`, which no
/// [`ProbedRecord`] reads as (it lacks their fields).
#[derive(Serialize, Deserialize)]
struct DetachJson {
    detached: DetachRecord,
}

impl DetachRecord {
    /// The ring-record bytes: an [`Event`] header (kind `KIND_PROBED`,
    /// function field 0), then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let header = Event {
            ts_ns: self.ts_ns,
            tid: 0,
            word: Event::pack(KIND_PROBED, 0),
            sp: 0,
        };
        // SAFETY: viewing a repr(C) record of plain integers as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&header as *const Event).cast::<u8>(), size_of::<Event>())
        };
        let mut out = bytes.to_vec();
        out.extend(
            serde_json::to_vec(&DetachJson {
                detached: self.clone(),
            })
            .expect("plain data"),
        );
        out
    }

    /// Reads one back; None when it is not one.
    pub fn decode(rec: &[u8]) -> Option<Self> {
        serde_json::from_slice::<DetachJson>(rec.get(size_of::<Event>()..)?)
            .ok()
            .map(|j| j.detached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{decode, RecordKind};

    #[test]
    fn round_trips_through_the_record_decoder() {
        let rec = ProbedRecord {
            pid: 42,
            ts_ns: 7,
            exe: "/bin/helper".into(),
            binaries: vec!["/bin/helper".into()],
            funcs: vec![FuncInfo {
                name: "work".into(),
                binary: 1,
                offset: 64,
                dispatch: false,
                exit: "ret".into(),
                cost: Default::default(),
            }],
        };
        let bytes = rec.encode();
        let (kind, ev) = decode(&bytes).unwrap();
        assert_eq!((kind, ev.tid, ev.func()), (RecordKind::Probed, 42, 1));
        assert_eq!(ProbedRecord::decode(&bytes), Some(rec));
        assert_eq!(ProbedRecord::decode(&bytes[..30]), None);
    }

    #[test]
    fn detach_records_are_told_apart_from_probed_ones() {
        let rec = DetachRecord {
            ts_ns: 900,
            decided_ns: 800,
            funcs: vec![3, 5],
        };
        let bytes = rec.encode();
        let (kind, ev) = decode(&bytes).unwrap();
        assert_eq!((kind, ev.ts_ns), (RecordKind::Probed, 900));
        assert_eq!(DetachRecord::decode(&bytes), Some(rec));
        assert_eq!(ProbedRecord::decode(&bytes), None);
        let probed = ProbedRecord {
            pid: 1,
            ..Default::default()
        };
        assert_eq!(DetachRecord::decode(&probed.encode()), None);
    }
}
