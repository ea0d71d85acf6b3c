//! The call tree of one slow dispatch: traced calls with exact times, in
//! call order, consecutive identical calls at the same depth merged (with a
//! count); sampled frames (on-CPU, statistical) and blocked frames (off-CPU,
//! weighted by the time blocked) hang under the traced call that was
//! running, marked as such.
//!
//! Trimming follows Matrix's rule, made deterministic: drop nodes costing ≤ 5%
//! of the dispatch, then in rounds n = 1..3 drop nodes costing ≤ 10%·n of their
//! parent, stopping once at most `limit` nodes remain; then drop the cheapest
//! leaves until `limit` is met.
//!
//! The paths down to the frames a verdict names are pinned: never trimmed,
//! even past the limit.
//!
//! The key (`key.rs`) is Matrix's too, on exact data: among traced calls costing ≥ 30% of
//! the dispatch, the one with the largest (depth + 1) × cost (depth counted
//! in frames of the program's own), skipping the
//! dispatch function itself if anything else qualifies. Sampled frames only
//! decide when no traced call does, so repeats of one cause share one key.
//! A pick that is not the program's own frame (a C library or runtime
//! wrapper, see `frames.rs`) moves up to the nearest one that is, and a
//! signature's caller is the nearest frame of the program's own above it.

/// What a node's time is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A probed call: exact entry/exit times.
    Traced,
    /// On-CPU time in unprobed code, estimated from samples.
    Sampled,
    /// Off-CPU time in unprobed code, from the scheduler (exact durations).
    Blocked,
    /// Who woke the blocked thread (`[waited for: …]`, weighted by the time
    /// blocked) and, under it, that thread's sampled stacks meanwhile.
    Waker,
}

/// One node of a dispatch's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Function name.
    pub name: String,
    /// Where the numbers come from.
    pub kind: Kind,
    /// Calls merged into this node (samples or blocks for other kinds).
    pub calls: u64,
    /// Inclusive time.
    pub total_ns: u64,
    /// Time not attributed to children.
    pub self_ns: u64,
    /// Children in call order.
    pub children: Vec<usize>,
    /// Parent (the root is its own parent).
    pub parent: usize,
    /// Of `calls`, those closed when the overhead governor detached the
    /// function (their return could not be seen: time up to the detach).
    pub detached: u64,
    /// Of `calls`, those entered by a tail call (`jmp`) from the caller,
    /// which stayed open until this one returned.
    pub tail_calls: u64,
    /// The sampled and blocked time at or below it: its `total_ns` as the
    /// samples and blocked stacks alone would have it, traced or not.
    pub seen_ns: u64,
    /// False once a later sibling was called: no more merging into it.
    open_for_merge: bool,
}

/// A dispatch's tree; node 0 is the dispatch function.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// All nodes, root first.
    pub nodes: Vec<Node>,
}

