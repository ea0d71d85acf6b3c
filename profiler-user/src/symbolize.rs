//! Turns sampled addresses into names with blazesym: user addresses of the
//! target (ELF symbols and DWARF, demangled) and kernel addresses (kallsyms).
//! Results are cached per address; a frame that cannot be resolved is kept
//! as `[unknown] 0x…`, never dropped.
use std::collections::HashMap;

use blazesym::{
    symbolize::{
        source::{Kernel, Process, Source},
        Input, Symbolized, Symbolizer as Blaze,
    },
    Pid,
};

/// Largest cache before it is cleared, to keep memory flat.
const CACHE_CAP: usize = 200_000;

/// Address-to-name resolution for one target process.
pub struct Symbolizer {
    blaze: Blaze,
    pid: u32,
    user: HashMap<u64, String>,
    kernel: HashMap<u64, String>,
}

impl Symbolizer {
    /// A symbolizer for process `pid`.
    pub fn new(pid: u32) -> Self {
        Symbolizer {
            blaze: Blaze::new(),
            pid,
            user: HashMap::new(),
            kernel: HashMap::new(),
        }
    }

    /// Names for a user stack (innermost first). Return addresses beyond the
    /// first are moved back one byte so they land inside the call.
    pub fn user_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        let src = Source::Process(Process::new(Pid::from(self.pid)));
        resolve(&self.blaze, &src, &mut self.user, addrs)
    }

    /// Names for a kernel stack (innermost first), suffixed `_[k]`.
    pub fn kernel_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        let src = Source::Kernel(Kernel {
            debug_syms: false,
            ..Kernel::default()
        });
        resolve(&self.blaze, &src, &mut self.kernel, addrs)
            .into_iter()
            .map(|n| format!("{n}_[k]"))
            .collect()
    }
}

fn resolve(
    blaze: &Blaze,
    src: &Source,
    cache: &mut HashMap<u64, String>,
    addrs: &[u64],
) -> Vec<String> {
    let lookup: Vec<u64> = addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect();
    let missing: Vec<u64> = lookup
        .iter()
        .copied()
        .filter(|a| !cache.contains_key(a))
        .collect();
    if !missing.is_empty() {
        if cache.len() + missing.len() > CACHE_CAP {
            cache.clear();
        }
        let names: Vec<String> = match blaze.symbolize(src, Input::AbsAddr(&missing)) {
            Ok(syms) => syms
                .iter()
                .zip(&missing)
                .map(|(s, a)| match s {
                    Symbolized::Sym(sym) => sym.name.to_string(),
                    Symbolized::Unknown(_) => format!("[unknown] {a:#x}"),
                })
                .collect(),
            Err(_) => missing
                .iter()
                .map(|a| format!("[unknown] {a:#x}"))
                .collect(),
        };
        for (a, n) in missing.into_iter().zip(names) {
            cache.insert(a, n);
        }
    }
    lookup.iter().map(|a| cache[a].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolizer() -> u64 {
        marker_function_for_symbolizer as *const () as u64
    }

    #[test]
    fn resolves_own_function_and_keeps_unknowns() {
        let mut s = Symbolizer::new(std::process::id());
        let names = s.user_stack(&[marker_function_for_symbolizer(), 0x10]);
        assert!(
            names[0].ends_with("marker_function_for_symbolizer"),
            "{names:?}"
        );
        assert!(names[1].starts_with("[unknown]"), "{names:?}");
    }
}
