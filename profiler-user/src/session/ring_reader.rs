//! Reads the kernel-to-agent rings ([`EventRing`]s: one per CPU, or one
//! shared). One epoll descriptor watches them all, so the collector waits
//! on a single readiness. With several rings their records go through
//! [`Merge`], so the sinks (and `profile.data`) see them in timestamp
//! order; a single ring is read straight through, in ring order.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::{
    attach::rings::EventRing,
    clock::monotonic_ns,
    session::ring_merge::{ts_of, Merge, SLACK_NS},
    Error, Result,
};

/// The rings of a session.
pub struct Rings {
    rings: Vec<EventRing>,
    /// Readable when any ring has records ready.
    epoll: OwnedFd,
    /// Several rings: their merge.
    merge: Option<Merge>,
    /// The ring that had the most records in the last drain: read last, so
    /// its records can go out without a copy (see [`Merge::push_or_hand_out`]).
    busiest: usize,
    /// The last drain left records behind (see [`Rings::drain`]).
    more: bool,
}

/// The most records a live [`Rings::drain`] takes from one ring: about
/// 50 ms of the agent's work on a current machine.
pub const DRAIN_BUDGET: usize = 1 << 16;

impl Rings {
    /// Watches `rings` (at least one).
    pub fn new(rings: Vec<EventRing>) -> Result<Self> {
        let io = |what: &str, e: std::io::Error| Error::io(what.to_string(), e);
        if rings.is_empty() {
            return Err(Error::Load("no event ring".into()));
        }
        // SAFETY: epoll_create1 with a valid flag; the fd is ours.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io(
                "creating an epoll descriptor",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a new descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        for (i, r) in rings.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: both descriptors are open; `ev` lives across the call.
            let rc = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    r.ring.as_raw_fd(),
                    &mut ev,
                )
            };
            if rc < 0 {
                return Err(io(
                    "polling the event rings",
                    std::io::Error::last_os_error(),
                ));
            }
        }
        let merge = (rings.len() > 1).then(|| Merge::new(rings.len()));
        Ok(Rings {
            rings,
            epoll,
            merge,
            busiest: 0,
            more: false,
        })
    }

    /// The descriptor that turns readable when records are ready.
    pub fn poll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Reads every ring and hands records to `f`: with one ring, all of
    /// them in ring order; with several, merged, those older than the
    /// watermark (all of them with `flush`, once no more can come). The
    /// busiest ring of the last drain is read last, its records handed out
    /// as they are read where the merge allows, the others' held first.
    /// Returns the time up to which records were handed out (None: all
    /// that were read, live).
    ///
    /// Live, each ring gives at most [`DRAIN_BUDGET`] records a call, so a
    /// target that writes faster than the agent reads (software emulation,
    /// thousands of probes) cannot keep the collector here past its
    /// deadline or a Ctrl-C; [`Rings::more`] then says records are left,
    /// and the watermark stops at the last record read from a ring cut
    /// short (its unread records are newer), so the merge stays in order.
    pub fn drain(&mut self, flush: bool, mut f: impl FnMut(&[u8])) -> Option<u64> {
        let budget = match flush {
            true => usize::MAX,
            false => DRAIN_BUDGET,
        };
        self.more = false;
        let Some(merge) = &mut self.merge else {
            let ring = &mut self.rings[0].ring;
            let mut last = None;
            for _ in 0..budget {
                // Emptied: all read, live.
                let item = ring.next()?;
                last = Some(ts_of(&item));
                f(&item);
            }
            // Cut short: handed out up to the last record read.
            self.more = true;
            return last;
        };
        let start = monotonic_ns();
        let mut watermark = match flush {
            true => u64::MAX,
            false => start.saturating_sub(SLACK_NS),
        };
        let last = self.busiest;
        let mut most = (0, last);
        for (i, r) in self.rings.iter_mut().enumerate() {
            if i == last {
                continue;
            }
            let (mut n, mut last_ts) = (0, 0);
            while n < budget {
                let Some(item) = r.ring.next() else {
                    break;
                };
                last_ts = ts_of(&item);
                merge.push(i, &item);
                n += 1;
            }
            if n == budget {
                watermark = watermark.min(last_ts);
                self.more = true;
            }
            if n > most.0 {
                most = (n, i);
            }
        }
        let (mut n, mut last_ts) = (0, 0);
        let ring = &mut self.rings[last].ring;
        while n < budget {
            let Some(item) = ring.next() else {
                break;
            };
            last_ts = ts_of(&item);
            merge.push_or_hand_out(last, &item, watermark, &mut f);
            n += 1;
        }
        if n == budget {
            watermark = watermark.min(last_ts);
            self.more = true;
        }
        if n < most.0 {
            self.busiest = most.1;
        }
        merge.pop_to(watermark, f);
        Some(watermark.min(start))
    }

    /// Whether the last [`Rings::drain`] left records in a ring (its
    /// budget ran out): drain again soon, without waiting for a wakeup.
    pub fn more(&self) -> bool {
        self.more
    }

    /// Records that arrived after the merge had passed their time (handed
    /// out then; another thread's records may have gone ahead of them).
    pub fn late(&self) -> u64 {
        self.merge.as_ref().map_or(0, Merge::late)
    }
}
