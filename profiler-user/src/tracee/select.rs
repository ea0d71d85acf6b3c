//! Which functions to probe: `--func`/`--exclude` globs over demangled and
//! raw names, the binaries searched (`--lib`), default excludes and the cap.
use std::path::PathBuf;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::{
    exits::{self, ExitProbe, Policy, Runtime, Unprobed},
    process::{FileId, Target},
    symbols, usdt,
};
use crate::{
    cli::{ExitProbes, SelectArgs},
    Error, Result,
};

/// Runtime and startup internals left out when no `--func` is given: they
/// are not the program's own work, and some never return.
pub const DEFAULT_EXCLUDES: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "__*",
    "_GLOBAL_*",
    "_dl_*",
    "deregister_tm_clones",
    "register_tm_clones",
    "frame_dummy",
    "std::*",
    "core::*",
    "alloc::*",
    "<std::*",
    "<core::*",
    "<alloc::*",
    "<&*",
    "rust_begin_unwind",
    "rust_panic",
    "__gnu_cxx::*",
    "_Unwind_*",
];

/// A compiled set of globs.
#[derive(Debug, Clone)]
pub struct Patterns {
    set: GlobSet,
}

impl Patterns {
    /// Compiles `patterns`, failing with [`Error::BadPattern`] on the first
    /// that does not parse.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            let p = p.as_ref();
            let glob = GlobBuilder::new(p)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .map_err(|e| Error::BadPattern {
                    pattern: p.to_string(),
                    reason: e.kind().to_string(),
                })?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| Error::BadPattern {
            pattern: String::new(),
            reason: e.to_string(),
        })?;
        Ok(Patterns { set })
    }

    /// True when `sym`'s demangled or raw name matches.
    pub fn matches(&self, sym: &symbols::Symbol) -> bool {
        self.set.is_match(&sym.name) || self.set.is_match(&sym.raw)
    }

    /// Number of patterns.
    #[expect(dead_code, reason = "no caller in the crate")]
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when there are no patterns.
    #[expect(dead_code, reason = "no caller in the crate")]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A function chosen for probing.
#[derive(Debug, Clone)]
pub struct Func {
    /// Demangled name.
    pub name: String,
    /// Index into [`Selection::binaries`].
    pub binary: u32,
    /// File offset to attach at.
    pub offset: u64,
    /// True for dispatch functions: an outermost call of one on the watched
    /// thread is one dispatch.
    pub dispatch: bool,
    /// How its returns are observed.
    pub exit: ExitProbe,
    /// A way its frame can end that no exit probe sees (it is closed by
    /// stack pointer then), with return-site probes.
    pub unprobed: Option<Unprobed>,
    /// What its probe hits add to measured durations (zero until the
    /// calibration at attach says).
    pub cost: super::exits::ProbeCost,
    /// File offsets of the USDT semaphores its entry and exit probes
    /// raise (0: none; see `usdt.rs`).
    pub semaphores: [u64; 2],
    /// Its return sites that are tail calls to the start of another
    /// function of its binary: (site, the callee's file offset). Where the
    /// callee is probed too, the site's exit is marked, and the frame
    /// stays open until the callee returns (`analyze/tail_calls.rs`).
    pub tails: Vec<(u64, u64)>,
    /// Where its entry probe (and a return uprobe) go: bytes after
    /// `offset`, on the first instruction the kernel emulates when the
    /// first one it would single-step (`exits.rs`); 0: at `offset`.
    pub entry_shift: u32,
}

impl Func {
    /// The file offset its entry probe (and a return uprobe) go at.
    pub fn entry_offset(&self) -> u64 {
        self.offset + u64::from(self.entry_shift)
    }

    fn new(sym: &symbols::Symbol, binary: u32, dispatch: bool) -> Self {
        Func {
            name: sym.name.clone(),
            binary,
            offset: sym.offset,
            dispatch,
            exit: ExitProbe::Uretprobe,
            unprobed: None,
            cost: Default::default(),
            semaphores: [0; 2],
            tails: Vec::new(),
            entry_shift: 0,
        }
    }
}

