//! The traced processes, one section each (`--follow`, several `--pid`,
//! `--pid-of`): who made whom, what each ran, when it started and ended,
//! how it exited, and its own shadow stacks and per-function aggregates.
//!
//! Threads are attributed to their process by the kernel's first sighting
//! of each thread (a [`CommEvent`] carries its tgid) and by fork events (a
//! new process's first thread has its pid). Pairing stays per thread, so
//! a child's calls never pair with its parent's.
use std::collections::{BTreeMap, HashMap};

use profiler_common::{CommEvent, Event, ProcEvent, PROC_EXEC, PROC_EXIT, PROC_FORK};

use crate::analyze::{
    dispatch::stats::{Stats, Worst},
    stacks::{same_frame, Stacks},
};

/// Dispatches of one process's main thread (its tid is its pid), by the
/// session's rule: an outermost call of a dispatch function (of any traced
/// call, when none is known). Timed and counted; the watched thread of the
/// first target is also explained in `dispatches.txt`.
#[derive(Debug, Default)]
pub struct MainDispatches {
    /// Open dispatch: its start and open frames (function, stack pointer).
    open: Option<(u64, Vec<(u32, u64)>)>,
    /// Completed dispatches' statistics.
    pub stats: Stats,
    /// Those at least the slow threshold long.
    pub slow: u64,
    /// The longest.
    pub max_ns: u64,
}

impl MainDispatches {
    fn on_call(&mut self, ev: &Event, is_dispatch: &[bool], rule: &DispatchRule) {
        let func = ev.func();
        if ev.kind() == profiler_common::KIND_ENTRY {
            match &mut self.open {
                Some((_, calls)) => calls.push((func, ev.sp)),
                None if is_dispatch.get(func as usize).copied().unwrap_or(false) => {
                    self.open = Some((ev.ts_ns, vec![(func, ev.sp)]));
                }
                None => {}
            }
            return;
        }
        let Some((start, calls)) = &mut self.open else {
            return;
        };
        let Some(pos) = calls
            .iter()
            .rposition(|&(f, sp)| f == func && same_frame(sp, ev.sp))
        else {
            return;
        };
        calls.truncate(pos);
        if pos == 0 {
            let duration_ns = ev.ts_ns.saturating_sub(*start);
            self.stats.add(
                Worst {
                    duration_ns,
                    index: self.stats.count,
                    start_ns: *start,
                },
                rule.frame_interval_ns,
            );
            self.slow += u64::from(duration_ns >= rule.threshold_ns);
            self.max_ns = self.max_ns.max(duration_ns);
            self.open = None;
        }
    }
}

/// How each process's main-thread dispatches are timed.
#[derive(Debug, Clone, Copy, Default)]
pub struct DispatchRule {
    /// Slow from this long.
    pub threshold_ns: u64,
    /// One frame, for the frame buckets.
    pub frame_interval_ns: u64,
}

/// One traced process.
#[derive(Debug)]
pub struct Process {
    /// Its pid (tgid).
    pub pid: u32,
    /// Its parent's pid (0: unknown).
    pub ppid: u32,
    /// Its executable: the last one it exec'd.
    pub exe: String,
    /// When it was made (fork), or when the session started.
    pub start_ns: u64,
    /// When its last thread exited.
    pub end_ns: Option<u64>,
    /// Its wait status at exit (`exit_code` of the task).
    pub status: Option<u32>,
    /// A child made by a traced process (`--follow`), not a named target.
    pub child: bool,
    /// Execs: when, the new program, and when its functions were probed
    /// (None: nothing in it matched, or already probed from the start).
    pub execs: Vec<Exec>,
    /// Its threads' shadow stacks and its per-function aggregates.
    pub stacks: Stacks,
    /// Its main thread's dispatches.
    pub dispatches: MainDispatches,
}

