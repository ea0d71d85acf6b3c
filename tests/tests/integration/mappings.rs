//! Symbolization where the file is hard to find: a library dlopen'd after
//! sampling began, and a binary that only exists in the target's own mount
//! namespace.
use profiler_tests::*;
use std::process::{Command, Stdio};

fn gcc_ok(args: &[&str]) {
    let out = Command::new("gcc").args(args).output().expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn library_dlopened_after_attach_is_symbolized() {
    require_root!();
    let dir = TempDir::new("dlopen-bin");
    let src = |f: &str| format!("{}/fixtures/{f}", env!("CARGO_MANIFEST_DIR"));
    let lib = dir.join("libburn.so");
    let exe = dir.join("dlopen_main");
    gcc_ok(&[
        "-O1",
        "-g",
        "-fPIC",
        "-shared",
        "-o",
        lib.to_str().unwrap(),
        &src("dlopen_lib.c"),
    ]);
    gcc_ok(&[
        "-O1",
        "-g",
        "-o",
        exe.to_str().unwrap(),
        &src("dlopen_main.c"),
        "-ldl",
    ]);
    let out = TempDir::new("dlopen");
    // The library must stay mapped until the agent's first look at the
    // new mapping (a tick after the sample that met it).
    let secs = match relaxed("mappings: the dlopened library burns 10 s, not 2 s: the agent's ticks come seconds apart under emulation") {
        true => "10",
        false => "2",
    };
    let mut fx = Fixture::spawn(&exe, &[lib.to_str().unwrap(), secs]);
    let pid = fx.pid.to_string();
    let mut cmd = Command::new(profiler_bin());
    cmd.args([
        "sample",
        "--pid",
        &pid,
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let rec = Recording::spawn(cmd);
    fx.run();
    let fin = rec.wait();
    assert!(fin.status.success(), "{fin:?}");
    let folded = read(out.path(), "cpu.folded");
    assert!(
        folded.lines().any(|l| l.contains(";lib_burn")),
        "lib_burn not symbolized:\n{folded}"
    );
}

#[test]
fn binary_in_another_mount_namespace_is_traced_and_symbolized() {
    require_root!();
    // The fixture runs from a tmpfs mounted only in its own mount namespace:
    // its path does not exist here, only /proc/PID/exe and map_files reach it.
    let exe = build_c(
        "burn.c",
        "burn_ns",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let script = format!(
        // It is killed when the profiler is done: 600 s outlasts even an
        // emulated machine's attach.
        "mount -t tmpfs none /mnt && cp {} /mnt/burn_ns && exec /mnt/burn_ns 600 chain",
        exe.display()
    );
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid: u32 = line
        .trim()
        .strip_prefix("ready ")
        .expect("ready line")
        .parse()
        .unwrap();
    assert!(
        !std::path::Path::new("/mnt/burn_ns").exists(),
        "the fixture's file is visible here"
    );
    let out = TempDir::new("mntns");
    let fin = profiler(&[
        "sample",
        "--pid",
        &pid.to_string(),
        "--duration",
        "1s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(fin.status.success(), "{fin:?}");
    let folded = read(out.path(), "cpu.folded");
    assert!(
        folded.lines().any(|l| l.contains("a1;b1;c1")),
        "no a1;b1;c1:\n{folded}"
    );
}
