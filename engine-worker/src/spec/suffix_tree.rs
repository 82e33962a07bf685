//! A depth-bounded suffix trie with occurrence counts, the data structure of SuffixDecoding.
//!
//! Every node stands for a token string (its path from the root) and counts how many times a
//! string was added through it. Adding every suffix of a text cut at `max_depth` tokens makes a
//! node's count the number of occurrences (end positions) of its string in the text, and a
//! child's count over the sum of its siblings' the chance that this token followed the string.
//! Nodes live in an arena with a free list, so pruning reuses them instead of fragmenting.

/// Index of a node in the arena.
pub type NodeId = u32;

/// The empty string's node; it is never freed.
pub const ROOT: NodeId = 0;

#[derive(Debug, Clone, Default)]
struct Node {
    count: u32,
    /// (token, child) pairs; most nodes have one or two, so a scan beats a map.
    children: Vec<(u32, NodeId)>,
}

#[derive(Debug, Clone)]
pub struct SuffixTrie {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
}

impl Default for SuffixTrie {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixTrie {
    pub fn new() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
        }
    }

    /// Nodes in use, the root excluded.
    pub fn live_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    pub fn count(&self, node: NodeId) -> u32 {
        self.nodes[node as usize].count
    }

    pub fn child(&self, node: NodeId, token: u32) -> Option<NodeId> {
        self.nodes[node as usize]
            .children
            .iter()
            .find(|c| c.0 == token)
            .map(|c| c.1)
    }

    pub fn has_children(&self, node: NodeId) -> bool {
        !self.nodes[node as usize].children.is_empty()
    }

    /// The node of `path`, if some added string went through it.
    pub fn find(&self, path: &[u32]) -> Option<NodeId> {
        path.iter()
            .try_fold(ROOT, |node, &token| self.child(node, token))
    }

    /// Counts one more occurrence of `node`'s string followed by `token`; returns that child.
    pub fn extend(&mut self, node: NodeId, token: u32) -> NodeId {
        let child = match self.child(node, token) {
            Some(child) => child,
            None => {
                let child = self.alloc();
                self.nodes[node as usize].children.push((token, child));
                child
            }
        };
        let c = &mut self.nodes[child as usize];
        c.count = c.count.saturating_add(1);
        child
    }

    /// Adds one occurrence of `path` (and so of each of its prefixes).
    pub fn add_path(&mut self, path: &[u32]) {
        path.iter()
            .fold(ROOT, |node, &token| self.extend(node, token));
    }

    /// Takes back one occurrence of a `path` added before; nodes left with no occurrence go, with
    /// their subtrees (a child never counts more than its parent, so those are empty too).
    pub fn remove_path(&mut self, path: &[u32]) {
        let mut node = ROOT;
        for &token in path {
            let Some(child) = self.child(node, token) else {
                return;
            };
            let c = &mut self.nodes[child as usize];
            c.count = c.count.saturating_sub(1);
            if c.count == 0 {
                self.nodes[node as usize].children.retain(|c| c.0 != token);
                self.free_subtree(child);
                return;
            }
            node = child;
        }
    }

    /// The most frequent child of `node` (ties: the smaller token, so drafts are deterministic)
    /// and the chance it follows: its count over all the children's.
    pub fn best_child(&self, node: NodeId) -> Option<(u32, NodeId, f64)> {
        let children = &self.nodes[node as usize].children;
        let total: u64 = children
            .iter()
            .map(|c| u64::from(self.nodes[c.1 as usize].count))
            .sum();
        let &(token, child) = children.iter().max_by(|a, b| {
            let (ca, cb) = (self.count(a.1), self.count(b.1));
            ca.cmp(&cb).then(b.0.cmp(&a.0))
        })?;
        if total == 0 {
            return None;
        }
        Some((token, child, f64::from(self.count(child)) / total as f64))
    }

    /// Walks greedily from `node` to the most frequent child while the path's chance (the
    /// product of the steps' chances) stays at least `min_prob`, appending at most `limit`
    /// tokens to `out`. Returns the draft's score: the sum of the path chances, the expected
    /// number of accepted tokens if the counts are the truth.
    pub fn draft(&self, mut node: NodeId, limit: usize, min_prob: f64, out: &mut Vec<u32>) -> f64 {
        let (mut chance, mut score) = (1.0, 0.0);
        for _ in 0..limit {
            let Some((token, child, p)) = self.best_child(node) else {
                break;
            };
            chance *= p;
            if chance < min_prob {
                break;
            }
            out.push(token);
            score += chance;
            node = child;
        }
        score
    }

    fn alloc(&mut self) -> NodeId {
        if let Some(id) = self.free.pop() {
            return id;
        }
        self.nodes.push(Node::default());
        (self.nodes.len() - 1) as NodeId
    }

    fn free_subtree(&mut self, top: NodeId) {
        let mut stack = vec![top];
        while let Some(id) = stack.pop() {
            let node = &mut self.nodes[id as usize];
            stack.extend(node.children.drain(..).map(|c| c.1));
            node.count = 0;
            node.children.shrink_to_fit();
            self.free.push(id);
        }
    }

    /// Every string with its count, sorted: two tries hold the same strings iff these match.
    #[cfg(test)]
    pub fn dump(&self) -> Vec<(Vec<u32>, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((id, path)) = stack.pop() {
            for &(token, child) in &self.nodes[id as usize].children {
                let mut p = path.clone();
                p.push(token);
                out.push((p.clone(), self.count(child)));
                stack.push((child, p));
            }
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every suffix of `text`, cut at `depth` tokens.
    fn batch(text: &[u32], depth: usize) -> SuffixTrie {
        let mut t = SuffixTrie::new();
        for i in 0..text.len() {
            t.add_path(&text[i..(i + depth).min(text.len())]);
        }
        t
    }

    #[test]
    fn counts_are_occurrences() {
        let t = batch(&[1, 2, 1, 2, 3], 8);
        assert_eq!(t.find(&[1]).map(|n| t.count(n)), Some(2));
        assert_eq!(t.find(&[1, 2]).map(|n| t.count(n)), Some(2));
        assert_eq!(t.find(&[2, 1, 2]).map(|n| t.count(n)), Some(1));
        assert_eq!(t.find(&[3]).map(|n| t.count(n)), Some(1));
        assert_eq!(t.find(&[3, 1]), None);
        // [1, 2] is followed by 1 once and by 3 once: a tie goes to the smaller token.
        let n = t.find(&[1, 2]).unwrap();
        assert_eq!(t.best_child(n).map(|b| (b.0, b.2)), Some((1, 0.5)));
    }

    #[test]
    fn depth_bounds_the_strings() {
        let t = batch(&[1, 2, 3, 4], 2);
        assert!(t.find(&[1, 2]).is_some());
        assert_eq!(t.find(&[1, 2, 3]), None);
    }

    #[test]
    fn removing_what_was_added_leaves_the_rest() {
        let (a, b) = ([1, 2, 3, 1, 2], [2, 3, 4]);
        let mut t = batch(&a, 3);
        for i in 0..b.len() {
            t.add_path(&b[i..(i + 3).min(b.len())]);
        }
        for i in 0..a.len() {
            t.remove_path(&a[i..(i + 3).min(a.len())]);
        }
        assert_eq!(t.dump(), batch(&b, 3).dump());
        for i in 0..b.len() {
            t.remove_path(&b[i..(i + 3).min(b.len())]);
        }
        assert_eq!(t.live_nodes(), 0);
        // Freed nodes are reused.
        let arena = t.nodes.len();
        t.add_path(&[9, 9]);
        assert_eq!(t.nodes.len(), arena);
        assert_eq!(t.live_nodes(), 2);
    }

    #[test]
    fn drafts_follow_the_most_frequent_path_until_it_is_unlikely() {
        // After 5: 6 twice, 7 once; after 5 6: 8 both times.
        let t = batch(&[5, 6, 8, 5, 6, 8, 5, 7], 4);
        let n = t.find(&[5]).unwrap();
        let mut out = Vec::new();
        let score = t.draft(n, 4, 0.1, &mut out);
        // The depth (4) ends the path at 5 6 8 5.
        assert_eq!(out, [6, 8, 5]);
        assert!((score - (2.0 / 3.0 + 2.0 / 3.0 + 2.0 / 3.0)).abs() < 1e-9);
        out.clear();
        t.draft(n, 4, 0.7, &mut out);
        assert!(out.is_empty(), "2/3 is below 0.7");
        out.clear();
        t.draft(n, 1, 0.1, &mut out);
        assert_eq!(out, [6]);
    }
}
