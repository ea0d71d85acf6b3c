//! The profiler's agent as a library; `main.rs` is a thin CLI over it.
//! See ARCHITECTURE.md for how data flows through these modules.
#![warn(missing_docs)]
pub mod analyze;
pub mod attach;
pub mod cli;
pub mod clock;
pub mod collector;
pub mod datafile;
pub mod error;
pub mod finish;
pub mod fmt;
pub mod output;
pub mod pipeline;
pub mod record;
pub mod replay;
pub mod sample;
pub mod status;
pub mod symbolize;
pub mod target;

pub use error::{Error, Result};
