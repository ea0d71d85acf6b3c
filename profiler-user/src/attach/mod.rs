//! Attaching to the target: the eBPF object and its probes.
//!
//! - [`probes`]: loads the object, attaches the entry/exit uprobes, the
//!   scheduler tracepoints and the dispatch sampler; reads the counters;
//! - [`uprobe_multi`]: one `BPF_TRACE_UPROBE_MULTI` link per binary and
//!   direction, for fast attach and detach;
//! - [`samplers`]: the CPU and off-CPU samplers and the maps they fill;
//! - [`task_btf`]: `task_struct` field offsets for the process tracepoints;
//! - [`rings`]: the kernel-to-agent rings, one per CPU or one shared;
//! - [`calibrate`]: what one probe hit costs on this host (the governor);
//! - [`kernel`]: the running kernel's release and what it lacks;
//! - [`check`]: `profiler check`, what this kernel supports and what works.
pub mod calibrate;
pub mod check;
pub mod kernel;
pub mod probes;
pub mod rings;
pub mod samplers;
pub mod task_btf;
mod uprobe_multi;
