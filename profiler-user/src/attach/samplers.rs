//! The samplers: `prof_cpu_sample` on a perf event on every online CPU
//! (hardware cycles where the machine has a PMU, else `cpu-clock`), and
//! `prof_offcpu` on `sched_switch`. The kernel aggregates what they see in
//! maps, which [`CpuMaps`] takes out of the object so they outlive it.
//! System-wide, [`NewProcesses`] reads the kernel's notices of processes
//! sampled for the first time.
use aya::{
    maps::{Array, HashMap as MapHash, MapData, PerCpuHashMap, RingBuf, StackTraceMap},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError,
    },
    Ebpf,
};
use profiler_common::{
    Event, SampleKey, UserStack, CPU_COMMS_MAP, CPU_COUNTS_MAP, CPU_STACKS_MAP, KIND_NEW_PROCESS,
    NOTICED_MAP, NOTICE_PENDING, NOTICE_QUIET_MAP, OFFCPU_NS_MAP, PROG_CPU_SAMPLE, PROG_OFFCPU,
    USER_STACKS_MAP,
};

use std::collections::HashMap;

use crate::{Error, Result};

/// The rate a `cpu-clock` sampler asked for `hz` delivers on this kernel,
/// and the line that says so when it is less.
///
/// `cpu-clock` samples from a high-resolution timer. A kernel whose
/// high-resolution timers are off (no clock event device that can do them,
/// as in some VMs: `clock_getres` then says the tick, 4 ms at Debian's
/// HZ=250) runs that timer from the tick, once a tick at most, and
/// the periods it skips are not counted: 499 Hz asked gave 250 in the
/// 6.1 VM, and every sampled time was half what it was. Asked for no more
/// than the tick, each sample stands for the time it says.
pub fn timer_hz(hz: u64) -> (u64, Option<String>) {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the resolution into our local.
    let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut res) } == 0;
    let res_ns = (res.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(res.tv_nsec as u64);
    clamp_hz(hz, ok.then_some(res_ns))
}

/// The rate [`start`]'s sampler delivers for `hz`, and the line that says
/// so when it is less: the hardware cycles event where the machine has one
/// (which no timer limits), else `cpu-clock` ([`timer_hz`]).
pub fn sampler_hz(hz: u64) -> (u64, Option<String>) {
    match has_cycles() {
        true => (hz, None),
        false => timer_hz(hz),
    }
}

/// True when this machine has a hardware cycles counter, as [`start`]
/// asks for first: one is opened (disabled) on the first online CPU, and
/// closed.
fn has_cycles() -> bool {
    /// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`).
    #[repr(C)]
    #[derive(Default)]
    struct Attr {
        kind: u32,
        size: u32,
        config: u64,
        sample_period: u64,
        sample_type: u64,
        read_format: u64,
        /// Bit 0: `disabled`.
        flags: u64,
        wakeup_events: u32,
        bp_type: u32,
        config1: u64,
    }
    const PERF_TYPE_HARDWARE: u32 = 0;
    const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    let attr = Attr {
        kind: PERF_TYPE_HARDWARE,
        size: std::mem::size_of::<Attr>() as u32,
        config: PERF_COUNT_HW_CPU_CYCLES,
        flags: 1,
        ..Attr::default()
    };
    let cpu = aya::util::online_cpus()
        .ok()
        .and_then(|c| c.first().copied())
        .unwrap_or(0);
    // SAFETY: perf_event_open reads `attr`, which is as long as its `size`
    // says; the descriptor it returns is closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the descriptor was just opened here and is not used after.
    unsafe { libc::close(fd as libc::c_int) };
    true
}

/// [`timer_hz`] for a timer resolution of `res_ns` (None: unknown).
fn clamp_hz(hz: u64, res_ns: Option<u64>) -> (u64, Option<String>) {
    // High resolution: 1 ns. Anything up to a microsecond does 1 kHz and
    // more with room to spare.
    let Some(res_ns) = res_ns.filter(|&r| r > 1_000) else {
        return (hz, None);
    };
    let max = (1_000_000_000 / res_ns).max(1);
    if hz <= max {
        return (hz, None);
    }
    let line = format!(
        "this kernel's timers are low-resolution ({:.1} ms: high-resolution timers are off, as in some VMs), so cpu-clock samples at most {max} times a second: sampling at {max} Hz, not {hz}",
        res_ns as f64 / 1e6
    );
    (max, Some(line))
}

