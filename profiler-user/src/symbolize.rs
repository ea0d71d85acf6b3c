//! Turns addresses into names with blazesym: user addresses of a process
//! (ELF symbols, DWARF with inlined functions and file:line, debug files
//! under /usr/lib/debug; demangled) and kernel addresses (kallsyms).
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

/// Frames of one address, outermost first: the function, then the
/// functions inlined into it at that address (suffixed `_[i]`).
pub type Frames = Vec<String>;

/// Address-to-name resolution, with a cache.
pub struct Symbolizer {
    blaze: Blaze,
    pid: u32,
    cache: HashMap<(u32, u64), Frames>,
}

/// Pseudo-pid under which kernel addresses are cached.
const KERNEL: u32 = 0;

impl Symbolizer {
    /// A symbolizer whose default process is `pid`.
    pub fn new(pid: u32) -> Self {
        Symbolizer {
            blaze: Blaze::new(),
            pid,
            cache: HashMap::new(),
        }
    }

    /// Innermost names for a user stack of the default process (innermost
    /// first), without inlined frames: for matching against traced calls.
    pub fn user_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(self.pid, addrs)
            .into_iter()
            .map(|mut f| f.swap_remove(0))
            .collect()
    }

    /// Names for a kernel stack (innermost first), suffixed `_[k]`.
    pub fn kernel_stack(&mut self, addrs: &[u64]) -> Vec<String> {
        self.frames(KERNEL, addrs)
            .into_iter()
            .map(|mut f| format!("{}_[k]", f.swap_remove(0)))
            .collect()
    }

    /// Frames for every address of a stack (innermost first) of process
    /// `pid` (0: the kernel). Return addresses past the first are moved back
    /// one byte so they land inside the call instruction.
    pub fn frames(&mut self, pid: u32, addrs: &[u64]) -> Vec<Frames> {
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
            .collect();
        let missing: Vec<u64> = lookup
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&(pid, *a)))
            .collect();
        if !missing.is_empty() {
            if self.cache.len() + missing.len() > CACHE_CAP {
                self.cache.clear();
            }
            let src = if pid == KERNEL {
                Source::Kernel(Kernel {
                    debug_syms: false,
                    ..Kernel::default()
                })
            } else {
                Source::Process(Process::new(Pid::from(pid)))
            };
            let resolved: Vec<Frames> = match self.blaze.symbolize(&src, Input::AbsAddr(&missing)) {
                Ok(syms) => syms
                    .iter()
                    .zip(&missing)
                    .map(|(s, a)| match s {
                        Symbolized::Sym(sym) => {
                            let mut f = vec![sym.name.to_string()];
                            f.extend(sym.inlined.iter().map(|i| format!("{}_[i]", i.name)));
                            f
                        }
                        Symbolized::Unknown(_) => vec![format!("[unknown] {a:#x}")],
                    })
                    .collect(),
                Err(_) => missing
                    .iter()
                    .map(|a| vec![format!("[unknown] {a:#x}")])
                    .collect(),
            };
            for (a, f) in missing.into_iter().zip(resolved) {
                self.cache.insert((pid, a), f);
            }
        }
        lookup
            .iter()
            .map(|a| self.cache[&(pid, *a)].clone())
            .collect()
    }
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
