//! `cargo xtask lint`: formatting, the agent's module layering
//! ([`crate::layers`]), the man pages (one per subcommand), the docs'
//! links ([`crate::links`]), the API docs (`cargo doc`, every intra-doc
//! link resolving, private items included), and clippy,
//! with the eBPF crate checked in its own nightly invocation (feature
//! unification would break its `no_std`).

use std::process::Command;

use anyhow::Result;

use crate::util::{cargo, exec, workspace_root};

pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    crate::setup::ensure_nightly_component("clippy", &mut Vec::new())?;
    exec(cargo().args(["fmt", "--all", "--", "--check"]))?;
    crate::layers::check(&workspace_root().join("profiler-user/src"))?;
    // One man page per subcommand, from the clap definitions (what dist ships).
    let man = workspace_root().join("target/lint-man");
    let pages = crate::dist::man::write_pages(&man, &crate::dist::version_here())?;
    crate::dist::man::check_pages(&pages)?;
    eprintln!("lint: {} man pages, one per subcommand", pages.len());
    let docs = crate::links::check(&workspace_root())?;
    eprintln!("lint: links of {docs} Markdown files");
    // Each command the README shows parses as the profiler would parse it.
    let readme = std::fs::read_to_string(workspace_root().join("README.md"))?;
    let refused = crate::dist::man::refused_commands(&readme);
    if !refused.is_empty() {
        anyhow::bail!(
            "README.md shows commands the profiler refuses:\n{}",
            refused.join("\n")
        );
    }
    // Every intra-doc link resolves (private items too: most of the agent
    // is `pub(crate)`), so a renamed or moved item cannot leave a doc
    // pointing nowhere. Links from public docs to private items are fine
    // here: the docs are for the project's developers.
    exec(
        cargo()
            .env(
                "RUSTDOCFLAGS",
                "-D rustdoc::broken_intra_doc_links -A rustdoc::private_intra_doc_links",
            )
            .args([
                "doc",
                "--no-deps",
                "--workspace",
                "--exclude",
                "profiler-ebpf",
                "--document-private-items",
            ]),
    )?;
    eprintln!("lint: cargo doc, every intra-doc link resolved");
    exec(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // `+nightly` needs rustup's cargo proxy, not the toolchain's cargo binary.
    exec(
        Command::new("cargo")
            .current_dir(workspace_root().join("profiler-ebpf"))
            .env_remove("RUSTUP_TOOLCHAIN")
            .args([
                "+nightly",
                "clippy",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ]),
    )
}