/// Starts sampling at `hz` on every online CPU, with the hardware cycles
/// event where the machine has one, else the software `cpu-clock` (VMs
/// without a PMU). Returns the event's name.
pub fn start(ebpf: &mut Ebpf, hz: u64) -> Result<&'static str> {
    let prog: &mut PerfEvent = ebpf
        .program_mut(PROG_CPU_SAMPLE)
        .ok_or_else(|| Error::Load(format!("program {PROG_CPU_SAMPLE} missing")))?
        .try_into()
        .map_err(|e: ProgramError| Error::ebpf(e))?;
    prog.load()
        .map_err(|e| super::kernel::load_error(PROG_CPU_SAMPLE, e))?;
    let cpus = aya::util::online_cpus().map_err(|(what, e)| Error::io(what.to_string(), e))?;
    let cycles = PerfEventConfig::Hardware(HardwareEvent::CpuCycles);
    let first = cpus.first().copied().unwrap_or(0);
    let (config, name) = match prog.attach(
        cycles,
        PerfEventScope::AllProcessesOneCpu { cpu: first },
        SamplePolicy::Frequency(hz),
        false,
    ) {
        Ok(_) => (cycles, "cycles"),
        Err(_) => (
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            "cpu-clock",
        ),
    };
    for cpu in cpus {
        if name == "cycles" && cpu == first {
            continue;
        }
        prog.attach(
            config,
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(hz),
            false,
        )
        .map_err(|e| Error::ebpf_in(format!("starting the {name} sampler on CPU {cpu}"), e))?;
    }
    Ok(name)
}

/// The maps the sampler fills, taken out of the object so they outlive it.
pub struct CpuMaps {
    /// Stacks by id, as the sampled counts name them.
    pub stacks: StackTraceMap<MapData>,
    /// Samples per (process, thread, user stack, kernel stack), per CPU.
    pub counts: PerCpuHashMap<MapData, SampleKey, u64>,
    /// Thread names (`comm`) by tid.
    pub comms: MapHash<MapData, u32, [u8; 16]>,
    /// Off-CPU nanoseconds per (thread, stacks), when `--off-cpu` is on.
    pub offcpu: Option<PerCpuHashMap<MapData, SampleKey, u64>>,
    /// Stacks walked with the unwind tables, by key.
    pub user_stacks: MapHash<MapData, u64, UserStack>,
    /// Counts of threads that exited, moved out of `counts` (which would
    /// otherwise fill up with them in a long session whose target starts
    /// threads all the time): [`CpuMaps::fold_exited`].
    pub exited: ExitedThreads,
}

/// Sample counts of exited threads, folded under one thread id per
/// (process, name): memory grows with the distinct names and stacks, not
/// with how many threads ever ran.
#[derive(Debug, Default)]
pub struct ExitedThreads {
    /// Samples per key, the key's `tid` being the (process, name)'s.
    pub counts: HashMap<SampleKey, u64>,
    /// The name of each thread id in `counts`.
    pub names: HashMap<u32, [u8; 16]>,
    /// The thread id each (process, name) is kept under.
    ids: HashMap<(u32, [u8; 16]), u32>,
}

impl ExitedThreads {
    /// Adds `count` samples of exited thread `key.tid`, named `comm`.
    pub fn add(&mut self, key: SampleKey, comm: [u8; 16], count: u64) {
        let tid = *self.ids.entry((key.pid, comm)).or_insert(key.tid);
        self.names.entry(tid).or_insert(comm);
        *self.counts.entry(SampleKey { tid, ..key }).or_default() += count;
    }
}

