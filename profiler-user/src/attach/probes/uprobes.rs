//! The functions' probes: entry and exit uprobes (return sites or return
//! uprobes) by file offset, attached as one uprobe_multi link per binary
//! where the kernel has them, else one perf event a probe; detached by the
//! governor a few functions at a time.

use std::{
    num::NonZeroU32,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::Instant,
};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        ProgramError, UProbe,
    },
    Ebpf,
};
use profiler_common::{
    COOKIE_DISPATCH, COOKIE_GO, LINK_GEN, MAX_FUNCS, PROG_ENTRY, PROG_EXIT, PROG_RET, TAIL_CALL,
};

use super::{super::kernel, super::uprobe_multi as multi, Probes, EBPF_OBJECT};
use crate::{
    error::chain,
    tracee::{exits::ExitProbe, select::Selection},
    Error, Result,
};

/// The programs loaded for uprobe_multi links.
pub(crate) struct MultiPrograms {
    pub(crate) entry: OwnedFd,
    pub(crate) exit: OwnedFd,
    pub(crate) ret: OwnedFd,
}

/// The uprobe_multi links of one binary: exits first, the entry link last.
pub(super) struct BinLinks {
    /// Index into [`Selection::binaries`].
    bin: usize,
    /// The functions these links probe.
    funcs: Vec<usize>,
    /// The [`LINK_GEN`] bit of their cookies.
    gen: bool,
    links: Vec<OwnedFd>,
    /// The binary, held open so that links rebuilt later name the same
    /// file even once its path in `/proc/PID` is gone (the target's main
    /// thread exited, or the target is exiting).
    file: Option<std::fs::File>,
}

impl BinLinks {
    /// Where to attach rebuilt links: the file held open, else its path.
    fn path(&self, sel: &Selection) -> PathBuf {
        match &self.file {
            Some(f) => format!("/proc/self/fd/{}", f.as_raw_fd()).into(),
            None => sel.binaries[self.bin].open_path.clone(),
        }
    }
}

/// The probe cookie of function `i`: its index, the link generation bit,
/// and the dispatch and Go flags.
fn cookie(sel: &Selection, i: usize, gen: bool) -> u64 {
    let f = &sel.funcs[i];
    let mut c = i as u64;
    if gen {
        c |= u64::from(LINK_GEN);
    }
    if f.dispatch {
        c |= COOKIE_DISPATCH;
    }
    if sel.binaries[f.binary as usize].go {
        c |= COOKIE_GO;
    }
    c
}

/// Which kind of probe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    /// A function's first instruction.
    Entry,
    /// A return uprobe on the function.
    Return,
    /// A return instruction (or tail-call jump) of the function.
    ReturnSite,
}

/// File offsets and cookies of the `kind` probes of functions `idx`, whose
/// tail calls are followed into functions `attached` (attached with them).
fn probe_points(
    sel: &Selection,
    idx: &[usize],
    attached: &[usize],
    kind: ProbeKind,
    cookie: impl Fn(usize) -> u64,
) -> (Vec<u64>, Vec<u64>) {
    let mut offsets = Vec::new();
    let mut cookies = Vec::new();
    // Tail calls are followed to the functions attached together (one
    // binary's link, or the functions attached one probe each) that have
    // an exit probe: their entry comes right after the jump, and their
    // return ends the caller's frame too. (A callee whose entry does not
    // come next leaves the caller's exit as it was: `tail_calls.rs`.)
    // (Their dispatch flag too: the kernel's dispatch depth counts the
    // caller's exit at the jump, so a dispatch function's tail call is
    // followed only into another, whose entry counts it back.)
    let callees: std::collections::HashMap<(u32, u64), bool> = match kind {
        ProbeKind::ReturnSite => attached
            .iter()
            .map(|&j| &sel.funcs[j])
            .filter(|f| !matches!(f.exit, ExitProbe::EntryOnly(_)))
            .map(|f| ((f.binary, f.offset), f.dispatch))
            .collect(),
        _ => Default::default(),
    };
    for &i in idx {
        let f = &sel.funcs[i];
        let entry = f.entry_offset();
        let points: &[u64] = match (kind, &f.exit) {
            (ProbeKind::Entry, _) | (ProbeKind::Return, ExitProbe::Uretprobe) => {
                std::slice::from_ref(&entry)
            }
            (ProbeKind::ReturnSite, ExitProbe::Sites(sites)) => sites,
            _ => &[],
        };
        // Not in Go (its events are keyed by goroutine).
        let follows = !f.tails.is_empty() && !sel.binaries[f.binary as usize].go;
        offsets.extend_from_slice(points);
        cookies.extend(points.iter().map(|site| {
            let tail = follows
                && f.tails.iter().any(|&(s, callee)| {
                    s == *site
                        && callee != f.offset
                        && callees
                            .get(&(f.binary, callee))
                            .is_some_and(|&dispatch| dispatch || !f.dispatch)
                });
            cookie(i) | if tail { u64::from(TAIL_CALL) } else { 0 }
        }));
    }
    (offsets, cookies)
}

