//! Drains the rings into the [`Sinks`] until a stop condition: Ctrl-C,
//! SIGTERM, `--duration`, or the target's exit (its pidfd turns readable).
//! Decoding copies each record out of the ring (per-CPU rings: into the
//! merge's buffers, `session/ring_merge.rs`); nothing is allocated per
//! entry/exit event.
use std::{
    os::fd::{AsRawFd, OwnedFd, RawFd},
    time::{Duration, Instant},
};

use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    analyze::processes::Processes, attach::probes::CounterMap, session::ring_reader::Rings,
    session::sinks::Sinks, session::status::Status, Error, Result,
};

/// Why recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The target exited.
    TargetExited,
    /// `--duration` elapsed.
    Duration,
    /// SIGINT or SIGTERM (the number).
    Signal(i32),
    /// Every scenario has its `--runs`.
    RunsComplete,
    /// The target exec'd another program: the probes no longer apply.
    TargetExeced,
    /// Every traced process has exited (`--follow`, several targets).
    AllExited,
    /// Something failed while recording (the error is told at the end,
    /// after the outputs are written).
    Failed,
}

impl StopReason {
    /// As written in the outputs.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::TargetExited => "target exited",
            StopReason::Duration => "duration",
            StopReason::Signal(_) => "signal",
            StopReason::RunsComplete => "runs complete",
            StopReason::TargetExeced => "target exec'd another program",
            StopReason::AllExited => "every traced process exited",
            StopReason::Failed => "failed",
        }
    }
}

/// How often the ring is drained when the kernel does not wake us (it only
/// wakes us once a quarter of the ring is pending).
pub const DRAIN_TICK: Duration = Duration::from_millis(10);

struct Fd(RawFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// What the user sees while recording.
pub struct Live<'a> {
    /// The kernel's counters, for the status line.
    pub counters: &'a CounterMap,
    /// The live status line.
    pub status: &'a mut Status,
    /// The `attached` line, printed once SIGINT and SIGTERM are handled.
    pub attached: &'a str,
    /// How often the rings are drained when the kernel does not wake us,
    /// and the ticks run ([`DRAIN_TICK`]; `watch` takes longer ones).
    pub tick: Duration,
}

/// What a live session does to its own probes while it runs: probe the new
/// program of a traced process that exec'd (`--follow`,
/// `session/follow.rs`), or detach the functions that cost the target too
/// much (the overhead governor, `session/governor.rs`). Both change the
/// probes, so a session has one of them.
pub trait Steer {
    /// Traced process `pid` exec'd.
    fn on_exec(&mut self, _sinks: &mut Sinks, _pid: u32) {}
    /// Every drain tick.
    fn on_tick(&mut self, _sinks: &mut Sinks) -> Result<()> {
        Ok(())
    }
}

/// Changes nothing.
pub struct NoSteer;

impl Steer for NoSteer {}

