//! `profiler check`: what the running kernel has of what the profiler
//! uses, whether each of its programs loads, and what therefore works
//! (as `bpftrace --info` does). It loads every program of the object
//! once, attaches a few probes to the profiler's own calibration
//! functions, and leaves nothing loaded.
use std::path::Path;

use aya::{
    programs::{perf_event, Program},
    Btf, EbpfLoader,
};
use profiler_common::{
    PROG_ENTRY, PROG_EXIT, PROG_RET, SAMPLE_ALL_GLOBAL, TARGET_TGID_GLOBAL, WAIT_SYSCALLS,
    WAKEUP_BYTES_GLOBAL, WATCH_TID_GLOBAL,
};

use super::{
    calibrate, kernel,
    probes::EBPF_OBJECT,
    rings::{self, RingSpec},
};
use crate::error::chain;

/// One line of the check.
pub struct Finding {
    /// What was checked.
    pub what: String,
    /// Whether it is there and works.
    pub ok: bool,
    /// What was found, or what doing without it means.
    pub detail: String,
}

/// The whole check.
pub struct Check {
    /// `uname -r`.
    pub release: String,
    /// The kernel's features.
    pub features: Vec<Finding>,
    /// Each program of the object: whether the verifier accepts it.
    pub programs: Vec<Finding>,
    /// The refused programs' verifier logs.
    pub logs: Vec<(String, String)>,
    /// What works, from the above.
    pub works: Vec<Finding>,
}

impl Check {
    /// Whether the profiler can record and sample here.
    pub fn usable(&self) -> bool {
        self.features.iter().take(2).all(|f| f.ok) && self.works.iter().all(|f| f.ok)
    }
}

fn finding(what: impl Into<String>, ok: bool, detail: impl Into<String>) -> Finding {
    Finding {
        what: what.into(),
        ok,
        detail: detail.into(),
    }
}

