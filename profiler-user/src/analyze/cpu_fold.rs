//! Folding CPU samples into a [`CpuProfile`], one sample at a time
//! ([`Folder`]), and folding processes that exited while the session runs
//! ([`ExitedProcs`]): their stacks become file offsets (normalized, with
//! the mappings remembered while they lived), the same for every process
//! running the same code, and everything else kept about them (their keys
//! in the kernel's map, their mappings) is dropped. A system-wide sampler
//! on a machine that starts hundreds of short-lived processes a second
//! then grows with the distinct stacks and cgroups, not with the processes
//! that ever ran; naming still happens once, at the end.
use std::collections::{BTreeMap, HashMap, HashSet};

use profiler_common::SampleKey;

use aya::maps::{MapData, PerCpuHashMap};

use super::cpu_profile::{
    comm_name, end_reason, is_complete, read_stack, read_user, CpuProfile, TOP_LOCATIONS,
};
use crate::{
    attach::samplers::CpuMaps,
    symbolize::{Symbolizer, NORMALIZED},
    text::folded_frame,
    unwind::budget::{Placement, Status},
};

/// One sample's (or one key's) worth of stacks to fold.
pub struct SampleStacks<'a> {
    /// The process whose mappings name `user`.
    pub pid: u32,
    /// The process it is counted under (`per_pid`, `by_pid`).
    pub shown_pid: u32,
    /// The thread's name, the folded line's first frame.
    pub comm: &'a str,
    pub count: u64,
    /// User return addresses, innermost first, and why the walk ended.
    pub user: &'a [u64],
    pub end: u32,
    /// Kernel addresses, innermost first.
    pub kernel: &'a [u64],
}

/// A profile being folded.
#[derive(Debug, Default, Clone)]
pub struct Folder {
    prof: CpuProfile,
    paths: BTreeMap<String, u64>,
    leaves: HashMap<String, u64>,
    /// A (process, address) of each leaf, for its `file:line`.
    leaf_addr: HashMap<String, (u32, u64)>,
    /// Which binary each address was in and whether it had a table, to
    /// count the samples the unwind-table budget cost.
    placement: Option<Placement>,
}

impl Folder {
    /// Names `s`'s frames and adds its count. With `offcpu`, the leaf is the
    /// innermost user frame (where the thread blocked). With `locate`, the
    /// leaf's address is kept for its `file:line` (not for processes that
    /// exited: their mappings are gone by the end).
    pub fn add(&mut self, sym: &mut Symbolizer, s: SampleStacks<'_>, offcpu: bool, locate: bool) {
        if s.count == 0 {
            return;
        }
        let prof = &mut self.prof;
        prof.samples += s.count;
        *prof.per_pid.entry(s.shown_pid).or_default() += s.count;
        let user_frames = sym.frames(s.pid, s.user);
        super::cpu_profile::count_runtimes(prof, &user_frames, s.count);
        if s.end != 0 {
            *prof.ends.entry(end_reason(s.end).to_string()).or_default() += s.count;
        }
        if let Some(p) = &self.placement {
            count_fp(prof, p, &s);
        }
        // Complete means the walk reached the outermost frame: the CFI said
        // so, or the last frame is a known process or thread start.
        if s.user.is_empty() {
            prof.no_user_stack += s.count;
        } else if is_complete(s.end, user_frames.last().map(|f| f[0].as_str())) {
            prof.complete += s.count;
        }
        let mut line = folded_frame(s.comm);
        for frames in user_frames.iter().rev() {
            for f in frames {
                line.push(';');
                line.push_str(&folded_frame(f));
            }
        }
        let mut kframes = sym.kernel_stack(s.kernel);
        if offcpu {
            // Innermost of `__schedule` is the tracing machinery (the BPF
            // trampoline and program), not where the thread blocked.
            if let Some(pos) = kframes.iter().position(|f| f == "__schedule_[k]") {
                kframes.drain(..pos);
            }
        }
        for f in kframes.iter().rev() {
            line.push(';');
            line.push_str(&folded_frame(f));
        }
        // Off-CPU: where the program blocked is the innermost user frame.
        let user_leaf = user_frames
            .first()
            .and_then(|f| f.first())
            .filter(|_| offcpu);
        let leaf = match user_leaf {
            Some(name) => folded_frame(name),
            None => line.rsplit(';').next().unwrap_or_default().to_string(),
        };
        if locate && (s.kernel.is_empty() || offcpu) {
            if let Some(&addr) = s.user.first() {
                self.leaf_addr.entry(leaf.clone()).or_insert((s.pid, addr));
            }
        }
        *self.leaves.entry(leaf).or_default() += s.count;
        *prof.by_pid.entry((s.shown_pid, line.clone())).or_default() += s.count;
        *self.paths.entry(line).or_default() += s.count;
    }