/// `sample --all`: the processes the sampler saw for the first time, told
/// by the kernel through the shared ring as they are sampled, so their
/// mappings (names, unwind tables) are read within a tick, while a
/// short-lived process still runs.
///
/// The first notice after a quiet spell wakes the agent; while notices keep
/// coming, the agent reads them on a timer instead (`polling`), and the
/// kernel, told so through `NOTICE_QUIET`, no longer wakes it for each
/// batch: one wake-up per tick, not two.
pub struct NewProcesses {
    ring: RingBuf<MapData>,
    quiet: Array<MapData, u64>,
    /// The kernel's record of what it told ([`NewProcesses::mappings_read`]).
    noticed: MapHash<MapData, u32, u8>,
    polling: bool,
}

impl NewProcesses {
    /// Reads the notices from `ring` (the sampler's shared ring).
    pub fn take(ebpf: &mut Ebpf, ring: RingBuf<MapData>) -> Result<Self> {
        let quiet = ebpf
            .take_map(NOTICE_QUIET_MAP)
            .ok_or_else(|| Error::Load(format!("no {NOTICE_QUIET_MAP} map")))?;
        let noticed = ebpf
            .take_map(NOTICED_MAP)
            .ok_or_else(|| Error::Load(format!("no {NOTICED_MAP} map")))?;
        Ok(NewProcesses {
            ring,
            quiet: Array::try_from(quiet).map_err(Error::ebpf)?,
            noticed: MapHash::try_from(noticed).map_err(Error::ebpf)?,
            polling: false,
        })
    }

    /// Readable when the kernel has told of new processes (and the agent
    /// is not polling).
    pub fn poll_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.ring)
    }

    /// Whether the agent should read the notices again after a short gap,
    /// without waiting to be woken (some came at the last read).
    pub fn polling(&self) -> bool {
        self.polling
    }

    /// The processes told of since the last call, once each, in order.
    pub fn drain(&mut self) -> Vec<u32> {
        let mut pids = Vec::new();
        self.read(&mut pids);
        if !pids.is_empty() && !self.polling {
            self.set_polling(true);
        } else if pids.is_empty() && self.polling {
            self.set_polling(false);
            // A notice written between the last read and now did not wake
            // anyone.
            self.read(&mut pids);
            if !pids.is_empty() {
                self.set_polling(true);
            }
        }
        pids
    }

    fn read(&mut self, pids: &mut Vec<u32>) {
        while let Some(item) = self.ring.next() {
            match profiler_common::read::<Event>(&item) {
                Some(ev) if ev.kind() == KIND_NEW_PROCESS && !pids.contains(&ev.tid) => {
                    pids.push(ev.tid)
                }
                _ => {}
            }
        }
    }

    /// Tells the kernel that the mappings (and unwind tables) of `pids`
    /// are read: a later stack outside them (a `dlopen`) tells of the
    /// process again. Until then such stacks are expected, and tell
    /// nothing.
    pub fn mappings_read(&mut self, pids: impl IntoIterator<Item = u32>) {
        for pid in pids {
            if let Ok(told) = self.noticed.get(&pid, 0) {
                if told & NOTICE_PENDING != 0 {
                    // A race with the kernel at worst tells once more.
                    let _ = self.noticed.insert(pid, told & !NOTICE_PENDING, 0);
                }
            }
        }
    }

    fn set_polling(&mut self, on: bool) {
        // On failure the kernel keeps waking the agent (or stays quiet,
        // and the agent's 1-s tick reads the notices): slower, not wrong.
        let told = self.quiet.set(0, u64::from(on), 0).is_ok();
        self.polling = on && told;
    }
}