/// A binary searched for functions.
#[derive(Debug, Clone)]
pub struct Binary {
    /// Path as the target sees it (reported to the user).
    pub path: PathBuf,
    /// Path that opens the same file from here (for reading and attaching).
    pub open_path: PathBuf,
    /// A Go binary: its calls are paired by goroutine.
    pub go: bool,
    /// A `--lib` the target had not mapped when probes were attached: the
    /// file's identity, to notice when it is.
    pub unmapped: Option<FileId>,
}

/// The outcome of selection.
#[derive(Debug, Default)]
pub struct Selection {
    /// Binaries searched, main executable first.
    pub binaries: Vec<Binary>,
    /// Functions to probe; a function's index here is its probe cookie.
    pub funcs: Vec<Func>,
    /// Functions that matched but were left out by `--max-funcs`.
    pub capped: usize,
    /// Functions of the main executable chosen from where the watched
    /// thread was sampled ([`select_among`]), when that chose them: how
    /// many of those on its stacks are probed.
    pub presampled: Option<usize>,
    /// Probed beside those, in the room `--max-funcs` left: functions that
    /// tail-call one sampled (not on the stacks themselves: the jump took
    /// their frame off).
    pub tail_callers: usize,
    /// How dispatches are recognised, in words, for the reports.
    pub dispatch_rule: String,
    /// The dispatch functions are a preset's (no `--dispatch`).
    pub preset: bool,
    /// True when no dispatch function is known and every outermost traced
    /// call counts as one.
    pub dispatch_fallback: bool,
    /// How returns are observed, in words, for the reports.
    pub exit_rule: String,
}

impl Selection {
    /// Probes attached: one per entry, return uprobe and return site.
    pub fn probe_count(&self) -> usize {
        self.funcs.iter().map(|f| f.exit.probes()).sum()
    }
}

/// A function the session needs whatever `--func` says (a stage trigger,
/// `main` for startup timing, `--ready`).
#[derive(Debug, Clone)]
pub struct Required {
    /// Exact demangled or raw name.
    pub name: String,
    /// Fail if it is missing (else skip it quietly).
    pub must: bool,
    /// Which option needs it, for the error message.
    pub why: String,
}

/// Dispatch functions of well-known native event loops: each runs one
/// event's handlers and none of them includes the idle wait for events.
pub const PRESETS: &[(&str, &str, &[&str])] = &[
    // g_main_dispatch is static (stripped from distribution builds);
    // g_main_context_dispatch is exported. Both run after the poll, so
    // neither includes the idle wait; the outermost call is the dispatch.
    (
        "GLib",
        "libglib-2.0",
        &["g_main_context_dispatch", "g_main_dispatch"],
    ),
    (
        "Qt 5",
        "libQt5Core",
        &["QCoreApplication::notifyInternal2(*"],
    ),
    (
        "Qt 6",
        "libQt6Core",
        &["QCoreApplication::notifyInternal2(*"],
    ),
    (
        "libuv",
        "libuv",
        &[
            "uv__run_timers",
            "uv__stream_io",
            "uv__async_io",
            "uv__server_io",
            "uv__udp_io",
            "uv__poll_io",
            "uv__work_done",
        ],
    ),
];

/// Compiles the patterns in `args` (so a bad one fails before anything
/// else happens).
pub fn compile(args: &SelectArgs) -> Result<(Option<Patterns>, Patterns)> {
    let include = if args.funcs.is_empty() {
        None
    } else {
        Some(Patterns::new(&args.funcs)?)
    };
    let mut excludes: Vec<&str> = args.excludes.iter().map(String::as_str).collect();
    if include.is_none() {
        excludes.extend_from_slice(DEFAULT_EXCLUDES);
    }
    Patterns::new(&args.dispatch)?;
    Ok((include, Patterns::new(&excludes)?))
}

