//! Perf maps (`/tmp/perf-PID.map`) are read only when they are regular
//! files owned by root or the target's user: a FIFO, a symlink or another
//! user's file planted there gets one warning, is not read (the session
//! ends on time) and nothing from it reaches an output. A proper one names
//! JIT code in anonymous executable memory, hostile bytes neutralised.
use flate2::read::GzDecoder;
use profiler_tests::*;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What a planted perf map names, which must never appear in an output.
const PLANTED: &str = "PLANTED_NAME";
/// The profiler must be done within this (it samples for 1 s): 20 s, or
/// 120 s under emulation, where loading the programs and reading glibc's
/// DWARF take most of 20 s by themselves. A blocked read never ends.
fn limit() -> Duration {
    match relaxed("perfmap: sample --duration 1s must end within 120 s, not 20 s: loading and symbolizing are about 20x slower under emulation") {
        true => Duration::from_secs(120),
        false => Duration::from_secs(20),
    }
}

fn burn() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        build_c(
            "burn.c",
            "burn_perfmap",
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        )
    })
}

fn jit() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_c("jit.c", "jit", &["-O1", "-g", "-fno-omit-frame-pointer"]))
}

/// A file planted at a perf map path, removed on drop.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Clone, Copy, Debug)]
enum Plant {
    /// A FIFO nobody writes to: reading it would block forever.
    Fifo,
    /// A symlink to a file only root may read.
    Symlink,
    /// A regular file owned by `nobody` (the target runs as root).
    OtherUser,
}

impl Plant {
    /// Words the warning must hold.
    fn reason(self) -> &'static str {
        match self {
            Plant::Fifo => "it is a FIFO",
            Plant::Symlink => "it is a symbolic link",
            Plant::OtherUser => "it is owned by uid 65534, the target runs as uid 0",
        }
    }
}

/// Plants `kind` at `/tmp/perf-PID.map`, naming `[start, start+size)`
/// `PLANTED` (when it is a file with content).
fn plant(kind: Plant, pid: u32, start: u64, size: u64, keep: &TempDir) -> Planted {
    let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _ = std::fs::remove_file(&path);
    let line = format!("{start:x} {size:x} {PLANTED}\n");
    match kind {
        Plant::Fifo => mkfifo(&path),
        Plant::Symlink => {
            // A root-only file holding the planted name: if the link were
            // followed, the name would be read.
            let secret = keep.join("root-only.map");
            std::fs::write(&secret, &line).unwrap();
            std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            std::os::unix::fs::symlink(&secret, &path).unwrap();
        }
        Plant::OtherUser => {
            std::fs::write(&path, &line).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        }
    }
    Planted(path)
}

/// `profiler sample --pid PID --duration 1s`, killed if it outlives
/// [`limit`]; asserts it succeeded within it.
fn sample(pid: u32, out: &Path) -> Finished {
    let limit = limit();
    let started = Instant::now();
    let fin = profiler_wrapped(
        &["timeout", "-s", "KILL", &limit.as_secs().to_string()],
        &[
            "sample",
            "--pid",
            &pid.to_string(),
            "--duration",
            "1s",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let took = started.elapsed();
    assert!(
        fin.status.success(),
        "profiler sample did not finish within {limit:?} or failed (took {took:?}): {fin:?}"
    );
    assert!(took < limit, "took {took:?}");
    fin
}

/// Every output of `out` as bytes (`profile.pb.gz` decompressed), by name.
fn outputs(out: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let raw = std::fs::read(&p).unwrap();
        let bytes = if name.ends_with(".gz") {
            let mut v = Vec::new();
            GzDecoder::new(&raw[..])
                .read_to_end(&mut v)
                .unwrap_or_else(|e| panic!("{name} does not gunzip: {e}"));
            v
        } else {
            raw
        };
        files.push((name, bytes));
    }
    assert!(
        files.iter().any(|(n, _)| n == "cpu.folded"),
        "no cpu.folded in {files:?}"
    );
    files
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The checks of a refused perf map: one warning naming it with the
/// reason, nothing from it in any output or on stdout.
fn assert_refused(kind: Plant, fin: &Finished, out: &Path, map: &Path) {
    let shown = map.display().to_string();
    let warnings: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("warning") && l.contains(&shown))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "{kind:?}: exactly one warning naming {shown}: {:?}",
        fin.stderr
    );
    assert!(
        warnings[0].starts_with(&format!("profiler: warning: ignoring {shown}: "))
            && warnings[0].contains(kind.reason())
            && warnings[0].contains("owned by root or the target's user"),
        "{kind:?}: {:?}",
        warnings[0]
    );
    for (name, bytes) in outputs(out) {
        assert!(!contains(&bytes, PLANTED), "{kind:?}: {PLANTED} in {name}");
    }
    assert!(
        !fin.stdout.contains(PLANTED),
        "{kind:?}: {PLANTED} on stdout"
    );
    assert!(
        !fin.stderr.iter().any(|l| l.contains(PLANTED)),
        "{kind:?}: {PLANTED} on stderr"
    );
}

