//! What one `profile.data` block holds before compression: the stream's
//! entries as ops. Entry/exit events, nearly all of a recording, are packed
//! with varints: the function index, the timestamp as a delta from the
//! previous event's (zigzag: the shared ring is not strictly ordered across
//! CPUs), the thread id only when it changes, and the stack pointer as a
//! delta from the same thread's previous one. Every other record is kept
//! raw. The state starts afresh in each block, so a block decodes alone.
use std::collections::HashMap;

use profiler_common::{
    FUNC_BITS, FUNC_MASK, KIND_ENTRY, KIND_EXIT, KIND_GO_ENTRY, KIND_GO_EXIT, LINK_GEN, TAIL_CALL,
};

use super::Entry;

/// An entry or exit event (`| CALL_EXIT`, `| CALL_TID` when a thread id follows).
const OP_CALL: u8 = 0x10;
const CALL_EXIT: u8 = 1;
const CALL_TID: u8 = 2;
/// Any other ring record: varint length, bytes.
const OP_RAW: u8 = 1;
/// A hang check: varint time.
const OP_TICK: u8 = 2;
/// Threads folded as exited: `now` byte, varint count, varint tids.
const OP_REAP: u8 = 3;
/// A thread name: varint tid, varint length, UTF-8 bytes.
const OP_NAME: u8 = 4;
/// Loss counters: three varints.
const OP_LOST: u8 = 5;

/// Size of a ring `Event`, the only record packed.
const EVENT_LEN: usize = 24;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn zigzag(v: u64) -> u64 {
    let v = v as i64;
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

/// Packs entries into a block's content.
#[derive(Default)]
pub struct Encoder {
    /// The block so far.
    pub buf: Vec<u8>,
    /// Entries in `buf`.
    pub entries: u64,
    last_ts: u64,
    tid: Option<u32>,
    sp: u64,
    sps: HashMap<u32, u64>,
}

impl Encoder {
    /// Starts the next block: `buf` is empty, and no state carries over.
    pub fn reset(&mut self, buf: Vec<u8>) {
        self.buf = buf;
        self.buf.clear();
        self.entries = 0;
        self.last_ts = 0;
        self.tid = None;
        self.sp = 0;
        self.sps.clear();
    }

    /// One ring record; true when it was an entry or exit event.
    #[inline]
    pub fn record(&mut self, rec: &[u8]) -> bool {
        self.entries += 1;
        let word = rec
            .get(12..16)
            .map_or(u32::MAX, |w| u32::from_le_bytes(w.try_into().unwrap()));
        let kind = word >> FUNC_BITS;
        if rec.len() == EVENT_LEN {
            let u64_at = |at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().unwrap());
            let ts = u64_at(0);
            let tid = u32::from_le_bytes(rec[8..12].try_into().unwrap());
            let sp = u64_at(16);
            if kind == KIND_ENTRY || kind == KIND_EXIT {
                let mut op = OP_CALL | if kind == KIND_EXIT { CALL_EXIT } else { 0 };
                if self.tid != Some(tid) {
                    op |= CALL_TID;
                    if let Some(old) = self.tid {
                        self.sps.insert(old, self.sp);
                    }
                    self.sp = self.sps.get(&tid).copied().unwrap_or(0);
                    self.tid = Some(tid);
                }
                self.buf.push(op);
                if op & CALL_TID != 0 {
                    put_varint(&mut self.buf, u64::from(tid));
                }
                // The function index with its link generation bit: replay
                // drops the copies two link generations reported.
                put_varint(
                    &mut self.buf,
                    u64::from(word & (FUNC_MASK | LINK_GEN | TAIL_CALL)),
                );
                put_varint(&mut self.buf, zigzag(ts.wrapping_sub(self.last_ts)));
                put_varint(&mut self.buf, zigzag(sp.wrapping_sub(self.sp)));
                self.last_ts = ts;
                self.sp = sp;
                return true;
            }
        }
        self.buf.push(OP_RAW);
        put_varint(&mut self.buf, rec.len() as u64);
        self.buf.extend_from_slice(rec);
        // A Go entry or exit (kept whole, with its goroutine) is one too.
        kind == KIND_GO_ENTRY || kind == KIND_GO_EXIT
    }

    /// Any other entry of the stream.
    pub fn entry(&mut self, e: &Entry) {
        match e {
            Entry::Record(r) => {
                self.record(r);
                return;
            }
            Entry::Tick(t) => {
                self.buf.push(OP_TICK);
                put_varint(&mut self.buf, *t);
            }
            Entry::Reap(now, tids) => {
                self.buf.push(OP_REAP);
                self.buf.push(u8::from(*now));
                put_varint(&mut self.buf, tids.len() as u64);
                for t in tids {
                    put_varint(&mut self.buf, u64::from(*t));
                }
            }
            Entry::Name(tid, name) => {
                self.buf.push(OP_NAME);
                put_varint(&mut self.buf, u64::from(*tid));
                put_varint(&mut self.buf, name.len() as u64);
                self.buf.extend_from_slice(name.as_bytes());
            }
            Entry::Lost(a, b, c) => {
                self.buf.push(OP_LOST);
                for v in [a, b, c] {
                    put_varint(&mut self.buf, *v);
                }
            }
        }
        self.entries += 1;
    }
}

