//! The key of a slow dispatch's tree: which node names it (Matrix's pick,
//! on exact data, see `tree.rs`'s module doc), moved to the program's own
//! frames, and the signatures (`name <- caller`) keys are made of.
use super::frames;
use super::tree::{Kind, Node, Tree};

impl Tree {
    /// Depth of every node in frames of the program's own: its own
    /// ancestors, and itself if it is one ([`frames::is_own`]). The same as
    /// the depth where every frame is (traced C code); a handler below 15
    /// frames of libuv and V8 is not weighed as if those were its callers.
    fn own_depths(&self) -> Vec<u32> {
        let mut d = vec![0u32; self.nodes.len()];
        for i in 1..self.nodes.len() {
            d[i] = d[self.nodes[i].parent] + u32::from(self.is_own(i));
        }
        d
    }

    /// Whether node `id` is a frame of the program's own
    /// ([`frames::is_own_in`]: below a Python frame, only Python frames are).
    fn is_own(&self, id: usize) -> bool {
        let mut up = self.nodes[id].parent;
        let mut under_python = false;
        while up != 0 {
            if self.nodes[up].name.starts_with("py:") {
                under_python = true;
                break;
            }
            up = self.nodes[up].parent;
        }
        frames::is_own_in(&self.nodes[id].name, under_python)
    }

    /// The key node: Matrix's rule over traced nodes, sampled ones only if
    /// no traced node qualifies; then moved up to the nearest frame of the
    /// program's own ([`Self::own_or_ancestor`]), so a C library or runtime
    /// wrapper (`__GI_epoll_pwait`, `Builtins_*`) never is the key. A
    /// traced pick with no frame of the program's own above it gives way to
    /// the sampled and blocked frames.
    #[cfg(test)]
    pub fn key_node(&self) -> usize {
        self.key_node_given(0)
    }

    /// The key node (`key_node`, in tests) when the dispatch spent `runnable_ns` waiting
    /// for a CPU: time no sample or blocked stack can show, so sampled and
    /// blocked frames qualify from 30% of the rest (a CPU-bound handler
    /// starved of CPU is still its own key).
    pub fn key_node_given(&self, runnable_ns: u64) -> usize {
        let total = self.nodes[0].total_ns.max(1);
        let seen = total.saturating_sub(runnable_ns).max(1);
        let of =
            |kinds: &'static [Kind]| move |n: &Node| kinds.contains(&n.kind).then_some(n.total_ns);
        let sampled = of(&[Kind::Sampled, Kind::Blocked]);
        self.pick(total, of(&[Kind::Traced]))
            .filter(|&i| i != 0)
            .or_else(|| self.pick(seen, sampled))
            .or_else(|| self.pick_by_function(seen, sampled))
            .unwrap_or(0)
    }