    /// The profile: folded lines sorted, leaves by samples, and the
    /// `file:line` of the top leaves.
    pub fn finish(self, sym: &mut Symbolizer) -> CpuProfile {
        let Folder {
            mut prof,
            paths,
            leaves,
            leaf_addr,
            ..
        } = self;
        prof.folded = paths.into_iter().map(|(p, c)| format!("{p} {c}")).collect();
        let mut leaves: Vec<(String, u64)> = leaves.into_iter().collect();
        leaves.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        prof.leaves = leaves;
        for (leaf, _) in prof.leaves.iter().take(TOP_LOCATIONS) {
            if let Some(loc) = leaf_addr
                .get(leaf)
                .and_then(|&(pid, addr)| sym.location(pid, addr))
            {
                prof.locations.insert(leaf.clone(), loc);
            }
        }
        prof
    }
}

/// One stack of an exited process, with its addresses normalized
/// ([`Symbolizer::normalize`]): the same for every process running the
/// same code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ExitedKey {
    shown_pid: u32,
    comm: String,
    user: Vec<u64>,
    end: u32,
    /// The kernel stack's id in the stack-trace map (kernel addresses are
    /// the same in every process; read at the end).
    kernel_stack: i32,
}

/// The samples of processes that exited during the session (on-CPU only;
/// `--off-cpu` keeps its keys in the kernel's map), their stacks
/// normalized so that the processes' mappings can be forgotten; named at
/// the end with everything else.
#[derive(Debug, Default)]
pub struct ExitedProcs {
    counts: HashMap<ExitedKey, u64>,
    /// The process each group (cgroup, where known) of exited processes is
    /// counted under: the first of them folded (the lowest PID of those
    /// found gone at the same tick).
    under: HashMap<Option<String>, u32>,
    /// How many other exited processes each of those stands for.
    pub folded: BTreeMap<u32, u64>,
}

impl ExitedProcs {
    /// Whether `pid` is one the exited processes are counted under (its
    /// cgroup is still needed for the labels).
    pub fn counts_under(&self, pid: u32) -> bool {
        self.under.values().any(|&p| p == pid)
    }

    /// Moves the samples of processes that have exited (`gone(pid)`) out of
    /// the kernel's map, their stacks normalized with the mappings
    /// remembered while they lived; each is counted under the first exited
    /// process folded in its group (`group_of`: its cgroup). Their names and
    /// mappings are then forgotten. Returns the processes folded.
    pub fn fold(
        &mut self,
        maps: &mut CpuMaps,
        sym: &mut Symbolizer,
        gone: impl Fn(u32) -> bool,
        group_of: impl Fn(u32) -> Option<String>,
    ) -> Vec<u32> {
        let mut keys: Vec<SampleKey> = maps.counts.keys().filter_map(|k| k.ok()).collect();
        // Lowest PID first: of those found gone together, the one that
        // started first stands for the others.
        keys.sort_unstable_by_key(|k| (k.pid, k.tid));
        let mut exited: HashMap<u32, bool> = HashMap::new();
        // Each process folded now, and the one it is counted under.
        let mut folded: HashMap<u32, u32> = HashMap::new();
        let mut tids = HashSet::new();
        for key in keys {
            if key.pid == 0 || !*exited.entry(key.pid).or_insert_with(|| gone(key.pid)) {
                continue;
            }
            let Ok(per_cpu) = maps.counts.get(&key, 0) else {
                continue;
            };
            let count: u64 = per_cpu.iter().sum();
            if maps.counts.remove(&key).is_err() {
                continue;
            }
            let comm = maps
                .comms
                .get(&key.tid, 0)
                .map(|c| comm_name(&c))
                .unwrap_or_else(|_| format!("tid-{}", key.tid));
            tids.insert(key.tid);
            let shown_pid = *folded.entry(key.pid).or_insert_with(|| {
                let under = *self.under.entry(group_of(key.pid)).or_insert(key.pid);
                if under != key.pid {
                    *self.folded.entry(under).or_default() += 1;
                }
                under
            });
            let (user, end) = read_user(maps, &key);
            let k = ExitedKey {
                shown_pid,
                comm,
                user: sym.normalize(key.pid, &user),
                end,
                kernel_stack: key.kernel_stack,
            };
            *self.counts.entry(k).or_default() += count;
        }
        // Their names go too (kept with --off-cpu, whose keys stay).
        for tid in tids.into_iter().filter(|_| maps.offcpu.is_none()) {
            let _ = maps.comms.remove(&tid);
        }
        let forget: HashSet<u32> = folded.keys().copied().collect();
        sym.forget(&forget);
        folded.into_keys().collect()
    }

