//! `profiler`: the command line over the `profiler` library.
// The library uses the package's dependencies and is linted for unused ones;
// this thin binary uses only clap and the library.
#![allow(unused_crate_dependencies)]

use std::process::ExitCode;

use clap::{error::ErrorKind, Parser};
use profiler::{
    cli::{Cli, Command},
    commands,
    error::chain,
};

fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // One line, like every other error; clap's own text names the flag.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("profiler: error: {first}; see `profiler --help`");
            return ExitCode::from(2);
        }
    };
    let result = match &mut cli.command {
        Command::Record(args) => commands::record::run(args).map(ExitCode::from),
        Command::Watch(args) => commands::watch::run(args).map(|()| ExitCode::SUCCESS),
        Command::List(args) => commands::list::run(args).map(|()| ExitCode::SUCCESS),
        Command::Sample(args) => commands::sample::run(args).map(|()| ExitCode::SUCCESS),
        Command::Diff(args) => commands::diff::run(args).map(|()| ExitCode::SUCCESS),
        Command::Report(args) => commands::report::run(args).map(|()| ExitCode::SUCCESS),
        Command::Tables(args) => commands::tables::run(args).map(|()| ExitCode::SUCCESS),
        Command::Completions(args) => commands::completions::run(args).map(|()| ExitCode::SUCCESS),
        Command::Check(args) => commands::check::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("profiler: error: {}", chain(&err));
            ExitCode::FAILURE
        }
    }
}
