//! The profiler's agent as a library; `main.rs` is a thin CLI over it.
//! See ARCHITECTURE.md for how data flows through these modules.
#![warn(missing_docs)]
pub(crate) mod analyze;
pub(crate) mod attach;
pub mod cli;
pub(crate) mod clock;
pub mod commands;
pub mod error;
pub(crate) mod fmt;
pub(crate) mod output;
pub(crate) mod session;
pub(crate) mod symbolize;
pub(crate) mod target;
pub(crate) mod untrusted;

pub use error::{Error, Result};
