//! Man pages for `profiler` and each of its subcommands (`profiler.1`,
//! `profiler-record.1`, …), generated with clap_mangen from the agent's own
//! command-line definitions.
//!
//! `cli.rs` depends on clap (and clap_complete's `Shell`) alone, so xtask
//! compiles it as a module of its own, the way clap's docs generate
//! completions in a build script: xtask must build before `cargo xtask
//! setup` has installed the nightly eBPF toolchain, which a dependency on
//! the whole agent would need.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::CommandFactory as _;

#[path = "../../../profiler-user/src/cli.rs"]
#[allow(
    dead_code,
    reason = "xtask reads the definitions, not the parsed values"
)]
mod cli;

/// `cargo xtask man`.
#[derive(clap::Args)]
pub struct Args {
    /// Directory to write the pages into (created if missing).
    #[arg(default_value = "target/man", value_name = "OUTDIR")]
    pub out: PathBuf,
}

/// `cargo xtask man OUTDIR`: the pages, with the version this checkout
/// would build.
pub fn run(args: &Args) -> Result<()> {
    let pages = write_pages(&args.out, &super::version_here())?;
    eprintln!("man: {} pages in {}", pages.len(), args.out.display());
    Ok(())
}

/// The `profiler` command as clap sees it.
pub fn command() -> clap::Command {
    cli::Cli::command()
}

/// Writes one page for `profiler` and one per visible subcommand (nested
/// ones too) into `dir`, each titled with `version` (what `profiler
/// --version` says after the name). Returns the pages written, sorted.
pub fn write_pages(dir: &Path, version: &str) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = command()
        .version(version.to_owned())
        .disable_help_subcommand(true);
    // Sets each subcommand's display name (`profiler-record`), the pages'
    // names and titles.
    cmd.build();
    let source = format!("profiler {version}");
    let mut pages = Vec::new();
    write_tree(&cmd, dir, &source, &mut pages)?;
    pages.sort();
    Ok(pages)
}

fn write_tree(
    cmd: &clap::Command,
    dir: &Path,
    source: &str,
    pages: &mut Vec<PathBuf>,
) -> Result<()> {
    let page = clap_mangen::Man::new(cmd.clone())
        .source(source.to_owned())
        .manual("profiler manual");
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing a man page into {}", dir.display()))?;
    pages.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, source, pages)?;
    }
    Ok(())
}

/// The file names [`write_pages`] must produce: `profiler.1` and
/// `profiler-NAME.1` for each visible subcommand.
pub fn expected_names() -> Vec<String> {
    let mut names: Vec<String> = command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| format!("profiler-{}.1", s.get_name()))
        .collect();
    names.push("profiler.1".into());
    names.sort();
    names
}

/// Fails unless `pages` are exactly [`expected_names`], each a page
/// (`.TH` title line) naming its command.
pub fn check_pages(pages: &[PathBuf]) -> Result<()> {
    let names: Vec<String> = pages
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    let expected = expected_names();
    if names != expected {
        bail!("man pages {names:?}, expected one per subcommand: {expected:?}");
    }
    for page in pages {
        let text =
            std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
        let stem = page.file_stem().unwrap_or_default().to_string_lossy();
        if !text.contains(".TH ") || !text.contains(&*stem) {
            bail!("{} is not a man page for {stem}", page.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_subcommand() {
        let dir = std::env::temp_dir().join(format!("xtask-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pages = write_pages(&dir, "0.0.0 (test)").unwrap();
        check_pages(&pages).unwrap();
        assert!(expected_names().contains(&"profiler-record.1".to_owned()));
        assert!(expected_names().contains(&"profiler-completions.1".to_owned()));
        let record = std::fs::read_to_string(dir.join("profiler-record.1")).unwrap();
        assert!(record.contains("max\\-funcs"), "an option of record");
        assert!(record.contains("0.0.0 (test)"), "the version in the title");
        // The profiler's own description, not xtask's (Cargo.toml's).
        let top = std::fs::read_to_string(dir.join("profiler.1")).unwrap();
        assert!(top.contains("main thread stalls"), "{top}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The `profiler` command lines shown in fenced code blocks of `text`
/// (Markdown) that the command-line definitions refuse, each with clap's
/// first error line. A line is taken as the shell would split it on
/// spaces, after any `sudo` and before any `#` comment.
pub fn refused_commands(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut bad = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let l = line.trim();
        let l = l.strip_prefix("sudo ").unwrap_or(l);
        if !fenced || !l.starts_with("profiler ") {
            continue;
        }
        let l = l.split(" #").next().unwrap_or(l);
        let args: Vec<&str> = l.split_whitespace().collect();
        if let Err(e) = command().try_get_matches_from(&args) {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or_default().to_string();
            bad.push(format!("{line}: {first}"));
        }
    }
    bad
}

#[cfg(test)]
mod readme_tests {
    #[test]
    fn shown_commands_are_checked_against_the_definitions() {
        let text = "```\nsudo profiler record --pid 4242 --duration 10s --out prof/   # ten seconds\nprofiler sample --bogus\n```\nprofiler sample --bogus (prose)\n";
        let bad = super::refused_commands(text);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("--bogus"), "{bad:?}");
    }
}