fn add_binary(binaries: &mut Vec<Binary>, b: Binary) -> u32 {
    match binaries.iter().position(|x| x.path == b.path) {
        Some(i) => i as u32,
        None => {
            binaries.push(b);
            (binaries.len() - 1) as u32
        }
    }
}

fn joined<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// Chooses the functions to probe in `target`: dispatch functions first
/// (`--dispatch`, else a preset the target has), then `--func` matches (or,
/// with neither `--func` nor `--dispatch`, the main executable's own
/// functions). With no dispatch function, every outermost traced call on the
/// watched thread counts as a dispatch.
pub fn select(target: &Target, args: &SelectArgs, required: &[Required]) -> Result<Selection> {
    select_among(target, args, required, None)
}

/// [`select`], where the main executable's own functions (the default
/// selection, with no `--func`) are only those holding one of `sampled`:
/// (file offset, weight) pairs sorted by offset, where the watched thread
/// was seen running or waiting; the heaviest first, up to `--max-funcs`.
pub fn select_among(
    target: &Target,
    args: &SelectArgs,
    required: &[Required],
    sampled: Option<&[(u64, u64)]>,
) -> Result<Selection> {
    let (include, exclude) = compile(args)?;
    let mut binaries = vec![Binary {
        path: target.exe.clone(),
        open_path: target.exe_open_path(),
        go: false,
        unmapped: None,
    }];
    for lib in &args.libs {
        let l = target.library(lib)?;
        add_binary(
            &mut binaries,
            Binary {
                open_path: l.open_path,
                path: l.path,
                go: false,
                unmapped: l.unmapped,
            },
        );
    }
    let mut symbols: Vec<symbols::Functions> = Vec::new();
    for b in &binaries {
        symbols.push(symbols::read_binary(&b.open_path)?);
    }
    let mut sel = Selection::default();
    let mut taken = std::collections::HashSet::new();
    if !args.dispatch.is_empty() {
        let pats = Patterns::new(&args.dispatch)?;
        for (bi, syms) in symbols.iter().enumerate() {
            for sym in syms.iter().filter(|s| pats.matches(s)) {
                taken.insert((bi as u32, sym.offset));
                sel.funcs.push(Func::new(sym, bi as u32, true));
            }
        }
        if sel.funcs.is_empty() {
            return Err(Error::NoMatch {
                what: joined(args.dispatch.iter().map(|d| format!("--dispatch {d:?}"))),
                where_: joined(binaries.iter().map(|b| b.path.display())),
                pid: target.pid,
            });
        }
        sel.dispatch_rule = format!("--dispatch {}", joined(args.dispatch.iter()));
    } else {
        apply_presets(target, &mut binaries, &mut symbols, &mut sel, &mut taken)?;
    }
    for req in required {
        let found = symbols.iter().enumerate().find_map(|(bi, syms)| {
            syms.iter()
                .find(|s| s.name == req.name || s.raw == req.name)
                .map(|s| (bi as u32, s))
        });
        match found {
            Some((bi, sym)) if taken.insert((bi, sym.offset)) => {
                sel.funcs.push(Func::new(sym, bi, false));
            }
            Some(_) => {}
            None if req.must => {
                return Err(Error::Usage(format!(
                    "{} needs a function named {:?}, which {} does not have; check the name with `profiler list`",
                    req.why,
                    req.name,
                    joined(binaries.iter().map(|b| b.path.display()))
                )))
            }
            None => {}
        }
    }
    let regular =
        include.is_some() || (args.dispatch.is_empty() && required.iter().all(|r| !r.must));
    for (bi, syms) in symbols.iter().enumerate().filter(|_| regular) {
        // With no --func, only the main executable's own functions.
        if include.is_none() && bi != 0 {
            break;
        }
        let mut candidates: Vec<(u64, &symbols::Symbol)> = syms
            .iter()
            .filter(|sym| {
                include.as_ref().is_none_or(|inc| inc.matches(sym))
                    && !exclude.matches(sym)
                    && !taken.contains(&(bi as u32, sym.offset))
            })
            .map(|sym| (0, sym))
            .collect();
        if let Some(sampled) = sampled.filter(|_| include.is_none() && bi == 0) {
            let matching = candidates.len();
            for (weight, sym) in &mut candidates {
                let end = sym.offset + sym.size.max(1);
                let from = sampled.partition_point(|&(off, _)| off < sym.offset);
                *weight = sampled[from..]
                    .iter()
                    .take_while(|&&(off, _)| off < end)
                    .map(|&(_, w)| w)
                    .sum();
            }
            candidates.retain(|&(w, _)| w > 0);
            candidates.sort_by_key(|&(w, _)| std::cmp::Reverse(w));
            candidates.truncate(args.max_funcs());
            // Their tail callers too: a stack cannot show a function that
            // left by jumping to one of them, and probed, it is kept open
            // until its callee returns (`analyze/tail_calls.rs`).
            let chosen: std::collections::HashSet<u64> =
                candidates.iter().map(|(_, s)| s.addr).collect();
            let callers = exits::Code::new(&syms.data, syms).tail_callers(&chosen);
            let callers: Vec<&symbols::Symbol> = callers
                .into_iter()
                .filter(|c| !exclude.matches(c) && !taken.contains(&(bi as u32, c.offset)))
                .collect();
            // The stack's functions first: their tail callers get the
            // room --max-funcs leaves (the callers left out are capped).
            let stack = candidates.len();
            let room = args.max_funcs().saturating_sub(sel.funcs.len());
            candidates.extend(callers.into_iter().map(|c| (0, c)));
            let probed = candidates.len().min(room);
            sel.capped += matching.saturating_sub(candidates.len());
            sel.presampled = Some(stack.min(probed));
            sel.tail_callers = probed.saturating_sub(stack);
        }
        for (_, sym) in candidates {
            if sel.funcs.len() >= args.max_funcs() {
                sel.capped += 1;
                continue;
            }
            sel.funcs.push(Func::new(sym, bi as u32, false));
        }
    }
    sel.binaries = binaries;
    // With no pattern given, a binary with no symbols of its own (stripped)
    // still has an event loop: its iterations need no probe.
    let nothing_asked = args.funcs.is_empty() && args.dispatch.is_empty();
    if sel.funcs.is_empty() && !(nothing_asked && required.iter().all(|r| !r.must)) {
        let what = if args.funcs.is_empty() {
            "the default selection (all functions minus runtime internals)".to_string()
        } else {
            joined(args.funcs.iter().map(|f| format!("--func {f:?}")))
        };
        let where_ = joined(sel.binaries.iter().map(|b| b.path.display()));
        return Err(Error::NoMatch {
            what,
            where_,
            pid: target.pid,
        });
    }
    plan_exits(&mut sel, &symbols, args.exit_probes);
    if !sel.funcs.iter().any(|f| f.dispatch) {
        for f in &mut sel.funcs {
            f.dispatch = true;
        }
        sel.dispatch_fallback = true;
        sel.dispatch_rule = FALLBACK_RULE.to_string();
    }
    add_python_gc(&mut sel, &symbols, &mut taken);
    Ok(sel)
}

