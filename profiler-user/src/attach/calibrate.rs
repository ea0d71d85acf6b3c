//! What one probe hit costs on this host, measured at attach for the
//! overhead governor: the agent loads a second copy of the kernel programs
//! that traces the agent itself, attaches them (uprobe_multi, as the session
//! does) to two small functions of its own, and times a few thousand calls
//! with no probe, with an entry probe (on each kind of first instruction
//! the kernel handles differently: one it must single-step, a `push` it
//! emulates, a 5-byte nop it turns into a call, and a 4-byte nop and
//! `endbr64`, which kernels may emulate or single-step), with an entry
//! probe plus a
//! return-site probe, and with an entry probe plus a return uprobe. Each hit
//! runs the whole program, event written to a ring included; the ring is
//! drained between batches.
//!
//! The events' own timestamps give the other half: how much of a call's
//! measured duration its own two probe hits make (the part of the entry hit
//! after its timestamp, the part of the exit hit before), for each kind of
//! entry and exit, from functions that do almost nothing. With the full
//! cost of each hit, that is what the durations are corrected by
//! ([`HitCost::cost_of`]).
//!
//! The rounds run on each CPU in turn ([`Pinning`]): a hit can cost a
//! quarter more on one CPU than another. A session that corrects durations
//! calibrates again as it ends, and [`drift_pct`] says how far the costs
//! moved meanwhile.
use std::{num::NonZeroU32, os::fd::AsFd, path::Path, time::Instant};

use aya::{
    maps::RingBuf,
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    EbpfLoader,
};
use profiler_common::{
    Event, KIND_ENTRY, PROG_ENTRY, PROG_EXIT, PROG_RET, SAMPLE_ALL_GLOBAL, TARGET_TGID_GLOBAL,
    WAKEUP_BYTES_GLOBAL, WATCH_TID_GLOBAL,
};
use serde::{Deserialize, Serialize};

pub use super::probes::WaitTracepoints;
use super::{
    kernel,
    probes::EBPF_OBJECT,
    rings::{self, RingSpec},
    uprobe_multi as multi,
};
use crate::{error::chain, tracee::exits::ProbeCost, Error, Result};

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
    /// An entry probe on `endbr64`, the first instruction of every
    /// function built with `-fcf-protection` (Ubuntu's and Fedora's
    /// default): some kernels emulate it, others single-step it. 0 in
    /// recordings made before it was measured (then priced as
    /// single-stepped).
    #[serde(default)]
    pub entry_endbr_ns: f64,
    /// An entry probe on a multi-byte nop other than the 5-byte one
    /// (`nopl 0(%rax)`, the padding before a loop's head, where an entry
    /// may move): emulated by recent kernels, single-stepped by older ones.
    /// 0 in recordings made before it was measured.
    #[serde(default)]
    pub entry_nopl_ns: f64,
    /// A probe on a return instruction.
    pub ret_site_ns: f64,
    /// A return uprobe (its share at entry included).
    pub uretprobe_ns: f64,
    /// The probes' own share of a call's measured duration (its exit's
    /// timestamp minus its entry's, for a function that does almost
    /// nothing), by entry kind and exit: single-stepped, `push`, 5-byte nop
    /// entry, each with a return-site probe then a return uprobe. All zero
    /// in recordings made before it was measured.
    #[serde(default)]
    pub inside_ns: [f64; 6],
    /// How much those shares vary from one calibration round to the next:
    /// the largest interquartile range of the rounds' medians, in % of the
    /// median.
    #[serde(default)]
    pub inside_spread_pct: f64,
}

impl HitCost {
    /// The hit cost assumed when calibration fails: this kernel's int3
    /// cost as measured by `cargo xtask bench` (BENCHMARKS.md, part a).
    /// Durations are not corrected with guesses.
    pub const FALLBACK: HitCost = HitCost {
        entry_ns: 5000.0,
        entry_push_ns: 1500.0,
        entry_nop_ns: 500.0,
        entry_endbr_ns: 5000.0,
        entry_nopl_ns: 5000.0,
        ret_site_ns: 5000.0,
        uretprobe_ns: 3000.0,
        inside_ns: [0.0; 6],
        inside_spread_pct: 0.0,
    };

