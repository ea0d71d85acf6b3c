//! The `.deb` of `cargo xtask dist`, built with `dpkg-deb` from a staged
//! tree (no crate from crates.io at dist time): `/usr/bin/profiler`, the
//! man pages gzipped in `/usr/share/man/man1`, the bash, zsh and fish
//! completions where those shells look for them,
//! `/usr/share/doc/profiler/copyright`, and `profiler watch` as a service
//! (`systemd.rs`): the units in `/lib/systemd/system`, the conffiles
//! `/etc/default/profiler-watch` and `/etc/logrotate.d/profiler-watch`,
//! `/usr/share/doc/profiler/watch-ops.md`, and maintainer scripts that
//! only tell systemd to reload its units (nothing is enabled or started).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use super::{systemd, Staged};
use crate::util::{exec, workspace_root};

/// Where each shell's completions go in a Debian package.
fn completion_path(shell: &str) -> Option<&'static str> {
    Some(match shell {
        "bash" => "usr/share/bash-completion/completions/profiler",
        "zsh" => "usr/share/zsh/vendor-completions/_profiler",
        "fish" => "usr/share/fish/vendor_completions.d/profiler.fish",
        _ => return None,
    })
}

/// Builds `profiler_VERSION_amd64.deb` in `out_dir` from `staged`.
pub fn build(staged: &Staged, out_dir: &Path, version: &str) -> Result<PathBuf> {
    let root = out_dir.join("deb-root");
    let put = |rel: &str, from: &Path| -> Result<()> {
        let to = root.join(rel);
        mkdir(to.parent().expect("a path under the root"))?;
        std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        Ok(())
    };
    put("usr/bin/profiler", &staged.binary)?;
    let man_dir = root.join("usr/share/man/man1");
    mkdir(&man_dir)?;
    for page in &staged.man_pages {
        let name = page.file_name().context("a man page's name")?;
        let gz = man_dir.join(format!("{}.gz", name.to_string_lossy()));
        // -n: no name or time stamp inside, so the same page gives the
        // same bytes.
        let out = Command::new("gzip")
            .args(["-9", "-n", "-c"])
            .arg(page)
            .output()
            .context("running gzip")?;
        if !out.status.success() {
            bail!("gzip {} failed", page.display());
        }
        std::fs::write(&gz, out.stdout).with_context(|| format!("writing {}", gz.display()))?;
    }
    for (shell, file) in &staged.completions {
        let rel = completion_path(shell).with_context(|| format!("no place for {shell}"))?;
        put(rel, file)?;
    }
    let doc = root.join("usr/share/doc/profiler");
    mkdir(&doc)?;
    let mit = std::fs::read_to_string(
        staged
            .licenses
            .iter()
            .find(|p| p.ends_with("LICENSE-MIT"))
            .context("LICENSE-MIT staged")?,
    )?;
    std::fs::write(doc.join("copyright"), copyright(&mit)).context("writing copyright")?;
    std::fs::copy(
        workspace_root().join("docs/watch-ops.md"),
        doc.join("watch-ops.md"),
    )
    .context("copying docs/watch-ops.md")?;
    let write = |rel: &str, text: String| -> Result<()> {
        let to = root.join(rel);
        mkdir(to.parent().expect("a path under the root"))?;
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))
    };
    write(
        &format!("{}/{}", systemd::UNIT_DIR, systemd::TEMPLATE),
        systemd::template_unit(),
    )?;
    write(
        &format!("{}/{}", systemd::UNIT_DIR, systemd::CONFIGURED),
        systemd::configured_unit(),
    )?;
    write(systemd::DEFAULTS, systemd::defaults())?;
    write(systemd::LOGROTATE, systemd::logrotate())?;
    write(LINTIAN_OVERRIDES, lintian_overrides())?;

    // Every file 0644 and directory 0755 whatever the umask, the binary
    // 0755; dpkg-deb --root-owner-group makes them root's.
    normalize_modes(&root)?;
    std::fs::set_permissions(
        root.join("usr/bin/profiler"),
        PermissionsExt::from_mode(0o755),
    )?;
    let installed_kib = tree_kib(&root)?;
    let debian = root.join("DEBIAN");
    mkdir(&debian)?;
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: profiler\n\
             Version: {version}\n\
             Architecture: amd64\n\
             Maintainer: The profiler developers <profiler@localhost>\n\
             Installed-Size: {installed_kib}\n\
             Section: devel\n\
             Priority: optional\n\
             Description: eBPF profiler that finds why a program's main thread stalls\n \
             Puts uprobes on the entry and exit of the functions you pick in a\n \
             running process (or a command it launches), rebuilds every thread's\n \
             call stack exactly, and writes text and JSON reports and flame graphs.\n \
             A static binary with its eBPF programs inside; needs root (CAP_BPF,\n \
             CAP_PERFMON, CAP_SYS_ADMIN) and a kernel with BTF.\n"
        ),
    )
    .context("writing DEBIAN/control")?;
    std::fs::write(
        debian.join("conffiles"),
        format!("/{}\n/{}\n", systemd::DEFAULTS, systemd::LOGROTATE),
    )
    .context("writing DEBIAN/conffiles")?;
    std::fs::write(debian.join("postinst"), maintainer_script("configure"))
        .context("writing DEBIAN/postinst")?;
    std::fs::write(debian.join("postrm"), maintainer_script("remove"))
        .context("writing DEBIAN/postrm")?;
    normalize_modes(&debian)?;
    for script in ["postinst", "postrm"] {
        std::fs::set_permissions(debian.join(script), PermissionsExt::from_mode(0o755))?;
    }
    let deb = out_dir.join(format!("profiler_{version}_amd64.deb"));
    exec(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&root)
            .arg(&deb),
    )?;
    std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    check(&deb, out_dir)?;
    Ok(deb)
}