/// CPython's collections, where the interpreter has the `gc__start` and
/// `gc__done` probes: one call of [`usdt::PYTHON_GC`] each, from one probe
/// to the other (both in the collector's frame, at the same stack
/// pointer), enabled through their semaphores.
fn add_python_gc(
    sel: &mut Selection,
    symbols: &[symbols::Functions],
    taken: &mut std::collections::HashSet<(u32, u64)>,
) {
    for (bi, syms) in symbols.iter().enumerate() {
        let probes = usdt::probes(&syms.data);
        let Some((start, done)) = usdt::python_gc(&probes) else {
            continue;
        };
        if taken.insert((bi as u32, start.offset)) {
            sel.funcs.push(Func {
                name: usdt::PYTHON_GC.into(),
                binary: bi as u32,
                offset: start.offset,
                dispatch: false,
                exit: ExitProbe::Sites(vec![done.offset]),
                unprobed: None,
                cost: Default::default(),
                semaphores: [start.semaphore, done.semaphore],
                tails: Vec::new(),
                entry_shift: 0,
            });
        }
    }
}

/// How dispatches are found when no dispatch function is known: the
/// watched thread's event-loop iterations (one traced process), else, per
/// process, every outermost traced call.
pub const FALLBACK_RULE: &str =
    "iterations of the watched thread's event loop, from the return of \
     its wait syscall (epoll, poll, select, io_uring, futex) to its next entry (no dispatch function \
     known: --dispatch names one)";
