//! Who woke the watched thread in each blocked interval of a slow
//! dispatch, and what that waker was doing meanwhile.
//!
//! The kernel names the waking task at `sched_waking` (a [`WakeRec`]) and,
//! while the watched thread is blocked in a dispatch, samples the target's
//! other threads ([`PeerRec`]). Here each blocked interval gets its waker,
//! classified from the waker's kernel stack and flags (another thread of
//! the target, another process, an interrupt, a kernel thread), and the
//! waker's samples inside the interval are credited to it, one sample
//! period each.
use std::collections::HashMap;

use serde::Serialize;

use super::{
    frames,
    tree::{pct, Kind, Tree},
};
use crate::symbolize::Symbolizer;

/// A wake-up of the watched thread while it was blocked in a dispatch.
#[derive(Debug, Clone)]
pub struct WakeRec {
    /// When (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The waking task (in an interrupt: the task it interrupted).
    pub tid: u32,
    /// Its process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// It had no user-mode state (a kernel thread, or the idle task).
    pub kernel_thread: bool,
    /// Its user stack, innermost first.
    pub user: Box<[u64]>,
    /// Its kernel stack, innermost first.
    pub kernel: Box<[u64]>,
    /// It woke the thread out of its loop's own wait (the kernel's
    /// `WAKER_LOOP`): the source of the next iteration.
    pub loop_wake: bool,
}

/// A sample of another thread of the target while the watched thread was
/// blocked in a dispatch.
#[derive(Debug, Clone)]
pub struct PeerRec {
    /// When.
    pub ts_ns: u64,
    /// The sampled thread.
    pub tid: u32,
    /// Its user stack, innermost first.
    pub user: Box<[u64]>,
}

/// What kind of task woke the watched thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WakerKind {
    /// Another thread of the target.
    Thread,
    /// Another process (a pipe, a socket, a signal…).
    Process,
    /// An interrupt handler (a timer, a device).
    Irq,
    /// A kernel thread (ksoftirqd, a kworker…).
    Kernel,
}

/// One waker of a slow dispatch, over all the intervals it ended.
#[derive(Debug, Clone)]
pub struct Waker {
    /// Thread, process, interrupt or kernel thread.
    pub kind: WakerKind,
    /// `timer`, `I/O completion`, `softirq` or `interrupt`, from the
    /// kernel stack of the wake-up, when it says so.
    pub label: Option<&'static str>,
    /// Its thread id (0 for an interrupt).
    pub tid: u32,
    /// Its process id (0 for an interrupt).
    pub pid: u32,
    /// Its name (empty for an interrupt).
    pub comm: String,
    /// Time the watched thread was blocked in the intervals it ended.
    pub blocked_ns: u64,
    /// Its stack at the (first) wake-up, innermost first: user frames for
    /// a thread or process, kernel frames (`_[k]`) otherwise.
    pub stack: Vec<String>,
    /// Its sampled on-CPU time inside those intervals (same process only).
    pub on_cpu_ns: u64,
    /// Where it woke us: `function <- caller`, the first frames of its
    /// stack outside the C library and the kernel; for an interrupt or
    /// kernel thread, its label.
    pub function: String,
    /// Its most sampled innermost frame meanwhile.
    pub hot: Option<String>,
    /// When it woke us, since the session began.
    pub wakes_ns: Vec<u64>,
}

impl Waker {
    /// `worker-1 (tid 123)`, `process helper (pid 9)`, `a timer interrupt`,
    /// `an I/O completion interrupt`.
    pub fn who(&self) -> String {
        match self.kind {
            WakerKind::Thread => format!("{} (tid {})", self.comm, self.tid),
            WakerKind::Process => format!("process {} (pid {})", self.comm, self.pid),
            WakerKind::Irq => match self.label.unwrap_or("interrupt") {
                "interrupt" => "an interrupt".to_string(),
                l if l.starts_with(['I', 'a', 'e', 'i', 'o', 'u']) => format!("an {l} interrupt"),
                l => format!("a {l} interrupt"),
            },
            WakerKind::Kernel => match self.label {
                Some(l) => format!("{l} in kernel thread {}", self.comm),
                None => format!("kernel thread {}", self.comm),
            },
        }
    }
}

/// One blocked interval of the watched thread.
#[derive(Debug, Clone)]
pub struct Interval {
    /// The tree node the blocked chain ends at.
    pub node: usize,
    /// Switched out.
    pub out_ns: u64,
    /// Woken (or switched back in).
    pub end_ns: u64,
    /// Who woke it, if named.
    pub waker: Option<WakeRec>,
}