/// The built package checked as installed: its units through
/// `systemd-analyze verify` (unpacked into a root with the host's units),
/// and the package through `lintian`, each skipped with a note where the
/// tool is missing (`cargo xtask setup` installs both).
fn check(deb: &Path, out_dir: &Path) -> Result<()> {
    let root = out_dir.join("deb-check");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    exec(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root))?;
    // ExecReload's /bin/kill, as the unpacked root has no other program.
    mkdir(&root.join("bin"))?;
    std::fs::copy("/bin/kill", root.join("bin/kill")).context("copying /bin/kill")?;
    if systemd::host_units_into(&root)? {
        for unit in systemd::VERIFIED {
            let (ok, said) = systemd::verify(&root, unit)?;
            if !ok || !said.trim().is_empty() {
                bail!("systemd-analyze verify {unit}, as the .deb installs it:\n{said}");
            }
        }
        eprintln!(
            "dist: systemd-analyze verify: {} clean",
            systemd::VERIFIED.join(", ")
        );
    } else {
        eprintln!("dist: note: systemd-analyze missing, units not verified (cargo xtask setup)");
    }
    std::fs::remove_dir_all(&root)?;
    if crate::util::find_program("lintian").is_none() {
        eprintln!("dist: note: lintian missing, package not checked (cargo xtask setup)");
        return Ok(());
    }
    let out = Command::new("lintian")
        .args([
            "--pedantic",
            "--info",
            "--fail-on",
            "error,warning,info,pedantic",
        ])
        .arg(deb)
        .output()
        .context("running lintian")?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || said.lines().any(|l| l.len() > 2 && l.as_bytes()[1] == b':') {
        bail!(
            "lintian finds {} (fix it, or override it with a reason in lintian_overrides):\n{said}{}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "dist: lintian --pedantic: clean (overrides: {})",
        LINTIAN_OVERRIDES
    );
    Ok(())
}

/// Where lintian looks for the package's overrides.
const LINTIAN_OVERRIDES: &str = "usr/share/lintian/overrides/profiler";

/// The lintian tags the package keeps (`lintian --pedantic --info`
/// names no other), each with why.
fn lintian_overrides() -> String {
    "\
# Built by cargo xtask dist from the project's own tree, not from a Debian
# source package: there is no Debian changelog to ship (CHANGELOG.md is
# the project's), and no maintainer with a mail host of their own.
profiler: no-changelog
profiler: bogus-mail-host
# A static PIE (musl's libc linked in, so it starts on any glibc): an
# ET_DYN file with no DT_NEEDED, by design; lintian takes it for a shared
# library without dependencies.
profiler: shared-library-lacks-prerequisites [usr/bin/profiler]
# Only .symtab is kept (no DWARF, 1.8 of 12.4 MB): a panic's backtrace and
# a profile of the agent itself name its functions.
profiler: unstripped-binary-or-object [usr/bin/profiler]
"
    .to_owned()
}

/// `postinst` (`configure`) or `postrm` (`remove`): systemd told to read
/// the units again, where systemd runs; nothing enabled or started.
fn maintainer_script(when: &str) -> String {
    format!(
        "#!/bin/sh\n\
         set -e\n\
         if [ \"$1\" = \"{when}\" ] && [ -d /run/systemd/system ]; then\n\
         \tsystemctl --system daemon-reload >/dev/null || true\n\
         fi\n"
    )
}

/// `debian/copyright` in the machine-readable format, with the MIT text
/// inline and Apache-2.0 by reference to the copy every Debian system has.
fn copyright(mit: &str) -> String {
    let mut mit_field = String::new();
    for line in mit.lines() {
        if line.trim().is_empty() {
            mit_field.push_str(" .\n");
        } else {
            mit_field.push(' ');
            mit_field.push_str(line);
            mit_field.push('\n');
        }
    }
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: profiler\n\
         Comment: /usr/bin/profiler is statically linked: it holds the Rust\n \
         crates listed in the source's Cargo.lock, musl libc and zstd, each under\n \
         its own license (MIT, Apache-2.0, BSD, Zlib and the like). The eBPF\n \
         programs inside it declare the license \"Dual MIT/GPL\" to the kernel.\n\
         \n\
         Files: *\n\
         Copyright: 2026 The profiler developers\n\
         License: MIT or Apache-2.0\n\
         \n\
         License: MIT\n\
         {mit_field}\
         \n\
         License: Apache-2.0\n \
         On Debian systems, the full text of the Apache License, Version 2.0, is\n \
         in /usr/share/common-licenses/Apache-2.0.\n"
    )
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Directories 0755, files 0644, under `dir` (itself included).
fn normalize_modes(dir: &Path) -> Result<()> {
    std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            normalize_modes(&path)?;
        } else {
            std::fs::set_permissions(&path, PermissionsExt::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// The size of the files under `dir`, in KiB, each rounded up (the
/// control file's `Installed-Size`).
fn tree_kib(dir: &Path) -> Result<u64> {
    let mut kib = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            kib += tree_kib(&path)?;
        } else {
            kib += std::fs::metadata(&path)?.len().div_ceil(1024);
        }
    }
    Ok(kib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copyright_fields_are_continued() {
        let text = copyright("MIT License\n\nCopyright (c) 2026 X\n");
        assert!(
            text.contains(
                "License: MIT\n MIT License\n .\n Copyright (c) 2026 X\n\nLicense: Apache-2.0\n"
            ),
            "{text}"
        );
        for line in text.lines() {
            assert!(!line.starts_with('\t'), "{line:?}");
        }
    }
}
