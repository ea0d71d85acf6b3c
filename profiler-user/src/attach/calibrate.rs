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
    PROG_ENTRY, PROG_EXIT, PROG_RET, SAMPLE_ALL_GLOBAL, TARGET_TGID_GLOBAL, WAKEUP_BYTES_GLOBAL,
    WATCH_TID_GLOBAL,
};
use serde::{Deserialize, Serialize};

use super::{
    probes::EBPF_OBJECT,
    rings::{self, RingSpec},
    uprobe_multi as multi,
};
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

// Leaf functions whose layout is known, so that the return instruction
// needs no decoding (it is at byte 9 of each). One copy per configuration,
// all probed at once, so the configurations are timed in alternation and
// the host's load weighs on each alike: `step_*` start with `lea` (which the
// kernel single-steps), `push_*` with `push rbp` (emulated), `nop_*` with
// the 5-byte nop `nopl 0(%rax,%rax,1)` that compilers emit for `-mfentry
// -mnop-mcount` (turned into a call).
macro_rules! calibration_functions {
    ($($name:literal: [$($insn:literal),*];)*) => {
        std::arch::global_asm!(
            ".pushsection .text.profiler_calibration,\"ax\",@progbits",
            $(
                concat!(".globl ", $name),
                concat!(".type ", $name, ",@function"),
                concat!($name, ":"),
                $($insn,)*
                concat!(".size ", $name, ", .-", $name),
            )*
            ".popsection",
        );
    };
}

