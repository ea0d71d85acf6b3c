//! User stacks without frame pointers: the tables the kernel's unwinder
//! walks, and the copy unwinder.
//!
//! - [`cfi`]: a binary's call-frame information (`.eh_frame`,
//!   `.debug_frame`) compiled into sorted rows the BPF program
//!   binary-searches;
//! - [`tables`]: those rows kept current in the kernel's `UNWIND_ROWS` and
//!   `UNWIND_PROCS` maps for the processes sampled (`what_runs.rs`: the
//!   binaries samples land in first);
//! - [`budget`]: how much kernel memory the tables may take, and which
//!   binaries it left to frame pointers;
//! - `row_space.rs`: which rows of that array are free;
//! - [`DwarfUnwinder`] (`copy.rs`): framehop over a copied stack and each
//!   executable mapping's `.eh_frame`, for `sample --unwind copy`.
pub mod budget;
pub mod cfi;
mod copy;
mod row_space;
pub mod tables;

pub use copy::DwarfUnwinder;
