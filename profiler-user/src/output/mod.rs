//! Output: the checked output directory and everything written into it.
//!
//! - [`OutDir`] (`dir.rs`): created and checked before anything is
//!   attached, never written through a symlink, handed to the sudo user;
//! - [`writers`]: each output file of a session, from the analysis results;
//! - [`report`]: report.txt, functions.json, trace.folded and flame graphs;
//! - [`dispatches`]: dispatches.txt, dispatches.json, dispatch-N.svg;
//! - [`html`]: report.html, one self-contained page over all of them;
//! - [`timeline`]: trace.json, streamed while recording;
//! - [`watch`]: `watch`'s lines, reports and groups, as data, and the
//!   reports' text and flame graphs;
//! - [`metrics`]: `profiler watch`'s Prometheus metrics and their `--metrics`
//!   listener;
//! - [`export`]: other tools' formats (pprof, Chrome trace, diff).
mod dir;
mod dispatches;
pub mod export;
pub mod html;
pub mod metrics;
pub mod report;
pub mod timeline;
pub mod watch;
pub mod writers;

pub use dir::OutDir;
