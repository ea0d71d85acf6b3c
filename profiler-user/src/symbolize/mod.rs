//! Addresses to names.
//!
//! - [`Symbolizer`] (`symbolizer.rs`): blazesym over a process's mappings,
//!   remembered for processes that exited, with a journal for offline
//!   replay;
//! - [`perfmap`]: JIT perf maps (`/tmp/perf-PID.map`);
//! - [`python`], [`v8`], [`hotspot`]: the interpreters' own frames named
//!   from their memory (`proc_mem.rs` reads another process's memory for
//!   them).
//!
//! User stacks to addresses is the next layer, [`crate::unwind`].
pub mod hotspot;
pub mod perfmap;
mod proc_mem;
pub mod python;
mod symbolizer;
pub mod v8;

pub use symbolizer::{collection_ended, collection_started, Symbolizer, NORMALIZED};
