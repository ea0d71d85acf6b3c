//! Seed inputs for the fuzz targets, made from real inputs on this machine
//! each time (nothing committed): libc and fixture ELFs and their CFI
//! sections, a perf map of libc's symbols, ring records of every kind, and
//! a short recording of the demo program (as root, with the release
//! build).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result};
use object::{Object, ObjectSection, ObjectSymbol};
use profiler_common as pc;

use crate::proc::Target;
use crate::util::{exec, gcc, is_root, profiler_bin, workspace_root};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// Writes every target's seeds under `dir/TARGET/` (emptied first).
pub fn write_all(dir: &Path, targets: &[&str]) -> Result<()> {
    let root = workspace_root();
    let elfs = elfs(&root.join("target/xtask/fuzz"))?;
    for target in targets {
        let d = dir.join(target);
        if d.exists() {
            std::fs::remove_dir_all(&d).with_context(|| format!("emptying {}", d.display()))?;
        }
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        let seeds: Vec<(String, Vec<u8>)> = match *target {
            "ring_record" => ring_records(),
            "perf_map" => perf_maps()?,
            "unwind_table" => elfs.clone(),
            "cfi_section" => cfi_sections(&elfs),
            "profile_data" => recording(&root)?.into_iter().collect(),
            other => anyhow::bail!("no seeds for fuzz target {other}"),
        };
        for (name, bytes) in &seeds {
            std::fs::write(d.join(name), bytes)?;
        }
        eprintln!("fuzz: {target}: {} seeds in {}", seeds.len(), d.display());
    }
    Ok(())
}

/// Small ELF files: a fixture built with `.eh_frame`, the same with
/// `.debug_frame` only (and compressed), `/usr/bin/true`, and libc.
fn elfs(build: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let src = workspace_root().join("tests/fixtures/calls.c");
    let variants: [(&str, &[&str]); 3] = [
        ("calls-eh", &["-O2"]),
        (
            "calls-debug-frame",
            &["-O2", "-g", "-fno-asynchronous-unwind-tables"],
        ),
        (
            "calls-zdebug",
            &["-O2", "-g", "-fno-asynchronous-unwind-tables", "-gz=zlib"],
        ),
    ];
    let mut out = Vec::new();
    for (name, flags) in variants {
        let exe = build.join(name);
        gcc(&src, &exe, flags)?;
        out.push((name.to_string(), std::fs::read(&exe)?));
    }
    for path in ["/usr/bin/true", LIBC] {
        if let Ok(bytes) = std::fs::read(path) {
            let name = Path::new(path)
                .file_name()
                .expect("a file")
                .to_string_lossy();
            out.push((name.into_owned(), bytes));
        }
    }
    Ok(out)
}

/// The `.eh_frame` and `.debug_frame` of each ELF, as `cfi_section` takes
/// them (a first byte saying which).
fn cfi_sections(elfs: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, bytes) in elfs {
        let Ok(file) = object::File::parse(&**bytes) else {
            continue;
        };
        for (section, which) in [(".eh_frame", 0u8), (".debug_frame", 1)] {
            let data = file
                .section_by_name(section)
                .and_then(|s| s.uncompressed_data().ok());
            if let Some(data) = data.filter(|d| !d.is_empty()) {
                let mut seed = vec![which];
                seed.extend_from_slice(&data);
                out.push((format!("{name}{section}"), seed));
            }
        }
    }
    out
}

/// Perf maps: libc's function symbols in the `START SIZE NAME` format,
/// and a JIT-style one with the cases the parser must tolerate.
fn perf_maps() -> Result<Vec<(String, Vec<u8>)>> {
    let bytes = std::fs::read(LIBC).with_context(|| format!("reading {LIBC}"))?;
    let file = object::File::parse(&*bytes).context("parsing libc")?;
    let mut text = String::new();
    for sym in file.dynamic_symbols().filter(|s| s.is_definition()) {
        if sym.kind() == object::SymbolKind::Text {
            let name = sym.name().unwrap_or("?");
            text.push_str(&format!(
                "{:x} {:x} {name}\n",
                0x7f00_0000_0000 + sym.address(),
                sym.size()
            ));
        }
    }
    let jit = "\
7f1c2a400040 10 LazyCompile:*handleRequest /srv/app/server.js:42
0x7f1c2a400100 0x80 Function:~<anonymous> /srv/app/util.js:7\r
7f1c2a400200 0 Stub:CEntry
7f1c2a400300\t20\tjava.lang.String::hashCode()I
7f1c2a400300 40 later entry for the same start wins
ffffffffffffffff 1 overflowing end
zz 10 bad start
7f1c2a400400 30 partial last li";
    Ok(vec![
        ("libc.map".into(), text.into_bytes()),
        ("jit.map".into(), jit.as_bytes().to_vec()),
    ])
}

