use anyhow::{anyhow, Context as _};
// A build dependency only so that cargo rebuilds when the eBPF crate
// changes; build_ebpf below compiles it.
use profiler_ebpf as _;

fn main() -> anyhow::Result<()> {
    version();
    // The fuzz targets (fuzz/, built by cargo-fuzz with `--cfg fuzzing`)
    // run parsers only and never load the eBPF object: an empty one saves
    // the nightly eBPF build and keeps it out of the sanitizer's flags.
    println!("cargo:rustc-check-cfg=cfg(fuzzing)");
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
        std::fs::write(out.join("profiler"), b"").context("writing the empty eBPF object")?;
        return Ok(());
    }
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf_package = packages
        .into_iter()
        .find(|cargo_metadata::Package { name, .. }| name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("profiler-ebpf package not found"))?;
    let cargo_metadata::Package {
        name,
        manifest_path,
        ..
    } = ebpf_package;
    let root_dir = manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {manifest_path}"))?;
    let ebpf_package = aya_build::Package {
        name: name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf_package], aya_build::Toolchain::default())
}

/// Sets `PROFILER_VERSION` (`--version`, cli.rs) to the package version and
/// the commit: `PROFILER_COMMIT` when set (a build from a source archive),
/// else `git rev-parse --short HEAD`; without either, the version alone.
fn version() {
    println!("cargo:rerun-if-env-changed=PROFILER_COMMIT");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    };
    let commit = std::env::var("PROFILER_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]));
    // Run again when HEAD moves: HEAD itself (a checkout), the branch's ref
    // (a commit), packed-refs. Only files that exist: cargo would rerun a
    // build script watching a missing file on every build.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let version = env!("CARGO_PKG_VERSION");
    let full = match commit {
        Some(c) => format!("{version} ({c})"),
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=PROFILER_VERSION={full}");
}