impl Probes {
    /// Attaches exit probes (return-site uprobes or return uprobes), then
    /// entry probes, to every selected function. Exits first, so that a
    /// call entered mid-attach shows up as an orphan exit (counted) rather
    /// than as a frame that never closes. Returns the number of functions
    /// probed. `pid` scopes the probes to one process; 0 puts them on every
    /// process mapping the binaries, and the kernel's map of traced
    /// processes decides (`--follow`, several targets).
    pub fn attach(&mut self, sel: &Selection, pid: u32) -> Result<usize> {
        self.attach_from(sel, 0, pid)
    }

    /// [`Probes::attach`] for the functions from index `first` on (those a
    /// selection gained after an exec).
    pub fn attach_from(&mut self, sel: &Selection, first: usize, pid: u32) -> Result<usize> {
        assert!(sel.funcs.len() <= MAX_FUNCS as usize);
        let start = Instant::now();
        let cookie = |i: usize| cookie(sel, i, false);
        // Fast path: one uprobe_multi link per binary and program, which
        // also detaches in one grace period instead of one per probe.
        let mut pending: Vec<bool> = (0..sel.funcs.len()).map(|i| i >= first).collect();
        if let Some(progs) = self.multi.as_ref() {
            for (bi, bin) in sel.binaries.iter().enumerate() {
                let idx: Vec<usize> = (first..sel.funcs.len())
                    .filter(|&i| sel.funcs[i].binary as usize == bi)
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                // A set the kernel refuses (one unprobeable function, such
                // as libc's `pthread_spin_lock`) is split in halves and
                // retried, so only the refused functions fall back to one
                // perf link per probe: thousands of those take minutes to
                // close (one RCU grace period each).
                let mut todo = vec![idx];
                while let Some(idx) = todo.pop() {
                    match multi_links(progs, sel, &bin.open_path, &idx, false, pid) {
                        Ok(links) => {
                            for &i in &idx {
                                pending[i] = false;
                            }
                            self.multi_links.push(BinLinks {
                                bin: bi,
                                funcs: idx,
                                gen: false,
                                links,
                                file: std::fs::File::open(&bin.open_path).ok(),
                            });
                        }
                        Err(e) if e.contains("os error 3)") || e.contains("os error 2)") => {
                            return Err(Error::TargetGone(pid));
                        }
                        // The per-probe fallback below tells which function
                        // the kernel refused, and why.
                        Err(e) => {
                            if std::env::var_os("PROFILER_DEBUG").is_some() {
                                eprintln!(
                                    "profiler: debug: uprobe_multi attach of {} functions to {}: {e}",
                                    idx.len(),
                                    bin.open_path.display()
                                );
                            }
                            if idx.len() > 1 {
                                let (l, r) = idx.split_at(idx.len() / 2);
                                todo.push(r.to_vec());
                                todo.push(l.to_vec());
                            }
                        }
                    }
                }
            }
        }
        let scope = match NonZeroU32::new(pid) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let mut ok: Vec<bool> = (0..sel.funcs.len()).map(|i| i >= first).collect();
        // Probes behind a USDT semaphore: aya's per-probe attach has none.
        for (i, f) in sel.funcs.iter().enumerate() {
            if !ok[i] || !pending[i] || f.semaphores == [0; 2] {
                continue;
            }
            ok[i] = match self.attach_gated(sel, i, pid) {
                Ok(fds) => {
                    self.gated.push((i, fds));
                    true
                }
                Err(reason) => {
                    self.failed.push((f.name.clone(), reason));
                    false
                }
            };
            pending[i] = false;
        }
        let attached: Vec<usize> = (0..sel.funcs.len())
            .filter(|&i| ok[i] && pending[i])
            .collect();
        for (name, kind) in [
            (PROG_RET, ProbeKind::ReturnSite),
            (PROG_EXIT, ProbeKind::Return),
            (PROG_ENTRY, ProbeKind::Entry),
        ] {
            let prog: &mut UProbe = program(&mut self.ebpf, name)?;
            for (i, f) in sel.funcs.iter().enumerate() {
                if !ok[i] || !pending[i] {
                    continue;
                }
                let bin = &sel.binaries[f.binary as usize];
                // The sites' own cookies: a tail call's carries TAIL_CALL.
                let (offsets, cookies) = probe_points(sel, &[i], &attached, kind, cookie);
                for (offset, c) in offsets.into_iter().zip(cookies) {
                    let point = UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(offset),
                        cookie: Some(c),
                    };
                    match prog.attach(point, &bin.open_path, scope) {
                        Ok(id) => self.per_probe.push((i, name, id)),
                        Err(e) => {
                            let reason = chain(&e);
                            if reason.contains("Operation not permitted") {
                                return Err(Error::MissingCapability {
                                    missing: "CAP_SYS_ADMIN".into(),
                                });
                            }
                            if reason.contains("No such process") || reason.contains("No such file")
                            {
                                return Err(Error::TargetGone(pid));
                            }
                            ok[i] = false;
                            self.failed.push((f.name.clone(), reason));
                            break;
                        }
                    }
                }
            }
        }
        self.attach_ms = start.elapsed().as_millis();
        let attached = ok.iter().filter(|&&b| b).count();
        if attached == 0 && first < sel.funcs.len() {
            let (func, reason) = self.failed.first().cloned().unwrap_or_default();
            let f = &sel.funcs[first];
            return Err(Error::Attach {
                func,
                binary: sel.binaries[f.binary as usize].path.clone(),
                offset: f.offset,
                reason,
            });
        }
        Ok(attached)
    }

    /// Attaches function `i`, whose probes sit behind USDT semaphores, one
    /// perf event a probe ([`multi::attach_gated_probe`]): its exit sites,
    /// then its entry. Returns the fds, the entry's first.
    fn attach_gated(
        &mut self,
        sel: &Selection,
        i: usize,
        pid: u32,
    ) -> std::result::Result<Vec<OwnedFd>, String> {
        let f = &sel.funcs[i];
        let path = &sel.binaries[f.binary as usize].open_path;
        let c = cookie(sel, i, false);
        let ExitProbe::Sites(sites) = &f.exit else {
            return Err("a USDT pair without its second probe".into());
        };
        let prog = |ebpf: &mut Ebpf, name| -> std::result::Result<OwnedFd, String> {
            let p = program(ebpf, name).map_err(|e| e.to_string())?;
            p.fd()
                .map_err(|e| chain(&e))?
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| e.to_string())
        };
        let (ret, entry) = (
            prog(&mut self.ebpf, PROG_RET)?,
            prog(&mut self.ebpf, PROG_ENTRY)?,
        );
        let mut exits = Vec::new();
        for &site in sites {
            exits.extend(multi::attach_gated_probe(
                ret.as_fd(),
                path,
                (site, f.semaphores[1]),
                c,
                pid,
            )?);
        }
        let mut fds = Vec::from(multi::attach_gated_probe(
            entry.as_fd(),
            path,
            (f.entry_offset(), f.semaphores[0]),
            c,
            pid,
        )?);
        fds.extend(exits);
        Ok(fds)
    }

    /// Stops probing the functions `gone` (the overhead governor's call),
    /// leaving every other function probed without a gap. A binary's
    /// uprobe_multi links cannot be changed, so they are rebuilt without
    /// those functions: the new links (the other [`LINK_GEN`] bit in their
    /// cookies) are created first, then the old entry link is dropped, then
    /// the old exit links, so calls of a removed function still in flight
    /// return through a live exit probe. A hit that lands while both sets are
    /// attached is reported twice, once per generation; the agent keeps one
    /// (`analyze/dedup.rs`).
    pub fn detach_funcs(&mut self, sel: &Selection, gone: &[usize], pid: u32) -> Result<()> {
        let is_gone = |i: &usize| gone.contains(i);
        for set in &mut self.multi_links {
            if !set.funcs.iter().any(is_gone) {
                continue;
            }
            let keep: Vec<usize> = set.funcs.iter().copied().filter(|i| !is_gone(i)).collect();
            let gen = !set.gen;
            let links = match (&self.multi, keep.is_empty()) {
                (Some(progs), false) => multi_links(progs, sel, &set.path(sel), &keep, gen, pid)
                    .map_err(|e| match e.contains("os error 3)") {
                        // ESRCH: the process is gone.
                        true => Error::TargetGone(pid),
                        false => Error::Load(format!("rebuilding the probes: {e}")),
                    })?,
                _ => Vec::new(),
            };
            let old = std::mem::replace(&mut set.links, links);
            // The entry link is the last one: drop it first.
            for link in old.into_iter().rev() {
                drop(link);
            }
            set.funcs = keep;
            set.gen = gen;
        }
        self.gated.retain(|(i, _)| !is_gone(i));
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.per_probe)
            .into_iter()
            .partition(|(i, _, _)| is_gone(i));
        self.per_probe = kept;
        self.detach_per_probe(gone)
    }

    /// Detaches probes attached one perf event each: entries first, then
    /// exits, with expedited RCU grace periods when there are many
    /// ([`kernel::ExpeditedRcu`]).
    pub(super) fn detach_per_probe(
        &mut self,
        links: Vec<(usize, &'static str, UProbeLinkId)>,
    ) -> Result<()> {
        let _fast =
            (links.len() >= kernel::ExpeditedRcu::FROM_LINKS).then(kernel::ExpeditedRcu::begin);
        let (entries, exits): (Vec<_>, Vec<_>) = links
            .into_iter()
            .partition(|(_, name, _)| *name == PROG_ENTRY);
        for (_, name, id) in entries.into_iter().chain(exits) {
            program(&mut self.ebpf, name)?
                .detach(id)
                .map_err(|e| Error::Load(format!("detaching a probe: {}", chain(&e))))?;
        }
        Ok(())
    }

    /// The entry, exit and return-site programs loaded for uprobe_multi
    /// links, or None when this kernel cannot (the per-probe path is used
    /// then).
    pub(super) fn multi_programs(ebpf: &Ebpf) -> Option<MultiPrograms> {
        if !kernel::uprobe_multi() {
            return None;
        }
        let load = |name| {
            multi::load_multi_program(EBPF_OBJECT, ebpf, name)
                .map_err(|e| {
                    if std::env::var_os("PROFILER_DEBUG").is_some() {
                        eprintln!("profiler: debug: uprobe_multi load of {name}: {e}");
                    }
                })
                .ok()
        };
        Some(MultiPrograms {
            entry: load(PROG_ENTRY)?,
            exit: load(PROG_EXIT)?,
            ret: load(PROG_RET)?,
        })
    }

    /// One line per reason the kernel gave for refusing functions: how
    /// many, why, and the first few names (not one warning each).
    pub fn refused_summary(&self) -> Vec<String> {
        refused_summary(&self.failed)
    }

    /// How the probes were attached, for the attached line.
    pub fn attach_kind(&self) -> &'static str {
        if self.multi_links.is_empty() {
            "one perf event per probe"
        } else if self.failed.is_empty() && self.per_probe.is_empty() {
            "uprobe_multi"
        } else {
            "uprobe_multi + per-probe"
        }
    }
}

