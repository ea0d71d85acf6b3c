//! Exports to other tools' formats, each self-contained: `pprof`
//! (`profile.pb.gz` for pprof, Pyroscope, Parca, Grafana), `trace` (Chrome
//! Trace Event JSON for Perfetto and chrome://tracing) and `diff`
//! (differential flame graph of two folded files).
pub mod diff;
pub mod pprof;
pub mod trace;