/// A flattened node for reports: pre-order with depth.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FlatNode {
    /// Function name.
    pub name: String,
    /// Depth below the dispatch function (0).
    pub depth: u32,
    /// Merged calls (or samples, or blocks).
    pub calls: u64,
    /// Inclusive time.
    pub total_ns: u64,
    /// Self time.
    pub self_ns: u64,
    /// Traced, sampled or blocked.
    pub kind: Kind,
    /// Of `calls`, those closed when the overhead governor detached the
    /// function (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub detached: u64,
    /// Of `calls`, those entered by a tail call from the caller (absent
    /// when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub tail_calls: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Tree {
    /// A tree whose root is the dispatch function `name`.
    pub fn new(name: &str) -> Self {
        Tree {
            nodes: vec![node(name, Kind::Traced, 0)],
        }
    }

    /// Enters a traced call of `name` under `parent`, merging it into the
    /// previous child if that was a call of the same function.
    pub fn enter(&mut self, parent: usize, name: &str) -> usize {
        if let Some(&last) = self.nodes[parent].children.last() {
            let n = &self.nodes[last];
            if n.kind == Kind::Traced && n.open_for_merge && n.name == name {
                return last;
            }
        }
        for i in 0..self.nodes[parent].children.len() {
            let c = self.nodes[parent].children[i];
            self.nodes[c].open_for_merge = false;
        }
        self.push(parent, name, Kind::Traced)
    }

    /// Records a completed traced call at `id`.
    pub fn complete(&mut self, id: usize, total_ns: u64, self_ns: u64) {
        let n = &mut self.nodes[id];
        n.calls += 1;
        n.total_ns += total_ns;
        n.self_ns += self_ns;
    }

    /// Takes up to `ns` out of traced node `id`'s self time, and as much out
    /// of its total and its callers' totals: the probes' time that its
    /// calls' own timestamps held. Returns what it took.
    pub fn take_out(&mut self, id: usize, ns: u64) -> u64 {
        let took = ns.min(self.nodes[id].self_ns);
        self.nodes[id].self_ns -= took;
        let mut at = id;
        loop {
            let n = &mut self.nodes[at];
            n.total_ns = n.total_ns.saturating_sub(took);
            if at == 0 {
                return took;
            }
            at = n.parent;
        }
    }

    /// Adds an estimated chain `frames` (outermost first) of `kind` under
    /// `parent`, weighted by `ns`. Chains merge by name at each level.
    /// Returns the node of the innermost frame (`parent` if none).
    pub fn add_chain(&mut self, parent: usize, frames: &[String], kind: Kind, ns: u64) -> usize {
        if matches!(kind, Kind::Sampled | Kind::Blocked) {
            let mut up = parent;
            loop {
                self.nodes[up].seen_ns += ns;
                if up == 0 {
                    break;
                }
                up = self.nodes[up].parent;
            }
        }
        let mut at = parent;
        for (i, f) in frames.iter().enumerate() {
            let found = self.nodes[at]
                .children
                .iter()
                .copied()
                .find(|&c| self.nodes[c].kind == kind && self.nodes[c].name == *f);
            let id = match found {
                Some(id) => id,
                None => self.push(at, f, kind),
            };
            let n = &mut self.nodes[id];
            n.total_ns += ns;
            if matches!(kind, Kind::Sampled | Kind::Blocked) {
                n.seen_ns += ns;
            }
            if i + 1 == frames.len() {
                n.calls += 1;
                n.self_ns += ns;
            }
            at = id;
        }
        at
    }

    fn push(&mut self, parent: usize, name: &str, kind: Kind) -> usize {
        let id = self.nodes.len();
        let mut n = node(name, kind, parent);
        n.open_for_merge = kind == Kind::Traced;
        self.nodes.push(n);
        self.nodes[parent].children.push(id);
        id
    }

    /// The heaviest leaf-most descendant of `id` of `kind`, if any.
    pub fn heaviest(&self, id: usize, kind: Kind) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut stack = vec![id];
        while let Some(i) = stack.pop() {
            for &c in &self.nodes[i].children {
                let n = &self.nodes[c];
                if n.kind == kind && best.is_none_or(|b| n.self_ns > self.nodes[b].self_ns) {
                    best = Some(c);
                }
                stack.push(c);
            }
        }
        best
    }

    /// The tree trimmed to about `limit` nodes (see the module doc), as a
    /// pre-order list. The paths from the root down to the `pinned` nodes
    /// (the frames a verdict names) are always kept, even past `limit`.
    pub fn trimmed(&self, limit: usize, pinned: &[usize]) -> Vec<FlatNode> {
        let total = self.nodes[0].total_ns;
        let mut pin = vec![false; self.nodes.len()];
        for &p in pinned {
            let mut i = p.min(self.nodes.len() - 1);
            while !pin[i] {
                pin[i] = true;
                i = self.nodes[i].parent;
            }
        }
        let mut keep = vec![true; self.nodes.len()];
        let count = |keep: &[bool]| keep.iter().filter(|&&k| k).count();
        for ((k, n), &p) in keep.iter_mut().zip(&self.nodes).zip(&pin).skip(1) {
            if !p && n.total_ns.saturating_mul(20) <= total {
                *k = false;
            }
        }
        self.prune_orphans(&mut keep);
        for round in 1..=3u64 {
            if count(&keep) <= limit {
                break;
            }
            for (i, n) in self.nodes.iter().enumerate().skip(1) {
                if keep[i]
                    && !pin[i]
                    && u128::from(n.total_ns) * 10
                        <= u128::from(self.nodes[n.parent].total_ns) * u128::from(round)
                {
                    keep[i] = false;
                }
            }
            self.prune_orphans(&mut keep);
        }
        while count(&keep) > limit {
            let leaf = (1..self.nodes.len())
                .filter(|&i| keep[i] && !pin[i] && !self.nodes[i].children.iter().any(|&c| keep[c]))
                .min_by_key(|&i| (self.nodes[i].total_ns, std::cmp::Reverse(i)));
            match leaf {
                Some(i) => keep[i] = false,
                None => break,
            }
        }
        self.flatten(&keep)
    }

    /// The whole tree as a pre-order list.
    pub fn full(&self) -> Vec<FlatNode> {
        self.flatten(&vec![true; self.nodes.len()])
    }

    fn prune_orphans(&self, keep: &mut [bool]) {
        for i in 1..self.nodes.len() {
            if !keep[self.nodes[i].parent] {
                keep[i] = false;
            }
        }
    }

    fn flatten(&self, keep: &[bool]) -> Vec<FlatNode> {
        let mut out = Vec::new();
        let mut stack = vec![(0usize, 0u32)];
        while let Some((i, depth)) = stack.pop() {
            let n = &self.nodes[i];
            out.push(FlatNode {
                name: n.name.clone(),
                depth,
                calls: n.calls,
                total_ns: n.total_ns,
                self_ns: n.self_ns,
                kind: n.kind,
                detached: n.detached,
                tail_calls: n.tail_calls,
            });
            for &c in n.children.iter().rev() {
                if keep[c] {
                    stack.push((c, depth + 1));
                }
            }
        }
        out
    }

    /// Folded lines (`a;b;c weight`) of the whole tree, for a flame graph.
    /// Sampled and blocked frames are suffixed ` [sampled]` / ` [blocked]`.
    pub fn folded(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut stack = vec![(0usize, String::new())];
        while let Some((i, prefix)) = stack.pop() {
            let n = &self.nodes[i];
            let frame = crate::text::folded_frame(&n.name);
            let frame = match n.kind {
                Kind::Traced => frame,
                Kind::Sampled => format!("{frame} [sampled]"),
                Kind::Blocked => format!("{frame} [blocked]"),
                Kind::Waker => format!("{frame} [waker]"),
            };
            let path = if prefix.is_empty() {
                frame
            } else {
                format!("{prefix};{frame}")
            };
            let child_sum: u64 = n.children.iter().map(|&c| self.nodes[c].total_ns).sum();
            let own = n.total_ns.saturating_sub(child_sum);
            if own > 0 {
                lines.push(format!("{path} {own}"));
            }
            for &c in n.children.iter().rev() {
                stack.push((c, path.clone()));
            }
        }
        lines.sort();
        lines
    }
}

