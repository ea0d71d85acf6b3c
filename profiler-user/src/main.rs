use std::process::ExitCode;

use clap::Parser;
use profiler::{
    cli::{Cli, Command},
    probes::chain,
    record,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Record(args) => record::record(args),
        Command::List(args) => record::list(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("profiler: error: {}", chain(&err));
            ExitCode::FAILURE
        }
    }
}