calibration_functions! {
    "profiler_calib_step_base": ["lea rax, [rdi + rdi*2]", "add rax, 1", "nop", "ret"];
    "profiler_calib_step_entry": ["lea rax, [rdi + rdi*2]", "add rax, 1", "nop", "ret"];
    "profiler_calib_step_ret": ["lea rax, [rdi + rdi*2]", "add rax, 1", "nop", "ret"];
    "profiler_calib_step_ret_only": ["lea rax, [rdi + rdi*2]", "add rax, 1", "nop", "ret"];
    "profiler_calib_step_uret": ["lea rax, [rdi + rdi*2]", "add rax, 1", "nop", "ret"];
    "profiler_calib_push_base": ["push rbp", "mov rbp, rsp", "lea rax, [rdi + rdi*2]", "pop rbp", "ret"];
    "profiler_calib_push_entry": ["push rbp", "mov rbp, rsp", "lea rax, [rdi + rdi*2]", "pop rbp", "ret"];
    "profiler_calib_nop_base": [".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "lea rax, [rdi + rdi*2]", "ret"];
    "profiler_calib_nop_entry": [".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "lea rax, [rdi + rdi*2]", "ret"];
}

unsafe extern "C" {
    fn profiler_calib_step_base(x: u64) -> u64;
    fn profiler_calib_step_entry(x: u64) -> u64;
    fn profiler_calib_step_ret(x: u64) -> u64;
    fn profiler_calib_step_ret_only(x: u64) -> u64;
    fn profiler_calib_step_uret(x: u64) -> u64;
    fn profiler_calib_push_base(x: u64) -> u64;
    fn profiler_calib_push_entry(x: u64) -> u64;
    fn profiler_calib_nop_base(x: u64) -> u64;
    fn profiler_calib_nop_entry(x: u64) -> u64;
}

/// A calibration function.
type CalibFn = unsafe extern "C" fn(u64) -> u64;

/// Its address.
fn addr(f: CalibFn) -> u64 {
    f as *const () as usize as u64
}

/// Byte offset of every calibration function's `ret`.
const RET_AT: u64 = 9;
/// Calls per timed batch.
const BATCH: u64 = 200;
/// Rounds: each times one batch of every function. The median batch is
/// kept: on a busy VM a single-stepped trap costs from 4 to over 100 µs in
/// bursts, and one burst during calibration must not set the estimate for
/// the whole session.
const ROUNDS: usize = 15;

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

/// Nanoseconds per call of each of `fns`: the median of [`ROUNDS`]
/// batches, timed in alternation.
fn time_calls(fns: &[CalibFn], ring: &mut RingBuf<aya::maps::MapData>) -> Vec<f64> {
    let run = |f: CalibFn, n: u64| {
        let f = std::hint::black_box(f);
        let mut acc = 0u64;
        for i in 0..n {
            // SAFETY: the calibration functions read only their argument.
            acc = acc.wrapping_add(unsafe { f(i) });
        }
        std::hint::black_box(acc);
    };
    // Warm-up: the kernel optimizes a nop-site uprobe after its first hits.
    for &f in fns {
        run(f, 50);
    }
    while ring.next().is_some() {}
    let mut times = vec![Vec::with_capacity(ROUNDS); fns.len()];
    for _ in 0..ROUNDS {
        for (t, &f) in times.iter_mut().zip(fns) {
            let start = Instant::now();
            run(f, BATCH);
            t.push(start.elapsed());
            while ring.next().is_some() {}
        }
    }
    times
        .into_iter()
        .map(|mut t: Vec<Duration>| {
            t.sort();
            t[ROUNDS / 2].as_nanos() as f64 / BATCH as f64
        })
        .collect()
}

/// Measures [`HitCost`] on this host (about 0.1–0.3 s, most of it loading
/// the programs again).
pub fn calibrate() -> Result<HitCost> {
    let pid = std::process::id();
    let fail = |what: &str, e: String| Error::Load(format!("calibrating probe cost: {what}: {e}"));
    // One shared ring, as the session's own writes cost the same per hit
    // with a ring per CPU (a hit writes to one ring either way).
    let spec = RingSpec::shared(1 << 20);
    let mut loader = EbpfLoader::new();
    let mut ebpf = spec
        .configure(&mut loader)?
        .override_global(TARGET_TGID_GLOBAL, &pid, true)
        .override_global(WATCH_TID_GLOBAL, &0u32, true)
        .override_global(SAMPLE_ALL_GLOBAL, &0u32, true)
        .override_global(WAKEUP_BYTES_GLOBAL, &u64::MAX, true)
        .load(EBPF_OBJECT)
        .map_err(|e| fail("loading", chain(&e)))?;
    let mut ring = rings::create(&mut ebpf, spec)?
        .pop()
        .ok_or_else(|| fail("ring", "missing".into()))?
        .ring;
    let prog = |name| multi::load_multi_program(EBPF_OBJECT, &ebpf, name);
    let entry = prog(PROG_ENTRY).map_err(|e| fail(PROG_ENTRY, e))?;
    let ret = prog(PROG_RET).map_err(|e| fail(PROG_RET, e))?;
    let exit = prog(PROG_EXIT).map_err(|e| fail(PROG_EXIT, e))?;
    let off = |f: CalibFn| file_offset(addr(f));
    let entries = [
        off(profiler_calib_step_entry)?,
        off(profiler_calib_step_ret)?,
        off(profiler_calib_step_uret)?,
        off(profiler_calib_push_entry)?,
        off(profiler_calib_nop_entry)?,
    ];
    let exe = Path::new("/proc/self/exe");
    let attach = |prog: &std::os::fd::OwnedFd, offs: &[u64], ret: bool| {
        let cookies = vec![0; offs.len()];
        multi::attach_uprobe_multi(prog.as_fd(), exe, offs, &cookies, pid, ret)
            .map_err(|e| fail("attaching", e))
    };
    let _links = [
        attach(
            &ret,
            &[
                off(profiler_calib_step_ret)? + RET_AT,
                off(profiler_calib_step_ret_only)? + RET_AT,
            ],
            false,
        )?,
        attach(&exit, &[off(profiler_calib_step_uret)?], true)?,
        attach(&entry, &entries, false)?,
    ];
    let t = time_calls(
        &[
            profiler_calib_step_base,
            profiler_calib_step_entry,
            profiler_calib_step_ret,
            profiler_calib_step_uret,
            profiler_calib_push_base,
            profiler_calib_push_entry,
            profiler_calib_nop_base,
            profiler_calib_nop_entry,
            profiler_calib_step_ret_only,
        ],
        &mut ring,
    );
    let pos = |x: f64| x.max(1.0);
    Ok(HitCost {
        entry_ns: pos(t[1] - t[0]),
        entry_push_ns: pos(t[5] - t[4]),
        entry_nop_ns: pos(t[7] - t[6]),
        ret_site_ns: pos(t[8] - t[0]),
        uretprobe_ns: pos(t[3] - t[1]),
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
        let all: [CalibFn; 9] = [
            profiler_calib_step_base,
            profiler_calib_step_entry,
            profiler_calib_step_ret,
            profiler_calib_step_uret,
            profiler_calib_step_ret_only,
            profiler_calib_push_base,
            profiler_calib_push_entry,
            profiler_calib_nop_base,
            profiler_calib_nop_entry,
        ];
        for (i, f) in all.into_iter().enumerate() {
            // SAFETY: reading our own code bytes.
            let code = unsafe { std::slice::from_raw_parts(addr(f) as *const u8, 10) };
            assert_eq!(code[RET_AT as usize], 0xc3, "function {i}");
            let first = match i {
                0..=4 => 0x48,
                5 | 6 => 0x55,
                _ => 0x0f,
            };
            assert_eq!(code[0], first, "function {i}");
            let want = if i < 5 { 16 } else { 15 };
            // SAFETY: plain leaf functions that read only their argument.
            let got = unsafe { f(5) };
            assert_eq!(got, want, "function {i}");
        }
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
