//! The subcommands, one file each: check the arguments, run a session or
//! read one, and say what was written.
pub mod check;
pub mod completions;
pub mod diff;
pub mod list;
pub mod record;
pub mod report;
pub mod sample;
pub mod tables;
pub mod watch;