impl CpuMaps {
    /// Takes the maps out of `ebpf` (with the off-CPU counts if `offcpu`).
    pub fn take(ebpf: &mut Ebpf, offcpu: bool) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| Error::Load(format!("no {name} map")))
        };
        let stacks = StackTraceMap::try_from(take(CPU_STACKS_MAP)?).map_err(Error::ebpf)?;
        let counts = PerCpuHashMap::try_from(take(CPU_COUNTS_MAP)?).map_err(Error::ebpf)?;
        let comms = MapHash::try_from(take(CPU_COMMS_MAP)?).map_err(Error::ebpf)?;
        let user_stacks = MapHash::try_from(take(USER_STACKS_MAP)?).map_err(Error::ebpf)?;
        let offcpu = match offcpu {
            true => Some(PerCpuHashMap::try_from(take(OFFCPU_NS_MAP)?).map_err(Error::ebpf)?),
            false => None,
        };
        Ok(CpuMaps {
            stacks,
            counts,
            comms,
            offcpu,
            user_stacks,
            exited: ExitedThreads::default(),
        })
    }

    /// Processes sampled so far.
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        let off = self.offcpu.iter().flat_map(|m| m.keys());
        self.counts
            .keys()
            .chain(off)
            .filter_map(|k| k.ok())
            .map(|k| k.pid)
            .collect()
    }

    /// The keys added to the maps since the last scan, by process.
    pub fn scan(&self, seen: &mut Seen) -> Scan {
        let off = self.offcpu.iter().flat_map(|m| m.keys());
        seen.update(self.counts.keys().chain(off).filter_map(|k| k.ok()))
    }

    /// Moves the counts of threads that exited out of the kernel's map into
    /// [`CpuMaps::exited`], keyed by the first thread id seen with the same
    /// process and name, so the map holds only live threads and a target
    /// that starts threads all the time never fills it. Returns how many
    /// keys were moved. `alive(pid, tid)` says whether a thread still runs.
    pub fn fold_exited(&mut self, alive: impl Fn(u32, u32) -> bool) -> usize {
        let keys: Vec<SampleKey> = self.counts.keys().filter_map(|k| k.ok()).collect();
        let mut dead: HashMap<u32, bool> = HashMap::new();
        let mut moved = 0;
        for key in keys {
            if !*dead
                .entry(key.tid)
                .or_insert_with(|| !alive(key.pid, key.tid))
            {
                continue;
            }
            let Ok(per_cpu) = self.counts.get(&key, 0) else {
                continue;
            };
            let count: u64 = per_cpu.iter().sum();
            let comm = self.comms.get(&key.tid, 0).unwrap_or([0; 16]);
            if self.counts.remove(&key).is_err() {
                continue;
            }
            moved += 1;
            self.exited.add(key, comm, count);
        }
        // Their names are kept with the folded counts; the kernel's map of
        // names would otherwise fill with every thread that ever ran (kept
        // with --off-cpu, whose counts of exited threads are not folded).
        let fold_names = self.offcpu.is_none();
        for (tid, _) in dead.into_iter().filter(|&(_, d)| d && fold_names) {
            let _ = self.comms.remove(&tid);
        }
        moved
    }
}

/// What `sample --all`'s periodic tick has already seen of the samplers'
/// maps, so that each tick does work only for what changed: a process
/// that exited is not looked up again every second, and a process whose
/// stacks are all known needs no new look at its mappings.
#[derive(Debug, Default)]
pub struct Seen {
    keys: std::collections::HashSet<SampleKey>,
    pids: std::collections::HashSet<u32>,
}

/// What changed since the last [`CpuMaps::scan`].
#[derive(Debug, Default, PartialEq)]
pub struct Scan {
    /// Processes sampled for the first time.
    pub new: Vec<u32>,
    /// Processes with a stack not seen before (new ones included): their
    /// mappings may have changed (exec, `dlopen`).
    pub changed: Vec<u32>,
}

impl Seen {
    /// Forgets processes that exited (their keys are out of the maps).
    pub fn forget(&mut self, pids: &[u32]) {
        if pids.is_empty() {
            return;
        }
        let gone: std::collections::HashSet<u32> = pids.iter().copied().collect();
        self.keys.retain(|k| !gone.contains(&k.pid));
        self.pids.retain(|p| !gone.contains(p));
    }

    /// Adds `keys` (those in the maps now) and says what is new.
    pub fn update(&mut self, keys: impl IntoIterator<Item = SampleKey>) -> Scan {
        let mut scan = Scan::default();
        for k in keys {
            if !self.keys.insert(k) {
                continue;
            }
            if self.pids.insert(k.pid) {
                scan.new.push(k.pid);
            }
            if !scan.changed.contains(&k.pid) {
                scan.changed.push(k.pid);
            }
        }
        scan
    }
}

