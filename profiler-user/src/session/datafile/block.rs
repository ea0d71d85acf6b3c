//! One block of a format-3 `profile.data`: a 21-byte frame, then its
//! content compressed with zstd.
//!
//! ```text
//! "PDBK" | kind u8 | stored_len u32 | raw_len u32 | content_crc u32 | frame_crc u32 | stored_len bytes of zstd
//! ```
//!
//! Integers are little-endian; the checksums are CRC-32 (IEEE), `frame_crc`
//! over the 17 bytes before it and `content_crc` over the stored bytes. A
//! damaged length is therefore caught before it is used, and any changed
//! byte of a block is caught before its content is decoded. Neither length
//! may exceed [`MAX_LEN`], and the content is decompressed as a stream
//! that stops at `raw_len`: hostile lengths cannot make the reader allocate
//! more than the file holds, decompressed, up to that cap.
use std::io::Read;

/// Marks the start of every block.
pub const MAGIC: &[u8; 4] = b"PDBK";
/// Bytes of a block's frame.
pub const FRAME: usize = 21;
/// The recording's [`super::Header`], JSON; the first block.
pub const KIND_HEADER: u8 = 1;
/// Entries of the stream ([`super::codec`]).
pub const KIND_ENTRIES: u8 = 2;
/// The [`super::Trailer`], JSON; the last block of a recording closed cleanly.
pub const KIND_TRAILER: u8 = 3;
/// Largest stored or decompressed length of a block.
pub const MAX_LEN: u32 = 256 << 20;

/// zstd level: fast, and most of the gain on these streams.
const LEVEL: i32 = 1;

/// Compresses `content` into a whole block. `content` must be under
/// [`MAX_LEN`] (the writer's blocks are about a megabyte).
pub fn seal(kind: u8, content: &[u8]) -> std::io::Result<Vec<u8>> {
    if content.len() >= MAX_LEN as usize {
        return Err(std::io::Error::other("a profile.data block over 256 MiB"));
    }
    let stored = zstd::bulk::compress(content, LEVEL)?;
    let mut b = Vec::with_capacity(FRAME + stored.len());
    b.extend_from_slice(MAGIC);
    b.push(kind);
    b.extend_from_slice(&(stored.len() as u32).to_le_bytes());
    b.extend_from_slice(&(content.len() as u32).to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(&stored).to_le_bytes());
    let frame_crc = crc32fast::hash(&b);
    b.extend_from_slice(&frame_crc.to_le_bytes());
    b.extend_from_slice(&stored);
    Ok(b)
}

/// Why a block could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The bytes end inside the block: it was never finished.
    Truncated,
    /// The block is damaged.
    Corrupt(String),
}

/// A block read back.
#[derive(Debug)]
pub struct Block {
    /// Its kind (`KIND_*`).
    pub kind: u8,
    /// The decompressed content.
    pub content: Vec<u8>,
    /// Bytes the block took in the file.
    pub len: usize,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the block at the start of `bytes`.
pub fn open(bytes: &[u8]) -> Result<Block, Problem> {
    let corrupt = |why: &str| Err(Problem::Corrupt(why.to_string()));
    let seen = bytes.len().min(MAGIC.len());
    if bytes[..seen] != MAGIC[..seen] {
        return corrupt("no block marker");
    }
    if bytes.len() < FRAME {
        return Err(Problem::Truncated);
    }
    if crc32fast::hash(&bytes[..17]) != u32_at(bytes, 17) {
        return corrupt("block frame checksum mismatch");
    }
    let (kind, stored, raw) = (bytes[4], u32_at(bytes, 5), u32_at(bytes, 9));
    if stored > MAX_LEN || raw > MAX_LEN {
        return corrupt("block length over 256 MiB");
    }
    if !matches!(kind, KIND_HEADER | KIND_ENTRIES | KIND_TRAILER) {
        return corrupt("unknown block kind");
    }
    let Some(payload) = bytes.get(FRAME..FRAME + stored as usize) else {
        return Err(Problem::Truncated);
    };
    if crc32fast::hash(payload) != u32_at(bytes, 13) {
        return corrupt("block checksum mismatch");
    }
    let mut content = Vec::new();
    let dec = zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(|_| Problem::Corrupt("bad zstd data".into()))?;
    dec.take(u64::from(raw) + 1)
        .read_to_end(&mut content)
        .map_err(|_| Problem::Corrupt("bad zstd data".into()))?;
    if content.len() != raw as usize {
        return corrupt("decompressed size differs from the block's");
    }
    Ok(Block {
        kind,
        content,
        len: FRAME + stored as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let content: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let b = seal(KIND_ENTRIES, &content).unwrap();
        assert!(b.len() < content.len() / 4, "compressed to {}", b.len());
        let mut file = b.clone();
        file.extend_from_slice(b"trailing");
        let got = open(&file).unwrap();
        assert_eq!((got.kind, got.len), (KIND_ENTRIES, b.len()));
        assert_eq!(got.content, content);
        let empty = seal(KIND_TRAILER, b"").unwrap();
        assert_eq!(open(&empty).unwrap().content, b"");
    }

    #[test]
    fn every_damage_kind_is_caught() {
        let content = b"some entries, some entries, some entries".repeat(50);
        let b = seal(KIND_ENTRIES, &content).unwrap();
        // Truncated anywhere.
        for cut in 0..b.len() {
            assert_eq!(
                open(&b[..cut]).unwrap_err(),
                Problem::Truncated,
                "cut {cut}"
            );
        }
        // Any byte changed, anywhere.
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x5a;
            assert!(
                matches!(open(&d), Err(Problem::Corrupt(_))),
                "flip at {at} not caught"
            );
        }
        let why = |d: &[u8]| match open(d) {
            Err(Problem::Corrupt(w)) => w,
            other => panic!("{other:?}"),
        };
        // A hostile length with a valid frame checksum.
        let mut d = b.clone();
        d[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        let c = crc32fast::hash(&d[..17]);
        d[17..21].copy_from_slice(&c.to_le_bytes());
        assert_eq!(why(&d), "block length over 256 MiB");
        // Bad zstd data with valid checksums.
        let mut d = b[..FRAME].to_vec();
        d.extend_from_slice(&vec![0x42; b.len() - FRAME]);
        let c = crc32fast::hash(&d[FRAME..]);
        d[13..17].copy_from_slice(&c.to_le_bytes());
        let c = crc32fast::hash(&d[..17]);
        d[17..21].copy_from_slice(&c.to_le_bytes());
        assert_eq!(why(&d), "bad zstd data");
        // A raw length that lies, checksums valid.
        let mut d = b.clone();
        d[9..13].copy_from_slice(&(content.len() as u32 + 1).to_le_bytes());
        let c = crc32fast::hash(&d[..17]);
        d[17..21].copy_from_slice(&c.to_le_bytes());
        assert_eq!(why(&d), "decompressed size differs from the block's");
        assert_eq!(why(b"PDBX"), "no block marker");
    }
}