/// Runs the check; it needs root (the caller checks the capabilities).
pub fn run() -> Check {
    let release = kernel::release();
    let version = kernel::version_of(&release);
    let since = |at: (u32, u32)| version.is_none_or(|v| v >= at);
    let mut features = vec![
        finding(
            format!("Linux {}.{} or later", kernel::OLDEST.0, kernel::OLDEST.1),
            since(kernel::OLDEST),
            match version {
                Some(v) => format!("Linux {}.{} ({release})", v.0, v.1),
                None => format!("release {release} not understood"),
            },
        ),
        finding(
            "BTF",
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "/sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF)",
        ),
        finding(
            "uprobe PMU",
            Path::new("/sys/bus/event_source/devices/uprobe/type").exists(),
            "uprobes through perf_event_open (CONFIG_UPROBE_EVENTS)",
        ),
        finding(
            "kprobe PMU",
            Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
            "the second choice for event-loop waits",
        ),
        finding(
            "uprobe_multi links (6.6, PID filter fixed in 6.10)",
            since(kernel::UPROBE_MULTI),
            if since(kernel::UPROBE_MULTI) {
                "one link per binary: thousands of functions attach and detach in milliseconds"
            } else {
                "not used: one perf event per probe (slower to attach and detach many functions)"
            },
        ),
        finding(
            "uretprobe syscall (6.11)",
            since((6, 11)),
            "cheaper return uprobes; without it each exit costs a trap (the calibration below measures it)",
        ),
        finding(
            "5-byte-nop uprobes as calls (6.18)",
            since((6, 18)),
            "cheaper entries on `nop5` prologues; without it they are single-stepped",
        ),
    ];
    let (programs, logs, waits) = load_each();
    let loaded = programs.iter().filter(|p| p.ok).count();
    let sampling = cpu_clock();
    features.push(finding(
        "cpu-clock perf events",
        sampling.is_ok(),
        sampling
            .clone()
            .err()
            .unwrap_or_else(|| "software sampling".into()),
    ));
    let calibration = if loaded > 0 {
        calibrate::calibrate(calibrate::WaitTracepoints::None).map_err(|e| chain(&e))
    } else {
        Err("no program loads".into())
    };
    let refused = |prefix: &str| {
        programs
            .iter()
            .filter(|p| p.what.starts_with(prefix) && !p.ok)
            .map(|p| p.what.clone())
            .collect::<Vec<_>>()
    };
    let loads = |name: &str| programs.iter().any(|p| p.what == name && p.ok);
    let mut works = Vec::new();
    let tracing = [PROG_ENTRY, PROG_EXIT, PROG_RET].into_iter().all(loads);
    works.push(finding(
        "record: function entries and exits",
        tracing && calibration.is_ok(),
        match &calibration {
            Ok(c) => format!(
                "a probe hit costs: entry {:.2} µs on a push, {:.2} µs on a 5-byte nop, {:.2} µs on a 4-byte nop ({}), {:.2} µs on endbr64 ({}), {:.2} µs single-stepped; exit {:.2} µs as a return uprobe, {:.2} µs as a return site",
                c.entry_push_ns / 1000.0,
                c.entry_nop_ns / 1000.0,
                c.entry_nopl_ns / 1000.0,
                if c.nopl_emulated() { "emulated" } else { "single-stepped" },
                c.entry_endbr_ns / 1000.0,
                if c.endbr_emulated() { "emulated" } else { "single-stepped" },
                c.entry_ns / 1000.0,
                c.uretprobe_ns / 1000.0,
                c.ret_site_ns / 1000.0
            ),
            Err(e) => e.clone(),
        },
    ));
    let sched = refused("prof_sched").is_empty();
    works.push(finding(
        "record: on-CPU vs blocked, wakers",
        sched,
        "sched_switch and sched_waking raw tracepoints",
    ));
    let samplers = refused("prof_sample").is_empty()
        && refused("prof_peer_sample").is_empty()
        && refused("prof_cpu_sample").is_empty();
    works.push(finding(
        "record and sample: stack samples",
        samplers && sampling.is_ok(),
        "cpu-clock samplers, stacks walked in the kernel",
    ));
    works.push(finding(
        "sample --off-cpu",
        refused("prof_offcpu").is_empty(),
        "blocked stacks at sched_switch",
    ));
    works.push(finding(
        "--follow, --all: processes and threads",
        refused("prof_proc").is_empty() && refused("sched_process_exit").is_empty(),
        "fork, exec and exit raw tracepoints",
    ));
    works.push(waits);
    Check {
        release,
        features,
        programs,
        logs,
        works,
    }
}

