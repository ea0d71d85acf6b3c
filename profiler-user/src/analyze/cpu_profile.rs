//! The CPU and off-CPU profiles: what the samplers
//! ([`crate::attach::samplers`]) aggregated in the kernel (stack ids plus a
//! per-CPU count per (process, thread, user stack, kernel stack)), read once
//! at the end, symbolized with blazesym and folded. Exited threads' counts
//! are moved out of the kernel's map as the session runs
//! ([`CpuMaps::fold_exited`](crate::attach::samplers::CpuMaps::fold_exited)), so it never fills with them.
use std::collections::{BTreeMap, HashMap};

use profiler_common::{unwind_end, SampleKey};

use crate::{
    attach::samplers::CpuMaps, symbolize::Symbolizer, text::folded_frame, unwind::tables::Tables,
};

/// Outermost user frames that mean the unwinder reached the bottom of the
/// stack: such a stack is complete.
const STACK_ROOTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__GI___clone3",
    "thread_start",
    "runtime.goexit",
];

/// Whether a user stack is complete: the walk reached the outermost frame,
/// because the CFI said so (`end`), or because its outermost frame is a known
/// process or thread start.
pub fn is_complete(end: u32, outermost: Option<&str>) -> bool {
    unwind_end::reason(end) == unwind_end::ROOT
        || outermost.is_some_and(|f| STACK_ROOTS.contains(&f))
}

/// Words for an `unwind_end` reason, for cpu.txt.
pub fn end_reason(end: u32) -> &'static str {
    match unwind_end::reason(end) {
        unwind_end::ROOT => "reached the outermost frame",
        unwind_end::FP_END => "frame-pointer chain ended",
        unwind_end::READ_FAULT => "stack unreadable",
        unwind_end::DEPTH => "depth limit (128 frames)",
        unwind_end::UNSUPPORTED => "CFI rule not supported",
        unwind_end::NO_TABLES => "no tables for the process (frame pointers)",
        unwind_end::BAD_FRAME => "bad frame (stack pointer did not move up)",
        _ => "unknown",
    }
}

/// Remembers the mappings of every process sampled so far in `maps` (and
/// refreshes `target`'s, for `dlopen`), so frames of processes that exit
/// before the end still resolve. Returns the processes sampled so far.
/// (A function of this layer, not a method of [`CpuMaps`]: the maps are
/// `attach/`'s, the symbolizer a later layer's.)
pub fn remember_maps(
    maps: &CpuMaps,
    sym: &mut Symbolizer,
    target: Option<u32>,
) -> std::collections::BTreeSet<u32> {
    let pids = maps.pids();
    for &pid in &pids {
        if !sym.knows(pid) {
            sym.remember_maps(pid);
        }
    }
    if let Some(pid) = target {
        sym.remember_maps(pid);
    }
    pids
}

/// Tells the unwind tables where the samples taken since the last call
/// landed (each user stack the kernel walked, once), so the binaries
/// they are in get tables first; makes room for those left without one
/// ([`Tables::rebalance`]). Returns whether the tables changed.
pub fn note_hot(maps: &CpuMaps, tables: &mut Tables) -> bool {
    let mut starved = false;
    for key in maps.counts.keys().filter_map(|k| k.ok()) {
        if key.user_hash == 0 || !tables.first_time(key.user_hash) {
            continue;
        }
        let (user, _) = read_user(maps, &key);
        starved |= tables.note_samples(key.pid, &user);
    }
    starved && tables.rebalance()
}

/// Leaves whose `file:line` is looked up.
pub(crate) const TOP_LOCATIONS: usize = 20;