/// `sample --all`: a process that execs is told of again at its next
/// sample (its mappings are new); one that exits is forgotten by the
/// kernel, so that a process given its PID later is told of too.
pub fn notice_execs_and_exits(ebpf: &mut Ebpf) -> Result<()> {
    super::probes::attach_raw_tp(ebpf, profiler_common::PROG_PROC_EXEC, "sched_process_exec")?;
    super::probes::attach_proc_exit(ebpf)
}

/// Starts off-CPU tracking: every target thread's blocked time, by stack.
pub fn start_offcpu(ebpf: &mut Ebpf) -> Result<()> {
    super::probes::attach_raw_tp(ebpf, PROG_OFFCPU, "sched_switch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_resolution_timer_caps_the_rate_and_says_so() {
        assert_eq!(clamp_hz(997, Some(1)), (997, None));
        assert_eq!(clamp_hz(997, None), (997, None));
        // Debian's HZ=250 tick: 4 ms.
        let (hz, line) = clamp_hz(997, Some(4_000_000));
        assert_eq!(hz, 250);
        let line = line.unwrap();
        assert!(
            line.contains("4.0 ms") && line.contains("250 Hz, not 997"),
            "{line}"
        );
        assert_eq!(clamp_hz(99, Some(4_000_000)), (99, None));
    }

    fn key(pid: u32, tid: u32, user_stack: i32) -> SampleKey {
        SampleKey {
            pid,
            tid,
            user_stack,
            kernel_stack: -1,
            user_hash: 0,
        }
    }

    fn comm(name: &str) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..name.len()].copy_from_slice(name.as_bytes());
        c
    }

    #[test]
    fn exited_threads_fold_by_process_and_name() {
        let mut e = ExitedThreads::default();
        // 1,000 short-lived workers of one process, two stacks between them.
        for tid in 100..1100 {
            e.add(key(7, tid, (tid % 2) as i32), comm("worker"), 3);
        }
        e.add(key(7, 5000, 0), comm("other"), 1);
        e.add(key(8, 6000, 0), comm("worker"), 2);
        let mut counts: Vec<_> = e
            .counts
            .iter()
            .map(|(k, &c)| (k.pid, k.tid, k.user_stack, c))
            .collect();
        counts.sort();
        assert_eq!(
            counts,
            vec![
                (7, 100, 0, 1500),
                (7, 100, 1, 1500),
                (7, 5000, 0, 1),
                (8, 6000, 0, 2)
            ]
        );
        assert_eq!(e.names.len(), 3);
        assert_eq!(e.names[&100], comm("worker"));
        assert_eq!(e.names[&5000], comm("other"));
    }

    fn sample_key(pid: u32, user_hash: u64) -> SampleKey {
        SampleKey {
            pid,
            tid: pid,
            user_stack: -1,
            kernel_stack: -1,
            user_hash,
        }
    }

    /// A tick looks again only at what changed: new processes once, and
    /// processes with a new stack; an exited process is not looked for
    /// again.
    #[test]
    fn seen_reports_only_changes() {
        let mut seen = Seen::default();
        let scan = seen.update([sample_key(1, 10), sample_key(1, 11), sample_key(2, 20)]);
        assert_eq!(scan.new, vec![1, 2]);
        assert_eq!(scan.changed, vec![1, 2]);
        assert_eq!(
            seen.update([sample_key(1, 10), sample_key(2, 20)]),
            Scan::default()
        );
        let scan = seen.update([sample_key(1, 10), sample_key(2, 21), sample_key(3, 30)]);
        assert_eq!(scan.new, vec![3]);
        assert_eq!(scan.changed, vec![2, 3]);
    }

    /// A process folded after it exited is forgotten; the same PID seen
    /// again later (reused) is new again.
    #[test]
    fn seen_forgets_exited_processes() {
        let mut seen = Seen::default();
        seen.update([sample_key(1, 10), sample_key(2, 20)]);
        seen.forget(&[2]);
        assert_eq!((seen.keys.len(), seen.pids.len()), (1, 1));
        let scan = seen.update([sample_key(1, 10), sample_key(2, 20)]);
        assert_eq!((scan.new, scan.changed), (vec![2], vec![2]));
    }
}
