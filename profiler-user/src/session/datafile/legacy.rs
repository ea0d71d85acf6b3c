//! Formats 1 and 2: `PROFDATA`, a little-endian `u32` version, then frames
//! of `[u8 tag][u32 len][payload]`: one header (JSON), records, journal
//! entries, and one trailer (JSON) last. Nothing is checksummed, so such a
//! file is read whole or refused.
use super::{Data, Entry, Header, Trailer};

const TAG_HEADER: u8 = 1;
const TAG_RECORD: u8 = 2;
const TAG_TICK: u8 = 3;
const TAG_REAP: u8 = 4;
const TAG_NAME: u8 = 5;
const TAG_TRAILER: u8 = 9;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// Reads a format 1 or 2 file (`bytes` starts with the magic and version).
pub fn parse(bytes: &[u8], version: u32) -> Result<Data, String> {
    let (mut header, mut trailer, mut entries) = (None::<Header>, None::<Trailer>, Vec::new());
    let mut at = 12;
    let corrupt = |at: usize| {
        format!("corrupt or truncated at byte {at} (format {version}, which has no checksums): record again")
    };
    while at < bytes.len() {
        let tag = bytes[at];
        let len = u32_at(bytes, at + 1).ok_or_else(|| corrupt(at))? as usize;
        let p = bytes
            .get(at + 5..(at + 5).saturating_add(len))
            .ok_or_else(|| corrupt(at))?;
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
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                entries.push(Entry::Reap(p[0] != 0, tids));
            }
            TAG_NAME if p.len() >= 4 => entries.push(Entry::Name(
                u32_at(p, 0).expect("4 bytes"),
                String::from_utf8_lossy(&p[4..]).into_owned(),
            )),
            _ => return Err(corrupt(at)),
        }
        at += 5 + len;
    }
    let header = header.ok_or("no header: record again")?;
    let trailer = trailer.ok_or_else(|| {
        format!("no trailer: the recording did not finish (killed?), and format {version} cannot be read in part: nothing to replay")
    })?;
    if !trailer.complete {
        return Err("the recording reached --data-limit, and this old format cannot be read in part: record again with a larger --data-limit".into());
    }
    Ok(Data {
        version,
        header,
        entries,
        trailer,
        has_trailer: true,
        damage: None,
        trailing: None,
    })
}

/// Writes a format-2 file, as the profiler did before format 3 (tests).
#[cfg(test)]
pub fn write(header: &Header, entries: &[Entry], trailer: &Trailer) -> Vec<u8> {
    let mut b = super::MAGIC.to_vec();
    b.extend_from_slice(&2u32.to_le_bytes());
    let mut frame = |tag: u8, p: &[u8]| {
        b.push(tag);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
    };
    frame(TAG_HEADER, &serde_json::to_vec(header).unwrap());
    for e in entries {
        match e {
            Entry::Record(r) => frame(TAG_RECORD, r),
            Entry::Tick(t) => frame(TAG_TICK, &t.to_le_bytes()),
            Entry::Reap(now, tids) => {
                let mut p = vec![u8::from(*now)];
                tids.iter()
                    .for_each(|t| p.extend_from_slice(&t.to_le_bytes()));
                frame(TAG_REAP, &p);
            }
            Entry::Name(t, n) => {
                let mut p = t.to_le_bytes().to_vec();
                p.extend_from_slice(n.as_bytes());
                frame(TAG_NAME, &p);
            }
            Entry::Lost(..) => {}
        }
    }
    frame(TAG_TRAILER, &serde_json::to_vec(trailer).unwrap());
    b
}
