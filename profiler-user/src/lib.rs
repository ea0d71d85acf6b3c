//! The profiler's agent as a library; `main.rs` is a thin CLI over it.
//! See ARCHITECTURE.md for how data flows through these modules.
#![warn(missing_docs)]
pub mod analyze;
pub mod attach;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod error;
pub mod fmt;
pub mod output;
pub mod session;
pub mod symbolize;
pub mod target;

pub use error::{Error, Result};
