use anyhow::{anyhow, Context as _};
// A build dependency only so that cargo rebuilds when the eBPF crate
// changes; build_ebpf below compiles it.
use profiler_ebpf as _;

fn main() -> anyhow::Result<()> {
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
