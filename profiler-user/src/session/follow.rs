//! `--follow`: when a traced process execs, the new program's functions
//! that the selection matches are probed (once per file: a program already
//! probed, such as the parent's own, is traced from its first instruction
//! without anything to do). Its calls before the probes are in place are
//! not seen; the process's section says when probing started.
use crate::{
    attach::probes::Probes,
    cli::SelectArgs,
    clock::monotonic_ns,
    session::{probed::ProbedRecord, sinks::Sinks},
    tracee::{probe_set::Probed, process::Target, select},
};

/// Probes the programs traced processes exec.
pub struct ExecProber<'a> {
    /// The session's probes.
    pub probes: &'a mut Probes,
    /// The session's selection, which grows.
    pub sel: &'a mut select::Selection,
    /// What is probed already, by file and offset.
    pub probed: Probed,
    /// The selection's options (without `--lib` and `--dispatch`, which
    /// name the first targets' libraries and dispatch functions).
    pub args: SelectArgs,
}

impl ExecProber<'_> {
    /// Process `pid` exec'd: select in its new program, attach what is new,
    /// and tell the pipeline (and `profile.data`).
    pub fn on_exec(&mut self, sinks: &mut Sinks, pid: u32) {
        let Ok(target) = Target::open(pid) else {
            // Gone already: nothing to probe.
            return;
        };
        let exe = target.exe.display().to_string();
        let first = self.sel.funcs.len();
        let first_binary = self.sel.binaries.len();
        match select::select(&target, &self.args, &[]) {
            Ok(new) => {
                self.probed.merge(self.sel, new, self.args.max_funcs());
            }
            Err(e) => eprintln!(
                "profiler: PID {pid} exec'd {exe}: nothing probed in it ({})",
                crate::error::chain(&e)
            ),
        }
        if self.sel.funcs.len() > first {
            if let Err(e) = self.probes.attach_from(self.sel, first, 0) {
                eprintln!(
                    "profiler: warning: PID {pid} exec'd {exe}, whose functions could not be probed: {}",
                    crate::error::chain(&e)
                );
                self.sel.funcs.truncate(first);
                self.sel.binaries.truncate(first_binary);
            }
        }
        let ts_ns = monotonic_ns();
        let added = &self.sel.funcs[first..];
        if !added.is_empty() {
            eprintln!(
                "profiler: PID {pid} exec'd {exe}: probing {} more functions from now on",
                added.len()
            );
        }
        let rec = ProbedRecord::new(pid, ts_ns, exe, &self.sel.binaries[first_binary..], added);
        sinks.inject(&rec.encode());
    }
}

impl crate::session::collector::Steer for ExecProber<'_> {
    fn on_exec(&mut self, sinks: &mut Sinks, pid: u32) {
        ExecProber::on_exec(self, sinks, pid);
    }
}
