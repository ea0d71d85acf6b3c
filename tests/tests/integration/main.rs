//! The root-only integration tests, one binary with a module per topic (as
//! aya's `test/integration-test`). Every helper is in the `profiler_tests`
//! library (`tests/src`); a test that cannot run says why on stderr
//! (`SKIP …`) and returns. Run them one at a time, as `cargo xtask test`
//! does: kernel state is shared. See tests/README.md.

// Used through profiler_tests, not here.
use anyhow as _;
use png as _;

mod asyncio_governor;
mod bad_input;
mod causes;
mod cgroups;
mod check;
mod containers;
mod costs;
mod deleted;
mod demangle;
mod dispatch;
mod event_loops;
mod exports;
mod flamegraph;
mod follow;
mod golang;
mod governor;
mod helpers;
mod html;
mod inlined;
mod java_frames;
mod js_frames;
mod launch;
mod libs;
mod loss;
mod mappings;
mod metrics;
mod offcpu;
mod perfmap;
mod presets;
mod python_frames;
mod reaping;
mod recording_damage;
mod recursion;
mod reliability;
mod replay;
mod sampling;
mod stages;
mod swing;
mod tables;
mod tail_calls;
mod teardown;
mod threads;
mod tk;
mod tracing;
mod unwind_budget;
mod unwinding;
mod waker;
mod watch;
mod watch_escalation;