    /// Whether this kernel emulates `endbr64` (its entry costs nearer a
    /// `push`'s than a single-stepped one's).
    pub fn endbr_emulated(&self) -> bool {
        self.emulated(self.entry_endbr_ns)
    }

    /// Whether this kernel emulates a multi-byte nop, as for `endbr64`.
    pub fn nopl_emulated(&self) -> bool {
        self.emulated(self.entry_nopl_ns)
    }

    /// Whether an entry measured at `ns` is emulated: nearer a `push`'s
    /// cost than a single-stepped instruction's (false when not measured).
    fn emulated(&self, ns: f64) -> bool {
        ns > 0.0 && (ns - self.entry_push_ns).abs() < (ns - self.entry_ns).abs()
    }

    /// One entry hit on an instruction of kind `entry`.
    pub fn entry_cost(&self, entry: EntryKind) -> f64 {
        match entry {
            EntryKind::Step => self.entry_ns,
            EntryKind::Push => self.entry_push_ns,
            EntryKind::Nop => self.entry_nop_ns,
            EntryKind::Endbr if self.entry_endbr_ns > 0.0 => self.entry_endbr_ns,
            EntryKind::Nopl if self.entry_nopl_ns > 0.0 => self.entry_nopl_ns,
            EntryKind::Endbr | EntryKind::Nopl => self.entry_ns,
        }
    }