/// Kernel frames that mean "in a hardware interrupt".
const HARDIRQ: &[&str] = &[
    "asm_sysvec_",
    "asm_common_interrupt",
    "sysvec_",
    "__sysvec_",
    "common_interrupt",
];
const TIMER: &[&str] = &[
    "hrtimer_wakeup",
    "__hrtimer_run_queues",
    "hrtimer_interrupt",
    "process_timeout",
    "call_timer_fn",
    "__run_timers",
];
const IO: &[&str] = &[
    "blk_mq_end_request",
    "__blk_mq_end_request",
    "blk_mq_complete_request",
    "blk_update_request",
    "bio_endio",
    "end_buffer_async",
    "nvme_irq",
    "vring_interrupt",
    "scsi_io_completion",
];
const SOFTIRQ: &[&str] = &["handle_softirqs", "__do_softirq", "run_ksoftirqd"];

fn has(frames: &[String], names: &[&str]) -> bool {
    frames.iter().any(|f| {
        let f = f.strip_suffix("_[k]").unwrap_or(f);
        names.iter().any(|n| {
            if n.ends_with('_') {
                f.starts_with(n)
            } else {
                f == *n
            }
        })
    })
}

/// The kind and label of a wake-up from its kernel frames.
pub fn classify(
    kernel: &[String],
    kernel_thread: bool,
    pid: u32,
    target: u32,
) -> (WakerKind, Option<&'static str>) {
    let label = if has(kernel, TIMER) {
        Some("timer")
    } else if has(kernel, IO) {
        Some("I/O completion")
    } else if has(kernel, SOFTIRQ) {
        Some("softirq")
    } else {
        None
    };
    if has(kernel, HARDIRQ) {
        return (WakerKind::Irq, label.or(Some("interrupt")));
    }
    if kernel_thread || pid == 0 {
        return (WakerKind::Kernel, label);
    }
    let kind = if pid == target {
        WakerKind::Thread
    } else {
        WakerKind::Process
    };
    (kind, label)
}

/// Where a waker woke us, named from its user stack (innermost first) by
/// names only, never a raw address: `function <- caller`, the first two
/// frames of the program's own ([`frames::is_own`]: not the C library's,
/// the loader's or a runtime's); else its first named frame (`write`);
/// else the system call its kernel stack is in (`exit_group`: a process
/// whose memory is already gone can have no named user frame); else its
/// first frame as `module+0xoffset` ([`frames::key_name`]).
pub fn function_of(stack: &[String], kernel: &[String]) -> String {
    let under = frames::under_python(stack);
    let own: Vec<&String> = stack
        .iter()
        .zip(&under)
        .filter(|(f, &u)| frames::is_own_in(f, u))
        .map(|(f, _)| f)
        .collect();
    match own.as_slice() {
        [f, caller, ..] => {
            return format!("{} <- {}", frames::key_name(f), frames::key_name(caller))
        }
        [f] => return frames::key_name(f),
        [] => {}
    }
    if let Some(f) = stack.iter().find(|f| !frames::is_unnamed(f)) {
        return frames::key_name(f);
    }
    if let Some(sc) = syscall_of(kernel) {
        return sc;
    }
    stack
        .first()
        .map_or_else(|| "?".into(), |f| frames::key_name(f))
}

/// The waker as a group key holds it: where it woke us when that is in
/// frames of its program's own (`flush_to_disk <- save_all`), else who it
/// is (`process sh`, `thread worker-1`), else its label (`timer`). A
/// process caught exiting or exec'ing has no frame of its own to name, and
/// which C library or loader frame it is caught in varies from one
/// wake-up to the next: its name does not.
pub fn key_of(w: &Waker) -> String {
    let own = w.stack.iter().any(|f| frames::is_own(f));
    match w.kind {
        WakerKind::Thread if !own => format!("thread {}", w.comm),
        WakerKind::Process if !own => format!("process {}", w.comm),
        _ => w.function.clone(),
    }
}

/// The system call a blocked kernel stack is in (`futex`, `read`…).
pub fn syscall_of(kernel: &[String]) -> Option<String> {
    kernel.iter().find_map(|f| {
        let f = f.strip_suffix("_[k]").unwrap_or(f);
        [
            "__x64_sys_",
            "__do_sys_",
            "__se_sys_",
            "__ia32_sys_",
            "ksys_",
        ]
        .iter()
        .find_map(|p| f.strip_prefix(p))
        .map(str::to_string)
    })
}

