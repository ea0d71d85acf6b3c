//! A per-thread call tree (a trie of call paths). Each node aggregates the
//! completed invocations of one function reached by one path. Nodes are
//! created once per distinct path, so steady-state events allocate nothing.
/// Keyed by (parent, function): small integers, hashed on every event.
type Edges = foldhash::HashMap<(NodeId, u32), NodeId>;

/// Index of a node; [`ROOT`] is the thread itself.
pub type NodeId = u32;
/// The root node: the thread, not a function.
pub const ROOT: NodeId = 0;

/// One call path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// Function index (meaningless for the root).
    pub func: u32,
    /// Parent node (the root is its own parent).
    pub parent: NodeId,
    /// Completed invocations.
    pub calls: u64,
    /// Summed inclusive time of completed invocations.
    pub total_ns: u64,
    /// Summed self time (inclusive minus traced children).
    pub self_ns: u64,
}

/// A trie of call paths.
#[derive(Debug, Clone)]
pub struct CallTree {
    nodes: Vec<Node>,
    children: Edges,
}

impl Default for CallTree {
    fn default() -> Self {
        CallTree {
            nodes: vec![Node::default()],
            children: Edges::default(),
        }
    }
}

impl CallTree {
    /// The node for calling `func` from `parent`, created on first use.
    #[inline]
    pub fn child(&mut self, parent: NodeId, func: u32) -> NodeId {
        let next = self.nodes.len() as NodeId;
        let id = *self.children.entry((parent, func)).or_insert(next);
        if id == next {
            self.nodes.push(Node {
                func,
                parent,
                ..Node::default()
            });
        }
        id
    }

    /// Records one completed invocation at `node`.
    #[inline]
    pub fn complete(&mut self, node: NodeId, total_ns: u64, self_ns: u64) {
        let n = &mut self.nodes[node as usize];
        n.calls += 1;
        n.total_ns += total_ns;
        n.self_ns += self_ns;
    }

    /// Adds every path of `other` into this tree, summing the counts. Used
    /// to fold an exited thread into the aggregate of its name.
    pub fn absorb(&mut self, other: &CallTree) {
        let mut map = vec![ROOT; other.nodes.len()];
        for (id, n) in other.nodes.iter().enumerate().skip(1) {
            let at = self.child(map[n.parent as usize], n.func);
            let dst = &mut self.nodes[at as usize];
            dst.calls += n.calls;
            dst.total_ns += n.total_ns;
            dst.self_ns += n.self_ns;
            map[id] = at;
        }
    }

    /// All nodes; index 0 is the root.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The function indices on the path from the root to `node`, outermost
    /// first.
    pub fn path(&self, mut node: NodeId) -> Vec<u32> {
        let mut out = Vec::new();
        while node != ROOT {
            let n = &self.nodes[node as usize];
            out.push(n.func);
            node = n.parent;
        }
        out.reverse();
        out
    }

    /// True when `func` appears among the strict ancestors of `node`.
    pub fn has_ancestor(&self, node: NodeId, func: u32) -> bool {
        let mut cur = self.nodes[node as usize].parent;
        while cur != ROOT {
            let n = &self.nodes[cur as usize];
            if n.func == func {
                return true;
            }
            cur = n.parent;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_shared_and_walkable() {
        let mut t = CallTree::default();
        let a = t.child(ROOT, 1);
        let b = t.child(a, 2);
        assert_eq!(t.child(ROOT, 1), a);
        assert_eq!(t.child(a, 2), b);
        let a2 = t.child(b, 1);
        assert_eq!(t.path(a2), vec![1, 2, 1]);
        assert!(t.has_ancestor(a2, 1));
        assert!(!t.has_ancestor(b, 2));
        t.complete(b, 10, 4);
        t.complete(b, 20, 6);
        assert_eq!(t.nodes()[b as usize].calls, 2);
        assert_eq!(t.nodes()[b as usize].total_ns, 30);
        assert_eq!(t.nodes()[b as usize].self_ns, 10);
        let mut other = CallTree::default();
        let x = other.child(ROOT, 1);
        let y = other.child(x, 2);
        other.complete(y, 5, 5);
        let z = other.child(x, 9);
        other.complete(z, 7, 7);
        t.absorb(&other);
        assert_eq!(t.nodes()[b as usize].calls, 3);
        assert_eq!(t.nodes()[b as usize].total_ns, 35);
        let a9 = t.child(a, 9);
        assert_eq!(t.path(a9), vec![1, 9]);
        assert_eq!(t.nodes()[a9 as usize].total_ns, 7);
    }
}
