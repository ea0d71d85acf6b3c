//! Small helpers: where the workspace is, running commands loudly, finding
//! programs.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Path of the release profiler binary.
pub fn profiler_bin() -> PathBuf {
    workspace_root().join("target/release/profiler")
}

/// Whether we run as root (the integration tests and the bench need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A `cargo` command for the toolchain that runs xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Render a command as a shell-like line for logs.
pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        let a = arg.to_string_lossy();
        if a.is_empty() || a.contains([' ', '*', '\'', '"', '{', '}', '?']) {
            s.push_str(&format!(" '{}'", a.replace('\'', r"'\''")));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Run a command, echoing it, and fail unless it exits 0.
pub fn exec(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{}`", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// Run a command quietly and return its stdout, or `None` if it cannot start or
/// exits non-zero.
pub fn stdout_of<I, S>(program: &str, args: I) -> Option<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Find a program in `PATH`, and also in the sbin directories, which a
/// non-root `PATH` often lacks.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `cargo build --release -p profiler-user`.
pub fn build_profiler() -> Result<()> {
    exec(cargo().args(["build", "--release", "-p", "profiler-user"]))?;
    let bin = profiler_bin();
    if !bin.is_file() {
        bail!("the build succeeded but {} is missing", bin.display());
    }
    Ok(())
}

/// Compile a C file with gcc.
pub fn gcc(src: &Path, out: &Path, flags: &[&str]) -> Result<()> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    exec(
        Command::new("gcc")
            .args(flags)
            .arg("-o")
            .arg(out)
            .arg(src)
            .arg("-pthread"),
    )
}
