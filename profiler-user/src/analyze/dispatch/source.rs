//! The source of an iteration: who woke the loop out of the wait before
//! it (issue 44). For a loop that waits on a futex (Tcl's notifier, the
//! Java event thread, a queue's consumer) it is the thread that posted the
//! work: the notifier, the toolkit's thread, a producer; for one that
//! waits on descriptors, the interrupt or process behind the event.
//!
//! The kernel writes a waker record flagged `WAKER_LOOP` when the watched
//! thread is woken while idle in its loop's wait. That record comes from
//! the waker's CPU, the wait's return from the watched thread's: either
//! may be read first, so each looks for the other.
use super::{wakers::WakeRec, Dispatcher, Rec};

/// How long before an iteration's start its loop's wake-up may be: a
/// wake-up older than that ended some other wait.
const MAX_WAKE_TO_START_NS: u64 = 1_000_000_000;

impl Dispatcher {
    /// A wake-up of the watched thread while it was idle in its loop's
    /// wait: the source of the iteration it starts. (One an iteration: the
    /// kernel walks the user stack of the target's own threads alone, and
    /// no other process's mappings are read for it.)
    pub(super) fn on_loop_waker(&mut self, w: WakeRec) {
        let w = Box::new(w);
        match &self.open {
            // Read after the return it caused (another CPU's ring).
            Some(open)
                if !open.sourced
                    && w.ts_ns <= open.start_ns
                    && open.start_ns - w.ts_ns <= MAX_WAKE_TO_START_NS =>
            {
                self.record(Rec::Source(w));
                if let Some(open) = &mut self.open {
                    open.sourced = true;
                }
            }
            // A wake-up out of a later wait, whose entry (ending this
            // iteration) is yet to be read; or no iteration open.
            _ => self.loop_source = Some(w),
        }
    }

    /// Gives the iteration just begun at `start_ns` the loop's last
    /// wake-up, if that came before it.
    pub(super) fn take_source(&mut self, start_ns: u64) {
        let Some(w) = self.loop_source.take() else {
            return;
        };
        if w.ts_ns > start_ns {
            // Out of a later wait: the next iteration's.
            self.loop_source = Some(w);
            return;
        }
        if start_ns - w.ts_ns > MAX_WAKE_TO_START_NS {
            return;
        }
        self.record(Rec::Source(w));
        if let Some(open) = &mut self.open {
            open.sourced = true;
        }
    }
}
