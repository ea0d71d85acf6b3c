//! `cargo xtask reliability`: runs the tests that cover the rows of the
//! failure-mode matrix (its rows are [`ROWS`], the one copy inside the
//! repository) and writes RELIABILITY.md at the repository root: one line per
//! row with its tests and their results, the date, commit and kernel.
//!
//! [`ROWS`] is the one row-to-test table. A test named here that does not
//! exist (yet) is reported `missing`, not an error.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context as _, Result};

use crate::libtest::{Parser, Status};
use crate::test::cargo_test;
use crate::util::{build_profiler, cargo, is_root, profiler_bin, stdout_of, workspace_root};

/// What covers a row.
#[derive(Debug, Clone, Copy)]
pub enum Cover {
    /// A test of the root-only integration suite (`tests/`), by path.
    It(&'static str),
    /// A unit test of profiler-user's library, by path.
    Unit(&'static str),
    /// Something run separately, named as a command line.
    Cmd(&'static str),
    /// The hour-long soak: figures from `target/soak.md`.
    Soak,
}

use Cover::{Cmd, It, Soak, Unit};

/// A row of the matrix.
#[derive(Debug)]
pub struct Row {
    pub n: u8,
    pub scenario: &'static str,
    pub covers: &'static [Cover],
}

/// The matrix, and the tests covering each row.
pub const ROWS: &[Row] = &[
    Row {
        n: 1,
        scenario: "ring buffer overflow with the consumer paused: drops equal the real losses",
        covers: &[
            It("loss::tiny_ring_paused_consumer_counts_losses_exactly"),
            It("loss::tiny_ring_running_consumer_accounting_holds"),
            It("loss::ring_size_suffix_accepted_and_accounting_holds"),
            It("loss::per_cpu_rings_paused_consumer_count_losses_exactly"),
            It("loss::shared_ring_paused_consumer_counts_losses_exactly"),
        ],
    },
    Row {
        n: 2,
        scenario: "many threads calling probed functions at full speed: accounting holds, drops shown live and in the report",
        covers: &[
            It("reliability::accounting::row02_many_threads_full_speed_drops_shown_live_and_in_report"),
            It("threads::per_thread_counts_names_and_target_exit"),
            It("loss::per_cpu_rings_running_consumer_accounting_holds"),
        ],
    },
    Row {
        n: 3,
        scenario: "agent stopped (SIGSTOP) for 5 s under load, then continued: no hang, memory capped, losses counted",
        covers: &[It("reliability::accounting::row03_agent_stopped_5s_under_load_counts_losses")],
    },
    Row {
        n: 4,
        scenario: "an entry or exit lost: other frames unchanged, orphan exits counted, not mis-paired",
        covers: &[
            It("reliability::accounting::row04_missed_entry_is_an_orphan_exit_not_a_mispairing"),
            It("teardown::recursion_past_uretprobe_limit_pairs_returns_with_their_frames"),
        ],
    },
    Row {
        n: 5,
        scenario: "recursion deeper than 64 (uretprobe nesting limit): target unharmed, omitted returns reported",
        covers: &[
            It("teardown::recursion_past_uretprobe_limit_leaves_target_unharmed"),
            It("teardown::recursion_100_deep_sees_every_return_with_return_site_probes"),
            It("teardown::recursion_past_uretprobe_limit_pairs_returns_with_their_frames"),
        ],
    },
    Row {
        n: 6,
        scenario: "longjmp or a C++ exception through probed frames: target as without probes, frames marked",
        covers: &[
            It("unwinding::cpp_exception_through_probed_frames_by_pid"),
            It("unwinding::cpp_exception_through_probed_frames_launched"),
            It("unwinding::rust_panic_inside_catch_unwind_by_pid"),
            It("unwinding::rust_panic_inside_catch_unwind_launched"),
            It("unwinding::longjmp_out_of_probed_frames_keeps_self_within_total"),
        ],
    },
    Row {
        n: 7,
        scenario: "Go binary: return-site probes, the target never crashes",
        covers: &[
            It("golang::go_goroutines_growing_stacks_are_traced_exactly"),
            It("golang::go_with_uretprobes_is_documented"),
        ],
    },
    Row {
        n: 8,
        scenario: "thousands of threads exiting in the middle of probed calls: state reaped, memory flat",
        covers: &[
            It("reliability::lifecycle::row08_threads_exiting_midcall_are_reaped_and_memory_stays_flat"),
            It("reaping::exited_threads_fold_into_one_entry_per_name"),
        ],
    },
    Row {
        n: 9,
        scenario: "target exits or execs while attached: the agent notices, writes its outputs, exits with a message",
        covers: &[
            It("reliability::lifecycle::row09_target_execs_inside_a_probed_call"),
            It("threads::per_thread_counts_names_and_target_exit"),
        ],
    },
    Row {
        n: 10,
        scenario: "PID reused after the target died: never attach to the new process",
        covers: &[It("reliability::lifecycle::row10_reused_pid_is_never_traced")],
    },
    Row {
        n: 11,
        scenario: "agent killed with SIGKILL during in-flight calls: target unharmed, no probes left",
        covers: &[It("teardown::sigkill_during_calls_leaves_target_unharmed")],
    },
    Row {
        n: 12,
        scenario: "function in a shared library, with a PID: other processes see no events and no slowdown",
        covers: &[It("reliability::safety::row12_library_probe_with_pid_leaves_other_processes_alone")],
    },
    Row {
        n: 13,
        scenario: "bad input (nonexistent PID, non-ELF, no match, bad pattern): one-line error, nothing attached",
        covers: &[
            It("bad_input::nonexistent_pid"),
            It("bad_input::non_elf_library"),
            It("bad_input::no_function_matches"),
            It("bad_input::bad_pattern"),
            It("bad_input::output_not_writable"),
            It("launch::missing_command_is_one_error"),
        ],
    },
    Row {
        n: 14,
        scenario: "not root, or CAP_BPF / CAP_PERFMON / CAP_SYS_ADMIN missing: the error names it",
        covers: &[It("bad_input::not_root"), It("bad_input::missing_cap_sys_admin")],
    },
    Row {
        n: 15,
        scenario: "verifier rejection: one line names the program and the verifier's reason, then the log's last 20 lines (`PROFILER_VERIFIER_LOG=full`: all); `profiler check --verbose` shows the verifier log",
        covers: &[It("reliability::input::row15_verifier_rejection_shows_the_log")],
    },
    Row {
        n: 16,
        scenario: "output path is a planted symlink: refused, the link's target untouched",
        covers: &[
            It("bad_input::output_dir_is_symlink"),
            It("bad_input::output_file_is_symlink"),
        ],
    },
    Row {
        n: 17,
        scenario: "hostile symbol names (`</script>`, `&`, control bytes): outputs stay valid, nothing injected",
        covers: &[
            It("flamegraph::hostile_symbol_name_is_escaped"),
            It("perfmap::own_perf_map_names_jit_code"),
            Unit("text::tests::hostile_names_are_neutralised"),
            Unit("output::export::trace::tests::hostile_names_are_escaped"),
        ],
    },
    Row {
        n: 18,
        scenario: "dlopen after attach, deleted binary, other mount namespace: frames resolved",
        covers: &[
            It("mappings::library_dlopened_after_attach_is_symbolized"),
            It("mappings::binary_in_another_mount_namespace_is_traced_and_symbolized"),
            It("deleted::deleted_binary_is_traced_exactly"),
        ],
    },
    Row {
        n: 19,
        scenario: "hour-long session at a high event rate: agent RSS and fds flat",
        covers: &[Soak],
    },
    Row {
        n: 20,
        scenario: "SIGINT / SIGTERM under load: complete report and SVGs, exit within 5 s",
        covers: &[
            It("reliability::lifecycle::row20_sigint_and_sigterm_under_load_end_within_5s_with_outputs"),
            It("tracing::sigterm_and_exclude"),
            It("perfmap::sigterm_ends_a_stalled_symbolization_with_outputs"),
            It("launch::ctrl_c_on_a_terminal_reaches_the_command_and_is_not_sent_again"),
        ],
    },
    Row {
        n: 21,
        scenario: "two profilers on the same PID at once: both exact",
        covers: &[It("reliability::accounting::row21_two_profilers_on_one_pid_both_exact")],
    },
    Row {
        n: 22,
        scenario: "fork or vfork inside a probed call: both run as untraced, the child never paired with the parent",
        covers: &[It("reliability::lifecycle::row22_fork_and_vfork_inside_probed_calls")],
    },
    Row {
        n: 23,
        scenario: "a signal handler calls probed functions during a probed call: frames nest, nothing mis-paired",
        covers: &[It("reliability::safety::row23_signal_handler_calls_nest_inside_the_interrupted_call")],
    },
    Row {
        n: 24,
        scenario: "target stopped (SIGSTOP) or traced (gdb) at attach: attach works, target runs on unharmed",
        covers: &[
            It("reliability::lifecycle::row24_target_stopped_by_sigstop_at_attach"),
            It("reliability::lifecycle::row24_target_traced_by_gdb_at_attach"),
        ],
    },
    Row {
        n: 25,
        scenario: "target exits while probes are being attached: a clear error, nothing left attached",
        covers: &[It("reliability::lifecycle::row25_target_exits_while_probes_attach")],
    },
    Row {
        n: 26,
        scenario: "`--out` on a full filesystem: one error line, partial recording readable, probes detached",
        covers: &[It("recording_damage::full_disk_tmpfs")],
    },
    Row {
        n: 27,
        scenario: "profile.data truncated or corrupted: complete blocks read, damage named with its offset",
        covers: &[
            It("recording_damage::truncated_reads_complete_blocks"),
            It("recording_damage::mutations_never_silently_wrong"),
            It("recording_damage::sigkill_cut_is_readable"),
            It("replay::corrupt_or_newer_data_is_refused"),
        ],
    },
    Row {
        n: 28,
        scenario: "perf map or debuglink file a FIFO, symlink or another user's: refused with a warning",
        covers: &[
            It("perfmap::planted_perf_maps_are_refused_and_never_block"),
            It("perfmap::fifos_beside_a_users_binary_never_block"),
        ],
    },
    Row {
        n: 29,
        scenario: "malformed ELF, DWARF or perf map (fuzzed): a warning and unnamed frames, no panic or hang",
        covers: &[
            Unit("symbolize::perfmap::tests::malformed_and_overflowing_lines_are_skipped_and_counted"),
            It("perfmap::own_perf_map_names_jit_code"),
            It("bad_input::non_elf_library"),
            Cmd("cargo xtask fuzz --minutes N"),
        ],
    },
    Row {
        n: 30,
        scenario: "bad values (0, negative, huge, --hz 0, non-UTF-8, own PID, PID 1, kernel thread): one-line error first",
        covers: &[
            It("reliability::input::row30_bad_values_are_refused_before_attaching"),
            It("bad_input::kernel_thread_is_named_as_such"),
            It("bad_input::zero_max_funcs_is_refused_by_name"),
            It("bad_input::bad_ring_size"),
        ],
    },
    Row {
        n: 31,
        scenario: "launch mode under sudo: the command runs as the invoking user, outputs owned by that user",
        covers: &[
            It("launch::runs_as_sudo_user_and_chowns_outputs"),
            It("tracing::outputs_chowned_to_sudo_user"),
        ],
    },
    Row {
        n: 32,
        scenario: "agent under a tight cgroup memory.max at a high event rate: drops counted, not OOM-killed",
        covers: &[It("reliability::resources::row32_agent_under_memory_max_is_not_oom_killed")],
    },
    Row {
        n: 33,
        scenario: "agent starved of CPU (pinned to a busy core): losses counted, no hang, report complete",
        covers: &[It("reliability::resources::row33_agent_starved_of_cpu_counts_losses_and_finishes")],
    },
    Row {
        n: 34,
        scenario: "agent stopped for 60 s, then killed with SIGKILL: target unharmed, everything detaches",
        covers: &[It("reliability::lifecycle::row34_agent_stopped_then_killed")],
    },
];

/// `cargo xtask reliability` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long row 34 keeps the agent stopped before killing it (the
    /// matrix says 60 s; `cargo xtask test` uses 5).
    #[arg(long, default_value_t = 60)]
    pub row34_secs: u64,
}

/// The tests of `ROWS` of one kind.
fn names(pick: fn(&Cover) -> Option<&'static str>) -> Vec<&'static str> {
    let mut v: Vec<&str> = ROWS
        .iter()
        .flat_map(|r| r.covers.iter().filter_map(pick))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

pub fn run(args: &Args) -> Result<()> {
    if !is_root() {
        bail!(
            "the integration tests load eBPF programs and need root: \
             `sudo -E cargo xtask reliability`"
        );
    }
    build_profiler()?;
    let mut parser = Parser::default();
    let it = names(|c| match c {
        It(n) => Some(n),
        _ => None,
    });
    // A failing test makes cargo exit non-zero: that is a result, not an
    // error of this command.
    let run = cargo_test(
        cargo()
            .args([
                "test",
                "--release",
                "-p",
                "profiler-tests",
                "--test",
                "integration",
            ])
            .args(["--", "--test-threads=1", "--show-output", "--exact"])
            .args(&it)
            .env("PROFILER_BIN", profiler_bin())
            .env("PROFILER_TESTS_ROW34_SECS", args.row34_secs.to_string()),
        &mut parser,
    );
    if let Err(e) = run {
        eprintln!("reliability: {e:#}");
    }
    let unit = names(|c| match c {
        Unit(n) => Some(n),
        _ => None,
    });
    let mut unit_parser = Parser::default();
    if let Err(e) = cargo_test(
        cargo()
            .args(["test", "-p", "profiler-user", "--lib"])
            .args(["--", "--show-output", "--exact"])
            .args(&unit),
        &mut unit_parser,
    ) {
        eprintln!("reliability: {e:#}");
    }
    let root = workspace_root();
    let md = render(
        &parser.results,
        &unit_parser.results,
        &Header::read(&root, args.row34_secs),
        read_soak(&root).as_deref(),
    );
    let path = root.join("RELIABILITY.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("reliability: wrote {}", path.display());
    Ok(())
}

/// Where and when the run happened.
pub struct Header {
    pub date: String,
    pub commit: String,
    pub kernel: String,
    pub row34_secs: u64,
}

impl Header {
    fn read(root: &Path, row34_secs: u64) -> Header {
        let one = |s: Option<String>| {
            s.map(|s| s.trim().to_string())
                .unwrap_or_else(|| "?".into())
        };
        let root = root.to_string_lossy();
        let mut commit = one(stdout_of(
            "git",
            ["-C", &root, "rev-parse", "--short=12", "HEAD"],
        ));
        if stdout_of(
            "git",
            ["-C", &root, "status", "--porcelain", "--untracked-files=no"],
        )
        .is_some_and(|s| !s.trim().is_empty())
        {
            commit.push_str(" (with uncommitted changes)");
        }
        Header {
            date: one(stdout_of("date", ["-u", "+%Y-%m-%d %H:%M UTC"])),
            commit,
            kernel: one(stdout_of("uname", ["-srm"])),
            row34_secs,
        }
    }
}

/// The length of the soak in `md` (its title, `# Soak: N min`).
fn soak_minutes(md: &str) -> u64 {
    md.lines()
        .find_map(|l| {
            l.strip_prefix("# Soak: ")?
                .strip_suffix(" min")?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// `target/soak.md` (written by `cargo xtask soak`), if present.
fn read_soak(root: &Path) -> Option<String> {
    std::fs::read_to_string(root.join("target/soak.md")).ok()
}

/// A row's verdict from its covers' results.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Pass,
    Skip,
    NotRun,
    Missing,
    Known,
    Fail,
}

/// A failure, a known defect or a missing test decides; otherwise one
/// pass is enough (a skip or a cover not run beside it stays visible in
/// the line); otherwise skip, else not run.
fn row_verdict(vs: &[Verdict]) -> Verdict {
    let worst = vs.iter().max().cloned().unwrap_or(Verdict::NotRun);
    if worst >= Verdict::Missing {
        worst
    } else if vs.contains(&Verdict::Pass) {
        Verdict::Pass
    } else if vs.contains(&Verdict::Skip) {
        Verdict::Skip
    } else {
        Verdict::NotRun
    }
}

impl Verdict {
    fn word(&self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Skip => "skip",
            Verdict::NotRun => "not run",
            Verdict::Missing => "missing",
            Verdict::Known => "known defect",
            Verdict::Fail => "FAIL",
        }
    }
}

fn status_text(s: Option<&Status>) -> (Verdict, String) {
    match s {
        None => (Verdict::Missing, "missing (no such test yet)".into()),
        Some(Status::Ok) => (Verdict::Pass, "pass".into()),
        Some(Status::Failed) => (Verdict::Fail, "FAIL".into()),
        Some(Status::Ignored(why)) => (
            Verdict::Known,
            format!("ignored ({})", why.as_deref().unwrap_or("no reason given")),
        ),
        Some(Status::Skipped(why)) => {
            // `row15: reason` -> `reason`: the row is the line's.
            let why = match why.split_once(": ") {
                Some((head, rest)) if head.starts_with("row") => rest,
                _ => why,
            };
            (Verdict::Skip, format!("skip: {}", why.replace('|', "/")))
        }
    }
}

/// RELIABILITY.md.
pub fn render(
    it: &BTreeMap<String, Status>,
    unit: &BTreeMap<String, Status>,
    h: &Header,
    soak: Option<&str>,
) -> String {
    let mut rows = String::new();
    let mut tally: BTreeMap<Verdict, u32> = BTreeMap::new();
    for row in ROWS {
        let mut parts = Vec::new();
        let mut verdicts = Vec::new();
        for c in row.covers {
            let (v, text) = match c {
                It(n) => {
                    let (v, t) = status_text(it.get(*n));
                    (v, format!("`{n}`: {t}"))
                }
                Unit(n) => {
                    let (v, t) = status_text(unit.get(*n));
                    (v, format!("`{n}` (unit): {t}"))
                }
                Cmd(c) => {
                    parts.push(format!("`{c}` (run separately)"));
                    continue;
                }
                Soak => match soak {
                    Some(md) if md.contains("soak: FAIL") => (
                        Verdict::Fail,
                        "`cargo xtask soak`: over the goal, figures below".into(),
                    ),
                    Some(md) if soak_minutes(md) < 60 => (
                        Verdict::NotRun,
                        format!(
                            "`cargo xtask soak --minutes {}` passed (figures below); the row asks \
                             for an hour: `cargo xtask soak --minutes 60`",
                            soak_minutes(md)
                        ),
                    ),
                    Some(_) => (Verdict::Pass, "`cargo xtask soak`: figures below".into()),
                    None => (
                        Verdict::NotRun,
                        "not run: `cargo xtask soak --minutes 60` writes target/soak.md".into(),
                    ),
                },
            };
            verdicts.push(v);
            parts.push(text);
        }
        let verdict = row_verdict(&verdicts);
        let word = verdict.word();
        *tally.entry(verdict).or_default() += 1;
        let _ = writeln!(
            rows,
            "| {} | {} | {} | {word} |",
            row.n,
            row.scenario,
            parts.join("<br>")
        );
    }
    let summary: Vec<String> = tally
        .iter()
        .map(|(v, n)| format!("{n} {}", v.word()))
        .collect();
    let mut md = format!(
        "# Reliability\n\n\
         Generated by `cargo xtask reliability` from a test run; do not edit by hand.\n\
         Each row of the failure-mode matrix with the \
         tests that cover it (the rows and their tests are `ROWS` in `xtask/src/reliability.rs`) and their results. \
         Every test ends with the matrix's teardown check: no BPF program or link of ours \
         left, the target's text equal to its ELF (read through /proc/PID/mem), and its \
         output and exit status those of an untraced run.\n\n\
         - date: {}\n- commit: {}\n- kernel: {}\n- row 34: agent stopped {} s\n\
         - rows: {}\n\n\
         | # | scenario | tests | result |\n| --- | --- | --- | --- |\n{rows}",
        h.date,
        h.commit,
        h.kernel,
        h.row34_secs,
        summary.join(", ")
    );
    md.push_str("\n## Soak (row 19)\n\n");
    match soak {
        Some(text) => md.push_str(text.trim_end()),
        None => md.push_str(
            "Not run for this file: `cargo xtask soak --minutes 60` writes target/soak.md, \
             which the next `cargo xtask reliability` includes here.",
        ),
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_once_in_order() {
        let ns: Vec<u8> = ROWS.iter().map(|r| r.n).collect();
        assert_eq!(ns, (1..=34).collect::<Vec<u8>>());
        assert!(ROWS.iter().all(|r| !r.covers.is_empty()));
    }

    #[test]
    fn verdicts_of_rows() {
        let mut it = BTreeMap::new();
        it.insert(
            "loss::tiny_ring_paused_consumer_counts_losses_exactly".into(),
            Status::Ok,
        );
        it.insert(
            "reliability::input::row15_verifier_rejection_shows_the_log".into(),
            Status::Skipped("row15: no hook".into()),
        );
        it.insert(
            "reliability::lifecycle::row10_reused_pid_is_never_traced".into(),
            Status::Failed,
        );
        let h = Header {
            date: "d".into(),
            commit: "c".into(),
            kernel: "k".into(),
            row34_secs: 60,
        };
        let md = render(&it, &BTreeMap::new(), &h, None);
        let line = |n: u8| {
            md.lines()
                .find(|l| l.starts_with(&format!("| {n} |")))
                .unwrap()
                .to_string()
        };
        // Row 1: one pass, two tests absent from this run.
        assert!(line(1).ends_with("| missing |"), "{}", line(1));
        assert!(line(10).ends_with("| FAIL |"), "{}", line(10));
        assert!(line(15).ends_with("| skip |"), "{}", line(15));
        assert!(line(15).contains("skip: no hook"), "{}", line(15));
        assert!(line(19).ends_with("| not run |"), "{}", line(19));
        assert!(line(26).contains("recording_damage::full_disk_tmpfs`: missing"));
        let row19 = |soak: &str| {
            render(&it, &BTreeMap::new(), &h, Some(soak))
                .lines()
                .find(|l| l.starts_with("| 19 |"))
                .unwrap()
                .to_string()
        };
        let hour = "# Soak: 60 min\nRSS slope 0 MB/h\nsoak: PASS";
        assert!(render(&it, &BTreeMap::new(), &h, Some(hour)).contains("RSS slope 0 MB/h"));
        assert!(row19(hour).ends_with("| pass |"), "{}", row19(hour));
        // A short run does not stand for the hour; a failed one fails.
        let short = "# Soak: 2 min\nsoak: PASS";
        assert!(row19(short).ends_with("| not run |"), "{}", row19(short));
        let failed = "# Soak: 60 min\nsoak: FAIL";
        assert!(row19(failed).ends_with("| FAIL |"), "{}", row19(failed));
    }
}