/// One `ring_record` item holding a record.
fn item(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The bytes of a plain-integer `repr(C)` record.
fn bytes_of<T: pc::Record>(r: &T) -> Vec<u8> {
    // SAFETY: `Record` types are repr(C) integers with no padding; viewing
    // one's bytes reads initialised memory of its own size.
    unsafe { std::slice::from_raw_parts((r as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// `ring_record` inputs: a dispatch on the watched thread with a nested
/// call, a sample, a block and wake-up, a Go call, a second thread, and
/// the journal's tick, reap and name; and each kind of record alone.
fn ring_records() -> Vec<(String, Vec<u8>)> {
    const MAIN: u32 = 1000;
    let ev = |ts, tid, kind, func, sp| pc::Event {
        ts_ns: ts,
        tid,
        word: pc::Event::pack(kind, func),
        sp,
    };
    let stack = |e: pc::Event| {
        // SAFETY: StackEvent is plain integers; all-zero is a valid value.
        let mut s: pc::StackEvent = unsafe { std::mem::zeroed() };
        s.event = e;
        s.user_len = 3;
        s.user[..3].copy_from_slice(&[0x401000, 0x401100, 0x401200]);
        s.kernel_len = 1;
        s.kernel[0] = 0xffff_ffff_8100_0000;
        s
    };
    let comm = |tid, name: &[u8]| {
        // SAFETY: CommEvent is plain integers; all-zero is a valid value.
        let mut c: pc::CommEvent = unsafe { std::mem::zeroed() };
        c.event = ev(1, tid, pc::KIND_COMM, 0, 0);
        c.comm[..name.len()].copy_from_slice(name);
        c
    };
    let go = |ts, kind, func, sp| pc::GoEvent {
        event: ev(ts, 2000, kind, func, sp),
        goroutine: 0xc000_0001,
    };
    let sp = 0x7ffe_0000_1000;
    let records: Vec<(&str, Vec<u8>)> = vec![
        ("comm", bytes_of(&comm(MAIN, b"main"))),
        ("entry", bytes_of(&ev(10, MAIN, pc::KIND_ENTRY, 0, sp))),
        ("entry", bytes_of(&ev(20, MAIN, pc::KIND_ENTRY, 1, sp - 64))),
        (
            "sample",
            bytes_of(&stack(ev(30, MAIN, pc::KIND_SAMPLE, 0, 0))),
        ),
        (
            "sched_out",
            bytes_of(&stack(ev(40, MAIN, pc::KIND_SCHED_OUT, 1, 0))),
        ),
        ("wakeup", bytes_of(&ev(50, MAIN, pc::KIND_WAKEUP, 0, 0))),
        ("sched_in", bytes_of(&ev(60, MAIN, pc::KIND_SCHED_IN, 0, 0))),
        ("exit", bytes_of(&ev(70, MAIN, pc::KIND_EXIT, 1, sp - 56))),
        (
            "exit",
            bytes_of(&ev(2_000_000, MAIN, pc::KIND_EXIT, 0, sp + 8)),
        ),
        ("go_entry", bytes_of(&go(80, pc::KIND_GO_ENTRY, 2, sp))),
        ("go_exit", bytes_of(&go(90, pc::KIND_GO_EXIT, 2, sp))),
        ("entry", bytes_of(&ev(100, 1001, pc::KIND_ENTRY, 3, sp))),
    ];
    let mut all = vec![4u8];
    for (_, r) in &records {
        all.extend(item(0, r));
    }
    all.extend(item(1, &200_000_000u64.to_le_bytes()));
    all.extend(item(3, &[&1001u32.to_le_bytes()[..], b"worker"].concat()));
    all.extend(item(2, &1001u32.to_le_bytes()));
    let mut out = vec![("sequence".to_string(), all)];
    for (i, (name, r)) in records.iter().enumerate() {
        let mut one = vec![4u8];
        one.extend(item(0, r));
        out.push((format!("{i:02}-{name}"), one));
    }
    out
}

/// A short recording of the demo program, `profile.data`: only as root
/// and when the release profiler is built (`cargo xtask test` has both).
fn recording(root: &Path) -> Result<Option<(String, Vec<u8>)>> {
    if !is_root() || !profiler_bin().is_file() {
        eprintln!(
            "fuzz: profile_data: no recording to seed with (needs root and target/release/profiler); \
             starting from an empty corpus"
        );
        return Ok(None);
    }
    let exe = root.join("target/xtask/demo_app");
    gcc(&root.join("xtask/demo/demo_app.c"), &exe, &["-O1", "-g"])?;
    let mut target = Target::start(&mut Command::new(&exe))?;
    let out: PathBuf = root.join("target/xtask/fuzz/recording");
    let recorded = exec(
        Command::new(profiler_bin())
            .args(["record", "--pid", &target.pid().to_string(), "--out"])
            .arg(&out)
            .args(["--duration", "1500ms", "--trace-events", "0"])
            .args(["--dispatch", "dispatch_event", "--threshold", "20ms"])
            .args(["--func", "handle_*", "--func", "parse_json", "--sample"])
            .stdout(std::process::Stdio::null()),
    );
    target.guard.child.kill().ok();
    target.guard.child.wait().ok();
    recorded?;
    let _ = target.guard.wait_timeout(Duration::from_secs(1));
    let data = std::fs::read(out.join("profile.data")).context("reading the recording")?;
    Ok(Some(("demo.profile.data".into(), data)))
}
