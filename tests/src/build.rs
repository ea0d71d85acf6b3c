//! Builds the fixture programs once per test process into `target/fixtures/`
//! (or, for the ones an unprivileged user must run, a world-readable
//! directory under /tmp).
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Symbol mangling scheme of a Rust fixture build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mangling {
    /// rustc's default `_ZN…17h<hash>E` scheme.
    Legacy,
    /// `-C symbol-mangling-version=v0` (`_R…`).
    V0,
}

fn fixtures_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn out_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join("target"))
        .join("fixtures");
    std::fs::create_dir_all(&dir).expect("create target/fixtures");
    dir.canonicalize().expect("canonicalize target/fixtures")
}

/// What a build of `out` by `cmd` depends on: the command line and every
/// source in `fixtures/` (headers included), by content.
fn build_key(cmd: &Command) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{cmd:?}").hash(&mut h);
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(fixtures_src())
        .expect("read fixtures/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    srcs.sort();
    for src in srcs {
        std::fs::read(&src).unwrap_or_default().hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// Runs `cmd` writing to a temporary name, then renames it to `out` so that a
/// running copy is never overwritten in place. A build whose command and
/// sources match the last one's (`OUT.key`) is kept: each test of
/// `cargo xtask kernels` is its own process, and compiling under emulation
/// takes most of a test's time there.
fn build(out: &Path, mut cmd: Command, tmp_flag: &str) -> PathBuf {
    let key = build_key(&cmd);
    let key_file = PathBuf::from(format!("{}.key", out.display()));
    if out.exists() && std::fs::read_to_string(&key_file).is_ok_and(|k| k == key) {
        return out.to_path_buf();
    }
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    cmd.arg(tmp_flag).arg(&tmp);
    let res = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        res.status.success(),
        "building {} failed: {cmd:?}\n{}",
        out.display(),
        String::from_utf8_lossy(&res.stderr)
    );
    std::fs::rename(&tmp, out).expect("rename fixture into place");
    let _ = std::fs::write(&key_file, key);
    out.to_path_buf()
}

/// Compiles `fixtures/SRC` with gcc, `-Wall` and `flags` into `dir/name`.
fn gcc(src: &str, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let mut cmd = Command::new("gcc");
    cmd.args(flags).arg("-Wall").arg(fixtures_src().join(src));
    build(&dir.join(name), cmd, "-o")
}

/// `target/fixtures/NAME`, built from `fixtures/SRC` with `flags`.
pub fn build_c(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    gcc(src, &out_dir(), name, flags)
}

/// `target/fixtures/NAME`, built from `fixtures/SRC` with `flags` against
/// GLib (`pkg-config glib-2.0`'s flags after the source, for `--as-needed`).
pub fn build_glib(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let glib = Command::new("pkg-config")
        .args(["--cflags", "--libs", "glib-2.0"])
        .output()
        .expect("pkg-config (installed by cargo xtask setup)");
    assert!(
        glib.status.success(),
        "glib-2.0 development files missing: run cargo xtask setup"
    );
    let glib = String::from_utf8(glib.stdout).unwrap();
    let mut cmd = Command::new("gcc");
    cmd.args(flags)
        .arg("-Wall")
        .arg(fixtures_src().join(src))
        .args(glib.split_whitespace());
    build(&out_dir().join(name), cmd, "-o")
}

/// `target/fixtures/NAME`, built from `fixtures/SRC` by `tool args… SRC -o
/// OUT` (g++, rustc) or, with `go`, by `go build -o OUT SRC` (with its
/// caches under `target/fixtures`).
pub fn build_with(tool: &str, args: &[&str], src: &str, name: &str) -> PathBuf {
    let dir = out_dir();
    let mut cmd = Command::new(tool);
    if tool == "go" {
        cmd.args(["build"])
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GO111MODULE", "off");
        let out = dir.join(name);
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        cmd.arg("-o").arg(&tmp).arg(fixtures_src().join(src));
        let res = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run go (setup installs golang-go): {e}"));
        assert!(
            res.status.success(),
            "building {name} failed:\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
        std::fs::rename(&tmp, &out).expect("rename fixture into place");
        return out;
    }
    cmd.args(args).arg(fixtures_src().join(src));
    build(&dir.join(name), cmd, "-o")
}

/// Like [`build_c`], into `/tmp/profiler-tests-fixtures-<pid>/` with mode
/// 755 on the directory and the binary, so that an unprivileged user
/// (`nobody`, for the SUDO_UID tests) can execute it: /root is not
/// accessible to nobody.
pub fn build_c_world(src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(format!(
        "/tmp/profiler-tests-fixtures-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create world-readable fixture dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = gcc(src, &dir, name, flags);
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// `target/fixtures/calls`, built from `fixtures/calls.c` with gcc.
pub fn calls_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "calls.c",
            "calls",
            &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
        )
    })
}

/// `target/fixtures/plugin_main` (linked with RUNPATH=$ORIGIN) and
/// `libplugin_fx.so` beside it, which it dlopens (`fixtures/plugin*.c`).
pub fn plugin_exes() -> &'static (PathBuf, PathBuf) {
    static EXES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    EXES.get_or_init(|| {
        let lib = build_c(
            "plugin.c",
            "libplugin_fx.so",
            &["-O1", "-g", "-shared", "-fPIC"],
        );
        let main = build_c(
            "plugin_main.c",
            "plugin_main",
            &["-O1", "-g", "-Wl,-rpath,$ORIGIN", "-ldl"],
        );
        (main, lib)
    })
}

/// The stages/launch fixture (`fixtures/stages.c`), built world-executable.
pub fn stages_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c_world(
            "stages.c",
            "stages",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

/// `target/fixtures/rust_fixture` (legacy) or `rust_fixture_v0`, built with
/// plain rustc; the crate name is `rust_fixture` in both.
pub fn rust_fixture_exe(mangling: Mangling) -> &'static Path {
    static LEGACY: OnceLock<PathBuf> = OnceLock::new();
    static V0: OnceLock<PathBuf> = OnceLock::new();
    let (cell, name) = match mangling {
        Mangling::Legacy => (&LEGACY, "rust_fixture"),
        Mangling::V0 => (&V0, "rust_fixture_v0"),
    };
    cell.get_or_init(|| {
        let mut cmd = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()));
        cmd.args(["-O", "-C", "debuginfo=0", "--crate-name", "rust_fixture"]);
        if mangling == Mangling::V0 {
            cmd.args(["-C", "symbol-mangling-version=v0"]);
        }
        cmd.arg(fixtures_src().join("rust_fixture.rs"));
        build(&out_dir().join(name), cmd, "-o")
    })
}