/// A symbolized CPU profile.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuProfile {
    /// Folded stacks: `comm;outer;…;inner_[k] count`, sorted.
    pub folded: Vec<String>,
    /// Samples counted.
    pub samples: u64,
    /// Samples whose user stack reached a known bottom frame.
    pub complete: u64,
    /// Samples with no user stack at all (lost, or a kernel thread).
    pub no_user_stack: u64,
    /// Samples per process id.
    pub per_pid: BTreeMap<u32, u64>,
    /// Self samples per leaf frame, for the top list.
    pub leaves: Vec<(String, u64)>,
    /// `file:line` of the top leaves, where DWARF says.
    #[serde(default)]
    pub locations: std::collections::BTreeMap<String, String>,
    /// Samples whose user stack the kernel could not store (kernel threads
    /// included), samples not counted because the map was full, and
    /// `--dwarf` samples dropped because the ring was full.
    #[serde(default)]
    pub lost: (u64, u64, u64),
    /// Samples by why the table unwinder stopped (`--unwind tables`).
    #[serde(default)]
    pub ends: BTreeMap<String, u64>,
    /// How each binary's frames were unwound (`tables`, or frame pointers
    /// and why), and what the tables cost.
    #[serde(default)]
    pub unwinding: Option<crate::unwind::tables::TablesStats>,
    /// Samples per (pid, folded path), before paths of one name merge
    /// (for per-process labels; not kept in `profile.data`).
    #[serde(skip)]
    pub by_pid: BTreeMap<(u32, String), u64>,
    /// Each sampled process's cgroup v2 path (system-wide sampling).
    #[serde(default)]
    pub cgroups: BTreeMap<u32, String>,
    /// How many other exited processes (of its cgroup) each PID's samples
    /// include: `sample` folds processes as they exit
    /// ([`super::cpu_fold::ExitedProcs`]).
    #[serde(default)]
    pub folded_processes: BTreeMap<u32, u64>,
    /// Samples in CPython's evaluator (a `_PyEval_EvalFrameDefault`
    /// frame), and of those, samples that carry its Python frames.
    #[serde(default)]
    pub python: (u64, u64),
    /// Samples in V8's JavaScript code (a JavaScript frame, or JIT
    /// memory or the interpreter's entry below V8's builtins), and of those,
    /// samples whose JavaScript frames are all named.
    #[serde(default)]
    pub javascript: (u64, u64),
    /// Samples with a frame in a binary the unwind-table budget left to
    /// frame pointers, by binary path.
    #[serde(default)]
    pub unwind_starved: BTreeMap<String, u64>,
    /// Samples walked by frame pointers through a binary that had no table
    /// then but had one by the end (its table was built after they were
    /// taken).
    #[serde(default)]
    pub fp_meantime: u64,
}

impl CpuProfile {
    /// Share (0..=1) of samples with complete stacks.
    pub fn complete_share(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.complete as f64 / self.samples as f64
        }
    }
}

/// Counts a stack's samples in CPython's evaluator, and those of them
/// that carry Python frames ([`CpuProfile::python`]); and those in V8's
/// JavaScript, and of them those named ([`CpuProfile::javascript`]).
pub(crate) fn count_runtimes(prof: &mut CpuProfile, frames: &[Vec<String>], count: u64) {
    fn first(f: &[String]) -> &str {
        f.first().map(String::as_str).unwrap_or("")
    }
    let (in_js, named) = javascript(frames.iter().map(|f| first(f)));
    if in_js {
        prof.javascript.0 += count;
        if named {
            prof.javascript.1 += count;
        }
    }
    if frames
        .iter()
        .any(|f| first(f) == crate::symbolize::python::EVAL_FRAME)
    {
        prof.python.0 += count;
        if frames
            .iter()
            .any(|f| first(f).starts_with(crate::symbolize::python::PREFIX))
        {
            prof.python.1 += count;
        }
    }
}

/// Whether a stack (frame names) runs V8's JavaScript, and if so whether
/// all its JavaScript frames are named: unnamed ones are JIT code in
/// anonymous memory (`[unknown] 0x…`) or the interpreter's entry builtin,
/// whose frame would have been replaced by its function's name.
pub fn javascript<'a>(names: impl Iterator<Item = &'a str> + Clone) -> (bool, bool) {
    let unnamed = |n: &str| {
        (n.starts_with("[unknown] 0x")) || n.starts_with("Builtins_InterpreterEntryTrampoline")
    };
    let v8 = names
        .clone()
        .any(|n| n.starts_with(crate::symbolize::v8::PREFIX) || n.starts_with("Builtins_"));
    if !v8 {
        return (false, false);
    }
    let js = names
        .clone()
        .any(|n| n.starts_with(crate::symbolize::v8::PREFIX) || unnamed(n));
    (js, js && !names.clone().any(unnamed))
}

