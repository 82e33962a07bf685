//! Suffix-tree drafting: SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: A Model-Free
//! Approach to Speeding Up Large Language Model Inference"; as in Arctic Inference and vLLM's
//! `suffix` method).
//!
//! Two depth-bounded suffix tries: one per request over its prompt and output, grown by the new
//! tokens of each step, and one over the outputs of recently finished requests, so an answer
//! that repeats across requests is drafted too. A draft matches the longest suffix of the
//! sequence (that was followed by something before) in a trie, then follows the most frequent
//! continuation while the path's chance (the product of each step's count over its siblings')
//! stays above [`MIN_TOKEN_PROB`], and for at most [`MAX_SPEC_FACTOR`] times the match's length:
//! a short match is weak evidence for a long draft. Of the two tries' drafts the one with the
//! larger score (its expected accepted tokens, the sum of the path chances) is proposed.
//!
//! The strength returned is the matched suffix's length, as the n-gram proposer's, so the
//! drafting policy's acceptance table reads both alike (it lumps long matches together).

use std::collections::HashMap;

use super::suffix_cache::{GlobalBounds, GlobalTrie, RequestTrie};
use super::suffix_tree::{NodeId, SuffixTrie};
use super::{Proposer, SeqKey};

/// A draft stops where its path's chance falls below this (Arctic Inference's default).
pub const MIN_TOKEN_PROB: f64 = 0.1;
/// A match of n tokens drafts at most this times n tokens (Arctic Inference's default).
pub const MAX_SPEC_FACTOR: f64 = 1.0;
/// Node and token budgets of the global trie (about 50 bytes a node at most).
const GLOBAL_MAX_NODES: usize = 1 << 19;
const GLOBAL_MAX_TOKENS: usize = 1 << 19;
/// Request tries kept at most; the engine forgets finished ones, so this is only a backstop
/// (the least recently used one goes, and is rebuilt if its sequence comes back).
const MAX_REQUEST_TRIES: usize = 1024;

/// Default of `--suffix-max-depth`.
pub const DEFAULT_SUFFIX_MAX_DEPTH: usize = 24;
/// Default of `--suffix-cache-outputs`.
pub const DEFAULT_SUFFIX_CACHE_OUTPUTS: usize = 256;

/// The suffix proposer's knobs, also the worker's `--suffix-*` options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct SuffixConfig {
    /// Suffix proposer: longest string its tries hold (matched suffix plus draft), at least 2.
    #[arg(long = "suffix-max-depth", value_name = "SUFFIX_MAX_DEPTH",
          env = "SPECULA_SUFFIX_MAX_DEPTH", default_value_t = DEFAULT_SUFFIX_MAX_DEPTH,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=256))]
    pub max_depth: usize,
    /// Suffix proposer: finished outputs kept in its global trie (0: each request drafts from
    /// its own tokens only).
    #[arg(long = "suffix-cache-outputs", value_name = "SUFFIX_CACHE_OUTPUTS",
          env = "SPECULA_SUFFIX_CACHE_OUTPUTS", default_value_t = DEFAULT_SUFFIX_CACHE_OUTPUTS)]
    pub max_cached_outputs: usize,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        Self {
            max_depth: DEFAULT_SUFFIX_MAX_DEPTH,
            max_cached_outputs: DEFAULT_SUFFIX_CACHE_OUTPUTS,
        }
    }
}

struct Draft {
    tokens: Vec<u32>,
    match_len: usize,
    score: f64,
}

pub struct SuffixProposer {
    max_depth: usize,
    requests: HashMap<SeqKey, (RequestTrie, u64)>,
    global: GlobalTrie,
    /// Proposals made, to tell which request trie was used last.
    tick: u64,
}