/// Where and why a block's content did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    /// Offset in the decompressed content.
    pub at: usize,
    /// What was wrong.
    pub why: &'static str,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn bad(&self, why: &'static str) -> Bad {
        Bad { at: self.at, why }
    }

    fn byte(&mut self) -> Result<u8, Bad> {
        let v = *self.b.get(self.at).ok_or_else(|| self.bad("ends early"))?;
        self.at += 1;
        Ok(v)
    }

    fn varint(&mut self) -> Result<u64, Bad> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return Err(self.bad("varint overflows 64 bits"));
            }
            v |= part << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.bad("varint longer than 10 bytes"))
    }

    fn u32(&mut self) -> Result<u32, Bad> {
        u32::try_from(self.varint()?).map_err(|_| self.bad("value over 32 bits"))
    }

    fn bytes(&mut self, len: u64) -> Result<&[u8], Bad> {
        let left = self.b.len() - self.at;
        let len = usize::try_from(len)
            .ok()
            .filter(|l| *l <= left)
            .ok_or_else(|| self.bad("length past the block's end"))?;
        let s = &self.b[self.at..self.at + len];
        self.at += len;
        Ok(s)
    }
}

/// Decodes a block's content, appending its entries to `out`. On an error
/// nothing of this block is appended.
pub fn decode(content: &[u8], out: &mut Vec<Entry>) -> Result<(), Bad> {
    let mut c = Cursor { b: content, at: 0 };
    let mut entries = Vec::new();
    let (mut last_ts, mut tid, mut sp) = (0u64, None::<u32>, 0u64);
    let mut sps: HashMap<u32, u64> = HashMap::new();
    while c.at < content.len() {
        let op = c.byte()?;
        match op {
            _ if op & !(CALL_EXIT | CALL_TID) == OP_CALL => {
                if op & CALL_TID != 0 {
                    let new = c.u32()?;
                    if let Some(old) = tid {
                        sps.insert(old, sp);
                    }
                    sp = sps.get(&new).copied().unwrap_or(0);
                    tid = Some(new);
                }
                let t = tid.ok_or_else(|| c.bad("event before any thread id"))?;
                let func = c.u32()?;
                if func > (FUNC_MASK | LINK_GEN | TAIL_CALL) {
                    return Err(c.bad("function index out of range"));
                }
                last_ts = last_ts.wrapping_add(unzigzag(c.varint()?));
                sp = sp.wrapping_add(unzigzag(c.varint()?));
                let kind = if op & CALL_EXIT != 0 {
                    KIND_EXIT
                } else {
                    KIND_ENTRY
                };
                let mut rec = Vec::with_capacity(EVENT_LEN);
                rec.extend_from_slice(&last_ts.to_le_bytes());
                rec.extend_from_slice(&t.to_le_bytes());
                rec.extend_from_slice(&((kind << FUNC_BITS) | func).to_le_bytes());
                rec.extend_from_slice(&sp.to_le_bytes());
                entries.push(Entry::Record(rec));
            }
            OP_RAW => {
                let len = c.varint()?;
                entries.push(Entry::Record(c.bytes(len)?.to_vec()));
            }
            OP_TICK => entries.push(Entry::Tick(c.varint()?)),
            OP_LOST => entries.push(Entry::Lost(c.varint()?, c.varint()?, c.varint()?)),
            OP_REAP => {
                let now = match c.byte()? {
                    0 => false,
                    1 => true,
                    _ => return Err(c.bad("bad flag")),
                };
                let n = c.varint()?;
                // Each tid takes at least a byte: a count past the end is damage.
                if n > (content.len() - c.at) as u64 {
                    return Err(c.bad("count past the block's end"));
                }
                let tids = (0..n).map(|_| c.u32()).collect::<Result<_, _>>()?;
                entries.push(Entry::Reap(now, tids));
            }
            OP_NAME => {
                let t = c.u32()?;
                let len = c.varint()?;
                let at = c.at;
                let name = std::str::from_utf8(c.bytes(len)?).map_err(|_| Bad {
                    at,
                    why: "thread name not UTF-8",
                })?;
                entries.push(Entry::Name(t, name.to_string()));
            }
            _ => {
                return Err(Bad {
                    at: c.at - 1,
                    why: "unknown op",
                })
            }
        }
    }
    out.append(&mut entries);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts: u64, tid: u32, kind: u32, func: u32, sp: u64) -> Vec<u8> {
        let mut r = ts.to_le_bytes().to_vec();
        r.extend_from_slice(&tid.to_le_bytes());
        r.extend_from_slice(&((kind << FUNC_BITS) | func).to_le_bytes());
        r.extend_from_slice(&sp.to_le_bytes());
        r
    }

    fn sample() -> Vec<Entry> {
        vec![
            Entry::Record(event(1_000_000, 7, KIND_ENTRY, 3, 0x7ffe_0000_1000)),
            Entry::Record(event(1_000_050, 7, KIND_ENTRY, 4, 0x7ffe_0000_0fe0)),
            Entry::Record(event(999_990, 8, KIND_ENTRY, 4, 0x7ffd_0000_0fe0)),
            Entry::Record(event(1_000_080, 7, KIND_EXIT, 4, 0x7ffe_0000_0fe8)),
            Entry::Record(event(1_000_100, 8, KIND_EXIT, FUNC_MASK, u64::MAX)),
            Entry::Record(event(u64::MAX, 7, KIND_EXIT, 3, 0)),
            // A scheduler event (kind 4) and short, odd and long records: raw.
            Entry::Record(event(5, 7, 4, 0, 0)),
            Entry::Record(vec![1, 2, 3]),
            Entry::Record(vec![0xab; 800]),
            Entry::Record(Vec::new()),
            Entry::Tick(123_456_789),
            Entry::Reap(true, vec![10, 11, u32::MAX]),
            Entry::Reap(false, vec![]),
            Entry::Name(10, "wörker".into()),
            Entry::Lost(0, u64::MAX, 3),
        ]
    }

    fn encode(entries: &[Entry]) -> Vec<u8> {
        let mut e = Encoder::default();
        for x in entries {
            e.entry(x);
        }
        assert_eq!(e.entries, entries.len() as u64);
        e.buf
    }

    #[test]
    fn entries_and_exits_are_counted_go_ones_too() {
        let mut e = Encoder::default();
        let mut go = event(5, 7, KIND_GO_ENTRY, 1, 0x1000);
        go.extend_from_slice(&0xc000_0001_u64.to_le_bytes());
        let counted = [
            e.record(&event(1, 7, KIND_ENTRY, 1, 0x1000)),
            e.record(&event(2, 7, KIND_EXIT, 1, 0x1008)),
            e.record(&go),
            e.record(&event(3, 7, profiler_common::KIND_SAMPLE, 0, 0)),
        ];
        assert_eq!(counted, [true, true, true, false]);
    }

    #[test]
    fn round_trip_is_exact() {
        let entries = sample();
        let buf = encode(&entries);
        let mut out = Vec::new();
        decode(&buf, &mut out).unwrap();
        assert_eq!(out, entries);
    }

    #[test]
    fn reset_starts_a_block_that_decodes_alone() {
        let mut e = Encoder::default();
        for x in sample() {
            e.entry(&x);
        }
        e.reset(Vec::new());
        let second = sample();
        for x in &second {
            e.entry(x);
        }
        let mut out = Vec::new();
        decode(&e.buf, &mut out).unwrap();
        assert_eq!(out, second);
    }

    #[test]
    fn calls_on_one_thread_take_few_bytes() {
        let mut e = Encoder::default();
        let n = 1000;
        for i in 0..n {
            let base = 1_000_000 + i * 90;
            e.record(&event(base, 7, KIND_ENTRY, 1, 0x7ffe_1000));
            e.record(&event(base + 20, 7, KIND_ENTRY, 2, 0x7ffe_0ff0));
            e.record(&event(base + 40, 7, KIND_EXIT, 2, 0x7ffe_0ff8));
            e.record(&event(base + 60, 7, KIND_EXIT, 1, 0x7ffe_1008));
        }
        assert!(e.buf.len() < (n as usize * 4) * 5, "{} bytes", e.buf.len());
    }

    #[test]
    fn every_damage_kind_is_an_error_not_a_panic() {
        let buf = encode(&sample());
        // Truncated anywhere: an error, or a clean prefix at an op boundary.
        for cut in 0..buf.len() {
            let mut out = Vec::new();
            if decode(&buf[..cut], &mut out).is_ok() {
                assert!(out.len() < sample().len());
                assert_eq!(out[..], sample()[..out.len()]);
            } else {
                assert!(out.is_empty(), "a failed block appends nothing");
            }
        }
        let cases: &[(&[u8], &str)] = &[
            (&[0x7f], "unknown op"),
            (&[OP_CALL, 1, 0, 0], "event before any thread id"),
            (
                &[OP_RAW, 0xff, 0xff, 0xff, 0xff, 0x0f],
                "length past the block's end",
            ),
            (
                &[
                    OP_TICK, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
                ],
                "varint overflows 64 bits",
            ),
            (
                &[
                    OP_TICK, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0,
                ],
                "varint longer than 10 bytes",
            ),
            (&[OP_REAP, 2, 0], "bad flag"),
            (
                &[OP_REAP, 1, 0xff, 0xff, 0xff, 0xff, 0x0f],
                "count past the block's end",
            ),
            (&[OP_NAME, 1, 2, 0xff, 0xfe], "thread name not UTF-8"),
            (
                &[OP_CALL | CALL_TID, 0xff, 0xff, 0xff, 0xff, 0x1f],
                "value over 32 bits",
            ),
            (
                &[OP_CALL | CALL_TID, 1, 0xff, 0xff, 0xff, 0xff, 0x0f],
                "function index out of range",
            ),
        ];
        for (bytes, why) in cases {
            let err = decode(bytes, &mut Vec::new()).unwrap_err();
            assert_eq!(err.why, *why, "{bytes:?}");
        }
    }
}