    /// The cost of a function whose entry is of kind `entry`, with
    /// return-site probes (`ret_sites`), a return uprobe, or no exit probe
    /// (`exit: false`).
    pub fn cost_of(&self, entry: EntryKind, exit: Option<bool>) -> ProbeCost {
        let entry_ns = self.entry_cost(entry);
        let row = match entry {
            EntryKind::Step => 0,
            EntryKind::Push => 2,
            EntryKind::Nop => 4,
            // Its share inside a call is a push's where the kernel
            // emulates it, a stepped instruction's where it does not (not
            // measured with both exits: the instruction is rare as a
            // probe site, as an entry moves past it onto a `push`).
            EntryKind::Endbr if self.endbr_emulated() => 2,
            EntryKind::Nopl if self.nopl_emulated() => 2,
            EntryKind::Endbr | EntryKind::Nopl => 0,
        };
        let round = |x: f64| x.clamp(0.0, u32::MAX as f64).round() as u32;
        match exit {
            None => ProbeCost {
                entry_ns: round(entry_ns),
                ..Default::default()
            },
            Some(ret_sites) => {
                let (exit_ns, inside) = match ret_sites {
                    true => (self.ret_site_ns, self.inside_ns[row]),
                    false => (self.uretprobe_ns, self.inside_ns[row + 1]),
                };
                ProbeCost {
                    entry_ns: round(entry_ns),
                    exit_ns: round(exit_ns),
                    // Never more than the two hits.
                    inside_ns: round(inside.min(entry_ns + exit_ns)),
                }
            }
        }
    }
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
    "profiler_calib_push_ret": ["push rbp", "mov rbp, rsp", "lea rax, [rdi + rdi*2]", "pop rbp", "ret"];
    "profiler_calib_push_uret": ["push rbp", "mov rbp, rsp", "lea rax, [rdi + rdi*2]", "pop rbp", "ret"];
    "profiler_calib_nop_ret": [".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "lea rax, [rdi + rdi*2]", "ret"];
    "profiler_calib_nop_uret": [".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "lea rax, [rdi + rdi*2]", "ret"];
    "profiler_calib_endbr_base": [".byte 0xf3, 0x0f, 0x1e, 0xfa", "lea rax, [rdi + rdi*2]", "nop", "ret"];
    "profiler_calib_endbr_entry": [".byte 0xf3, 0x0f, 0x1e, 0xfa", "lea rax, [rdi + rdi*2]", "nop", "ret"];
    "profiler_calib_nopl_base": [".byte 0x0f, 0x1f, 0x40, 0x00", "lea rax, [rdi + rdi*2]", "nop", "ret"];
    "profiler_calib_nopl_entry": [".byte 0x0f, 0x1f, 0x40, 0x00", "lea rax, [rdi + rdi*2]", "nop", "ret"];
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
    fn profiler_calib_push_ret(x: u64) -> u64;
    fn profiler_calib_push_uret(x: u64) -> u64;
    fn profiler_calib_nop_ret(x: u64) -> u64;
    fn profiler_calib_nop_uret(x: u64) -> u64;
    fn profiler_calib_endbr_base(x: u64) -> u64;
    fn profiler_calib_endbr_entry(x: u64) -> u64;
    fn profiler_calib_nopl_base(x: u64) -> u64;
    fn profiler_calib_nopl_entry(x: u64) -> u64;
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
/// the whole session. The rounds run on the CPUs in turn, and the medians
/// of at most [`GROUPS`] groups of them are averaged ([`Pinning`]).
const ROUNDS: usize = 15;
/// Groups of rounds, each on its own CPUs, whose medians are averaged.
const GROUPS: usize = 5;

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

/// The functions probed at both ends whose calls are timed from their
/// events, by cookie (1 to 6, the order of [`HitCost::inside_ns`]); other
/// probes have cookie 0.
const INSIDE: usize = 6;

/// What [`time_calls`] measured.
struct Timed {
    /// Nanoseconds per call of each function: of [`ROUNDS`] batches, timed
    /// in alternation, the median on each group of CPUs, averaged.
    per_call: Vec<f64>,
    /// For cookies 1 to [`INSIDE`]: each round's median exit-minus-entry
    /// time, aggregated as `per_call`, and the interquartile range of those
    /// medians in % of it.
    inside: [(f64, f64); INSIDE],
}

/// Times `fns` (see [`Timed`]), reading the events from `ring`.
fn time_calls(fns: &[CalibFn], ring: &mut RingBuf<aya::maps::MapData>) -> Timed {
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
    // (group, value) for each round.
    let mut times: Vec<Vec<(usize, f64)>> = vec![Vec::with_capacity(ROUNDS); fns.len()];
    let mut rounds: [Vec<(usize, f64)>; INSIDE] = Default::default();
    let pinning = Pinning::new();
    let groups = pinning.as_ref().map_or(1, |p| p.cpus.len().min(GROUPS));
    for round in 0..ROUNDS {
        if let Some(p) = &pinning {
            p.pin(round);
        }
        let group = round % groups;
        let mut spans: [Vec<u64>; INSIDE] = Default::default();
        let mut entered = [None::<u64>; INSIDE];
        for (t, &f) in times.iter_mut().zip(fns) {
            let start = Instant::now();
            run(f, BATCH);
            t.push((group, start.elapsed().as_nanos() as f64 / BATCH as f64));
            while let Some(item) = ring.next() {
                let Some(ev) = profiler_common::read::<Event>(&item) else {
                    continue;
                };
                let Some(i) = (ev.func() as usize).checked_sub(1).filter(|&i| i < INSIDE) else {
                    continue;
                };
                match ev.kind() {
                    KIND_ENTRY => entered[i] = Some(ev.ts_ns),
                    _ => {
                        if let Some(at) = entered[i].take() {
                            spans[i].push(ev.ts_ns.saturating_sub(at));
                        }
                    }
                }
            }
        }
        for (r, mut s) in rounds.iter_mut().zip(spans) {
            if !s.is_empty() {
                s.sort_unstable();
                r.push((group, s[s.len() / 2] as f64));
            }
        }
    }
    drop(pinning);
    let mut inside = [(0.0, 0.0); INSIDE];
    for (out, r) in inside.iter_mut().zip(rounds) {
        if r.is_empty() {
            continue;
        }
        let estimate = grouped_median(&r, groups);
        let mut all: Vec<f64> = r.iter().map(|&(_, v)| v).collect();
        all.sort_by(f64::total_cmp);
        let iqr = all[all.len() * 3 / 4] - all[all.len() / 4];
        *out = (
            estimate,
            if estimate > 0.0 {
                iqr / estimate * 100.0
            } else {
                0.0
            },
        );
    }
    Timed {
        per_call: times.iter().map(|t| grouped_median(t, groups)).collect(),
        inside,
    }
}

/// The mean over `groups` of the median of each group's values (groups
/// with none left out).
fn grouped_median(values: &[(usize, f64)], groups: usize) -> f64 {
    let medians: Vec<f64> = (0..groups)
        .filter_map(|g| {
            let mut v: Vec<f64> = values
                .iter()
                .filter(|&&(group, _)| group == g)
                .map(|&(_, x)| x)
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        })
        .collect();
    match medians.is_empty() {
        true => 0.0,
        false => medians.iter().sum::<f64>() / medians.len() as f64,
    }
}

/// Moves the calibrating thread from CPU to CPU, one per round, and back
/// to the CPUs it may run on when dropped. A probe hit costs more on some
/// CPUs than others (on this project's 2-vCPU VM, up to 25% more on one of
/// them; hybrid processors have slower cores), and the target's threads run
/// on any: rounds spread over the CPUs price the machine, not whichever
/// CPU the agent happened to be on.
struct Pinning {
    allowed: libc::cpu_set_t,
    cpus: Vec<usize>,
}

impl Pinning {
    /// None when the thread may run on one CPU only, or its mask is unread.
    fn new() -> Option<Self> {
        // SAFETY: a zeroed cpu_set_t is an empty set.
        let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the calling thread's mask, into a set of the right size.
        let rc = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed)
        };
        if rc != 0 {
            return None;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is below CPU_SETSIZE.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &allowed) })
            .collect();
        (cpus.len() > 1).then_some(Pinning { allowed, cpus })
    }

    /// Runs the calling thread on the CPU for `round` (stays put if the
    /// kernel refuses: an offline CPU).
    fn pin(&self, round: usize) {
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the index is below CPU_SETSIZE; a set of the right size.
        unsafe {
            libc::CPU_SET(self.cpus[round % self.cpus.len()], &mut one);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
        }
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        // SAFETY: the mask read at the start, for the calling thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.allowed);
        }
    }
}

