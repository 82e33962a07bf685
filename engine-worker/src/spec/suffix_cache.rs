//! The two suffix tries SuffixDecoding drafts from: one per request over its own prompt and
//! output, grown token by token, and one global over the outputs of recent requests, bounded
//! and evicted oldest first.

use std::collections::VecDeque;

use super::suffix_tree::{NodeId, SuffixTrie, ROOT};

/// A request's trie over its tokens so far (every suffix, cut at `max_depth`).
#[derive(Debug, Clone)]
pub struct RequestTrie {
    trie: SuffixTrie,
    /// The tokens the trie holds, to tell whether a sequence still extends them.
    tokens: Vec<u32>,
    /// Nodes of the suffixes that can still grow (shorter than `max_depth`), with their depth.
    active: Vec<(NodeId, usize)>,
    max_depth: usize,
}

impl RequestTrie {
    pub fn new(max_depth: usize) -> Self {
        Self {
            trie: SuffixTrie::new(),
            tokens: Vec::new(),
            active: Vec::new(),
            max_depth: max_depth.max(1),
        }
    }

    pub fn trie(&self) -> &SuffixTrie {
        &self.trie
    }

    /// Brings the trie to `tokens`: appends what is new, or starts over when `tokens` does not
    /// extend what it holds (a caller's sequence is the truth, whatever happened to it).
    pub fn sync(&mut self, tokens: &[u32]) {
        if !tokens.starts_with(&self.tokens) {
            *self = Self::new(self.max_depth);
        }
        let new = self.tokens.len();
        for &token in &tokens[new..] {
            self.push(token);
        }
    }

    /// One more token ends one more occurrence of every active suffix and of itself.
    fn push(&mut self, token: u32) {
        let mut active = std::mem::take(&mut self.active);
        active.push((ROOT, 0));
        self.active = active
            .into_iter()
            .map(|(node, depth)| (self.trie.extend(node, token), depth + 1))
            .filter(|&(_, depth)| depth < self.max_depth)
            .collect();
        self.tokens.push(token);
    }
}

/// Bounds of the global trie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalBounds {
    pub max_outputs: usize,
    pub max_nodes: usize,
    /// Also bounds every count, so none can overflow.
    pub max_tokens: usize,
}

/// The outputs of recently finished requests, in one trie.
#[derive(Debug, Clone)]
pub struct GlobalTrie {
    trie: SuffixTrie,
    /// The outputs in the trie, oldest first, kept to take them back out.
    outputs: VecDeque<Vec<u32>>,
    tokens: usize,
    max_depth: usize,
    bounds: GlobalBounds,
}

impl GlobalTrie {
    pub fn new(max_depth: usize, bounds: GlobalBounds) -> Self {
        Self {
            trie: SuffixTrie::new(),
            outputs: VecDeque::new(),
            tokens: 0,
            max_depth: max_depth.max(1),
            bounds,
        }
    }

    pub fn trie(&self) -> &SuffixTrie {
        &self.trie
    }

    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    #[cfg(test)]
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }

    /// Adds an output (its last `max_tokens` tokens at most), then evicts the oldest outputs
    /// until every bound holds again (possibly this one).
    pub fn add(&mut self, output: &[u32]) {
        if self.bounds.max_outputs == 0 || output.is_empty() {
            return;
        }
        let output = &output[output.len().saturating_sub(self.bounds.max_tokens)..];
        for start in 0..output.len() {
            self.trie.add_path(self.cut(output, start));
        }
        self.tokens += output.len();
        self.outputs.push_back(output.to_vec());
        while self.outputs.len() > self.bounds.max_outputs
            || self.trie.live_nodes() > self.bounds.max_nodes
            || self.tokens > self.bounds.max_tokens
        {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        let Some(output) = self.outputs.pop_front() else {
            return;
        };
        for start in 0..output.len() {
            self.trie.remove_path(self.cut(&output, start));
        }
        self.tokens -= output.len();
    }

    /// The suffix of `output` from `start`, cut at the depth.
    fn cut<'a>(&self, output: &'a [u32], start: usize) -> &'a [u32] {
        &output[start..(start + self.max_depth).min(output.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn batch(texts: &[&[u32]], depth: usize) -> SuffixTrie {
        let mut t = SuffixTrie::new();
        for text in texts {
            for i in 0..text.len() {
                t.add_path(&text[i..(i + depth).min(text.len())]);
            }
        }
        t
    }

    #[test]
    fn growing_token_by_token_equals_building_at_once() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..50 {
            let depth = rng.gen_range(1..8);
            let text: Vec<u32> = (0..rng.gen_range(0..60))
                .map(|_| rng.gen_range(0..4))
                .collect();
            let mut r = RequestTrie::new(depth);
            let mut at = 0;
            while at < text.len() {
                at = (at + rng.gen_range(1..5)).min(text.len());
                r.sync(&text[..at]);
            }
            assert_eq!(r.trie().dump(), batch(&[&text], depth).dump());
        }
    }

    #[test]
    fn a_sequence_that_no_longer_extends_the_trie_rebuilds_it() {
        let mut r = RequestTrie::new(4);
        r.sync(&[1, 2, 3, 4]);
        r.sync(&[1, 2, 5]);
        assert_eq!(r.trie().dump(), batch(&[&[1, 2, 5]], 4).dump());
        r.sync(&[]);
        assert_eq!(r.trie().live_nodes(), 0);
    }

    #[test]
    fn the_global_trie_keeps_the_newest_outputs_within_its_bounds() {
        let bounds = GlobalBounds {
            max_outputs: 3,
            max_nodes: 60,
            max_tokens: 25,
        };
        let mut g = GlobalTrie::new(5, bounds);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut added: Vec<Vec<u32>> = Vec::new();
        for _ in 0..200 {
            let out: Vec<u32> = (0..rng.gen_range(0..30))
                .map(|_| rng.gen_range(0..5))
                .collect();
            g.add(&out);
            if !out.is_empty() {
                added.push(out[out.len().saturating_sub(25)..].to_vec());
            }
            assert!(g.num_outputs() <= 3);
            assert!(g.trie().live_nodes() <= 60);
            assert!(g.num_tokens() <= 25);
            // What is left is exactly the newest outputs.
            let kept: Vec<&[u32]> = added[added.len() - g.num_outputs()..]
                .iter()
                .map(|o| o.as_slice())
                .collect();
            assert_eq!(g.trie().dump(), batch(&kept, 5).dump());
        }
    }

    #[test]
    fn a_global_trie_without_room_keeps_nothing() {
        let bounds = GlobalBounds {
            max_outputs: 0,
            max_nodes: 100,
            max_tokens: 100,
        };
        let mut g = GlobalTrie::new(4, bounds);
        g.add(&[1, 2, 3]);
        assert_eq!(g.trie().live_nodes(), 0);
    }
}