/// Creates the uprobe_multi links of binary `bi` for functions `idx`,
/// exits first and the entry link last, with generation bit `gen` in their
/// cookies. On failure, the links made so far are dropped.
fn multi_links(
    progs: &MultiPrograms,
    sel: &Selection,
    path: &Path,
    idx: &[usize],
    gen: bool,
    pid: u32,
) -> std::result::Result<Vec<OwnedFd>, String> {
    let mut links = Vec::new();
    // Probes behind a USDT semaphore get links of their own: a kernel that
    // refuses the semaphore leaves the functions' links alone.
    let (gated, plain): (Vec<usize>, Vec<usize>) = idx
        .iter()
        .partition(|&&i| sel.funcs[i].semaphores != [0; 2]);
    for (prog, kind) in [
        (&progs.ret, ProbeKind::ReturnSite),
        (&progs.exit, ProbeKind::Return),
        (&progs.entry, ProbeKind::Entry),
    ] {
        let (offsets, cookies) = probe_points(sel, &plain, &plain, kind, |i| cookie(sel, i, gen));
        if offsets.is_empty() {
            continue;
        }
        links.push(multi::attach_uprobe_multi(
            prog.as_fd(),
            path,
            &offsets,
            &cookies,
            &[],
            pid,
            kind == ProbeKind::Return,
        )?);
    }
    for &i in &gated {
        let f = &sel.funcs[i];
        let ExitProbe::Sites(sites) = &f.exit else {
            continue;
        };
        let c = cookie(sel, i, gen);
        let made = multi::attach_uprobe_multi(
            progs.ret.as_fd(),
            path,
            sites,
            &vec![c; sites.len()],
            &vec![f.semaphores[1]; sites.len()],
            pid,
            false,
        )
        .and_then(|exit| {
            multi::attach_uprobe_multi(
                progs.entry.as_fd(),
                path,
                &[f.entry_offset()],
                &[c],
                &[f.semaphores[0]],
                pid,
                false,
            )
            .map(|entry| [exit, entry])
        });
        match made {
            Ok(pair) => links.extend(pair),
            Err(e) => eprintln!("profiler: note: {} is not timed: {e}", f.name),
        }
    }
    Ok(links)
}