/// Most wake-up edges kept per waker (for the timeline's flow arrows).
const MAX_WAKES: usize = 64;

/// Names the waker of every interval, hangs `[waited for: …]` nodes (with
/// the waker's samples under them) in `tree`, and returns the wakers,
/// most blocked time first.
pub fn attach(
    sym: &mut Symbolizer,
    tree: &mut Tree,
    intervals: &[Interval],
    peers: &[PeerRec],
    target: u32,
    period_ns: u64,
    session_start_ns: u64,
) -> Vec<Waker> {
    let mut wakers: Vec<Waker> = Vec::new();
    let mut index: HashMap<(WakerKind, u32, &'static str), usize> = HashMap::new();
    let mut hot: Vec<HashMap<String, u64>> = Vec::new();
    for iv in intervals {
        let Some(w) = &iv.waker else { continue };
        let blocked = iv.end_ns.saturating_sub(iv.out_ns);
        let kernel = sym.kernel_stack(&w.kernel);
        let (kind, label) = classify(&kernel, w.kernel_thread, w.pid, target);
        let tid = match kind {
            WakerKind::Irq => 0,
            _ => w.tid,
        };
        let key = (kind, tid, label.unwrap_or(""));
        let at = *index.entry(key).or_insert_with(|| {
            wakers.push(named(sym, w, &kernel, kind, label));
            hot.push(HashMap::new());
            wakers.len() - 1
        });
        let waker = &mut wakers[at];
        waker.blocked_ns += blocked;
        if waker.wakes_ns.len() < MAX_WAKES {
            waker
                .wakes_ns
                .push(w.ts_ns.saturating_sub(session_start_ns));
        }
        let node_name = format!("[waited for: {}]", waker.who());
        let node = tree.add_chain(iv.node, &[node_name], Kind::Waker, blocked);
        if kind != WakerKind::Thread {
            continue;
        }
        for p in peers
            .iter()
            .filter(|p| p.tid == w.tid && p.ts_ns >= iv.out_ns && p.ts_ns <= iv.end_ns)
        {
            let names: Vec<String> = sym
                .user_stack(&p.user)
                .iter()
                .map(|n| frames::display(n).into_owned())
                .collect();
            // Where it was: its innermost frame of its own (not the C
            // library's, nor a clock read's).
            let under = frames::under_python(&names);
            let own = names
                .iter()
                .zip(&under)
                .find(|(f, &u)| frames::is_own_in(f, u))
                .map(|(f, _)| f);
            if let Some(top) = own.or(names.first()) {
                *hot[at].entry(frames::key_name(top)).or_default() += 1;
            }
            let chain: Vec<String> = names.into_iter().rev().collect();
            tree.add_chain(node, &chain, Kind::Waker, period_ns);
            wakers[at].on_cpu_ns += period_ns;
        }
    }
    for (w, h) in wakers.iter_mut().zip(hot) {
        w.hot = h
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(name, _)| name);
    }
    wakers.sort_by(|a, b| {
        b.blocked_ns
            .cmp(&a.blocked_ns)
            .then_with(|| a.tid.cmp(&b.tid))
    });
    wakers
}

/// The waker `w`, named: its kind and label from its kernel stack
/// (`kernel`, named), its stack (user frames for a thread or process,
/// kernel frames otherwise) and where it woke us; no time yet.
fn named(
    sym: &mut Symbolizer,
    w: &WakeRec,
    kernel: &[String],
    kind: WakerKind,
    label: Option<&'static str>,
) -> Waker {
    let (tid, pid, comm) = match kind {
        WakerKind::Irq => (0, 0, String::new()),
        _ => (w.tid, w.pid, w.comm.clone()),
    };
    let stack: Vec<String> = match kind {
        WakerKind::Thread | WakerKind::Process if !w.user.is_empty() => sym
            .frames(w.pid, &w.user)
            .into_iter()
            .map(|mut f| frames::display(&f.swap_remove(0)).into_owned())
            .collect(),
        // Without the profiler's own frames (its program, the
        // tracepoint's runner).
        _ => kernel
            .iter()
            .skip_while(|f| f.starts_with("bpf_"))
            .cloned()
            .collect(),
    };
    let function = match kind {
        WakerKind::Thread | WakerKind::Process => function_of(&stack, kernel),
        _ => label.unwrap_or("kernel").to_string(),
    };
    Waker {
        kind,
        label,
        tid,
        pid,
        comm,
        blocked_ns: 0,
        stack,
        on_cpu_ns: 0,
        function,
        hot: None,
        wakes_ns: Vec::new(),
    }
}