/// [`FALLBACK_RULE`] with several traced processes.
pub const FALLBACK_RULE_PER_PROCESS: &str =
    "every outermost traced call on each process's main thread (no dispatch function known: \
     --dispatch names one)";

/// Per function of `funcs`, the others its tail calls reach (indices):
/// the functions of its binary starting where its tail-call sites jump.
pub fn tail_callees(funcs: &[Func]) -> Vec<Vec<u32>> {
    let at: std::collections::HashMap<(u32, u64), u32> = funcs
        .iter()
        .enumerate()
        .map(|(i, f)| ((f.binary, f.offset), i as u32))
        .collect();
    funcs
        .iter()
        .map(|f| {
            f.tails
                .iter()
                .filter_map(|&(_, callee)| at.get(&(f.binary, callee)).copied())
                .collect()
        })
        .collect()
}

/// Decides how each selected function's returns are observed (see
/// [`ExitProbes`]) and finds its return sites.
fn plan_exits(sel: &mut Selection, symbols: &[symbols::Functions], mode: ExitProbes) {
    let runtimes: Vec<Runtime> = symbols.iter().map(|f| exits::runtime_of(&f.data)).collect();
    let unwinding = runtimes.iter().any(|&r| r != Runtime::Plain);
    for (b, r) in sel.binaries.iter_mut().zip(&runtimes) {
        b.go = *r == Runtime::Go;
    }
    let policy = match mode {
        ExitProbes::Ret => Policy::Ret,
        ExitProbes::Uretprobe => Policy::Uretprobe,
        // Return uprobes cost far less (one trap, not a trap and a
        // single-stepped `ret`: BENCHMARKS.md, parts a and b), but every
        // stack walked through a probed frame then meets the return
        // trampoline instead of the caller: C++ and Rust unwinders abort,
        // Go crashes. So return sites wherever something may unwind
        // through frames, return uprobes elsewhere (a plain C program);
        // the profiler's own walks put the caller back
        // (profiler-ebpf/src/unwind.rs, `put_back_return`).
        ExitProbes::Auto if unwinding => Policy::Ret,
        ExitProbes::Auto => Policy::Uretprobe,
    };
    let nop5_calls = crate::linux::at_least(crate::linux::NOP5_CALLS);
    for (bi, functions) in symbols.iter().enumerate() {
        let by_offset: std::collections::HashMap<u64, &symbols::Symbol> =
            functions.iter().map(|s| (s.offset, s)).collect();
        let mine: Vec<usize> = (0..sel.funcs.len())
            .filter(|&i| sel.funcs[i].binary as usize == bi)
            .collect();
        let plans = exits::plan(
            &functions.data,
            functions,
            mine.iter().map(|&i| by_offset[&sel.funcs[i].offset]),
            policy,
            nop5_calls,
        );
        for (i, plan) in mine.into_iter().zip(plans) {
            sel.funcs[i].exit = plan.exit;
            sel.funcs[i].unprobed = plan.unprobed;
            sel.funcs[i].tails = plan.tails;
            sel.funcs[i].entry_shift = plan.entry_shift;
        }
    }
    let n = |p: fn(&ExitProbe) -> bool| sel.funcs.iter().filter(|f| p(&f.exit)).count();
    let (sites, uret, entry_only) = (
        n(|e| matches!(e, ExitProbe::Sites(_))),
        n(|e| matches!(e, ExitProbe::Uretprobe)),
        n(|e| matches!(e, ExitProbe::EntryOnly(_))),
    );
    let why = match mode {
        ExitProbes::Auto if unwinding => {
            let what: Vec<&str> = runtimes
                .iter()
                .filter_map(|r| match r {
                    Runtime::Go => Some("Go"),
                    Runtime::Unwinding => Some("C++/Rust unwinding or thread cancellation"),
                    Runtime::Plain => None,
                })
                .collect();
            format!(" (auto: the target has {})", what[0])
        }
        ExitProbes::Auto => " (auto: nothing in the target unwinds through frames)".to_string(),
        ExitProbes::Ret => " (--exit-probes ret)".to_string(),
        ExitProbes::Uretprobe => " (--exit-probes uretprobe)".to_string(),
    };
    sel.exit_rule = format!(
        "{sites} at their return instructions, {uret} with return uprobes, {entry_only} at entry only{why}"
    );
}

