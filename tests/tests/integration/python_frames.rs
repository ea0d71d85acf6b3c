//! CPython frames by PID (issue 22): a script started without flags, by
//! every CPython 3.11+ on the machine (Debian's python3.11, pyenv's
//! builds), sampled by PID: the samples in the interpreter carry the
//! script's Python functions and lines, under the evaluator frames that
//! run them, checked against the script's known call structure.
use profiler_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `outer` (line 12) calls `middle` (line 9), which calls `leaf` (lines
/// 4-7), forever.
const SCRIPT: &str = concat!(
    "import os, time\n",
    "def leaf(n):\n",
    "    s = 0\n",
    "    for i in range(n):\n",
    "        s += i * i\n",
    "    return s\n",
    "\n",
    "def middle(n):\n",
    "    return leaf(n) + 1\n",
    "def outer():\n",
    "    while True:\n",
    "        middle(100000)\n",
    "print('ready', os.getpid(), flush=True)\n",
    "outer()\n",
);

/// The CPython 3.11+ interpreters installed: Debian's (and its debug build,
/// `python3.11-dbg`), then pyenv's.
fn pythons() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = vec!["/usr/bin/python3.11".into(), "/usr/bin/python3.11d".into()];
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
        let mut v: Vec<PathBuf> = versions
            .flatten()
            .flat_map(|v| (11..=13).map(move |m| v.path().join(format!("bin/python3.{m}"))))
            .collect();
        v.sort();
        found.extend(v);
    }
    found.retain(|p| p.exists());
    found
}

/// Of the samples of `stacks` in the evaluator, the share whose Python
/// frames are `<module>` → `outer` → `middle` → `leaf` at the script's
/// lines, and how many were in the evaluator.
fn named_share(stacks: &[(Vec<String>, u64)], script: &Path) -> (f64, u64) {
    let s = script.display();
    let chain = [
        format!("py:<module> ({s}:14)"),
        format!("py:outer ({s}:12)"),
        format!("py:middle ({s}:9)"),
    ];
    let leaf = format!("py:leaf ({s}:");
    let (mut in_eval, mut named) = (0, 0);
    for (frames, n) in stacks {
        if !frames.iter().any(|f| f == "_PyEval_EvalFrameDefault") {
            continue;
        }
        in_eval += n;
        let ok = frames.windows(4).any(|w| {
            w[..3].iter().zip(&chain).all(|(a, b)| a == b)
                && w[3]
                    .strip_prefix(&leaf)
                    .and_then(|l| l.strip_suffix(')'))
                    .and_then(|l| l.parse::<u32>().ok())
                    .is_some_and(|l| (4..=6).contains(&l))
        });
        if ok {
            named += n;
        }
    }
    (named as f64 / in_eval.max(1) as f64, in_eval)
}

#[test]
fn python_frames_by_pid_in_every_installed_cpython() {
    require_root!();
    let pythons = pythons();
    if pythons.is_empty() {
        eprintln!("SKIP python_frames_by_pid_in_every_installed_cpython: no CPython 3.11+");
        return;
    }
    let dir = TempDir::new("pyframes");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).expect("write app.py");
    for python in &pythons {
        let mut cmd = Command::new(python);
        cmd.arg(&script);
        let fx = Fixture::spawn_cmd(cmd, python);
        let out = TempDir::new("pyframes-out");
        let fin = profiler(&[
            "sample",
            "--pid",
            &fx.pid.to_string(),
            "--duration",
            "2s",
            "--out",
            out.path().to_str().unwrap(),
        ]);
        assert!(fin.status.success(), "{}: {fin:?}", python.display());
        let stacks = folded(&read(out.path(), "cpu.folded"));
        let (share, total) = named_share(&stacks, &script);
        eprintln!(
            "{}: <module>;outer;middle;leaf with their lines in {:.1}% of {total} samples in the evaluator",
            python.display(),
            share * 100.0
        );
        assert!(
            total >= 100,
            "{}: only {total} samples in the evaluator",
            python.display()
        );
        assert!(
            share >= 0.95,
            "{}: {:.3} of {total}",
            python.display(),
            share
        );
        let txt = read(out.path(), "cpu.txt");
        assert!(
            txt.contains("samples in the interpreter (_PyEval_EvalFrameDefault)"),
            "cpu.txt counts them: {txt}"
        );
        if python.starts_with("/usr/bin") {
            // System-wide, the same names (the Debian build only: one
            // system-wide session is enough).
            let out = TempDir::new("pyframes-all");
            let fin = profiler(&[
                "sample",
                "--all",
                "--hz",
                "499",
                "--duration",
                "3s",
                "--out",
                out.path().to_str().unwrap(),
            ]);
            assert!(fin.status.success(), "--all: {fin:?}");
            let stacks = folded(&read(out.path(), "cpu.folded"));
            let mine: Vec<(Vec<String>, u64)> = stacks
                .into_iter()
                .filter(|(s, _)| s[0] == "python3.11")
                .collect();
            let (share, total) = named_share(&mine, &script);
            eprintln!("--all: named in {:.1}% of {total}", share * 100.0);
            assert!(
                total >= 100 && share >= 0.95,
                "--all: {share:.3} of {total}"
            );
        }
    }
}

/// A Python older than the walker knows gets one line naming its version,
/// and its native frames as before; never a Python name.
#[test]
fn an_unsupported_python_says_so_once_and_keeps_native_frames() {
    require_root!();
    let old = pythons_before_311();
    let Some(python) = old.first() else {
        eprintln!("SKIP an_unsupported_python_says_so_once_and_keeps_native_frames: no CPython 3.8-3.10 (pyenv)");
        return;
    };
    let dir = TempDir::new("pyold");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).expect("write app.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script);
    let fx = Fixture::spawn_cmd(cmd, python);
    let out = TempDir::new("pyold-out");
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
    let notes: Vec<&String> = fin
        .stderr
        .iter()
        .filter(|l| l.contains("whose frames are not walked"))
        .collect();
    assert_eq!(notes.len(), 1, "one line: {:?}", fin.stderr);
    assert!(notes[0].contains("Python 3."), "{}", notes[0]);
    let folded = read(out.path(), "cpu.folded");
    assert!(!folded.contains("py:"), "no Python names for it");
    assert!(
        folded.contains("_PyEval_EvalFrameDefault"),
        "native frames as before"
    );
}

fn pythons_before_311() -> Vec<PathBuf> {
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = versions
        .flatten()
        .flat_map(|v| (8..=10).map(move |m| v.path().join(format!("bin/python3.{m}"))))
        .filter(|p| p.exists())
        .collect();
    v.sort();
    v
}