/// The source of an iteration: who woke the loop out of its wait before
/// it (`w`, flagged `loop_wake`), named as a waker; `wakes_ns` holds when,
/// since the session began, and its `blocked_ns` is 0.
pub fn source(sym: &mut Symbolizer, w: &WakeRec, target: u32, session_start_ns: u64) -> Waker {
    let kernel = sym.kernel_stack(&w.kernel);
    let (kind, label) = classify(&kernel, w.kernel_thread, w.pid, target);
    let mut waker = named(sym, w, &kernel, kind, label);
    waker
        .wakes_ns
        .push(w.ts_ns.saturating_sub(session_start_ns));
    waker
}

/// `a timer interrupt`, `Tk notifier (tid 7) in NotifierThreadProc`: an
/// iteration's source in words.
pub fn source_text(w: &Waker) -> String {
    match w.kind {
        WakerKind::Thread | WakerKind::Process => format!("{} in {}", w.who(), w.function),
        _ => w.who(),
    }
}

/// `, woken by worker-1 (tid 7) in flush_to_disk <- save_all; it was
/// on-CPU 95% of that time in compress_block`: the verdict's tail naming
/// the chain. `sampling` says whether other threads were sampled.
pub fn chain_text(w: &Waker, sampling: bool) -> String {
    let mut s = format!(", woken by {}", w.who());
    match w.kind {
        WakerKind::Thread | WakerKind::Process => {
            s.push_str(&format!(" in `{}`", w.function));
        }
        _ => {}
    }
    if w.kind == WakerKind::Thread && sampling {
        s.push_str(&format!(
            "; it was on-CPU {}% of that time",
            pct(w.on_cpu_ns, w.blocked_ns)
        ));
        if let Some(h) = &w.hot {
            s.push_str(&format!(" in `{h}`"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn wakeups_are_classified_by_their_kernel_stack() {
        let timer = names(&[
            "try_to_wake_up_[k]",
            "hrtimer_wakeup_[k]",
            "__hrtimer_run_queues_[k]",
            "hrtimer_interrupt_[k]",
            "__sysvec_apic_timer_interrupt_[k]",
            "asm_sysvec_apic_timer_interrupt_[k]",
        ]);
        assert_eq!(
            classify(&timer, true, 0, 5),
            (WakerKind::Irq, Some("timer"))
        );
        let futex = names(&[
            "try_to_wake_up_[k]",
            "wake_up_q_[k]",
            "futex_wake_[k]",
            "__x64_sys_futex_[k]",
        ]);
        assert_eq!(classify(&futex, false, 5, 5), (WakerKind::Thread, None));
        assert_eq!(classify(&futex, false, 9, 5), (WakerKind::Process, None));
        let ksoftirqd = names(&[
            "try_to_wake_up_[k]",
            "handle_softirqs_[k]",
            "run_ksoftirqd_[k]",
        ]);
        assert_eq!(
            classify(&ksoftirqd, true, 15, 5),
            (WakerKind::Kernel, Some("softirq"))
        );
        assert_eq!(syscall_of(&futex).as_deref(), Some("futex"));
        let irq = |label| Waker {
            kind: WakerKind::Irq,
            label: Some(label),
            tid: 0,
            pid: 0,
            comm: String::new(),
            blocked_ns: 0,
            stack: Vec::new(),
            on_cpu_ns: 0,
            function: label.into(),
            hot: None,
            wakes_ns: Vec::new(),
        };
        assert_eq!(irq("timer").who(), "a timer interrupt");
        assert_eq!(irq("I/O completion").who(), "an I/O completion interrupt");
        assert_eq!(irq("interrupt").who(), "an interrupt");
    }

    #[test]
    fn the_waker_function_skips_the_c_library() {
        let stack = names(&[
            "__GI___lll_unlock_wake",
            "pthread_mutex_unlock",
            "flush_to_disk",
            "save_all",
            "worker_main",
            "start_thread",
        ]);
        assert_eq!(function_of(&stack, &[]), "flush_to_disk <- save_all");
        assert_eq!(function_of(&names(&["write"]), &[]), "write");
    }

    /// A waker's name is never a raw address: its nearest named frame, or
    /// its system call (a process exiting has no user memory left to name
    /// its frames from), or its frame's module and offset.
    #[test]
    fn the_waker_function_is_never_a_raw_address() {
        let exiting = names(&["[unknown] 0x7f37665f0409"]);
        let kernel = names(&[
            "__wake_up_parent_[k]",
            "do_notify_parent_[k]",
            "do_exit_[k]",
            "do_group_exit_[k]",
            "__x64_sys_exit_group_[k]",
        ]);
        assert_eq!(function_of(&exiting, &kernel), "exit_group");
        // Another run, another address: the same name.
        let again = names(&["[unknown] 0x7efc49d94409"]);
        assert_eq!(function_of(&again, &kernel), "exit_group");
        assert_eq!(function_of(&again, &[]), "[unknown]");
        let waker = |stack: &[&str], function: &str| Waker {
            kind: WakerKind::Process,
            label: None,
            tid: 9,
            pid: 9,
            comm: "sh".into(),
            blocked_ns: 0,
            stack: names(stack),
            on_cpu_ns: 0,
            function: function.into(),
            hot: None,
            wakes_ns: Vec::new(),
        };
        // Caught in the loader, or exiting with no memory left: one key.
        assert_eq!(key_of(&waker(&["_start"], "_start")), "process sh");
        assert_eq!(
            key_of(&waker(&["[unknown] 0x7f37665f0409"], "exit_group")),
            "process sh"
        );
        assert_eq!(
            key_of(&waker(
                &["write", "write_reply", "main"],
                "write_reply <- main"
            )),
            "write_reply <- main"
        );
        let unnamed = names(&["[unknown] libfoo.so+0x1a2", "[unknown] 0x5"]);
        assert_eq!(function_of(&unnamed, &[]), "libfoo.so+0x1a2");
        // The nearest named frame, past unnamed ones and the C library.
        let mixed = names(&[
            "[unknown] 0x7f0000001000",
            "__GI___libc_write",
            "JS:~reply /srv/app.js:4:9",
            "JS:*emit node:events:514:28",
            "JS:^onData /srv/app.js:20:3",
        ]);
        assert_eq!(
            function_of(&mixed, &kernel),
            "JS:reply /srv/app.js:4:9 <- JS:onData /srv/app.js:20:3"
        );
    }

    #[test]
    fn samples_inside_the_interval_are_credited_to_its_waker() {
        let mut sym = Symbolizer::offline(
            5,
            [
                (5, 0x10, vec!["compress_block".to_string()]),
                (5, 0x1f, vec!["flush_to_disk".to_string()]),
                (5, 0x2f, vec!["save_all".to_string()]),
                (5, 0x40, vec!["other".to_string()]),
                (5, 0x50, vec!["pthread_mutex_unlock".to_string()]),
            ],
        );
        let mut tree = Tree::new("dispatch");
        let blocked = tree.add_chain(0, &["__lll_lock_wait".into()], Kind::Blocked, 100);
        let waker = WakeRec {
            loop_wake: false,
            ts_ns: 1100,
            tid: 7,
            pid: 5,
            comm: "worker-1".into(),
            kernel_thread: false,
            user: Box::new([0x50, 0x20, 0x30]),
            kernel: Box::new([]),
        };
        let iv = Interval {
            node: blocked,
            out_ns: 1000,
            end_ns: 1100,
            waker: Some(waker),
        };
        let sample = |ts_ns, tid, user: &[u64]| PeerRec {
            ts_ns,
            tid,
            user: user.into(),
        };
        let peers = [
            sample(1010, 7, &[0x10, 0x20, 0x30]),
            sample(1020, 7, &[0x10, 0x20, 0x30]),
            sample(1030, 8, &[0x40]),
            sample(1200, 7, &[0x10, 0x20, 0x30]),
        ];
        let w = attach(&mut sym, &mut tree, &[iv], &peers, 5, 10, 0);
        assert_eq!(w.len(), 1);
        let w = &w[0];
        assert_eq!(
            (w.kind, w.tid, w.blocked_ns, w.on_cpu_ns),
            (WakerKind::Thread, 7, 100, 20)
        );
        assert_eq!(w.function, "flush_to_disk <- save_all");
        assert_eq!(w.hot.as_deref(), Some("compress_block"));
        assert_eq!(w.wakes_ns, [1100]);
        let flat = tree.full();
        let node = flat
            .iter()
            .find(|n| n.name == "[waited for: worker-1 (tid 7)]")
            .expect("a waited-for node");
        assert_eq!((node.kind, node.total_ns), (Kind::Waker, 100));
        assert!(flat
            .iter()
            .any(|n| n.name == "compress_block" && n.kind == Kind::Waker && n.total_ns == 20));
        assert_eq!(
            chain_text(w, true),
            ", woken by worker-1 (tid 7) in `flush_to_disk <- save_all`; it was on-CPU 20% of that time in `compress_block`"
        );
    }
}