/// How a session would watch an event loop's waits: fentry/fexit on the
/// wait syscalls, else kprobes, else the syscall tracepoints (tried on the
/// first wait syscall, loaded and attached, then dropped).
fn wait_path(ebpf: &mut aya::Ebpf, btf: Option<&Btf>) -> Finding {
    let what = "record: event-loop waits";
    let name = WAIT_SYSCALLS[0];
    let func = format!("__x64_sys_{name}");
    let fentry = (|| -> Result<(), String> {
        let btf = btf.ok_or("no kernel BTF")?;
        let p: &mut aya::programs::FEntry = ebpf
            .program_mut(&format!("prof_enter_{name}"))
            .ok_or("no fentry program")?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| chain(&e))?;
        p.load(&func, btf).map_err(|e| chain(&e))?;
        p.attach().map(|_| ()).map_err(|e| chain(&e))
    })()
    .map_err(|e| {
        // An empty log: the kernel refused the program type, not its code.
        e.trim_end_matches(" Verifier output: ")
            .trim_end()
            .to_string()
    });
    let Err(fentry_why) = fentry else {
        return finding(
            what,
            true,
            "fentry/fexit on the wait syscalls (other syscalls pay nothing)",
        );
    };
    let kprobe = (|| -> Result<(), String> {
        let p: &mut aya::programs::KProbe = ebpf
            .program_mut(&format!("prof_kenter_{name}"))
            .ok_or("no kprobe program")?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| chain(&e))?;
        p.load().map_err(|e| chain(&e))?;
        p.attach(&func, 0).map(|_| ()).map_err(|e| chain(&e))
    })();
    match kprobe {
        Ok(()) => finding(
            what,
            true,
            format!("kprobes on the wait syscalls (fentry: {fentry_why})"),
        ),
        Err(kprobe_why) => {
            let syscall_tp = (|| -> Result<(), String> {
                let p: &mut aya::programs::TracePoint = ebpf
                    .program_mut(profiler_common::PROG_SYSCALL_ENTER)
                    .ok_or("no tracepoint program")?
                    .try_into()
                    .map_err(|e: aya::programs::ProgramError| chain(&e))?;
                p.load().map_err(|e| chain(&e))?;
                p.attach("syscalls", &format!("sys_enter_{name}"))
                    .map(|_| ())
                    .map_err(|e| chain(&e))
            })();
            finding(
                what,
                true,
                match syscall_tp {
                    Ok(()) => format!(
                        "the wait syscalls' own tracepoints, so every syscall on the machine takes the kernel's slower tracing path (fentry: {fentry_why}; kprobes: {kprobe_why})"
                    ),
                    Err(tp_why) => format!(
                        "the sys_enter/sys_exit tracepoints, so every syscall on the machine costs a little more (fentry: {fentry_why}; kprobes: {kprobe_why}; syscall tracepoints: {tp_why})"
                    ),
                },
            )
        }
    }
}

/// Opens and closes a `cpu-clock` sampling event on CPU 0.
fn cpu_clock() -> Result<(), String> {
    let mut ebpf = EbpfLoader::new().load(EBPF_OBJECT).map_err(|e| chain(&e))?;
    let prog: &mut aya::programs::PerfEvent = ebpf
        .program_mut(profiler_common::PROG_CPU_SAMPLE)
        .ok_or("no sampler program")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| chain(&e))?;
    prog.load().map_err(|e| chain(&e))?;
    prog.attach(
        perf_event::PerfEventConfig::Software(perf_event::SoftwareEvent::CpuClock),
        perf_event::PerfEventScope::AllProcessesOneCpu { cpu: 0 },
        perf_event::SamplePolicy::Frequency(1),
        false,
    )
    .map(|_| ())
    .map_err(|e| format!("cpu-clock on CPU 0: {}", chain(&e)))
}

