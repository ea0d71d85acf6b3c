//! The target: the process (or the command launched as one), what the
//! agent may do to it, and which of its functions to probe.
//!
//! - [`process`]: the process by pidfd, its mappings and threads;
//! - [`launch`]: `record -- COMMAND`, gated fork/exec, stopped at the end;
//! - [`exec_chain`]: a script or wrapper followed through its execs;
//! - [`ldso`]: libraries found as the dynamic loader would;
//! - [`libwatch`]: `--lib`s not mapped yet, polled until they are;
//! - [`cgroup`]: `sample --all --cgroup`, a process's cgroup;
//! - [`caps`]: the capabilities tracing needs, checked first;
//! - [`symbols`]: ELF symbol tables of its binaries;
//! - [`usdt`]: its USDT probes (CPython's collections);
//! - [`select`]: which functions to probe;
//! - [`exits`]: where a function's frame ends (its `ret`s and tail calls),
//!   what runs in a binary, the exit policy;
//! - [`probe_set`]: several processes' selections as one, each function once;
//! - [`find`]: processes by name (`--pid-of`), a process's parent;
//! - [`watched`]: which processes `watch` watches (`--pid`, `--exe`,
//!   `--cgroup`, `--unit`), found by scanning `/proc`.
pub mod caps;
pub mod cgroup;
mod exec_chain;
pub mod exits;
pub mod find;
pub mod launch;
mod ldso;
pub mod libwatch;
pub mod probe_set;
pub mod process;
pub mod select;
pub mod symbols;
mod usdt;
pub mod watched;
