//! Addresses to names, and user stacks to addresses.
//!
//! - [`Symbolizer`] (`symbolizer.rs`): blazesym over a process's mappings,
//!   remembered for processes that exited, with a journal for offline
//!   replay;
//! - [`DwarfUnwinder`] (`unwind.rs`): framehop over each executable
//!   mapping's `.eh_frame`, for `sample --dwarf`.
pub mod budget;
pub mod perfmap;
mod proc_mem;
pub mod python;
mod row_space;
mod symbolizer;
pub mod tables;
mod unwind;
pub mod unwind_table;
pub mod v8;

pub use symbolizer::{Symbolizer, NORMALIZED};
pub use unwind::DwarfUnwinder;