/// Reads events until a stop condition, then returns why. `steer` is told
/// of each traced process that exec'd, and of every tick.
/// With several processes, the session ends when all have exited, not
/// when the first target (`pidfd`) does.
pub async fn collect(
    rings: &mut Rings,
    sinks: &mut Sinks,
    pidfd: &OwnedFd,
    duration: Option<Duration>,
    live: Live<'_>,
    steer: &mut dyn Steer,
) -> Result<StopReason> {
    let Live {
        counters,
        status,
        attached,
        tick: every,
    } = live;
    let one_target = sinks.processes.is_none();
    let io = |what: &str, e: std::io::Error| Error::io(what.to_string(), e);
    // SAFETY: both descriptors stay open for longer than these AsyncFds,
    // which are dropped when this function returns; `rings` and `pidfd` are
    // borrowed for the whole call.
    let ring_fd =
        unsafe { AsyncFd::register_with_interest(Fd(rings.poll_fd()), Interest::READABLE) }
            .map_err(|e| io("polling the ring buffer", e.into()))?;
    // SAFETY: as above.
    let exit_fd =
        unsafe { AsyncFd::register_with_interest(Fd(pidfd.as_raw_fd()), Interest::READABLE) }
            .map_err(|e| io("polling the target's pidfd", e.into()))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| io("installing SIGTERM handler", e))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| io("installing SIGINT handler", e))?;
    eprintln!("{attached}");
    let deadline = sleep_or_forever(duration);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let mut last_tick = start;
    let debug = std::env::var_os("PROFILER_DEBUG").is_some();
    let reason = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break StopReason::Signal(libc::SIGINT),
            _ = sigterm.recv() => break StopReason::Signal(libc::SIGTERM),
            _ = &mut deadline => break StopReason::Duration,
            _ = exit_fd.readable(), if one_target => break StopReason::TargetExited,
            guard = ring_fd.readable() => {
                let mut guard = guard.map_err(|e| io("polling the ring buffer", e))?;
                let began = Instant::now();
                sinks.drain(rings);
                if debug && began.elapsed() >= Duration::from_millis(50) {
                    eprintln!("profiler: debug: a woken drain took {} ms", began.elapsed().as_millis());
                }
                // Records left behind (the drain's budget ran out): back
                // here after the stop conditions are checked again.
                if !rings.more() {
                    guard.clear_ready();
                }
                // The ring comes first above, and a ring that never runs
                // dry (a flood of events, a slow machine) would starve the
                // ticks: hangs, the tables of a program just exec'd, the
                // governor. A tick that is due runs here then.
                if last_tick.elapsed() >= every {
                    last_tick = Instant::now();
                    on_tick(sinks, counters, status, start, steer)?;
                }
            }
            _ = tick.tick() => {
                let began = Instant::now();
                sinks.drain(rings);
                if debug && began.elapsed() >= Duration::from_millis(50) {
                    eprintln!("profiler: debug: a tick's drain took {} ms", began.elapsed().as_millis());
                }
                last_tick = Instant::now();
                on_tick(sinks, counters, status, start, steer)?;
            }
        }
        for pid in std::mem::take(&mut sinks.execs) {
            steer.on_exec(sinks, pid);
        }
        if sinks.finished() {
            break StopReason::RunsComplete;
        }
        if sinks.all_gone || sinks.processes.as_ref().is_some_and(Processes::all_ended) {
            break StopReason::AllExited;
        }
        if sinks.execd {
            break StopReason::TargetExeced;
        }
    };
    sinks.drain(rings);
    if matches!(reason, StopReason::Signal(_) | StopReason::Duration) {
        // The dispatch open at the stop ends only while its probes and the
        // loop's wait watchers are still on: it gets up to `STOP_GRACE`
        // (a second signal, or the target's exit, ends that at once).
        if let Some(open) = open_dispatch(sinks) {
            let until = Instant::now() + STOP_GRACE;
            while open_dispatch(sinks) == Some(open) && Instant::now() < until {
                tokio::select! {
                    biased;
                    _ = sigint.recv() => break,
                    _ = sigterm.recv() => break,
                    _ = exit_fd.readable(), if one_target => break,
                    _ = tokio::time::sleep(STOP_POLL) => sinks.drain(rings),
                }
            }
        }
    }
    Ok(reason)
}

/// How long a stop waits for the dispatch open at it to end.
pub const STOP_GRACE: Duration = Duration::from_secs(1);
/// How often it looks meanwhile.
const STOP_POLL: Duration = Duration::from_millis(5);

/// The watched thread's open dispatch, by its ordinal, if one is open.
fn open_dispatch(sinks: &Sinks) -> Option<u64> {
    let d = sinks.dispatch.as_ref()?;
    d.is_open().then(|| d.decided_below())
}

/// A drain tick's work, after the drain: hangs and the once-a-second
/// passes ([`Sinks::tick`]), the losses journaled, the steering, the
/// status line.
fn on_tick(
    sinks: &mut Sinks,
    counters: &CounterMap,
    status: &mut Status,
    start: Instant,
    steer: &mut dyn Steer,
) -> Result<()> {
    sinks.tick();
    if sinks.second {
        // Journaled, so a recording cut short still tells its losses.
        if let Some(w) = &mut sinks.data {
            let c = counters.read();
            w.lost(c.lost, c.lost_sched, c.lost_comm);
        }
    }
    steer.on_tick(sinks)?;
    status.update(start.elapsed(), &sinks.stacks, counters);
    Ok(())
}

/// Waits for a stop condition without reading any ring: for `sample`.
/// Calls `tick` every `every` meanwhile, and also when `wake`'s descriptor
/// turns readable: `sample --all`'s notices of new processes. While `tick`
/// returns true (notices keep coming), it is called again after `wake`'s
/// gap instead, without waiting for the descriptor (which the kernel then
/// leaves quiet).
pub async fn wait_for_stop(
    pidfd: Option<&OwnedFd>,
    duration: Option<Duration>,
    every: Duration,
    wake: Option<(RawFd, Duration)>,
    mut tick: impl FnMut() -> bool,
) -> Result<StopReason> {
    let io = |what: &str, e: std::io::Error| Error::io(what.to_string(), e);
    let exit_fd = match pidfd {
        // SAFETY: the pidfd outlives this AsyncFd, dropped on return.
        Some(fd) => Some(
            unsafe { AsyncFd::register_with_interest(Fd(fd.as_raw_fd()), Interest::READABLE) }
                .map_err(|e| io("polling the target's pidfd", e.into()))?,
        ),
        None => None,
    };
    let exited = async {
        match &exit_fd {
            Some(fd) => {
                let _ = fd.readable().await;
            }
            None => std::future::pending().await,
        }
    };
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| io("installing SIGTERM handler", e))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| io("installing SIGINT handler", e))?;
    let wake_fd = match wake {
        Some((fd, _)) => Some(
            // SAFETY: the caller keeps the descriptor open for the whole
            // call; this AsyncFd is dropped on return.
            unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
                .map_err(|e| io("polling the notice ring", e.into()))?,
        ),
        None => None,
    };
    let gap = wake.map_or(Duration::ZERO, |(_, gap)| gap);
    let deadline = sleep_or_forever(duration);
    // While polling, the next tick is when this elapses.
    let next = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(deadline, exited, next);
    let mut second = tokio::time::interval(every);
    let mut polling = false;
    Ok(loop {
        let ticked = tokio::select! {
            _ = sigint.recv() => break StopReason::Signal(libc::SIGINT),
            _ = sigterm.recv() => break StopReason::Signal(libc::SIGTERM),
            _ = &mut deadline => break StopReason::Duration,
            _ = &mut exited => break StopReason::TargetExited,
            _ = second.tick() => tick(),
            guard = async { wake_fd.as_ref()?.readable().await.ok() }, if wake_fd.is_some() && !polling => {
                // Cleared before the tick reads: what comes after wakes us again.
                if let Some(mut g) = guard {
                    g.clear_ready();
                }
                tick()
            }
            _ = &mut next, if polling => tick(),
        };
        polling = ticked && wake_fd.is_some();
        if polling {
            next.as_mut().reset(tokio::time::Instant::now() + gap);
        }
    })
}