/// One exec of a traced process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    /// CLOCK_MONOTONIC of the exec.
    pub ts_ns: u64,
    /// The new program (its name, until the agent reads its path).
    pub exe: String,
    /// When probes on the new program's functions were in place, if any
    /// had to be added; its calls before then were not seen.
    pub probed_ns: Option<u64>,
    /// Functions of the new program probed then.
    pub probed: usize,
}

impl Process {
    /// Exit status when it exited normally.
    pub fn exit_code(&self) -> Option<i32> {
        self.status
            .filter(|s| s & 0x7f == 0)
            .map(|s| ((s >> 8) & 0xff) as i32)
    }

    /// The signal that killed it.
    pub fn signal(&self) -> Option<u32> {
        self.status.map(|s| s & 0x7f).filter(|&sig| sig != 0)
    }
}

/// What a process event asks of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcChange {
    /// Nothing more to do.
    None,
    /// Process `pid` exec'd: probe the new program's matching functions.
    Execd(u32),
}

/// Every traced process.
#[derive(Debug, Default)]
pub struct Processes {
    procs: BTreeMap<u32, Process>,
    tid_tgid: HashMap<u32, u32>,
    entry_only: Vec<bool>,
    is_dispatch: Vec<bool>,
    rule: DispatchRule,
    /// Call events of threads whose process is not known (their first
    /// sighting was lost): in the totals, in no process.
    pub unattributed: u64,
}