/// `{"start": hex, "size": hex}` of the jit fixture.
fn jit_region(fx: &mut Fixture) -> (u64, u64) {
    let v = fx.truth();
    let hex = |k: &str| u64::from_str_radix(v[k].as_str().unwrap(), 16).unwrap();
    (hex("start"), hex("size"))
}

#[test]
fn planted_perf_maps_are_refused_and_never_block() {
    require_root!();
    for kind in [Plant::Fifo, Plant::Symlink, Plant::OtherUser] {
        // The brief's target: an ordinary burner (no JIT code at all).
        let fx = Fixture::spawn(burn(), &[&lifetime(15), "chain"]);
        let keep = TempDir::new("perfmap-keep");
        let planted = plant(kind, fx.pid, 0x1000, 0x10, &keep);
        let out = TempDir::new("perfmap-burn");
        let fin = sample(fx.pid, out.path());
        assert_refused(kind, &fin, out.path(), &planted.0);
        drop(planted);
        drop(fx);

        // A target whose JIT code the planted file does name: had it been
        // read, PLANTED would be its hottest frame.
        let mut fx = Fixture::spawn(jit(), &[&lifetime(15), "nowrite"]);
        let (start, size) = jit_region(&mut fx);
        let planted = plant(kind, fx.pid, start, size, &keep);
        let out = TempDir::new("perfmap-jit");
        let fin = sample(fx.pid, out.path());
        assert_refused(kind, &fin, out.path(), &planted.0);
        let folded = read(out.path(), "cpu.folded");
        assert!(
            folded.contains("[unknown]"),
            "{kind:?}: the JIT frames should be unnamed:\n{folded}"
        );
        drop(planted);
        assert!(
            !Path::new(&format!("/tmp/perf-{}.map", fx.pid)).exists(),
            "planted file left behind"
        );
    }
}

#[test]
fn own_perf_map_names_jit_code() {
    require_root!();
    // Hostile bytes in the name: `;` (the folded separator), markup, ESC.
    let name = "JIT_SPIN;<b>\u{1b}&x";
    let mut fx = Fixture::spawn(jit(), &[&lifetime(15), "write", name]);
    let (start, _) = jit_region(&mut fx);
    let map = PathBuf::from(format!("/tmp/perf-{}.map", fx.pid));
    let _cleanup = Planted(map.clone());
    let out = TempDir::new("perfmap-own");
    let fin = sample(fx.pid, out.path());
    eprintln!("JIT loop at {start:#x}");
    let folded_text = read(out.path(), "cpu.folded");
    let stacks = folded(&folded_text);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let named: u64 = stacks
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|f| f == "JIT_SPIN:<b>?&x"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        named * 10 >= total * 8 && total > 0,
        "the JIT leaf is named from the perf map in only {named} of {total} samples:\n{folded_text}"
    );
    // No raw control byte anywhere; the SVG is still XML.
    for (name, bytes) in outputs(out.path()) {
        if name.ends_with(".folded") || name.ends_with(".txt") || name.ends_with(".svg") {
            assert!(!bytes.contains(&0x1b), "ESC in {name}");
        }
    }
    let svg = read(out.path(), "cpu.svg");
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(&svg, opts)
        .unwrap_or_else(|e| panic!("cpu.svg is not XML: {e}"));
    // The fixture's malformed first line is counted, once.
    let notes: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains(&map.display().to_string()))
        .collect();
    assert_eq!(notes.len(), 1, "{:?}", fin.stderr);
    assert!(
        notes[0].contains("1 malformed line(s) skipped"),
        "{:?}",
        notes[0]
    );
}

