//! A Go program under the profiler (reliability.md #7, issue 9 item 5):
//! return-site probes leave goroutine stacks alone, so the program never
//! crashes while its stacks grow and move, and calls are paired by
//! goroutine, so counts and durations match the program's own counters
//! although goroutines move between threads in the middle of calls.
use profiler_tests::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `target/fixtures/gostack`, built with the Debian Go toolchain.
fn gostack() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_with("go", &[], "gostack.go", "gostack"))
}

const FUNCS: [&str; 6] = ["-f", "main.traced", "-f", "main.grow", "-f", "main.leaf"];

#[test]
fn go_goroutines_growing_stacks_are_traced_exactly() {
    require_root!();
    // Exact counts need every function probed to the end: without
    // `--max-overhead 0` the governor may detach main.grow (50K calls a
    // second, two return sites' traps each: 13 µs a hit on a slow host).
    let mut args = FUNCS.to_vec();
    args.extend(["--max-overhead", "0"]);
    let (truth, o) = record_fixture(gostack(), &["10", "100"], &args);
    assert_eq!(o.get("lost_events"), 0, "raise the ring size: {}", o.report);
    for name in ["main.traced", "main.grow", "main.leaf"] {
        let want = num(truth_fn(&truth, name), "calls");
        assert!(want > 0, "{name} never ran");
        assert_eq!(o.sum(name, "calls"), want, "{name}: {}", o.report);
        assert_eq!(o.sum(name, "unwound"), 0, "{name}");
        assert_eq!(o.sum(name, "unfinished"), 0, "{name}");
        assert_eq!(o.functions(name)[0]["exit_probe"], "ret");
    }
    assert_eq!(o.get("orphan_exits"), 0);
    assert!(o.report.contains("auto: the target has Go"), "{}", o.report);
    let (got, want) = (
        o.sum("main.traced", "total_ns"),
        num(truth_fn(&truth, "main.traced"), "total_ns"),
    );
    // Summed over concurrent goroutines, so within 2% rather than 0.5 ms.
    assert!(
        got.abs_diff(want) <= want / 50,
        "main.traced total: profiler {got} ns, program {want} ns"
    );
}

/// What return uprobes do to the same program: documented, not required
/// (`auto` never uses them on Go).
#[test]
fn go_with_uretprobes_is_documented() {
    require_root!();
    let out = TempDir::new("go-uret");
    let mut fx = Fixture::spawn(gostack(), &["3", "100"]);
    let mut args = vec!["--exit-probes", "uretprobe"];
    args.extend_from_slice(&FUNCS);
    let rec = Recording::start(fx.pid, out.path(), &args);
    fx.go();
    std::thread::sleep(std::time::Duration::from_secs(5));
    let alive = fx.alive();
    let fin = rec.stop(libc::SIGINT);
    eprintln!(
        "with --exit-probes uretprobe the Go fixture {} (profiler exit {:?})",
        if alive {
            "survived this run (Go may still crash when a stack is copied)"
        } else {
            "crashed"
        },
        fin.status.code()
    );
    assert_nothing_attached();
}
