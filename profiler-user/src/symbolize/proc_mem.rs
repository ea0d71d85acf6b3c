//! Reads of another process's memory through one open `/proc/PID/mem`:
//! the runtimes' namers (`python.rs`, `v8.rs`) read their objects with it.
use std::{fs::File, os::unix::fs::FileExt};

/// One process's memory, open for reading.
pub struct Mem(File);

impl Mem {
    /// None when the process is gone or cannot be read.
    pub fn open(pid: u32) -> Option<Self> {
        File::open(format!("/proc/{pid}/mem")).ok().map(Mem)
    }

    /// `len` bytes at `addr`, all of them or None.
    pub fn bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.0.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    pub fn u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u64::from_ne_bytes(b))
    }

    pub fn u32(&self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u32::from_ne_bytes(b))
    }

    pub fn u16(&self, addr: u64) -> Option<u16> {
        let mut b = [0u8; 2];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u16::from_ne_bytes(b))
    }
}