/// Runs `cmd`, asserting success.
fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dir/bin`: the burn fixture, stripped of its DWARF into a
/// `.gnu_debuglink`ed `bin.debug` (then removed), if `link`.
fn burn_copy(dir: &Path, link: bool) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::copy(burn(), &bin).unwrap();
    if link {
        let (b, d) = (bin.to_str().unwrap(), format!("{}.debug", bin.display()));
        run("objcopy", &["--only-keep-debug", b, &d]);
        run("strip", &["--strip-debug", b]);
        run("objcopy", &[&format!("--add-gnu-debuglink={d}"), b]);
        std::fs::remove_file(&d).unwrap();
    }
    bin
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(
        // SAFETY: mkfifo with a NUL-terminated path.
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {}",
        path.display()
    );
}

#[test]
fn fifos_beside_a_users_binary_never_block() {
    require_root!();
    // blazesym opens `<binary>.dwp`, and for a debug link
    // `<binary's dir>/<link name>`, by path: FIFOs there used to hang the
    // agent. A binary in a directory root does not control is read only
    // through /proc/PID/map_files (DWARF kept when it has no debug link).
    for link in [false, true] {
        let dir = TempDir::new("perfmap-beside");
        let bin = burn_copy(dir.path(), link);
        mkfifo(&dir.join("bin.dwp"));
        if link {
            mkfifo(&dir.join("bin.debug"));
        }
        let fx = Fixture::spawn(&bin, &[&lifetime(15), "chain"]);
        let out = TempDir::new("perfmap-beside-out");
        sample(fx.pid, out.path());
        let folded_text = read(out.path(), "cpu.folded");
        assert!(
            folded_text.lines().any(|l| l.contains(";a1;b1;c1")),
            "link {link}: a1;b1;c1 unnamed:\n{folded_text}"
        );
        if !link {
            let txt = read(out.path(), "cpu.txt");
            assert!(txt.contains("(burn.c:"), "no file:line from DWARF:\n{txt}");
        }
    }
}

#[test]
fn sigterm_ends_a_stalled_symbolization_with_outputs() {
    require_root!();
    // A FIFO where blazesym looks for a debug link's target, beside a
    // binary in a root-owned directory (so blazesym is allowed to look
    // there): symbolization blocks. SIGTERM must still end the session,
    // with every output written, within a few seconds.
    // /run where it is root's alone and allows programs: the kernels' VMs
    // share target/ over 9p, which refuses FIFOs.
    let executable = |d: &Path| {
        let c = std::ffi::CString::new(d.as_os_str().as_bytes()).unwrap();
        // SAFETY: a zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a valid out-pointer.
        unsafe { libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_NOEXEC == 0 }
    };
    let base = Some(PathBuf::from("/run"))
        .filter(|d| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(d).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0)
                && executable(d)
        })
        .unwrap_or_else(|| workspace().join("target/fixtures"));
    let dir = base.join(format!("profiler-tests-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let rooted = {
        use std::os::unix::fs::MetadataExt;
        dir.ancestors()
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0))
    };
    if !rooted {
        eprintln!(
            "SKIP sigterm_ends_a_stalled_symbolization_with_outputs: {} is not root's alone",
            dir.display()
        );
        return;
    }
    let bin = burn_copy(&dir, true);
    mkfifo(&dir.join("bin.debug"));
    let fx = Fixture::spawn(&bin, &[&lifetime(30), "chain"]);
    let out = TempDir::new("perfmap-stall");
    let cmd = {
        let mut c = std::process::Command::new(profiler_bin());
        c.args([
            "sample",
            "--pid",
            &fx.pid.to_string(),
            "--duration",
            "1s",
            "--out",
        ])
        .arg(out.path());
        c
    };
    let rec = Recording::spawn(cmd);
    // Past --duration: symbolizing, and blocked on the FIFO.
    std::thread::sleep(Duration::from_secs(4));
    let signalled = Instant::now();
    let fin = rec.stop(libc::SIGTERM);
    let took = signalled.elapsed();
    assert!(fin.status.success(), "{fin:?}");
    assert!(took < Duration::from_secs(5), "exit {took:?} after SIGTERM");
    assert!(
        fin.stderr
            .iter()
            .any(|l| l.contains("symbolization stopped (interrupted by a signal)")),
        "{:?}",
        fin.stderr
    );
    for name in ["cpu.folded", "cpu.svg", "cpu.txt", "profile.pb.gz"] {
        assert!(out.join(name).exists(), "no {name}");
    }
    assert!(!read(out.path(), "cpu.folded").is_empty());
}