    /// Adds the exited processes' samples to `folder`, named now.
    pub fn add_to(&self, maps: &CpuMaps, folder: &mut Folder, sym: &mut Symbolizer) {
        let mut kernel: HashMap<i32, Vec<u64>> = HashMap::new();
        for (k, &count) in &self.counts {
            let kernel = kernel
                .entry(k.kernel_stack)
                .or_insert_with(|| read_stack(maps, k.kernel_stack));
            folder.add(
                sym,
                SampleStacks {
                    pid: NORMALIZED,
                    shown_pid: k.shown_pid,
                    comm: &k.comm,
                    count,
                    user: &k.user,
                    end: k.end,
                    kernel,
                },
                false,
                false,
            );
        }
    }
}

/// Counts a stack's samples against the unwind-table budget: once per
/// binary it has a frame in that the budget left without a table
/// ([`CpuProfile::unwind_starved`]), and, when the kernel says a frame was
/// walked by frame pointers for want of a table but every binary of the
/// stack has one by now, as walked before its table was built
/// ([`CpuProfile::fp_meantime`]).
fn count_fp(prof: &mut CpuProfile, p: &Placement, s: &SampleStacks<'_>) {
    let mut starved: Vec<&str> = Vec::new();
    let mut explained = false;
    for (i, &a) in s.user.iter().enumerate() {
        if profiler_common::python::is_frame(a) {
            continue;
        }
        let pc = if i == 0 { a } else { a.wrapping_sub(1) };
        match p.binary(s.pid, pc) {
            Some((path, Status::Starved)) => {
                explained = true;
                if !starved.contains(&path) {
                    starved.push(path);
                }
            }
            Some((_, Status::Other)) => explained = true,
            _ => {}
        }
    }
    for path in starved {
        *prof.unwind_starved.entry(path.to_string()).or_default() += s.count;
    }
    if s.end & profiler_common::unwind_end::FP_NO_TABLE != 0 && !explained {
        prof.fp_meantime += s.count;
    }
}

/// Reads, symbolizes and folds everything sampled; with `placement`
/// (the unwind tables' [`crate::unwind::tables::Tables::placement`]),
/// also counts what the tables' budget cost.
pub fn collect(maps: &CpuMaps, sym: &mut Symbolizer, placement: Option<Placement>) -> CpuProfile {
    fold(maps, &maps.counts, sym, false, None, placement)
}

/// As [`collect`], with the processes that exited during the session
/// (folded as they went).
pub fn collect_with_exited(
    maps: &CpuMaps,
    sym: &mut Symbolizer,
    exited: &ExitedProcs,
    placement: Option<Placement>,
) -> CpuProfile {
    fold(maps, &maps.counts, sym, false, Some(exited), placement)
}

/// Reads, symbolizes and folds the off-CPU time (weights in nanoseconds),
/// if `--off-cpu` was on.
pub fn collect_offcpu(maps: &CpuMaps, sym: &mut Symbolizer) -> Option<CpuProfile> {
    maps.offcpu
        .as_ref()
        .map(|m| fold(maps, m, sym, true, None, None))
}

