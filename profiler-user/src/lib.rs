//! The profiler's agent as a library; `main.rs` is a thin CLI over it.
//! See ARCHITECTURE.md for how data flows through these modules.
#![warn(missing_docs)]
pub(crate) mod analyze;
pub(crate) mod attach;
pub mod cli;
pub(crate) mod clock;
pub mod commands;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod heap;
pub(crate) mod linux;
pub(crate) mod output;
pub(crate) mod session;
pub(crate) mod symbolize;
pub(crate) mod text;
pub(crate) mod tracee;
pub(crate) mod untrusted;
pub(crate) mod unwind;

pub use error::{Error, Result};
/// `profiler watch`'s Prometheus registry and `--metrics` listener, public
/// so that the integration tests have a real Prometheus server scrape it
/// (tests/tests/integration/metrics.rs).
#[doc(hidden)]
pub use output::metrics;
/// The `profile.data` reader over bytes (what `profiler report` reads; a
/// fuzz target's entry point): never panics, bounded memory.
pub use session::datafile::{parse as parse_profile_data, Damage, Data as ProfileData};