impl Tree {
    /// A tree rooted at `root` from a thread's call-path trie (calls of one
    /// path merged), for windows such as startup.
    pub fn from_calltree(
        root: &str,
        ct: &crate::analyze::calltree::CallTree,
        names: &[String],
    ) -> Self {
        let mut t = Tree::new(root);
        let mut map = vec![0usize; ct.nodes().len()];
        for (id, n) in ct.nodes().iter().enumerate().skip(1) {
            let at = t.push(
                map[n.parent as usize],
                &names[n.func as usize],
                Kind::Traced,
            );
            let node = &mut t.nodes[at];
            node.calls = n.calls;
            node.total_ns = n.total_ns;
            node.self_ns = n.self_ns;
            map[id] = at;
        }
        let total: u64 = t.nodes[0]
            .children
            .iter()
            .map(|&c| t.nodes[c].total_ns)
            .sum();
        t.nodes[0].total_ns = total;
        t.nodes[0].calls = 1;
        t
    }
}

fn node(name: &str, kind: Kind, parent: usize) -> Node {
    Node {
        name: name.to_string(),
        kind,
        calls: 0,
        total_ns: 0,
        self_ns: 0,
        children: Vec::new(),
        parent,
        open_for_merge: false,
        detached: 0,
        tail_calls: 0,
        seen_ns: 0,
    }
}

