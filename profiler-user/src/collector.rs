//! Drains the ring buffer into [`Stacks`] until a stop condition: Ctrl-C,
//! SIGTERM, `--duration`, or the target's exit (its pidfd turns readable).
//! Decoding copies each 16-byte record out of the ring; nothing is
//! allocated per event.
use std::{
    os::fd::{AsRawFd, OwnedFd, RawFd},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use profiler_common::{CommEvent, Event, KIND_COMM};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    probes::CounterMap, stacks::Stacks, status::Status, target::thread_name, Error, Result,
};

/// Why recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The target exited.
    TargetExited,
    /// `--duration` elapsed.
    Duration,
    /// SIGINT or SIGTERM.
    Signal,
}

impl StopReason {
    /// As written in the outputs.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::TargetExited => "target exited",
            StopReason::Duration => "duration",
            StopReason::Signal => "signal",
        }
    }
}

/// How often the ring is drained when the kernel does not wake us (it only
/// wakes us once a quarter of the ring is pending).
const DRAIN_TICK: Duration = Duration::from_millis(10);

/// Copies every pending event out of the ring into `stacks`, then names
/// the threads seen for the first time (while they are most likely alive).
pub fn drain(ring: &mut RingBuf<MapData>, stacks: &mut Stacks, pid: u32) {
    drain_events(ring, stacks);
    stacks.name_new_threads(|tid| thread_name(pid, tid));
}

#[inline]
fn drain_events(ring: &mut RingBuf<MapData>, stacks: &mut Stacks) {
    while let Some(item) = ring.next() {
        if item.len() < size_of::<Event>() {
            continue;
        }
        // SAFETY: the record holds at least one `Event`, written by the
        // kernel program; `read_unaligned` copes with any alignment.
        let ev = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const Event) };
        if ev.kind() == KIND_COMM {
            if item.len() >= size_of::<CommEvent>() {
                // SAFETY: as above, for the longer record.
                let c = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const CommEvent) };
                stacks.on_comm(&c);
            }
        } else {
            stacks.on_event(&ev);
        }
    }
}

struct Fd(RawFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Reads events until a stop condition, then returns why.
pub async fn collect(
    ring: &mut RingBuf<MapData>,
    stacks: &mut Stacks,
    pid: u32,
    pidfd: &OwnedFd,
    duration: Option<Duration>,
    counters: &CounterMap,
    status: &mut Status,
) -> Result<StopReason> {
    let io = |what: &str, e: std::io::Error| Error::io(what.to_string(), e);
    // SAFETY: both descriptors stay open for longer than these AsyncFds,
    // which are dropped when this function returns; `ring` and `pidfd` are
    // borrowed for the whole call.
    let ring_fd =
        unsafe { AsyncFd::register_with_interest(Fd(ring.as_raw_fd()), Interest::READABLE) }
            .map_err(|e| io("polling the ring buffer", e.into()))?;
    let exit_fd =
        unsafe { AsyncFd::register_with_interest(Fd(pidfd.as_raw_fd()), Interest::READABLE) }
            .map_err(|e| io("polling the target's pidfd", e.into()))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| io("installing SIGTERM handler", e))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| io("installing SIGINT handler", e))?;
    let deadline = sleep_or_forever(duration);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(DRAIN_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let reason = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break StopReason::Signal,
            _ = sigterm.recv() => break StopReason::Signal,
            _ = &mut deadline => break StopReason::Duration,
            _ = exit_fd.readable() => break StopReason::TargetExited,
            guard = ring_fd.readable() => {
                let mut guard = guard.map_err(|e| io("polling the ring buffer", e))?;
                drain(ring, stacks, pid);
                guard.clear_ready();
            }
            _ = tick.tick() => {
                drain(ring, stacks, pid);
                status.update(start.elapsed(), stacks, counters);
            }
        }
    };
    drain(ring, stacks, pid);
    Ok(reason)
}

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
