//! What the dispatcher tells: a slow dispatch explained ([`Slow`], and
//! [`Streamed`] for a session that tells each as it happens), a hang
//! ([`Hang`]), and the notices to hear of at once ([`Notice`]).

use super::{sched, tree::FlatNode, wakers};

/// A slow dispatch, explained.
#[derive(Debug, Clone)]
pub struct Slow {
    /// Ordinal among all dispatches.
    pub index: u64,
    /// Start, since the session began.
    pub start_ns: u64,
    /// Wall time.
    pub duration_ns: u64,
    /// On-CPU / blocked / runnable split.
    pub split: sched::Split,
    /// `duration / frame interval`.
    pub dropped_frames: u64,
    /// Group key.
    pub key: String,
    /// One-line verdict.
    pub verdict: String,
    /// Samples taken during it.
    pub samples: u32,
    /// Trimmed (or full) tree, pre-order.
    pub tree: Vec<FlatNode>,
    /// Top blocking stacks: time blocked and frames (innermost first).
    pub blocking_stacks: Vec<(u64, Vec<String>)>,
    /// True if the record buffer overflowed.
    pub truncated: bool,
    /// Who woke it in its blocked intervals, most blocked time first.
    pub wakers: Vec<wakers::Waker>,
    /// Who woke the loop out of its wait before it (iterations bounded by
    /// the loop's waits, wakers recorded, and the wait blocked).
    pub source: Option<wakers::Waker>,
    /// Frames closed when the overhead governor detached their function
    /// (their return could not be seen); when the dispatch function's own
    /// frame is one, the dispatch ended at the detach.
    pub detached_frames: u32,
    /// The probes' cost taken out of `duration_ns` (measured: the sum).
    pub probe_ns: u64,
    /// Its wall time was over the threshold, `duration_ns` is not: slow
    /// mainly because of the probes (their estimated cost). Still slow.
    pub probes_mainly: bool,
}

/// A dispatch that ran longer than `--hang`, reported while running.
#[derive(Debug, Clone)]
pub struct Hang {
    /// Ordinal among all dispatches.
    pub index: u64,
    /// Start, since the session began.
    pub start_ns: u64,
    /// How long it had run when reported.
    pub reported_after_ns: u64,
    /// Final duration, once it ended.
    pub duration_ns: Option<u64>,
    /// Stack when reported, innermost first.
    pub stack: Vec<String>,
}

/// A hang's stack as told, innermost first; one that has none says why.
pub fn hang_stack_text(stack: &[String]) -> String {
    if stack.is_empty() {
        "no traced call open, and no sample or blocked stack of it yet".into()
    } else {
        stack.join(" <- ")
    }
}

/// A slow dispatch as it was explained, for a session that tells each one
/// as it happens (`watch`).
#[derive(Debug, Clone)]
pub struct Streamed {
    /// The report entry.
    pub slow: Slow,
    /// Folded stacks of its full tree.
    pub folded: Vec<String>,
}

/// What the dispatcher noticed that the user should hear of at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A dispatch ended slow.
    Slow {
        /// Its wall time.
        duration_ns: u64,
        /// Its group key.
        key: String,
        /// Its one-line verdict.
        verdict: String,
    },
    /// A dispatch ended that was not the program's own stall: the process
    /// was stopped or traced, or the system suspended, while it ran
    /// ([`Dispatcher::not_the_programs`](super::Dispatcher::not_the_programs)). Neither slow nor counted.
    Excluded {
        /// Start, since the session began.
        start_ns: u64,
        /// Its wall time.
        duration_ns: u64,
        /// Why, in words.
        reason: String,
    },
    /// A line to tell as it is (what the dispatcher decided).
    Note(String),
    /// A dispatch has run past `--hang` and is still running.
    Hang {
        /// Ordinal among all dispatches.
        index: u64,
        /// The watched thread.
        tid: u32,
        /// How long it had run when noticed.
        running_ns: u64,
        /// Its stack then, innermost first.
        stack: Vec<String>,
    },
}