/// `part` in % of `whole` (0 if `whole` is), without overflow on
/// durations that a damaged or hostile record can make huge.
pub fn pct(part: u64, whole: u64) -> u64 {
    (u128::from(part) * 100)
        .checked_div(u128::from(whole))
        .map_or(0, |p| p.min(u128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// dispatch { handle_trap { a1 790, a2 30, a3 300 } }
    fn trap() -> Tree {
        let mut t = Tree::new("dispatch");
        let h = t.enter(0, "handle_trap");
        for (name, ms) in [("step_a1", 790), ("step_a2", 30), ("step_a3", 300)] {
            let c = t.enter(h, name);
            t.complete(c, ms * MS, ms * MS);
        }
        t.complete(h, 1120 * MS, 0);
        t.complete(0, 1121 * MS, MS);
        t
    }

    #[test]
    fn blockcanary_trap_names_a1_then_a3_never_a2() {
        let t = trap();
        let names: Vec<String> = t.trimmed(20, &[]).into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["dispatch", "handle_trap", "step_a1", "step_a3"]);
        assert_eq!(t.signature(t.key_node()), "step_a1 <- handle_trap");
    }

    #[test]
    fn matrix_worked_example_keeps_a_b_b2() {
        // a 1.0 { b 0.9 { b1 0.09, b2 0.81 }, c 0.1 }
        let mut t = Tree::new("a");
        let b = t.enter(0, "b");
        let b1 = t.enter(b, "b1");
        t.complete(b1, 90, 90);
        let b2 = t.enter(b, "b2");
        t.complete(b2, 810, 810);
        t.complete(b, 900, 0);
        let c = t.enter(0, "c");
        t.complete(c, 100, 100);
        t.complete(0, 1000, 0);
        let names: Vec<String> = t.trimmed(3, &[]).into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b", "b2"]);
    }

    #[test]
    fn consecutive_calls_merge_but_interleaved_do_not() {
        let mut t = Tree::new("d");
        for name in ["x", "x", "y", "x"] {
            let id = t.enter(0, name);
            t.complete(id, 10, 10);
        }
        let flat = t.full();
        let got: Vec<(String, u64)> = flat[1..]
            .iter()
            .map(|n| (n.name.clone(), n.calls))
            .collect();
        assert_eq!(
            got,
            [
                ("x".to_string(), 2),
                ("y".to_string(), 1),
                ("x".to_string(), 1)
            ]
        );
    }

    /// watch's key: the same stall, its functions untraced, then with
    /// the outer ones traced and the inner ones detached by the governor
    /// (their samples hang under the traced caller), has one samples key;
    /// the traced pick would have moved it to the traced caller.
    #[test]
    fn the_samples_key_holds_still_whichever_frames_are_traced() {
        let chain = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut untraced = Tree::new("(loop iteration)");
        let mut traced = Tree::new("(loop iteration)");
        let s = traced.enter(0, "serve");
        let h = traced.enter(s, "handle_request");
        for _ in 0..14 {
            untraced.add_chain(
                0,
                &chain(&["serve", "handle_request", "parse_body", "tokenize"]),
                Kind::Sampled,
                10 * MS,
            );
            traced.add_chain(
                h,
                &chain(&["parse_body", "tokenize"]),
                Kind::Sampled,
                10 * MS,
            );
        }
        for _ in 0..2 {
            untraced.add_chain(0, &chain(&["serve"]), Kind::Sampled, 10 * MS);
            // A sample in the traced frame's own code.
            traced.add_chain(s, &[], Kind::Sampled, 10 * MS);
        }
        untraced.complete(0, 200 * MS, 40 * MS);
        traced.complete(h, 190 * MS, 50 * MS);
        traced.complete(s, 200 * MS, 10 * MS);
        traced.complete(0, 200 * MS, 0);
        let key = |t: &Tree, i: usize| t.signature(i);
        assert_eq!(
            key(&untraced, untraced.key_node()),
            "tokenize <- parse_body"
        );
        assert_eq!(
            key(&untraced, untraced.samples_key_node_given(0)),
            "tokenize <- parse_body"
        );
        assert_eq!(
            key(&traced, traced.samples_key_node_given(0)),
            "tokenize <- parse_body"
        );
        assert_eq!(key(&traced, traced.key_node()), "handle_request <- serve");
        assert_eq!(traced.nodes[s].seen_ns, 160 * MS);
        assert_eq!(traced.nodes[0].seen_ns, 160 * MS);
    }

    #[test]
    fn sampled_chains_hang_under_traced_and_do_not_take_the_key() {
        let mut t = Tree::new("d");
        let p = t.enter(0, "parse_json");
        t.complete(p, 100 * MS, 100 * MS);
        t.complete(0, 100 * MS, 0);
        for _ in 0..90 {
            t.add_chain(p, &["memcpy".to_string()], Kind::Sampled, MS);
        }
        assert_eq!(t.signature(t.key_node()), "parse_json <- d");
        assert_eq!(
            t.heaviest(p, Kind::Sampled)
                .map(|i| t.nodes[i].name.as_str()),
            Some("memcpy")
        );
        assert!(t
            .folded()
            .contains(&"d;parse_json;memcpy [sampled] 90000000".to_string()));
    }

    /// A dispatch blocked in the C library from a handler: the key and the
    /// call site name the handler and the call it made, not the wrapper
    /// the thread slept in.
    #[test]
    fn a_libc_wrapper_never_is_the_key() {
        let mut t = Tree::new("dispatch");
        let h = t.enter(0, "handle_a");
        t.complete(h, 100 * MS, 0);
        t.complete(0, 100 * MS, 0);
        let chain: Vec<String> = ["helper_a", "__GI___nanosleep", "__GI___clock_nanosleep"]
            .map(String::from)
            .to_vec();
        let leaf = t.add_chain(h, &chain, Kind::Blocked, 95 * MS);
        // A traced call qualifies: it is the key, as before.
        assert_eq!(t.signature(t.key_node()), "handle_a <- dispatch");
        assert_eq!(t.call_site(leaf).0, "nanosleep <- helper_a");
        // No traced call below the dispatch: Matrix's rule alone picks the
        // deepest heavy frame, the wrapper; the key is the handler above it.
        let mut b = Tree::new("dispatch");
        b.complete(0, 100 * MS, 0);
        let chain: Vec<String> = ["handle_b", "poll", "__GI___poll"]
            .map(String::from)
            .to_vec();
        let leaf = b.add_chain(0, &chain, Kind::Blocked, 95 * MS);
        assert_eq!(b.nodes[leaf].name, "__GI___poll");
        assert_eq!(b.signature(b.key_node()), "handle_b <- dispatch");
        assert_eq!(b.call_site(leaf).0, "poll <- handle_b");
        // Only sampled and blocked frames, all of them wrappers: the root.
        let mut w = Tree::new("uv__stream_io");
        w.complete(0, 100 * MS, 0);
        let leaf = w.add_chain(
            0,
            &["uv_run".to_string(), "__GI_epoll_pwait".to_string()],
            Kind::Blocked,
            90 * MS,
        );
        assert_eq!(w.key_node(), 0);
        assert_eq!(w.call_site(leaf).0, "uv_run <- uv__stream_io");
    }

    /// Node's execSync route: the verdict names the route's JS function
    /// and the API it called, through runtime frames in between, whatever
    /// tier ran them.
    #[test]
    fn a_runtime_call_is_named_by_the_programs_js_frame() {
        let mut t = Tree::new("uv__stream_io");
        t.complete(0, 200 * MS, 0);
        let chain: Vec<String> = [
            "node::LibuvStreamWrap::OnUvRead",
            "Builtins_JSEntry",
            "JS:emit node:events:514:28",
            "JS: /srv/app.js:14:35",
            "Builtins_InterpreterEntryTrampoline",
            "JS:sleepHandler /srv/app.js:9:22",
            "JS:execSync node:child_process:866:18",
            "JS:spawnSync node:child_process:820:19",
            "node::SyncProcessRunner::Spawn",
            "uv_run",
            "uv__io_poll",
            "epoll_pwait",
            "__GI_epoll_pwait",
        ]
        .map(String::from)
        .to_vec();
        let leaf = t.add_chain(0, &chain, Kind::Blocked, 190 * MS);
        let k = t.key_node();
        assert_eq!(
            t.signature(k),
            "JS:sleepHandler /srv/app.js:9:22 <- JS: /srv/app.js:14:35"
        );
        assert_eq!(
            t.call_site(leaf).0,
            "JS:execSync node:child_process:866:18 <- JS:sleepHandler /srv/app.js:9:22"
        );
    }

    /// The trimmed tree keeps the path down to the frames a verdict names,
    /// however deep, and still trims the rest.
    #[test]
    fn trimming_keeps_the_path_to_the_named_frames() {
        let mut t = Tree::new("dispatch");
        t.complete(0, 100 * MS, 0);
        let deep: Vec<String> = (0..40).map(|i| format!("frame_{i}")).collect();
        let leaf = t.add_chain(0, &deep, Kind::Blocked, 90 * MS);
        for i in 0..30 {
            t.add_chain(0, &[format!("side_{i}")], Kind::Sampled, MS / 4);
        }
        let names =
            |flat: Vec<FlatNode>| -> Vec<String> { flat.into_iter().map(|n| n.name).collect() };
        let plain = names(t.trimmed(20, &[]));
        assert_eq!(plain.len(), 20);
        assert!(!plain.contains(&"frame_39".to_string()), "{plain:?}");
        let kept = names(t.trimmed(20, &[leaf]));
        let mut want = vec!["dispatch".to_string()];
        want.extend(deep);
        assert_eq!(kept, want, "the whole path and nothing cheaper");
    }

    /// A CPU-bound handler starved of CPU: samples see only the time it
    /// ran, and that is what its frames are weighed against.
    #[test]
    fn a_starved_handler_is_still_the_key() {
        let mut t = Tree::new("uv__stream_io");
        t.complete(0, 170 * MS, 0);
        let chain: Vec<String> = ["JS:slowHandler /srv/app.js:3:21", "Builtins_MathSin"]
            .map(String::from)
            .to_vec();
        for _ in 0..30 {
            t.add_chain(0, &chain, Kind::Sampled, MS);
        }
        assert_eq!(t.key_node(), 0, "30 of 170 ms seen: below 30%");
        assert_eq!(
            t.signature(t.key_node_given(140 * MS)),
            "JS:slowHandler /srv/app.js:3:21 <- uv__stream_io"
        );
    }

    /// A JS handler under some 15 frames of libuv, Node and V8, with a few
    /// samples of its caller outside it: it is still the key, as it would
    /// be were those frames not there.
    #[test]
    fn runtime_frames_do_not_flatten_the_depth_weighting() {
        let mut t = Tree::new("uv__stream_io");
        t.complete(0, 40 * MS, 0);
        let mut chain: Vec<String> = (0..15).map(|i| format!("node::Frame{i}")).collect();
        chain.push("JS: /srv/app.js:14:34".into());
        for _ in 0..3 {
            t.add_chain(0, &chain, Kind::Sampled, MS);
        }
        chain.push("JS:slowHandler /srv/app.js:3:21".into());
        for _ in 0..30 {
            t.add_chain(0, &chain, Kind::Sampled, MS);
        }
        assert_eq!(
            t.signature(t.key_node()),
            "JS:slowHandler /srv/app.js:3:21 <- JS: /srv/app.js:14:34"
        );
    }
}
