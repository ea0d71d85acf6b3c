//! What one probe hit costs on this host, measured at attach for the
//! overhead governor: the agent loads a second copy of the kernel programs
//! that traces the agent itself, attaches them (uprobe_multi, as the session
//! does) to two small functions of its own, and times a few thousand calls
//! with no probe, with an entry probe (on each kind of first instruction
//! the kernel handles differently: one it must single-step, a `push` it
//! emulates, a 5-byte nop it turns into a call), with an entry probe plus a
//! return-site probe, and with an entry probe plus a return uprobe. Each hit
//! runs the whole program, event written to a ring included; the ring is
//! drained and discarded between batches.
use std::{
    os::fd::AsFd,
    path::Path,
    time::{Duration, Instant},
};

use aya::{maps::RingBuf, EbpfLoader};
use profiler_common::{
    EVENTS_MAP, PROG_ENTRY, PROG_EXIT, PROG_RET, SAMPLE_ALL_GLOBAL, TARGET_TGID_GLOBAL,
    WAKEUP_BYTES_GLOBAL, WATCH_TID_GLOBAL,
};
use serde::{Deserialize, Serialize};

use super::{probes::EBPF_OBJECT, uprobe_multi as multi};
use crate::{error::chain, Error, Result};

/// Nanoseconds one probe hit costs the thread that hits it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HitCost {
    /// An entry probe on a first instruction the kernel single-steps (an
    /// int3 trap, then a step out of line).
    pub entry_ns: f64,
    /// An entry probe on a `push` (an int3 trap; the kernel emulates it).
    #[serde(default)]
    pub entry_push_ns: f64,
    /// An entry probe on a 5-byte nop (the kernel turns it into a call).
    pub entry_nop_ns: f64,
    /// A probe on a return instruction.
    pub ret_site_ns: f64,
    /// A return uprobe (its share at entry included).
    pub uretprobe_ns: f64,
}

// Three leaf functions whose layout is known, so that the return
// instruction needs no decoding: `calib_step` starts with `lea` (which the
// kernel single-steps), `calib_plain` with `push rbp` (emulated),
// `calib_nop` with the 5-byte nop `nopl 0(%rax,%rax,1)` that compilers emit
// for `-mfentry -mnop-mcount`. All return at byte 9.
std::arch::global_asm!(
    ".pushsection .text.profiler_calibration,\"ax\",@progbits",
    ".globl profiler_calib_step",
    ".type profiler_calib_step,@function",
    "profiler_calib_step:",
    "lea rax, [rdi + rdi*2]",
    "add rax, 1",
    "nop",
    "ret",
    ".size profiler_calib_step, .-profiler_calib_step",
    ".globl profiler_calib_plain",
    ".type profiler_calib_plain,@function",
    "profiler_calib_plain:",
    "push rbp",
    "mov rbp, rsp",
    "lea rax, [rdi + rdi*2]",
    "pop rbp",
    "ret",
    ".size profiler_calib_plain, .-profiler_calib_plain",
    ".globl profiler_calib_nop",
    ".type profiler_calib_nop,@function",
    "profiler_calib_nop:",
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    "lea rax, [rdi + rdi*2]",
    "ret",
    ".size profiler_calib_nop, .-profiler_calib_nop",
    ".popsection",
);

unsafe extern "C" {
    fn profiler_calib_step(x: u64) -> u64;
    fn profiler_calib_plain(x: u64) -> u64;
    fn profiler_calib_nop(x: u64) -> u64;
}

/// Byte offset of both functions' `ret`.
const RET_AT: u64 = 9;
/// Calls per timed batch.
const BATCH: u64 = 500;
/// Timed batches per configuration; the median is kept: the cost as the
/// host is now, busy or not, without one preempted batch's outlier.
const BATCHES: usize = 5;

/// The file offset in `/proc/self/exe` of the code at `addr`.
fn file_offset(addr: u64) -> Result<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::io("reading /proc/self/maps", e))?;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(_perms), Some(off)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        if let (Some(start), Some(end), Some(off)) = (hex(start), hex(end), hex(off)) {
            if (start..end).contains(&addr) {
                return Ok(addr - start + off);
            }
        }
    }
    Err(Error::Load(format!(
        "calibration: {addr:#x} is not in a mapping of the agent"
    )))
}

/// Nanoseconds per call of `f`: the median of [`BATCHES`] batches.
fn time_calls(
    f: unsafe extern "C" fn(u64) -> u64,
    ring: &mut RingBuf<&mut aya::maps::MapData>,
) -> f64 {
    let f = std::hint::black_box(f);
    // Warm-up: the kernel optimizes a nop-site uprobe after its first hits.
    for i in 0..50 {
        // SAFETY: the calibration functions read only their argument.
        std::hint::black_box(unsafe { f(i) });
    }
    while ring.next().is_some() {}
    let mut times: Vec<Duration> = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let start = Instant::now();
        let mut acc = 0u64;
        for i in 0..BATCH {
            // SAFETY: as above.
            acc = acc.wrapping_add(unsafe { f(i) });
        }
        std::hint::black_box(acc);
        times.push(start.elapsed());
        while ring.next().is_some() {}
    }
    times.sort();
    times[BATCHES / 2].as_nanos() as f64 / BATCH as f64
}