pub(super) fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    ebpf.program_mut(name)
        .ok_or_else(|| Error::Load(format!("program {name} missing from the eBPF object")))?
        .try_into()
        .map_err(|e: ProgramError| Error::Load(chain(&e)))
}

/// See [`Probes::refused_summary`].
fn refused_summary(failed: &[(String, String)]) -> Vec<String> {
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (func, reason) in failed {
        match by_reason.iter_mut().find(|(r, _)| r == reason) {
            Some((_, funcs)) => funcs.push(func),
            None => by_reason.push((reason, vec![func])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, funcs)| {
            // ENOTSUPP from the kernel's uprobe instruction check.
            let why = if reason.contains("error 524") {
                " (ENOTSUPP: the kernel cannot place a uprobe on their first instruction)"
            } else {
                ""
            };
            let mut names = funcs.iter().take(3).copied().collect::<Vec<_>>().join(", ");
            if funcs.len() > 3 {
                names.push_str(&format!(" and {} more", funcs.len() - 3));
            }
            format!(
                "profiler: warning: the kernel refused {} function{}: {reason}{why}; not traced: {names}",
                funcs.len(),
                if funcs.len() == 1 { "" } else { "s" }
            )
        })
        .collect()
}

#[cfg(test)]
mod refused_tests {
    use super::refused_summary;

    #[test]
    fn refused_functions_are_summed_up_by_reason() {
        let e524 = "perf_event_open failed: Unknown error 524".to_string();
        let failed: Vec<(String, String)> = ["a", "b", "c", "d"]
            .iter()
            .map(|f| (f.to_string(), e524.clone()))
            .chain([("z".to_string(), "other".to_string())])
            .collect();
        let lines = refused_summary(&failed);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("refused 4 functions"), "{}", lines[0]);
        assert!(lines[0].contains("ENOTSUPP"), "{}", lines[0]);
        assert!(lines[0].ends_with("a, b, c and 1 more"), "{}", lines[0]);
        assert!(
            lines[1].contains("refused 1 function: other"),
            "{}",
            lines[1]
        );
    }
}