fn fold(
    maps: &CpuMaps,
    counts: &PerCpuHashMap<MapData, SampleKey, u64>,
    sym: &mut Symbolizer,
    offcpu: bool,
    exited: Option<&ExitedProcs>,
    placement: Option<Placement>,
) -> CpuProfile {
    let mut folder = Folder {
        placement,
        ..Default::default()
    };
    // Processes that exited during the session, folded as they went.
    if let Some(e) = exited.filter(|_| !offcpu) {
        e.add_to(maps, &mut folder, sym);
    }
    let mut walked: HashMap<u64, (Vec<u64>, u32)> = HashMap::new();
    let mut stack_cache: HashMap<i32, Vec<u64>> = HashMap::new();
    let live = counts
        .iter()
        .filter_map(|item| item.ok())
        .map(|(key, per_cpu)| (key, per_cpu.iter().sum::<u64>(), None));
    // Threads that exited (on-CPU counts only), with their names.
    let exited_threads = maps
        .exited
        .counts
        .iter()
        .filter(|_| !offcpu)
        .map(|(key, &count)| (*key, count, maps.exited.names.get(&key.tid)));
    for (key, count, exited_name) in live.chain(exited_threads) {
        if count == 0 {
            continue;
        }
        let comm = match exited_name {
            Some(c) => comm_name(c),
            None => maps
                .comms
                .get(&key.tid, 0)
                .map(|c| comm_name(&c))
                .unwrap_or_else(|_| format!("tid-{}", key.tid)),
        };
        let (user, end) = match key.user_hash {
            0 => (
                stack_cache
                    .entry(key.user_stack)
                    .or_insert_with(|| read_stack(maps, key.user_stack))
                    .clone(),
                0,
            ),
            h => walked
                .entry(h)
                .or_insert_with(|| read_user(maps, &key))
                .clone(),
        };
        let kernel = stack_cache
            .entry(key.kernel_stack)
            .or_insert_with(|| read_stack(maps, key.kernel_stack))
            .clone();
        folder.add(
            sym,
            SampleStacks {
                pid: key.pid,
                shown_pid: key.pid,
                comm: &comm,
                count,
                user: &user,
                end,
                kernel: &kernel,
            },
            offcpu,
            true,
        );
    }
    let mut prof = folder.finish(sym);
    if let Some(e) = exited.filter(|_| !offcpu) {
        prof.folded_processes = e.folded.clone();
    }
    prof
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> Vec<(u32, u64, Vec<String>)> {
        let n = |s: &str| vec![s.to_string()];
        vec![
            // Process 7's and process 8's code at the same addresses
            // (another program each): named by each one's own mappings.
            (7, 0x1000, n("leaf7")),
            (7, 0x1fff, n("main")),
            (7, 0x2fff, n("_start")),
            (8, 0x1000, n("leaf8")),
            (8, 0x1fff, n("main")),
            (8, 0x2fff, n("_start")),
            (0, 0xffff_1000, n("do_syscall_64")),
        ]
    }

    fn stacks<'a>(
        pid: u32,
        shown: u32,
        count: u64,
        user: &'a [u64],
        kernel: &'a [u64],
    ) -> SampleStacks<'a> {
        SampleStacks {
            pid,
            shown_pid: shown,
            comm: "cc1",
            count,
            user,
            end: 0,
            kernel,
        }
    }

    #[test]
    fn an_exited_process_is_named_by_its_own_mappings_and_counted_under_another() {
        let mut sym = Symbolizer::offline(7, journal());
        let user = [0x1000, 0x2000, 0x3000];
        let mut f = Folder::default();
        f.add(&mut sym, stacks(7, 7, 3, &user, &[]), false, true);
        f.add(
            &mut sym,
            stacks(8, 7, 2, &user, &[0xffff_1000]),
            false,
            false,
        );
        f.add(&mut sym, stacks(8, 7, 0, &user, &[]), false, false);
        let prof = f.finish(&mut sym);
        assert_eq!(
            prof.folded,
            vec![
                "cc1;_start;main;leaf7 3".to_string(),
                "cc1;_start;main;leaf8;do_syscall_64_[k] 2".to_string(),
            ]
        );
        assert_eq!((prof.samples, prof.complete, prof.no_user_stack), (5, 5, 0));
        assert_eq!(prof.per_pid.into_iter().collect::<Vec<_>>(), vec![(7, 5)]);
        assert!(prof.by_pid.keys().all(|(p, _)| *p == 7));
        assert_eq!(prof.leaves[0], ("leaf7".to_string(), 3));
    }

    #[test]
    fn folding_in_two_parts_gives_the_same_profile_as_at_once() {
        let user = [0x1000, 0x2000, 0x3000];
        let mut sym = Symbolizer::offline(7, journal());
        let mut once = Folder::default();
        let mut early = Folder::default();
        for (pid, n) in [(7, 4), (8, 1), (7, 2)] {
            once.add(&mut sym, stacks(pid, pid, n, &user, &[]), false, true);
            if pid == 8 {
                early.add(&mut sym, stacks(pid, pid, n, &user, &[]), false, false);
            }
        }
        let mut later = early.clone();
        for n in [4, 2] {
            later.add(&mut sym, stacks(7, 7, n, &user, &[]), false, true);
        }
        let (a, b) = (once.finish(&mut sym), later.finish(&mut sym));
        assert_eq!(a.folded, b.folded);
        assert_eq!(a.leaves, b.leaves);
        assert_eq!(a.per_pid, b.per_pid);
        assert_eq!(a.by_pid, b.by_pid);
    }
}