/// Measures [`HitCost`] on this host (about 0.1–0.3 s, most of it loading
/// the programs again).
pub fn calibrate() -> Result<HitCost> {
    let pid = std::process::id();
    let fail = |what: &str, e: String| Error::Load(format!("calibrating probe cost: {what}: {e}"));
    let mut ebpf = EbpfLoader::new()
        .override_global(TARGET_TGID_GLOBAL, &pid, true)
        .override_global(WATCH_TID_GLOBAL, &0u32, true)
        .override_global(SAMPLE_ALL_GLOBAL, &0u32, true)
        .override_global(WAKEUP_BYTES_GLOBAL, &u64::MAX, true)
        .map_max_entries(EVENTS_MAP, 1 << 20)
        .load(EBPF_OBJECT)
        .map_err(|e| fail("loading", chain(&e)))?;
    let prog = |name| multi::load_multi_program(EBPF_OBJECT, &ebpf, name);
    let entry = prog(PROG_ENTRY).map_err(|e| fail(PROG_ENTRY, e))?;
    let ret = prog(PROG_RET).map_err(|e| fail(PROG_RET, e))?;
    let exit = prog(PROG_EXIT).map_err(|e| fail(PROG_EXIT, e))?;
    let exe = Path::new("/proc/self/exe");
    let step = file_offset(profiler_calib_step as *const () as usize as u64)?;
    let plain = file_offset(profiler_calib_plain as *const () as usize as u64)?;
    let nop = file_offset(profiler_calib_nop as *const () as usize as u64)?;
    let mut ring = RingBuf::try_from(
        ebpf.map_mut(EVENTS_MAP)
            .ok_or_else(|| fail("ring", "missing".into()))?,
    )
    .map_err(|e| fail("ring", chain(&e)))?;
    let attach = |prog: &std::os::fd::OwnedFd, off: u64, ret: bool| {
        multi::attach_uprobe_multi(prog.as_fd(), exe, &[off], &[0], pid, ret)
            .map_err(|e| fail("attaching", e))
    };
    let base_step = time_calls(profiler_calib_step, &mut ring);
    let base_plain = time_calls(profiler_calib_plain, &mut ring);
    let base_nop = time_calls(profiler_calib_nop, &mut ring);
    let e = attach(&entry, step, false)?;
    let with_entry = time_calls(profiler_calib_step, &mut ring);
    let r = attach(&ret, step + RET_AT, false)?;
    let with_ret = time_calls(profiler_calib_step, &mut ring);
    drop(r);
    let u = attach(&exit, step, true)?;
    let with_uret = time_calls(profiler_calib_step, &mut ring);
    drop(u);
    drop(e);
    let p = attach(&entry, plain, false)?;
    let with_push = time_calls(profiler_calib_plain, &mut ring);
    drop(p);
    let n = attach(&entry, nop, false)?;
    let with_nop = time_calls(profiler_calib_nop, &mut ring);
    drop(n);
    let pos = |x: f64| x.max(1.0);
    Ok(HitCost {
        entry_ns: pos(with_entry - base_step),
        entry_push_ns: pos(with_push - base_plain),
        entry_nop_ns: pos(with_nop - base_nop),
        ret_site_ns: pos(with_ret - with_entry),
        uretprobe_ns: pos(with_uret - with_entry),
    })
}

/// How the kernel handles an entry probe, by the probed instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Trapped, then single-stepped out of line.
    Step,
    /// A `push` of a register: trapped, then emulated.
    Push,
    /// The 5-byte nop: turned into a call, no trap.
    Nop,
}

/// How the kernel will handle a probe on the first instruction of the
/// function at `offset` of the file `file` (opened once by the caller).
pub fn entry_kind(file: &std::fs::File, offset: u64) -> EntryKind {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 5];
    if file.read_exact_at(&mut b, offset).is_err() {
        return EntryKind::Step;
    }
    match b {
        [0x0f, 0x1f, 0x44, 0x00, 0x00] => EntryKind::Nop,
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => EntryKind::Push,
        _ => EntryKind::Step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_functions_have_the_expected_layout() {
        // SAFETY: reading our own code bytes.
        let step = unsafe {
            std::slice::from_raw_parts(profiler_calib_step as *const () as usize as *const u8, 10)
        };
        assert_eq!(step[RET_AT as usize], 0xc3);
        // SAFETY: a plain leaf function.
        assert_eq!(unsafe { profiler_calib_step(5) }, 16);
        // SAFETY: reading our own code bytes.
        let plain = unsafe {
            std::slice::from_raw_parts(profiler_calib_plain as *const () as usize as *const u8, 10)
        };
        let nop = unsafe {
            std::slice::from_raw_parts(profiler_calib_nop as *const () as usize as *const u8, 10)
        };
        assert_eq!(plain[RET_AT as usize], 0xc3);
        assert_eq!(nop[RET_AT as usize], 0xc3);
        assert_eq!(&nop[..5], &[0x0f, 0x1f, 0x44, 0x00, 0x00]);
        // SAFETY: plain leaf functions.
        assert_eq!(unsafe { profiler_calib_plain(5) }, 15);
        assert_eq!(unsafe { profiler_calib_nop(7) }, 21);
    }

    #[test]
    fn calibration_measures_positive_costs() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: calibration needs root");
            return;
        }
        let c = calibrate().expect("calibrates");
        println!("{c:?}");
        assert!(c.entry_ns > 50.0 && c.entry_ns < 100_000.0, "{c:?}");
        assert!(c.ret_site_ns > 50.0, "{c:?}");
    }
}
