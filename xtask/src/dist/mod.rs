//! `cargo xtask dist`: a release that installs. Builds a static binary
//! (musl, the eBPF object embedded as in every build), then writes into
//! `target/dist/`:
//!
//! - `profiler-VERSION-x86_64-linux-musl.tar.gz`: the binary, the man pages
//!   (`man/`), bash, zsh and fish completions (`completions/`) and the
//!   license files;
//! - `profiler_VERSION_amd64.deb` (`deb.rs`, built with `dpkg-deb`): the
//!   same files in their Debian places, and `profiler watch` as a systemd
//!   service (`systemd.rs`).
//!
//! The completions come from the built binary (`profiler completions
//! SHELL`), the man pages from its clap definitions (`man.rs`).

mod deb;
pub mod man;
mod systemd;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::util::{cargo, exec, stdout_of, workspace_root};

/// The static target: musl's libc is linked into the binary, so it starts
/// on any x86_64 Linux whatever its glibc.
pub const TARGET: &str = "x86_64-unknown-linux-musl";

/// The shells whose completions ship, and the file name each one's loader
/// looks for.
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "profiler.bash"),
    ("zsh", "_profiler"),
    ("fish", "profiler.fish"),
];

/// The license files shipped beside the binary (Cargo.toml: `MIT OR
/// Apache-2.0`).
const LICENSES: &[&str] = &["LICENSE-MIT", "LICENSE-APACHE"];

pub fn run() -> Result<()> {
    // Installs the musl target and musl-gcc (for zstd's C code) if missing.
    crate::setup::run(&crate::setup::Args::default())?;
    exec(cargo().args([
        "build",
        "--release",
        "-p",
        "profiler-user",
        "--target",
        TARGET,
    ]))?;
    let root = workspace_root();
    let bin = root.join("target").join(TARGET).join("release/profiler");
    check_static(&bin)?;
    let said = stdout_of(&bin.to_string_lossy(), ["--version"])
        .with_context(|| format!("`{} --version` failed", bin.display()))?;
    // `profiler 0.1.0 (1a2b3c4)`: the version as clap prints it.
    let version = said
        .trim()
        .strip_prefix("profiler ")
        .with_context(|| format!("unexpected --version output {said:?}"))?
        .to_owned();
    let package_version = env!("CARGO_PKG_VERSION");

    let dist = root.join("target/dist");
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("removing {}", dist.display()))?;
    }
    let name = format!("profiler-{package_version}-x86_64-linux-musl");
    let tree = dist.join(&name);
    let files = stage(&bin, &tree, &version)?;
    let archive = dist.join(format!("{name}.tar.gz"));
    exec(
        Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
            .arg("-C")
            .arg(&dist)
            .arg("-czf")
            .arg(&archive)
            .arg(&name),
    )?;
    let package = deb::build(&files, &dist, package_version)?;
    std::fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    eprintln!("dist: profiler {version}, static ({TARGET})");
    for out in [&archive, &package] {
        let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "  {} ({:.1} MiB)",
            out.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// What a release holds, as files staged under one directory.
pub struct Staged {
    pub binary: PathBuf,
    pub man_pages: Vec<PathBuf>,
    /// `(shell, file)`, in [`COMPLETIONS`] order.
    pub completions: Vec<(&'static str, PathBuf)>,
    pub licenses: Vec<PathBuf>,
}

/// Lays out the archive's tree in `tree`: `profiler`, `man/*.1`,
/// `completions/*`, the license files.
fn stage(bin: &Path, tree: &Path, version: &str) -> Result<Staged> {
    std::fs::create_dir_all(tree.join("completions"))
        .with_context(|| format!("creating {}", tree.display()))?;
    let binary = tree.join("profiler");
    std::fs::copy(bin, &binary).with_context(|| format!("copying {}", bin.display()))?;
    let man_pages = man::write_pages(&tree.join("man"), version)?;
    man::check_pages(&man_pages)?;
    let mut completions = Vec::new();
    for &(shell, file) in COMPLETIONS {
        let out = Command::new(&binary)
            .args(["completions", shell])
            .output()
            .with_context(|| format!("running {}", binary.display()))?;
        if !out.status.success() || out.stdout.is_empty() {
            bail!(
                "`profiler completions {shell}` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let path = tree.join("completions").join(file);
        std::fs::write(&path, &out.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
        completions.push((shell, path));
    }
    let mut licenses = Vec::new();
    for file in LICENSES {
        let path = tree.join(file);
        std::fs::copy(workspace_root().join(file), &path)
            .with_context(|| format!("copying {file}"))?;
        licenses.push(path);
    }
    Ok(Staged {
        binary,
        man_pages,
        completions,
        licenses,
    })
}

/// Fails unless `bin` is statically linked: an ELF with no program
/// interpreter (`PT_INTERP`) loads no shared library.
fn check_static(bin: &Path) -> Result<()> {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let data = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&*data)
        .with_context(|| format!("{} is not a 64-bit ELF", bin.display()))?;
    let endian = header.endian()?;
    for ph in header.program_headers(endian, &*data)? {
        if ph.p_type(endian) == object::elf::PT_INTERP {
            bail!(
                "{} is dynamically linked (it has a program interpreter): the static build failed",
                bin.display()
            );
        }
    }
    Ok(())
}

/// The version a build of this checkout reports (`build.rs`'s rule):
/// the package version and `git rev-parse --short HEAD`, if any.
pub fn version_here() -> String {
    let root = workspace_root();
    let commit = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
    let version = env!("CARGO_PKG_VERSION");
    match commit.as_deref().map(str::trim) {
        Some(c) if !c.is_empty() => format!("{version} ({c})"),
        _ => version.to_owned(),
    }
}
