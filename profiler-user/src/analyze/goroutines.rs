//! Go calls, keyed by goroutine. Goroutines move between threads and their
//! stacks move when they grow, so the kernel reports each Go entry and exit
//! with the goroutine (`g`) and the depth below its stack's top
//! ([`GoEvent`]). Here each goroutine gets a stable pseudo thread id, above
//! any real one, so the shadow stacks pair its calls like a thread's.
//!
//! When a goroutine's stack must grow at a function's prologue, Go copies
//! the stack and runs that function again from its first instruction: the
//! entry probe fires twice for one call, at the same depth, with nothing
//! probed in between. The second entry is dropped.
use std::collections::HashMap;

use profiler_common::{Event, GoEvent, KIND_ENTRY, KIND_EXIT, KIND_GO_ENTRY};

/// Pseudo thread ids of goroutines start here (Linux thread ids stay
/// below 2^22).
pub const GOROUTINE_TID_BASE: u32 = 1 << 31;

/// True for a goroutine's pseudo thread id.
pub fn is_goroutine(tid: u32) -> bool {
    tid >= GOROUTINE_TID_BASE
}

#[derive(Debug, Clone, Copy)]
struct Goroutine {
    tid: u32,
    /// The last event was an entry of this function at this depth.
    last_entry: Option<(u32, u64)>,
}

/// Pseudo thread ids by goroutine.
#[derive(Debug, Default)]
pub struct Goroutines {
    ids: HashMap<u64, Goroutine>,
}

impl Goroutines {
    /// The plain event for a Go event (its thread id is the goroutine's
    /// pseudo id), or None for the repeated entry of a stack-growth restart;
    /// and whether the goroutine is new.
    pub fn event(&mut self, g: &GoEvent) -> (Option<Event>, bool) {
        let next = GOROUTINE_TID_BASE + self.ids.len() as u32;
        let mut new = false;
        let state = self.ids.entry(g.goroutine).or_insert_with(|| {
            new = true;
            Goroutine {
                tid: next,
                last_entry: None,
            }
        });
        let func = g.event.func();
        let entry = g.event.kind() == KIND_GO_ENTRY;
        if entry && state.last_entry == Some((func, g.event.sp)) {
            return (None, new);
        }
        state.last_entry = entry.then_some((func, g.event.sp));
        let ev = Event {
            ts_ns: g.event.ts_ns,
            tid: state.tid,
            word: Event::pack(if entry { KIND_ENTRY } else { KIND_EXIT }, func),
            sp: g.event.sp,
        };
        (Some(ev), new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::KIND_GO_EXIT;

    fn go(g: u64, tid: u32, kind: u32, func: u32, sp: u64) -> GoEvent {
        GoEvent {
            event: Event {
                ts_ns: 1,
                tid,
                word: Event::pack(kind, func),
                sp,
            },
            goroutine: g,
        }
    }

    #[test]
    fn goroutines_keep_their_id_across_threads() {
        let mut gs = Goroutines::default();
        let a = gs.event(&go(0xa0, 7, KIND_GO_ENTRY, 1, 100)).0.unwrap();
        let b = gs.event(&go(0xb0, 7, KIND_GO_ENTRY, 1, 100)).0.unwrap();
        let a2 = gs.event(&go(0xa0, 8, KIND_GO_EXIT, 1, 108)).0.unwrap();
        assert_eq!(a.tid, a2.tid);
        assert_ne!(a.tid, b.tid);
        assert!(is_goroutine(a.tid) && is_goroutine(b.tid));
        assert_eq!((a.kind(), a2.kind()), (KIND_ENTRY, KIND_EXIT));
        assert_eq!(gs.ids.len(), 2);
    }

    #[test]
    fn stack_growth_restart_is_one_entry() {
        let mut gs = Goroutines::default();
        assert!(gs.event(&go(0xa0, 7, KIND_GO_ENTRY, 3, 500)).0.is_some());
        assert!(gs.event(&go(0xa0, 7, KIND_GO_ENTRY, 3, 500)).0.is_none());
        // A deeper call of the same function is a real call.
        assert!(gs.event(&go(0xa0, 7, KIND_GO_ENTRY, 3, 400)).0.is_some());
        assert!(gs.event(&go(0xa0, 7, KIND_GO_EXIT, 3, 408)).0.is_some());
        // So is a new call at the same depth after a return.
        assert!(gs.event(&go(0xa0, 7, KIND_GO_EXIT, 3, 508)).0.is_some());
        assert!(gs.event(&go(0xa0, 7, KIND_GO_ENTRY, 3, 500)).0.is_some());
    }
}