fn comm_str(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

impl Processes {
    /// State for functions whose entry-only and dispatch flags are these,
    /// main-thread dispatches timed by `rule`.
    pub fn new(entry_only: Vec<bool>, is_dispatch: Vec<bool>, rule: DispatchRule) -> Self {
        Processes {
            entry_only,
            is_dispatch,
            rule,
            ..Default::default()
        }
    }

    fn stacks(&self) -> Stacks {
        let mut s = Stacks::new(self.entry_only.len());
        s.set_entry_only(self.entry_only.clone());
        s
    }

    /// A process the session was told to trace.
    pub fn add_target(&mut self, pid: u32, ppid: u32, exe: String, start_ns: u64) {
        let stacks = self.stacks();
        self.tid_tgid.insert(pid, pid);
        self.procs.insert(
            pid,
            Process {
                pid,
                ppid,
                exe,
                start_ns,
                end_ns: None,
                status: None,
                child: false,
                execs: Vec::new(),
                stacks,
                dispatches: MainDispatches::default(),
            },
        );
    }

    /// Applies a fork, exec or exit.
    pub fn on_proc(&mut self, p: &ProcEvent) -> ProcChange {
        let pid = p.event.tid;
        let ts = p.event.ts_ns;
        match p.event.func() {
            PROC_FORK => {
                let exe = self
                    .procs
                    .get(&p.parent)
                    .map_or_else(|| comm_str(&p.comm), |parent| parent.exe.clone());
                let stacks = self.stacks();
                self.tid_tgid.insert(pid, pid);
                self.procs.insert(
                    pid,
                    Process {
                        pid,
                        ppid: p.parent,
                        exe,
                        start_ns: ts,
                        end_ns: None,
                        status: None,
                        child: true,
                        execs: Vec::new(),
                        stacks,
                        dispatches: MainDispatches::default(),
                    },
                );
                ProcChange::None
            }
            PROC_EXEC => match self.procs.get_mut(&pid) {
                Some(proc_) => {
                    // The exec'ing thread now has the process's pid.
                    self.tid_tgid.insert(pid, pid);
                    proc_.exe = comm_str(&p.comm);
                    proc_.execs.push(Exec {
                        ts_ns: ts,
                        exe: proc_.exe.clone(),
                        probed_ns: None,
                        probed: 0,
                    });
                    ProcChange::Execd(pid)
                }
                None => ProcChange::None,
            },
            PROC_EXIT => {
                if let Some(proc_) = self.procs.get_mut(&pid) {
                    proc_.end_ns = Some(ts);
                    proc_.status = Some(p.code);
                }
                ProcChange::None
            }
            _ => ProcChange::None,
        }
    }

    /// Learns a thread's process from its first sighting.
    pub fn on_comm(&mut self, c: &CommEvent) {
        let tgid = c.event.func();
        if tgid != 0 {
            self.tid_tgid.insert(c.event.tid, tgid);
        }
    }

    /// Applies a call event to its process's stacks.
    #[inline]
    pub fn on_event(&mut self, ev: &Event) {
        let tgid = self.tid_tgid.get(&ev.tid).copied().unwrap_or(ev.tid);
        match self.procs.get_mut(&tgid) {
            Some(p) => {
                p.stacks.on_event(ev);
                if ev.tid == p.pid && !p.stacks.is_entry_only(ev.func()) {
                    p.dispatches.on_call(ev, &self.is_dispatch, &self.rule);
                }
            }
            None => self.unattributed += 1,
        }
    }

    /// The process of thread `tid`, when known.
    pub fn pid_of(&self, tid: u32) -> Option<u32> {
        self.tid_tgid.get(&tid).copied()
    }

    /// The program process `pid` runs now, as the agent read it: its path.
    /// Children it forked since the exec, which had inherited the name
    /// the kernel gave until then, get the path too.
    pub fn set_exe(&mut self, pid: u32, exe: String) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let (old, since) = (p.exe.clone(), p.execs.last().map_or(0, |e| e.ts_ns));
        if let Some(last) = p.execs.last_mut() {
            last.exe = exe.clone();
        }
        p.exe = exe.clone();
        for c in self.procs.values_mut() {
            if c.ppid == pid && c.child && c.execs.is_empty() && c.exe == old && c.start_ns >= since
            {
                c.exe = exe.clone();
            }
        }
    }

    /// Functions were added to the session (after an exec of `pid`, at
    /// `ts_ns`): every process's aggregates grow; `pid`'s exec notes when
    /// its probing started.
    pub fn add_functions(
        &mut self,
        entry_only: &[bool],
        is_dispatch: &[bool],
        pid: u32,
        ts_ns: u64,
    ) {
        self.entry_only.extend_from_slice(entry_only);
        self.is_dispatch.extend_from_slice(is_dispatch);
        for p in self.procs.values_mut() {
            p.stacks.add_functions(entry_only);
        }
        if let Some(last) = self.procs.get_mut(&pid).and_then(|p| p.execs.last_mut()) {
            last.probed_ns = Some(ts_ns);
            last.probed += entry_only.len();
        }
    }

    /// The processes not seen exiting yet.
    pub fn running(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs
            .values()
            .filter(|p| p.end_ns.is_none())
            .map(|p| p.pid)
    }

    /// True once every process traced has exited.
    pub fn all_ended(&self) -> bool {
        !self.procs.is_empty() && self.procs.values().all(|p| p.end_ns.is_some())
    }

    /// Marks every frame still open as unfinished. Call once, at the end.
    pub fn finish(&mut self) {
        for p in self.procs.values_mut() {
            p.stacks.finish();
        }
    }

    /// The processes, by pid.
    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.procs.values()
    }

    /// How many processes.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// True when there are none.
    #[expect(dead_code, reason = "clippy wants it beside len")]
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{KIND_COMM, KIND_ENTRY, KIND_EXIT, KIND_PROC};

    fn proc_ev(ts: u64, pid: u32, what: u32, parent: u32, code: u32) -> ProcEvent {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"work");
        ProcEvent {
            event: Event {
                ts_ns: ts,
                tid: pid,
                word: Event::pack(KIND_PROC, what),
                sp: 0,
            },
            parent,
            code,
            comm,
        }
    }

    fn call(ts: u64, tid: u32, kind: u32, sp: u64) -> Event {
        Event {
            ts_ns: ts,
            tid,
            word: Event::pack(kind, 0),
            sp,
        }
    }

    #[test]
    fn children_get_their_own_sections_and_never_pair_with_the_parent() {
        let rule = DispatchRule {
            threshold_ns: 3,
            frame_interval_ns: 10,
        };
        let mut ps = Processes::new(vec![false], vec![true], rule);
        ps.add_target(100, 1, "/bin/server".into(), 0);
        // The parent enters f, forks inside it; the child returns from f
        // (an orphan in the child), the parent returns too.
        ps.on_event(&call(1, 100, KIND_ENTRY, 1000));
        ps.on_proc(&proc_ev(2, 101, PROC_FORK, 100, 0));
        ps.on_event(&call(3, 101, KIND_EXIT, 1008));
        ps.on_event(&call(4, 100, KIND_EXIT, 1008));
        // A second thread of the child, announced with its tgid.
        ps.on_comm(&CommEvent {
            event: Event {
                ts_ns: 5,
                tid: 150,
                word: Event::pack(KIND_COMM, 101),
                sp: 0,
            },
            comm: [0; 16],
        });
        ps.on_event(&call(6, 150, KIND_ENTRY, 500));
        ps.on_event(&call(7, 150, KIND_EXIT, 508));
        assert_eq!(
            ps.on_proc(&proc_ev(8, 101, PROC_EXEC, 0, 0)),
            ProcChange::Execd(101)
        );
        ps.on_proc(&proc_ev(9, 101, PROC_EXIT, 0, 3 << 8));
        assert!(!ps.all_ended());
        ps.on_proc(&proc_ev(10, 100, PROC_EXIT, 0, 9));
        assert!(ps.all_ended());
        let parent = ps.iter().find(|p| p.pid == 100).unwrap();
        let child = ps.iter().find(|p| p.pid == 101).unwrap();
        // Main threads' dispatches: the parent's f (3 ns, slow); the child's
        // main thread only returned (no dispatch); thread 150 is not main.
        assert_eq!(
            (
                parent.dispatches.stats.count,
                parent.dispatches.slow,
                parent.dispatches.max_ns
            ),
            (1, 1, 3)
        );
        assert_eq!(child.dispatches.stats.count, 0);
        assert_eq!(parent.stacks.funcs[0].calls, 1);
        assert_eq!(parent.stacks.funcs[0].total_ns, 3);
        assert_eq!(parent.stacks.orphan_exits(), 0);
        assert_eq!(child.stacks.funcs[0].calls, 1);
        assert_eq!(child.stacks.orphan_exits(), 1);
        assert_eq!(
            (child.ppid, child.start_ns, child.end_ns),
            (100, 2, Some(9))
        );
        assert_eq!((child.exit_code(), child.signal()), (Some(3), None));
        assert_eq!((parent.exit_code(), parent.signal()), (None, Some(9)));
        assert_eq!(child.exe, "work");
        assert_eq!(child.execs.len(), 1);
        // The agent reads the exec'd program's path: the exec and the
        // children forked since (with the kernel's name until then) get it.
        ps.on_proc(&proc_ev(11, 102, PROC_FORK, 101, 0));
        ps.set_exe(101, "/bin/work".into());
        let child = ps.iter().find(|p| p.pid == 101).unwrap();
        assert_eq!(
            (child.exe.as_str(), child.execs[0].exe.as_str()),
            ("/bin/work", "/bin/work")
        );
        assert_eq!(ps.iter().find(|p| p.pid == 102).unwrap().exe, "/bin/work");
        assert_eq!(ps.unattributed, 0);
    }

    #[test]
    fn unknown_threads_are_counted_unattributed() {
        let mut ps = Processes::new(vec![false], vec![true], DispatchRule::default());
        ps.add_target(100, 1, "x".into(), 0);
        ps.on_event(&call(1, 777, KIND_ENTRY, 0));
        assert_eq!(ps.unattributed, 1);
    }
}
