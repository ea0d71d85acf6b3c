//! `profiler check` (issue 26): on this kernel every program loads, the
//! features it reports match the running kernel, and nothing stays
//! loaded afterwards.
use profiler_tests::*;

#[test]
fn check_reports_this_kernel_and_leaves_nothing_loaded() {
    require_root!();
    let before = prof_prog_ids();
    let out = profiler(&["check"]);
    assert!(out.status.success(), "profiler check failed: {out:?}");
    let text = &out.stdout;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert!(
        text.starts_with(&format!("kernel: {}\n", release.trim())),
        "{text}"
    );
    // Every program the sessions load (the wait syscalls' trampolines and
    // kprobes are choices, reported under what works).
    let line = text
        .lines()
        .find(|l| l.starts_with("eBPF programs: "))
        .unwrap_or_else(|| panic!("no programs line: {text}"));
    let (loaded, total) = line
        .trim_start_matches("eBPF programs: ")
        .trim_end_matches(" load")
        .split_once(" of ")
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(loaded, total, "{text}");
    assert!(total.parse::<u32>().expect("count") >= 10, "{text}");
    // BTF is there, as every other test needs; a kernel since 6.10 uses
    // uprobe_multi links.
    assert!(text.contains("  yes BTF:"), "{text}");
    let (major, minor) = kernel_version();
    let multi = if (major, minor) >= (6, 10) {
        "yes"
    } else {
        "NO "
    };
    assert!(
        text.contains(&format!("  {multi} uprobe_multi links")),
        "{text}"
    );
    // What works: all of it, with the calibrated costs.
    let works = text
        .split("what works:")
        .nth(1)
        .expect("what works section");
    assert!(
        works.lines().filter(|l| !l.trim().is_empty()).count() >= 6,
        "{works}"
    );
    assert!(!works.contains("  NO "), "{works}");
    assert!(works.contains("a probe hit costs: entry"), "{works}");
    assert_none_left_since(&before, &[]);
}

#[test]
fn check_verbose_lists_every_program() {
    require_root!();
    let out = profiler(&["check", "--verbose"]);
    assert!(out.status.success(), "{out:?}");
    for prog in [
        "prof_entry",
        "prof_exit",
        "prof_ret",
        "prof_sched_switch",
        "prof_cpu_sample",
    ] {
        assert!(
            out.stdout.contains(&format!("  yes {prog}: loads")),
            "{prog} missing: {}",
            out.stdout
        );
    }
}