pub(crate) fn comm_name(raw: &[u8; 16]) -> String {
    let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..len]).into_owned()
}

/// User stacks unwound in the agent (`--dwarf`): count per (pid, tid,
/// return addresses innermost first, kernel stack innermost first: empty
/// for a sample in user mode).
pub type Unwound = HashMap<(u32, u32, Vec<u64>, Vec<u64>), u64>;

/// Adds stacks unwound in the agent to a profile (their samples were not
/// counted in the kernel), named by `names` (tid -> comm).
pub fn add_unwound(
    prof: &mut CpuProfile,
    stacks: &Unwound,
    names: &HashMap<u32, String>,
    sym: &mut Symbolizer,
) {
    let mut paths: BTreeMap<String, u64> = prof
        .folded
        .iter()
        .filter_map(|l| {
            l.rsplit_once(' ')
                .and_then(|(p, n)| Some((p.to_string(), n.parse().ok()?)))
        })
        .collect();
    let mut leaves: HashMap<String, u64> = prof.leaves.iter().cloned().collect();
    let mut leaf_addr: HashMap<String, (u32, u64)> = HashMap::new();
    for ((pid, tid, addrs, kernel), &count) in stacks {
        prof.samples += count;
        *prof.per_pid.entry(*pid).or_default() += count;
        let frames = sym.frames(*pid, addrs);
        count_runtimes(prof, &frames, count);
        if addrs.is_empty() {
            prof.no_user_stack += count;
        } else if is_complete(0, frames.last().map(|f| f[0].as_str())) {
            prof.complete += count;
        }
        let comm = names
            .get(tid)
            .cloned()
            .unwrap_or_else(|| format!("tid-{tid}"));
        let mut line = folded_frame(&comm);
        for f in frames.iter().rev().flatten() {
            line.push(';');
            line.push_str(&folded_frame(f));
        }
        for f in sym.kernel_stack(kernel).iter().rev() {
            line.push(';');
            line.push_str(&folded_frame(f));
        }
        let leaf = line.rsplit(';').next().unwrap_or_default().to_string();
        if let (Some(&a), true) = (addrs.first(), kernel.is_empty()) {
            leaf_addr.entry(leaf.clone()).or_insert((*pid, a));
        }
        *leaves.entry(leaf).or_default() += count;
        *prof.by_pid.entry((*pid, line.clone())).or_default() += count;
        *paths.entry(line).or_default() += count;
    }
    prof.folded = paths.into_iter().map(|(p, c)| format!("{p} {c}")).collect();
    let mut leaves: Vec<(String, u64)> = leaves.into_iter().collect();
    leaves.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    prof.leaves = leaves;
    for (leaf, _) in prof.leaves.iter().take(TOP_LOCATIONS) {
        if prof.locations.contains_key(leaf) {
            continue;
        }
        if let Some(loc) = leaf_addr
            .get(leaf)
            .and_then(|&(pid, addr)| sym.location(pid, addr))
        {
            prof.locations.insert(leaf.clone(), loc);
        }
    }
}

/// The user stack of `key`: walked in the kernel (`user_hash`) or by stack
/// id, innermost first, with why the walk ended (0: not said).
pub(crate) fn read_user(maps: &CpuMaps, key: &SampleKey) -> (Vec<u64>, u32) {
    match key.user_hash {
        0 => (read_stack(maps, key.user_stack), 0),
        h => match maps.user_stacks.get(&h, 0) {
            Ok(s) => {
                let len = (s.len as usize).min(s.frames.len());
                (s.frames[..len].to_vec(), s.end)
            }
            Err(_) => (Vec::new(), 0),
        },
    }
}

/// The stack of id `id` in the stack-trace map, innermost first (empty for
/// none).
pub(crate) fn read_stack(maps: &CpuMaps, id: i32) -> Vec<u64> {
    if id < 0 {
        return Vec::new();
    }
    maps.stacks
        .get(&(id as u32), 0)
        .map(|s| s.frames().iter().map(|f| f.ip).collect())
        .unwrap_or_default()
}
