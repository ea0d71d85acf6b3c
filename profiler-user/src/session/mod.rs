//! A session: the pipeline built, fed and finished.
//!
//! - [`record`]: a `record` session, plan → attach → collect → finish;
//! - [`sample`]: a `sample` session, attach → collect → write;
//! - [`watch`]: a `watch` session, always on: the targets found and
//!   followed, each watched without uprobes, a line per stall as it
//!   happens;
//! - [`replay`]: `profile.data` through the same pipeline (`report`);
//! - [`pipeline`]: builds the sinks the same way for `record` and `report`,
//!   from the `profile.data` header;
//! - [`collector`]: the loop that drains the rings into the sinks until a
//!   stop condition;
//! - [`sinks`]: the sinks, routing each record to the analyses;
//! - [`governor`]: the overhead governor at work, detaching hot functions;
//! - [`ring_reader`]: reads the rings (one per CPU, or one shared), merging
//!   per-CPU rings in timestamp order through [`ring_merge`];
//! - [`datafile`]: `profile.data`, written live and read for a replay;
//! - [`notices`]: slow dispatches and hangs told as they happen, hangs
//!   logged to `hangs.log`;
//! - [`status`]: the live status line;
//! - [`finish`]: every output of a finished pipeline;
//! - [`follow`]: probes the programs traced processes exec (`--follow`);
//! - [`probed`]: the stream record of functions probed after an exec;
//! - [`presample`]: where the watched thread runs, sampled before anything
//!   is probed, to choose the default selection of a big program.
mod collector;
pub mod datafile;
pub mod finish;
mod follow;
mod governor;
mod notices;
pub mod pipeline;
mod presample;
mod probed;
pub mod record;
pub mod replay;
mod ring_merge;
mod ring_reader;
pub mod sample;
pub mod sinks;
mod status;
pub mod watch;
