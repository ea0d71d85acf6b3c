//! `profiler completions`: a shell's completion script, generated from the
//! command line's definitions (`cli.rs`) by clap_complete.
use std::io::Write as _;

use clap::CommandFactory as _;

use crate::{
    cli::{Cli, CompletionsArgs},
    Error, Result,
};

/// Runs `profiler completions`: the script on stdout. A closed pipe
/// (`profiler completions bash | head`) is not an error.
pub fn run(args: &CompletionsArgs) -> Result<()> {
    let text = script(args.shell);
    let mut out = std::io::stdout().lock();
    match out.write_all(&text).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::io("writing the completion script to stdout", e))
        }
        _ => Ok(()),
    }
}

/// The completion script of `shell` for the `profiler` command.
pub fn script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "profiler", &mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum as _;

    #[test]
    fn every_shell_gets_a_script_naming_every_subcommand() {
        let subcommands: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        assert!(subcommands.iter().any(|s| s == "record"));
        for shell in clap_complete::Shell::value_variants() {
            let text = String::from_utf8(script(*shell)).expect("UTF-8");
            assert!(text.len() > 500, "{shell}: {} bytes", text.len());
            for sub in &subcommands {
                assert!(text.contains(sub.as_str()), "{shell}: no {sub}");
            }
            // An option of a subcommand, not only the names.
            assert!(text.contains("max-funcs"), "{shell}: no --max-funcs");
        }
    }
}