impl SuffixProposer {
    pub fn new(cfg: SuffixConfig) -> Self {
        let max_depth = cfg.max_depth.max(2);
        let bounds = GlobalBounds {
            max_outputs: cfg.max_cached_outputs,
            max_nodes: GLOBAL_MAX_NODES,
            max_tokens: GLOBAL_MAX_TOKENS,
        };
        Self {
            max_depth,
            requests: HashMap::new(),
            global: GlobalTrie::new(max_depth, bounds),
            tick: 0,
        }
    }

    /// Request tries held now.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Finished outputs the global trie holds now.
    pub fn num_cached_outputs(&self) -> usize {
        self.global.num_outputs()
    }

    /// Longest suffix matched: what the depth leaves after room for a full draft, but at least
    /// half the depth (long matches are the reliable ones).
    fn max_match(&self, max_drafts: usize) -> usize {
        self.max_depth
            .saturating_sub(max_drafts)
            .max(self.max_depth / 2)
            .max(1)
    }

    /// `seq`'s trie brought up to `tokens`.
    fn request_trie(&mut self, seq: SeqKey, tokens: &[u32]) -> &RequestTrie {
        self.tick += 1;
        if !self.requests.contains_key(&seq) && self.requests.len() >= MAX_REQUEST_TRIES {
            let oldest = self.requests.iter().min_by_key(|e| e.1 .1).map(|e| *e.0);
            if let Some(oldest) = oldest {
                self.requests.remove(&oldest);
            }
        }
        let depth = self.max_depth;
        let entry = self
            .requests
            .entry(seq)
            .or_insert_with(|| (RequestTrie::new(depth), 0));
        entry.1 = self.tick;
        entry.0.sync(tokens);
        &entry.0
    }
}

/// The longest suffix of `tokens` (at most `max_match` long) found in `trie` with a
/// continuation: its length and node. Shorter suffixes of a found one are found too, so the
/// longest is the first from the top.
fn longest_match(trie: &SuffixTrie, tokens: &[u32], max_match: usize) -> Option<(usize, NodeId)> {
    (1..=max_match.min(tokens.len())).rev().find_map(|len| {
        let node = trie.find(&tokens[tokens.len() - len..])?;
        trie.has_children(node).then_some((len, node))
    })
}

fn draft_from(
    trie: &SuffixTrie,
    tokens: &[u32],
    max_match: usize,
    max_drafts: usize,
) -> Option<Draft> {
    let (match_len, node) = longest_match(trie, tokens, max_match)?;
    let limit = ((MAX_SPEC_FACTOR * match_len as f64).ceil() as usize).clamp(1, max_drafts);
    let mut drafts = Vec::new();
    let score = trie.draft(node, limit, MIN_TOKEN_PROB, &mut drafts);
    (!drafts.is_empty()).then_some(Draft {
        tokens: drafts,
        match_len,
        score,
    })
}

impl Proposer for SuffixProposer {
    fn name(&self) -> &str {
        "suffix"
    }

    fn propose(
        &mut self,
        seq: SeqKey,
        tokens: &[u32],
        max_drafts: usize,
        out: &mut Vec<u32>,
    ) -> usize {
        if max_drafts == 0 || tokens.is_empty() {
            return 0;
        }
        let max_match = self.max_match(max_drafts);
        let own = draft_from(
            self.request_trie(seq, tokens).trie(),
            tokens,
            max_match,
            max_drafts,
        );
        let shared = draft_from(self.global.trie(), tokens, max_match, max_drafts);
        let best = match (own, shared) {
            (Some(a), Some(b)) => Some(if b.score > a.score { b } else { a }),
            (a, b) => a.or(b),
        };
        let Some(best) = best else {
            return 0;
        };
        out.extend_from_slice(&best.tokens);
        best.match_len
    }

    fn finished(&mut self, seq: SeqKey, output: &[u32]) {
        self.forget(seq);
        self.global.add(output);
    }

    fn forget(&mut self, seq: SeqKey) {
        self.requests.remove(&seq);
    }
}

#[cfg(test)]
#[path = "suffix_tests.rs"]
mod tests;