/// Loads every program of the object, each on its own (the fentry and
/// kprobe ones on the wait syscalls, as a session would choose among
/// them); returns a finding per program, the refused ones' logs, and how
/// event-loop waits would be watched.
fn load_each() -> (Vec<Finding>, Vec<(String, String)>, Finding) {
    // (The sched_process_exit finding, when there is one, is among the
    // programs.)
    let pid = std::process::id();
    let uret = super::probes::uret_setting();
    let spec = RingSpec::shared(1 << 16);
    let mut loader = EbpfLoader::new();
    let loaded = spec.configure(&mut loader).and_then(|l| {
        l.override_global(TARGET_TGID_GLOBAL, &pid, true)
            .override_global(WATCH_TID_GLOBAL, &0u32, true)
            .override_global(SAMPLE_ALL_GLOBAL, &0u32, true)
            .override_global(WAKEUP_BYTES_GLOBAL, &u64::MAX, true)
            // As `record` and `sample` load them by default: stacks
            // walked with the unwind tables (with the language walks),
            // through return uprobes' trampolines. With the settings'
            // zeros, the verifier would drop that code as dead and pass
            // programs a session's kernel refuses.
            .override_global(
                profiler_common::UNWIND_MODE_GLOBAL,
                &profiler_common::unwind_mode::TABLES,
                true,
            )
            .override_global(
                profiler_common::uret::GLOBAL,
                &uret,
                true,
            )
            .load(EBPF_OBJECT)
            .map_err(|e| crate::Error::Load(chain(&e)))
    });
    let mut ebpf = match loaded {
        Ok(e) => e,
        Err(e) => {
            let why = chain(&e);
            return (
                vec![finding("the eBPF object (maps, BTF)", false, why.clone())],
                Vec::new(),
                finding("record: event-loop waits", false, why),
            );
        }
    };
    let _rings = rings::create(&mut ebpf, spec);
    let btf = Btf::from_sys_fs().ok();
    let mut programs = Vec::new();
    let mut logs = Vec::new();
    // The program the verifier always refuses, only for its test.
    let test_refused = std::env::var_os(profiler_common::TEST_REFUSED_ENV).is_some();
    let mut names: Vec<String> = ebpf
        .programs()
        .map(|(n, _)| n.to_string())
        .filter(|n| test_refused || n != profiler_common::PROG_TEST_REFUSED)
        .collect();
    names.sort();
    for name in names {
        let Some(prog) = ebpf.program_mut(&name) else {
            continue;
        };
        // The wait syscalls' trampolines and kprobes are choices, tried
        // below as a session tries them.
        let result = match prog {
            Program::UProbe(p) => p.load(),
            Program::RawTracePoint(p) => p.load(),
            Program::PerfEvent(p) => p.load(),
            _ => continue,
        };
        let detail = match result {
            Ok(()) => "loads".to_string(),
            Err(aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            }) => {
                logs.push((name.clone(), verifier_log.to_string()));
                format!("refused by the verifier: {io_error}")
            }
            Err(e) => format!("not loaded: {}", chain(&e)),
        };
        programs.push(finding(name, detail == "loads", detail));
    }
    let waits = wait_path(&mut ebpf, btf.as_ref());
    // Loading does not check a raw tracepoint program's arguments against
    // the tracepoint's: attaching does.
    let exit_is_old = super::probes::attach_raw_tp(
        &mut ebpf,
        profiler_common::PROG_PROC_EXIT,
        "sched_process_exit",
    )
    .is_err();
    if exit_is_old {
        let old = super::probes::attach_raw_tp(
            &mut ebpf,
            profiler_common::PROG_PROC_EXIT_OLD,
            "sched_process_exit",
        );
        programs.push(finding(
            "sched_process_exit",
            old.is_ok(),
            match old {
                Ok(()) => {
                    "has no group_dead argument: the live-thread count is read instead".into()
                }
                Err(e) => format!("neither program attaches: {}", chain(&e)),
            },
        ));
    }
    (programs, logs, waits)
}

/// The check as text: features, programs (the refused ones' logs with
/// `verbose`), what works.
pub fn text(c: &Check, verbose: bool) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let mark = |ok: bool| if ok { "yes" } else { "NO " };
    let _ = writeln!(s, "kernel: {}\n\nkernel features:", c.release);
    for f in &c.features {
        let _ = writeln!(s, "  {} {}: {}", mark(f.ok), f.what, f.detail);
    }
    let refused: Vec<&Finding> = c.programs.iter().filter(|p| !p.ok).collect();
    let _ = writeln!(
        s,
        "\neBPF programs: {} of {} load",
        c.programs.len() - refused.len(),
        c.programs.len()
    );
    for p in &c.programs {
        if verbose || !p.ok {
            let _ = writeln!(s, "  {} {}: {}", mark(p.ok), p.what, p.detail);
        }
    }
    if verbose {
        for (name, log) in &c.logs {
            let _ = writeln!(s, "\nverifier log of {name}:\n{log}");
        }
    } else if !c.logs.is_empty() {
        let _ = writeln!(
            s,
            "  (`profiler check --verbose` prints the verifier's logs)"
        );
    }
    let _ = writeln!(s, "\nwhat works:");
    for f in &c.works {
        let _ = writeln!(s, "  {} {}: {}", mark(f.ok), f.what, f.detail);
    }
    s
}
