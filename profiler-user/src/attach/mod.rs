//! Attaching to the target: the eBPF object and its probes.
//!
//! - [`probes`]: loads the object, attaches the entry/exit uprobes, the
//!   scheduler tracepoints and the dispatch sampler; reads the counters;
//! - [`uprobe_multi`]: one `BPF_TRACE_UPROBE_MULTI` link per binary and
//!   direction, for fast attach and detach;
//! - [`samplers`]: the CPU and off-CPU samplers and the maps they fill.
pub mod calibrate;
pub mod probes;
pub mod samplers;
pub mod uprobe_multi;