/// The calibration's probes of one program: (file offset, cookie) pairs,
/// and whether they are return uprobes.
type PlanItem<'a> = (&'a str, Vec<(u64, u64)>, bool);

/// Attaches `plan` as one uprobe_multi link per program (Linux 6.6+).
fn attach_multi(
    ebpf: &aya::Ebpf,
    plan: &[PlanItem],
    exe: &Path,
    pid: u32,
) -> std::result::Result<Vec<std::os::fd::OwnedFd>, String> {
    let mut links = Vec::new();
    for (name, probes, ret) in plan {
        let prog = multi::load_multi_program(EBPF_OBJECT, ebpf, name)?;
        let (offs, cookies): (Vec<u64>, Vec<u64>) = probes.iter().copied().unzip();
        links.push(multi::attach_uprobe_multi(
            prog.as_fd(),
            exe,
            &offs,
            &cookies,
            &[],
            pid,
            *ret,
        )?);
    }
    Ok(links)
}

/// Attaches `plan` one perf event per probe; the links live as long as
/// `ebpf`.
fn attach_per_probe(
    ebpf: &mut aya::Ebpf,
    plan: &[PlanItem],
    exe: &Path,
    pid: u32,
) -> std::result::Result<(), String> {
    let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or("PID 0")?);
    for (name, probes, _) in plan {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing from the eBPF object"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| chain(&e))?;
        prog.load()
            .map_err(|e| format!("loading {name}: {}", chain(&e)))?;
        for &(offset, cookie) in probes {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie),
            };
            prog.attach(point, exe, scope)
                .map_err(|e| format!("{name} at {offset:#x}: {}", chain(&e)))?;
        }
    }
    Ok(())
}