/// Paces work done on some of [`wait_for_stop`]'s ticks: due once a period.
/// A tick that comes a little early (timer jitter; the ticks of `every` are
/// scheduled from the start, not from when the last one ran) still counts,
/// so a period equal to `every` never skips one.
#[derive(Debug)]
pub struct Pace {
    period: Duration,
    next: Option<Instant>,
}

impl Pace {
    /// Early by up to this much still counts as due.
    const SLACK: Duration = Duration::from_millis(50);

    pub fn new(period: Duration) -> Self {
        Self { period, next: None }
    }

    /// True on the first call and then once per period (give or take
    /// [`Self::SLACK`]).
    pub fn due(&mut self, now: Instant) -> bool {
        if self.next.is_some_and(|n| now + Self::SLACK < n) {
            return false;
        }
        self.next = Some(now + self.period);
        true
    }
}

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_are_polled_after_the_gap_while_they_come() {
        // A descriptor readable from the start (a pipe with a byte in it)
        // and a tick that says "more came" four times. The first two ticks
        // come at once (readiness, and the interval's first), then three a
        // gap apart, unwoken; the fifth says nothing more came, and the
        // readiness, cleared at the first, waits for new data: a byte
        // written at 150 ms gives the sixth.
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let write = move || {
            // SAFETY: writes one byte from a static to our own pipe.
            assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        };
        write();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            write();
        });
        let mut at = Vec::new();
        let t0 = Instant::now();
        let reason = rt
            .block_on(wait_for_stop(
                None,
                Some(Duration::from_millis(300)),
                Duration::from_secs(10),
                Some((fds[0], Duration::from_millis(20))),
                || {
                    at.push(t0.elapsed());
                    at.len() < 5
                },
            ))
            .unwrap();
        writer.join().unwrap();
        assert_eq!(reason, StopReason::Duration);
        let ms = Duration::from_millis;
        // Both are ready at the start, and `select!` takes either first.
        // Readiness first: the interval's tick follows at once, and the
        // polling ticks clear nothing. The interval's tick first: polling
        // starts at once, and the readiness, never taken while polling, is
        // taken as the fifth tick ends it (seen once, in a full unit run).
        let interval_first = at.len() == 7;
        let (polled, rest) = match interval_first {
            false => (&at[1..5], &at[5..]),
            true => {
                assert!(at[5] - at[4] < ms(15), "{at:?}");
                (&at[0..5], &at[6..])
            }
        };
        assert_eq!(rest.len(), 1, "{at:?}");
        assert!(at[1] < ms(15) || interval_first, "{at:?}");
        for w in polled.windows(2) {
            assert!(w[1] - w[0] >= ms(19), "{at:?}");
        }
        assert!(at[4] < ms(150) && rest[0] >= ms(150), "{at:?}");
        for fd in fds {
            // SAFETY: closes the pipe made above.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn pace_counts_ticks_that_come_a_little_early() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pace::new(ms(1000));
        // Ticks of a 1-s interval, the first run late by 5 ms, the next on
        // time: every one is due (with a plain `elapsed >= 1 s` the second
        // was skipped, so slow work ran every 2 s).
        assert!(p.due(t0 + ms(5)));
        assert!(p.due(t0 + ms(1000)));
        assert!(p.due(t0 + ms(2003)));
        // Ticks in between (new-process wake-ups every 20 ms) are not.
        assert!(!p.due(t0 + ms(2023)));
        assert!(!p.due(t0 + ms(2900)));
        assert!(p.due(t0 + ms(2960)));
    }
}