    /// [`Self::pick`] with each node weighed as its function is over the
    /// whole tree: the weights of the nodes of its name that no node of
    /// that name holds (a recursion counted once). A function's samples
    /// are split between two callers' nodes when the governor detaches a
    /// traced frame above them while it runs (those before hang under it,
    /// those after under its caller): neither part may reach 30% where
    /// the whole does. Only where no node qualifies by itself.
    fn pick_by_function(&self, base: u64, weight: impl Fn(&Node) -> Option<u64>) -> Option<usize> {
        let mut whole: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        let mut outermost = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let Some(w) = weight(n) else { continue };
            let mut up = n.parent;
            let mut held = false;
            while up != 0 && !held {
                held = self.nodes[up].name == n.name && weight(&self.nodes[up]).is_some();
                up = self.nodes[up].parent;
            }
            if !held {
                outermost[i] = true;
                *whole.entry(n.name.as_str()).or_default() += w;
            }
        }
        self.pick_at(base, |i| {
            outermost[i].then(|| whole[self.nodes[i].name.as_str()])
        })
        .filter(|&i| i != 0)
    }

    /// The key node as the samples and blocked stacks alone would pick it
    /// (the sampled and blocked pick of [`Self::key_node_given`], every
    /// node weighed by its `seen_ns`), whichever of its frames are traced:
    /// the same for a stall whether its functions were probed or not, so
    /// `watch`'s groups hold still while it probes a group's functions and
    /// its governor takes some of them off.
    pub fn samples_key_node_given(&self, runnable_ns: u64) -> usize {
        let total = self.nodes[0].total_ns.max(1);
        let seen = total.saturating_sub(runnable_ns).max(1);
        let seen_of = |n: &Node| (n.kind != Kind::Waker).then_some(n.seen_ns);
        self.pick(seen, seen_of)
            .filter(|&i| i != 0)
            .or_else(|| self.pick_by_function(seen, seen_of))
            .unwrap_or(0)
    }

    /// Matrix's pick: among the nodes `weight` weighs (None: not one) at
    /// 30% of `base` or more, the largest (own depth + 1) × weight, moved
    /// up to the program's own frame.
    fn pick(&self, base: u64, weight: impl Fn(&Node) -> Option<u64>) -> Option<usize> {
        self.pick_at(base, |i| weight(&self.nodes[i]))
    }

    /// [`Self::pick`] with nodes weighed by their index.
    fn pick_at(&self, base: u64, weight: impl Fn(usize) -> Option<u64>) -> Option<usize> {
        let depths = self.own_depths();
        let mut best: Option<(u128, usize)> = None;
        for (i, depth) in depths.iter().enumerate().skip(1) {
            let Some(w) = weight(i) else { continue };
            if u128::from(w) * 10 < u128::from(base) * 3 {
                continue;
            }
            let score = u128::from(depth + 1) * u128::from(w);
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, i));
            }
        }
        best.map(|(_, i)| self.own_or_ancestor(i))
    }

    /// `id` if it is a frame of the program's own ([`frames::is_own`]),
    /// else its nearest ancestor that is, else the root.
    pub fn own_or_ancestor(&self, mut id: usize) -> usize {
        while id != 0 && !self.is_own(id) {
            id = self.nodes[id].parent;
        }
        id
    }

    /// The nearest strict ancestor of `id` of the program's own, or the
    /// root.
    pub fn own_parent(&self, id: usize) -> usize {
        if id == 0 {
            return 0;
        }
        self.own_or_ancestor(self.nodes[id].parent)
    }

    /// `name <- caller` of node `id`: its caller is its nearest ancestor of
    /// the program's own (runtime frames between them left out), names as
    /// keys hold them ([`frames::key_name`]).
    pub fn signature(&self, id: usize) -> String {
        let name = frames::key_name(&self.nodes[id].name);
        if id == 0 {
            name
        } else {
            let caller = self.own_parent(id);
            format!("{name} <- {}", frames::key_name(&self.nodes[caller].name))
        }
    }

    /// What the program called that blocked (or ran) in `leaf`:
    /// `call <- own`, where `own` is the nearest frame of the program's own
    /// at or above `leaf` (its caller when `leaf` itself is one) and `call`
    /// the frame it called on the way to `leaf` (a wrapper such as
    /// `nanosleep` or `JS:execSync node:child_process:…`). Returns the
    /// text and the two nodes.
    pub fn call_site(&self, leaf: usize) -> (String, usize, usize) {
        let own = self.own_or_ancestor(leaf);
        if own == leaf {
            return (self.signature(leaf), leaf, self.own_parent(leaf));
        }
        let mut call = leaf;
        while self.nodes[call].parent != own {
            call = self.nodes[call].parent;
        }
        let text = format!(
            "{} <- {}",
            frames::key_name(&self.nodes[call].name),
            frames::key_name(&self.nodes[own].name)
        );
        (text, call, own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A Tk callback's stall while the governor detached the interpreter's
    /// functions (tk.rs, seen once in a full run): its Python function's
    /// samples are split between the detached frame (89 ms) and its caller
    /// (51 ms), neither 30% of the 325-ms dispatch; the function is still
    /// the key, not the loop iteration. Recursion is counted once.
    #[test]
    fn a_function_split_by_a_detach_is_still_the_key() {
        let chain = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let parse = "py:blocking_parse (/app/tk_app.py)";
        let mut t = Tree::new("(loop iteration)");
        let call = t.enter(0, "PyObject_Call");
        let vec = t.enter(call, "_PyFunction_Vectorcall");
        for _ in 0..89 {
            t.add_chain(
                vec,
                &chain(&[
                    "_PyEval_EvalFrameDefault",
                    "py:main.<locals>.slow (/app/tk_app.py)",
                    parse,
                ]),
                Kind::Sampled,
                MS,
            );
        }
        t.complete(vec, 217 * MS, 128 * MS);
        for _ in 0..51 {
            t.add_chain(call, &chain(&[parse, parse]), Kind::Sampled, MS);
        }
        t.complete(call, 325 * MS, 57 * MS);
        t.complete(0, 325 * MS, 0);
        for key in [t.key_node_given(0), t.samples_key_node_given(0)] {
            assert_eq!(t.nodes[key].name, parse, "{}", t.signature(key));
            // The outermost of its nodes: not the recursion's inner one.
            assert_ne!(t.nodes[t.nodes[key].parent].name, parse);
        }
        // 40 ms, its recursion's inner 40 ms not counted again: under 30%.
        let mut short = Tree::new("(loop iteration)");
        let call = short.enter(0, "PyObject_Call");
        for _ in 0..40 {
            short.add_chain(call, &chain(&[parse, parse]), Kind::Sampled, MS);
        }
        short.complete(call, 325 * MS, 285 * MS);
        short.complete(0, 325 * MS, 0);
        assert_eq!(short.key_node_given(0), 0, "40 of 325 ms is not a key");
    }
}