/// Measures [`HitCost`] on this host (about 0.1–0.3 s, most of it loading
/// the programs again), with the session's wait tracepoints, `waits`,
/// attached as it will have them.
pub fn calibrate(waits: WaitTracepoints) -> Result<HitCost> {
    let pid = std::process::id();
    let fail = |what: &str, e: String| Error::Load(format!("calibrating probe cost: {what}: {e}"));
    // One shared ring, as the session's own writes cost the same per hit
    // with a ring per CPU (a hit writes to one ring either way).
    let spec = RingSpec::shared(1 << 20);
    let mut loader = EbpfLoader::new();
    // No samplers and no tables: the maps they would fill take one entry
    // each (100 MiB of kernel memory otherwise, beside the session's own).
    for (map, entries) in super::probes::Samplers::NONE.map_sizes() {
        loader.map_max_entries(map, entries);
    }
    let mut ebpf = spec
        .configure(&mut loader)?
        .override_global(TARGET_TGID_GLOBAL, &pid, true)
        .override_global(WATCH_TID_GLOBAL, &0u32, true)
        .override_global(SAMPLE_ALL_GLOBAL, &0u32, true)
        .override_global(WAKEUP_BYTES_GLOBAL, &u64::MAX, true)
        .map_max_entries(profiler_common::UNWIND_ROWS_MAP, 1)
        .load(EBPF_OBJECT)
        .map_err(|e| fail("loading", chain(&e)))?;
    let mut ring = rings::create(&mut ebpf, spec)?
        .pop()
        .ok_or_else(|| fail("ring", "missing".into()))?
        .ring;
    let off = |f: CalibFn| file_offset(addr(f));
    // (offset, cookie): cookies 1 to 6 are the functions probed at both
    // ends, in the order of `HitCost::inside_ns`.
    let entries = vec![
        (off(profiler_calib_step_entry)?, 0),
        (off(profiler_calib_step_ret)?, 1),
        (off(profiler_calib_step_uret)?, 2),
        (off(profiler_calib_push_entry)?, 0),
        (off(profiler_calib_nop_entry)?, 0),
        (off(profiler_calib_push_ret)?, 3),
        (off(profiler_calib_push_uret)?, 4),
        (off(profiler_calib_nop_ret)?, 5),
        (off(profiler_calib_nop_uret)?, 6),
        (off(profiler_calib_endbr_entry)?, 0),
        (off(profiler_calib_nopl_entry)?, 0),
    ];
    // Exits first, the entries last, as the session attaches them.
    let plan: [PlanItem; 3] = [
        (
            PROG_RET,
            vec![
                (off(profiler_calib_step_ret)? + RET_AT, 1),
                (off(profiler_calib_step_ret_only)? + RET_AT, 0),
                (off(profiler_calib_push_ret)? + RET_AT, 3),
                (off(profiler_calib_nop_ret)? + RET_AT, 5),
            ],
            false,
        ),
        (
            PROG_EXIT,
            vec![
                (off(profiler_calib_step_uret)?, 2),
                (off(profiler_calib_push_uret)?, 4),
                (off(profiler_calib_nop_uret)?, 6),
            ],
            true,
        ),
        (PROG_ENTRY, entries, false),
    ];
    // They do nothing here (no thread is watched), but make every syscall
    // dearer, the return uprobes' included, as in the session.
    let wait_links = super::probes::attach_wait_tracepoints(&mut ebpf, waits)
        .map_err(|e| fail("attaching the wait tracepoints", e))?;
    let exe = Path::new("/proc/self/exe");
    let multi = match kernel::uprobe_multi() {
        true => attach_multi(&ebpf, &plan, exe, pid),
        false => Err("not before Linux 6.10".into()),
    };
    let _links = match multi {
        Ok(links) => links,
        // Kernels before 6.6 have no uprobe_multi links: one perf event per
        // probe, as the session then attaches them (held by `ebpf`).
        Err(multi_err) => {
            attach_per_probe(&mut ebpf, &plan, exe, pid).map_err(|e| {
                fail(
                    "attaching",
                    format!("{e} (and as uprobe_multi: {multi_err})"),
                )
            })?;
            Vec::new()
        }
    };
    let timed = time_calls(
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
            profiler_calib_push_ret,
            profiler_calib_push_uret,
            profiler_calib_nop_ret,
            profiler_calib_nop_uret,
            profiler_calib_endbr_base,
            profiler_calib_endbr_entry,
            profiler_calib_nopl_base,
            profiler_calib_nopl_entry,
        ],
        &mut ring,
    );
    super::probes::detach_together(wait_links);
    let t = &timed.per_call;
    let pos = |x: f64| x.max(1.0);
    Ok(HitCost {
        entry_ns: pos(t[1] - t[0]),
        entry_push_ns: pos(t[5] - t[4]),
        entry_nop_ns: pos(t[7] - t[6]),
        entry_endbr_ns: pos(t[14] - t[13]),
        entry_nopl_ns: pos(t[16] - t[15]),
        ret_site_ns: pos(t[8] - t[0]),
        // A return uprobe over an emulated entry (push, 5-byte nop), not a
        // single-stepped one: each is a difference of two batches' times,
        // and 5% of a single-stepped call (about 14 µs here) was most of a
        // return uprobe's 1 µs (0.78-1.58 µs in eight calibrations run
        // back to back).
        uretprobe_ns: pos(((t[10] - t[5]) + (t[12] - t[7])) / 2.0),
        inside_ns: timed.inside.map(|(median, _)| median),
        inside_spread_pct: timed
            .inside
            .iter()
            .map(|&(_, spread)| spread)
            .fold(0.0, f64::max),
    })
}