/// Adds the dispatch functions of the first preset whose library (or the
/// executable) has them. None for a JVM: its threads' loops run in the VM
/// (AWT maps libglib, and its event-dispatch thread never calls it), so
/// they are bounded by their waits from the first, with no trial.
fn apply_presets(
    target: &Target,
    binaries: &mut Vec<Binary>,
    symbols: &mut Vec<symbols::Functions>,
    sel: &mut Selection,
    taken: &mut std::collections::HashSet<(u32, u64)>,
) -> Result<()> {
    if target.find_library("libjvm.so").is_ok() {
        return Ok(());
    }
    for (name, lib, patterns) in PRESETS {
        let pats = Patterns::new(patterns)?;
        let mut candidates: Vec<u32> = vec![0];
        if let Ok(m) = target.find_library(lib) {
            let before = binaries.len();
            let bi = add_binary(
                binaries,
                Binary {
                    open_path: m.open_path(target.pid),
                    path: m.path,
                    go: false,
                    unmapped: None,
                },
            );
            if binaries.len() > before {
                symbols.push(symbols::read_binary(&binaries[bi as usize].open_path)?);
            }
            candidates.push(bi);
        }
        for bi in candidates {
            for sym in symbols[bi as usize].iter().filter(|s| pats.matches(s)) {
                if taken.insert((bi, sym.offset)) {
                    sel.funcs.push(Func::new(sym, bi, true));
                }
            }
        }
        if !sel.funcs.is_empty() {
            sel.dispatch_rule = format!("preset {name}: {}", joined(patterns.iter()));
            sel.preset = true;
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, raw: &str) -> symbols::Symbol {
        symbols::Symbol {
            name: name.into(),
            raw: raw.into(),
            addr: 1,
            offset: 1,
            size: 1,
        }
    }

    #[test]
    fn globs_match_demangled_or_raw() {
        let p = Patterns::new(&["parse_*", "app::net::*"]).unwrap();
        assert!(p.matches(&sym("parse_json", "parse_json")));
        assert!(p.matches(&sym(
            "app::net::send",
            "_ZN3app3net4send17h0000000000000000E"
        )));
        assert!(!p.matches(&sym("render", "render")));
        let raw = Patterns::new(&["_ZN3app*"]).unwrap();
        assert!(raw.matches(&sym(
            "app::net::send",
            "_ZN3app3net4send17h0000000000000000E"
        )));
    }

    #[test]
    fn bad_pattern_is_reported() {
        let err = Patterns::new(&["a[b"]).unwrap_err().to_string();
        assert!(err.starts_with("bad pattern \"a[b\""), "{err}");
    }

    #[test]
    fn default_excludes_cover_runtime_internals() {
        let args = SelectArgs::default();
        let (inc, exc) = compile(&args).unwrap();
        assert!(inc.is_none());
        assert!(exc.matches(&sym("_start", "_start")));
        assert!(exc.matches(&sym("std::rt::lang_start", "x")));
        assert!(exc.matches(&sym("__libc_csu_init", "__libc_csu_init")));
        assert!(!exc.matches(&sym("parse_json", "parse_json")));
    }
}
