//! Analysis of the event stream: what the session's sinks compute.
//!
//! - [`stacks`] and [`calltree`]: shadow stacks of every thread, per-function
//!   aggregates and per-thread call-path tries;
//! - [`dispatch`]: the watched thread's dispatches, slow ones explained,
//!   hangs noticed while they run;
//! - [`stages`]: stage intervals per run, nesting derived;
//! - [`startup`]: exec to main to ready, in launch mode;
//! - [`tail_calls`]: a tail-calling function kept open until its callee
//!   returns, as written;
//! - [`processes`]: one section per traced process (`--follow`, several
//!   targets): parent, program, lifetime, exit, its own aggregates;
//! - [`cpu_profile`]: the samplers' maps read, symbolized and folded;
//!   [`cpu_fold`]: the folding, and processes that exit folded as they go;
//! - [`goroutines`]: Go calls keyed by goroutine, not by thread;
//! - [`overhead`]: the overhead governor's estimates (what the probes cost,
//!   which functions to detach);
//! - [`flight`]: `watch`'s flight recorder, the watched thread's recent
//!   samples; [`windows`]: its samples by window of `--profile-every`,
//!   labelled stalled or not once their iterations are decided;
//! - [`dedup`]: the second copy of a hit two generations of links reported
//!   while both were attached, dropped.
mod calltree;
pub mod cpu_fold;
pub mod cpu_profile;
pub mod dedup;
pub mod dispatch;
pub mod flight;
pub mod goroutines;
pub mod overhead;
pub mod processes;
pub mod stacks;
pub mod stages;
pub mod startup;
pub mod tail_calls;
pub mod windows;