/// Gives each function of `sel` what its probe hits cost, from `cost`, by
/// its first instruction and how its returns are probed. Go functions get
/// none: their calls are paired by goroutine, and stay as measured.
pub fn set_costs(sel: &mut crate::tracee::select::Selection, cost: &HitCost) {
    for (f, c) in costs_of(sel, cost).into_iter().enumerate() {
        if let Some(c) = c {
            sel.funcs[f].cost = c;
        }
    }
}

/// What each function of `sel` costs at `cost` (None: a Go function, or
/// its binary is gone).
fn costs_of(sel: &crate::tracee::select::Selection, cost: &HitCost) -> Vec<Option<ProbeCost>> {
    use crate::tracee::exits::ExitProbe;
    let files: Vec<Option<std::fs::File>> = sel
        .binaries
        .iter()
        .map(|b| match b.go {
            true => None,
            false => std::fs::File::open(&b.open_path).ok(),
        })
        .collect();
    sel.funcs
        .iter()
        .map(|f| {
            let file = files.get(f.binary as usize).and_then(Option::as_ref)?;
            let exit = match f.exit {
                ExitProbe::Sites(_) => Some(true),
                ExitProbe::Uretprobe => Some(false),
                ExitProbe::EntryOnly(_) => None,
            };
            Some(cost.cost_of(entry_kind(file, f.entry_offset()), exit))
        })
        .collect()
}

/// How much more (< 0: less) the traced calls' hits cost at `end`, a
/// calibration made as the session ends, than at the costs `sel`'s
/// functions were given at attach: in % of what their `calls` (by function
/// index) were priced at then. None when no traced call returned.
pub fn drift_pct(
    sel: &crate::tracee::select::Selection,
    end: &HitCost,
    calls: impl Fn(usize) -> u64,
) -> Option<f64> {
    let (mut then, mut now) = (0.0, 0.0);
    for (i, c) in costs_of(sel, end).into_iter().enumerate() {
        let (Some(c), Some(f)) = (c, sel.funcs.get(i)) else {
            continue;
        };
        let n = calls(i) as f64;
        then += n * f.cost.hits_ns() as f64;
        now += n * c.hits_ns() as f64;
    }
    (then > 0.0).then(|| (now - then) / then * 100.0)
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
    /// `endbr64`: emulated or single-stepped, by kernel (the calibration
    /// says which).
    Endbr,
    /// A multi-byte nop other than the 5-byte one: emulated or
    /// single-stepped, by kernel.
    Nopl,
}

/// How the kernel will handle a probe on the instruction at `offset` of
/// the file `file` (opened once by the caller): a function's entry probe.
pub fn entry_kind(file: &std::fs::File, offset: u64) -> EntryKind {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    match file.read_at(&mut b, offset) {
        Ok(n) if n > 0 => kind_of(&b[..n]),
        _ => EntryKind::Step,
    }
}

/// How the kernel handles a probe on the instruction that `code` starts
/// with.
fn kind_of(code: &[u8]) -> EntryKind {
    // Operand-size and segment prefixes pad the long nops compilers align
    // loops with (`66 2e 0f 1f 84 00…`, `nopw %cs:0(%rax,%rax,1)`).
    let unprefixed = code
        .iter()
        .position(|&b| b != 0x66 && b != 0x2e)
        .map_or(&[][..], |i| &code[i..]);
    match code {
        [0x0f, 0x1f, 0x44, 0x00, 0x00, ..] => EntryKind::Nop,
        [0xf3, 0x0f, 0x1e, 0xfa, ..] => EntryKind::Endbr,
        // The one-byte nop: emulated by every kernel, as a push is.
        [0x90, ..] | [0x66, 0x90, ..] => EntryKind::Push,
        // A relative call is emulated as a push is (`exits.rs` moves an
        // entry onto one).
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] | [0xe8, ..] => EntryKind::Push,
        _ if unprefixed.starts_with(&[0x0f, 0x1f]) => EntryKind::Nopl,
        _ => EntryKind::Step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_functions_have_the_expected_layout() {
        // (function, first byte: lea / push rbp / 5-byte nop, f(5))
        let all: [(CalibFn, u8, u64); 17] = [
            (profiler_calib_step_base, 0x48, 16),
            (profiler_calib_step_entry, 0x48, 16),
            (profiler_calib_step_ret, 0x48, 16),
            (profiler_calib_step_uret, 0x48, 16),
            (profiler_calib_step_ret_only, 0x48, 16),
            (profiler_calib_push_base, 0x55, 15),
            (profiler_calib_push_entry, 0x55, 15),
            (profiler_calib_push_ret, 0x55, 15),
            (profiler_calib_push_uret, 0x55, 15),
            (profiler_calib_nop_base, 0x0f, 15),
            (profiler_calib_nop_entry, 0x0f, 15),
            (profiler_calib_nop_ret, 0x0f, 15),
            (profiler_calib_nop_uret, 0x0f, 15),
            (profiler_calib_endbr_base, 0xf3, 15),
            (profiler_calib_endbr_entry, 0xf3, 15),
            (profiler_calib_nopl_base, 0x0f, 15),
            (profiler_calib_nopl_entry, 0x0f, 15),
        ];
        for (i, (f, first, want)) in all.into_iter().enumerate() {
            // SAFETY: reading our own code bytes.
            let code = unsafe { std::slice::from_raw_parts(addr(f) as *const u8, 10) };
            assert_eq!(code[RET_AT as usize], 0xc3, "function {i}");
            assert_eq!(code[0], first, "function {i}");
            // SAFETY: plain leaf functions that read only their argument.
            let got = unsafe { f(5) };
            assert_eq!(got, want, "function {i}");
        }
    }

    #[test]
    fn rounds_on_each_group_of_cpus_weigh_alike() {
        // Group 0 (a fast CPU) has more rounds than group 1 (a slow one):
        // the estimate is the mean of their medians, not the median of all
        // rounds (which would be group 0's).
        let rounds = [
            (0, 700.0),
            (1, 900.0),
            (0, 690.0),
            (1, 880.0),
            (0, 5000.0),
            (1, 910.0),
            (0, 710.0),
        ];
        assert_eq!(grouped_median(&rounds, 2), (710.0 + 900.0) / 2.0);
        // A burst in one round moves nothing.
        assert_eq!(
            grouped_median(&[(0, 700.0), (0, 5000.0), (0, 690.0)], 1),
            700.0
        );
        // A group with no rounds is left out.
        assert_eq!(grouped_median(&rounds[..1], 3), 700.0);
        assert_eq!(grouped_median(&[], 2), 0.0);
    }

    #[test]
    fn entry_kinds_by_first_instruction() {
        let cases: [(&[u8], EntryKind); 11] = [
            (&[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55], EntryKind::Nop),
            (&[0x0f, 0x1f, 0x40, 0x00, 0x55], EntryKind::Nopl),
            (&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00], EntryKind::Nopl),
            (
                &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00],
                EntryKind::Nopl,
            ),
            (&[0xf3, 0x0f, 0x1e, 0xfa, 0x55], EntryKind::Endbr),
            (&[0x90, 0x55], EntryKind::Push),
            (&[0x55, 0x48, 0x89, 0xe5], EntryKind::Push),
            (&[0x41, 0x57, 0x41, 0x56], EntryKind::Push),
            (&[0xe8, 0x00, 0x00, 0x00, 0x00], EntryKind::Push),
            (&[0x48, 0x89, 0xfa], EntryKind::Step),
            (&[0x66, 0x66], EntryKind::Step),
        ];
        for (code, want) in cases {
            assert_eq!(kind_of(code), want, "{code:02x?}");
        }
    }

    #[test]
    fn costs_per_function_from_the_calibration() {
        let c = HitCost {
            entry_ns: 9000.0,
            entry_push_ns: 900.0,
            entry_nop_ns: 300.0,
            entry_endbr_ns: 0.0,
            entry_nopl_ns: 0.0,
            ret_site_ns: 9500.0,
            uretprobe_ns: 1000.0,
            inside_ns: [9100.0, 8900.0, 1200.0, 700.0, 900.0, 400.0],
            inside_spread_pct: 3.0,
        };
        let cost = |e, x| c.cost_of(e, x);
        assert_eq!(
            cost(EntryKind::Push, Some(false)),
            ProbeCost {
                entry_ns: 900,
                exit_ns: 1000,
                inside_ns: 700
            }
        );
        assert_eq!(cost(EntryKind::Step, Some(true)).inside_ns, 9100);
        // Its own share and its inner calls' hits, never past what it measured.
        let push = cost(EntryKind::Push, Some(false));
        assert_eq!(push.removed(10_000, 3_000), 3_700);
        assert_eq!(push.removed(1_000, 3_000), 1_000);
        assert_eq!(cost(EntryKind::Nop, Some(true)).hits_ns(), 9800);
        assert_eq!(
            cost(EntryKind::Step, None),
            ProbeCost {
                entry_ns: 9000,
                exit_ns: 0,
                inside_ns: 0
            }
        );
        // endbr64: priced as stepped when not measured (an old recording),
        // as measured otherwise, with a push's share when it is emulated.
        assert_eq!(cost(EntryKind::Endbr, Some(true)).entry_ns, 9000);
        let emulated = HitCost {
            entry_endbr_ns: 1100.0,
            ..c
        };
        assert!(emulated.endbr_emulated());
        assert_eq!(
            emulated.cost_of(EntryKind::Endbr, Some(false)),
            ProbeCost {
                entry_ns: 1100,
                exit_ns: 1000,
                inside_ns: 700
            }
        );
        let stepped = HitCost {
            entry_endbr_ns: 8000.0,
            ..c
        };
        assert!(!stepped.endbr_emulated());
        assert_eq!(
            stepped.cost_of(EntryKind::Endbr, Some(true)).inside_ns,
            9100
        );
        // Never more inside than the two hits.
        let odd = HitCost {
            inside_ns: [1e6; 6],
            ..c
        };
        assert_eq!(odd.cost_of(EntryKind::Nop, Some(false)).inside_ns, 1300);
    }

    #[test]
    fn calibration_measures_positive_costs() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: calibration needs root");
            return;
        }
        let c = calibrate(WaitTracepoints::None).expect("calibrates");
        println!("{c:?}");
        assert!(c.entry_ns > 50.0 && c.entry_ns < 100_000.0, "{c:?}");
        assert!(c.ret_site_ns > 50.0, "{c:?}");
        // Each configuration probed at both ends was timed from its
        // events, and its own hits weigh on its duration.
        for (i, inside) in c.inside_ns.iter().enumerate() {
            assert!(*inside > 20.0 && *inside < 100_000.0, "{i}: {c:?}");
        }
    }
}
