//! Which positions of a draft model's own KV cache hold what the draft would compute for a
//! sequence's tokens.
//!
//! The draft's cache has the target's layout: the same block ids, so every sequence's block
//! table (prefix-cache hits, preemption, resumption) serves both. The draft only catches up
//! lazily, though: it computes a sequence's positions when it drafts for it, and a block may be
//! shared (a cached prefix) or handed to another sequence after it was freed. So each whole block
//! carries a tag, the hash of every token up to its end (a block's keys and values are a function
//! of exactly those tokens), set once the draft's values for them are known to be right and
//! cleared by any write. A sequence trusts the whole blocks whose tags match its own tokens, and
//! the part of its last block that it wrote itself since it last lost its blocks (preemption).
//!
//! A wrong tag can only cost acceptance, never correctness: drafts are verified against the
//! target. The tests on the toy model nevertheless check that no stale slot is ever read.

use std::collections::HashMap;

use super::proposer::SeqKey;

/// Draft-cache validity for every block and running sequence.
#[derive(Debug)]
pub struct DraftKv {
    block_size: usize,
    /// Per physical block: hash of the tokens `0..end of block` whose draft KV it holds, whole.
    tags: Vec<Option<u64>>,
    seqs: HashMap<SeqKey, SeqDraftKv>,
}

#[derive(Debug, Default)]
struct SeqDraftKv {
    /// Positions whose draft KV this sequence wrote or verified since it last lost its blocks;
    /// `None` when only tags can tell.
    computed: Option<usize>,
    /// `chain[i]`: hash of tokens `0..(i + 1) * block_size`.
    chain: Vec<u64>,
}

impl SeqDraftKv {
    /// Extends the chain over the whole blocks of `tokens`.
    fn extend_chain(&mut self, tokens: &[u32], block_size: usize) {
        let full = tokens.len() / block_size;
        while self.chain.len() < full {
            let i = self.chain.len();
            let prev = i.checked_sub(1).map_or(0x5EED, |p| self.chain[p]);
            let block = &tokens[i * block_size..(i + 1) * block_size];
            self.chain
                .push(block.iter().fold(prev, |h, &t| mix(h, u64::from(t))));
        }
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

impl DraftKv {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            tags: vec![None; num_blocks],
            seqs: HashMap::new(),
        }
    }

    /// How many leading positions of `seq` (tokens `tokens`, block table `table`) the draft
    /// cache holds correctly: never its last token, which a draft forward always starts from.
    pub fn start(&mut self, seq: SeqKey, tokens: &[u32], table: &[u32]) -> usize {
        let bs = self.block_size;
        let limit = tokens.len().saturating_sub(1);
        let state = self.seqs.entry(seq).or_default();
        state.extend_chain(&tokens[..limit], bs);
        let known = state.computed.map_or(limit, |c| c.min(limit));
        let mut valid = 0;
        for (i, &hash) in state.chain.iter().enumerate().take(known / bs) {
            let tagged = table
                .get(i)
                .and_then(|&b| self.tags.get(b as usize).copied().flatten());
            if tagged != Some(hash) {
                break;
            }
            valid = (i + 1) * bs;
        }
        // The partial block was written by this sequence alone, if every block before it holds.
        if state.computed.is_some() && valid == known / bs * bs {
            valid = known;
        }
        state.computed = Some(valid);
        valid
    }

    /// A draft forward writes positions `from..to` through `table`: their blocks lose their tags.
    pub fn will_write(&mut self, table: &[u32], from: usize, to: usize) {
        if to <= from {
            return;
        }
        for i in from / self.block_size..=(to - 1) / self.block_size {
            if let Some(tag) = table.get(i).and_then(|&b| self.tags.get_mut(b as usize)) {
                *tag = None;
            }
        }
    }

    /// After verification: the draft cache of `seq` holds its positions `0..valid` (`tokens` now
    /// extends past them); the whole blocks among them get their tags.
    pub fn settle(&mut self, seq: SeqKey, tokens: &[u32], table: &[u32], valid: usize) {
        let bs = self.block_size;
        let valid = valid.min(tokens.len());
        let state = self.seqs.entry(seq).or_default();
        state.extend_chain(&tokens[..valid], bs);
        let from = state.computed.unwrap_or(0) / bs;
        for i in from..valid / bs {
            if let Some(tag) = table.get(i).and_then(|&b| self.tags.get_mut(b as usize)) {
                *tag = Some(state.chain[i]);
            }
        }
        state.computed = Some(valid);
    }

    /// `seq` lost its blocks (preempted): only tags tell what its next blocks hold.
    pub fn preempted(&mut self, seq: SeqKey) {
        if let Some(state) = self.seqs.get_mut(&seq) {
            state.computed = None;
        }
    }

    /// `seq` is gone.
    pub fn forget(&mut self, seq: SeqKey) {
        self.seqs.remove(&seq);
    }

    /// Sequences with state (bounded by the running ones: each is forgotten when it ends).
    pub fn tracked(&self) -> usize {
        self.seqs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;

    const BS: usize = 4;

    /// A reference draft cache: per slot, the token chain it was written for.
    struct Slots(Vec<Option<u64>>);

    fn chain_at(tokens: &[u32], pos: usize) -> u64 {
        tokens[..=pos].iter().fold(0u64, |h, &t| {
            h.wrapping_mul(1_000_003).wrapping_add(u64::from(t) + 1)
        })
    }

    impl Slots {
        fn write(&mut self, table: &[u32], tokens: &[u32], from: usize, to: usize) {
            for pos in from..to {
                self.0[table[pos / BS] as usize * BS + pos % BS] = Some(chain_at(tokens, pos));
            }
        }
        fn holds(&self, table: &[u32], tokens: &[u32], upto: usize) -> bool {
            (0..upto).all(|pos| {
                self.0[table[pos / BS] as usize * BS + pos % BS] == Some(chain_at(tokens, pos))
            })
        }
    }

    #[test]
    fn a_fresh_sequence_trusts_nothing_and_its_own_writes_once_settled() {
        let mut kv = DraftKv::new(8, BS);
        let tokens: Vec<u32> = (0..10).collect();
        let table = [3, 5, 7];
        assert_eq!(kv.start(1, &tokens, &table), 0);
        kv.will_write(&table, 0, 9);
        kv.settle(1, &tokens, &table, 9);
        assert_eq!(kv.start(1, &tokens, &table), 9);
        // Another sequence with the same first 8 tokens in the same blocks (a prefix hit).
        let mut other = tokens[..8].to_vec();
        other.extend([42, 43, 44]);
        assert_eq!(kv.start(2, &other, &[3, 5, 6]), 8);
        // Different tokens: nothing.
        let stranger: Vec<u32> = (100..110).collect();
        assert_eq!(kv.start(3, &stranger, &table), 0);
    }

    #[test]
    fn a_write_by_another_sequence_untags_a_block() {
        let mut kv = DraftKv::new(8, BS);
        let tokens: Vec<u32> = (0..9).collect();
        kv.will_write(&[0, 1, 2], 0, 8);
        kv.settle(1, &tokens, &[0, 1, 2], 8);
        kv.forget(1);
        kv.will_write(&[1], 0, 2);
        assert_eq!(kv.start(2, &tokens, &[0, 1, 2]), 4);
    }

    #[test]
    fn preemption_keeps_only_what_tags_prove() {
        let mut kv = DraftKv::new(8, BS);
        let tokens: Vec<u32> = (0..12).collect();
        kv.will_write(&[0, 1, 2], 0, 10);
        kv.settle(1, &tokens, &[0, 1, 2], 10);
        kv.preempted(1);
        // Same ids back (block 2 was the partial one): only the whole blocks count.
        assert_eq!(kv.start(1, &tokens, &[0, 1, 2]), 8);
    }

    /// Random sequences share prefixes, draft, get preempted and end, over a small cache whose
    /// blocks are reused; whatever `start` trusts must hold the right values in a reference
    /// cache written the same way.
    #[test]
    fn trusted_positions_always_hold_the_sequences_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _round in 0..200 {
            let num_blocks = 12;
            let mut kv = DraftKv::new(num_blocks, BS);
            let mut slots = Slots(vec![None; num_blocks * BS]);
            let mut free: Vec<u32> = (0..num_blocks as u32).collect();
            // Per sequence: its tokens and block table.
            let mut seqs: BTreeMap<SeqKey, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
            let mut next_id = 0;
            for _ in 0..60 {
                match rng.gen_range(0..10) {
                    0..=2 if free.len() >= 3 => {
                        let len = rng.gen_range(1..9);
                        let tokens: Vec<u32> = (0..len).map(|_| rng.gen_range(0..3)).collect();
                        seqs.insert(next_id, (tokens, Vec::new()));
                        next_id += 1;
                    }
                    3 => {
                        if let Some(&id) = seqs.keys().next() {
                            let (_, table) = seqs.remove(&id).unwrap();
                            free.extend(table);
                            kv.forget(id);
                        }
                    }
                    4 => {
                        if let Some(&id) = seqs.keys().next() {
                            let (_, table) = seqs.get_mut(&id).unwrap();
                            free.append(table);
                            kv.preempted(id);
                        }
                    }
                    _ => {
                        let Some(&id) = seqs.keys().nth(rng.gen_range(0..seqs.len().max(1))) else {
                            continue;
                        };
                        let drafts = rng.gen_range(1..4);
                        let (tokens, table) = seqs.get_mut(&id).unwrap();
                        let need = (tokens.len() + drafts).div_ceil(BS);
                        while table.len() < need {
                            match free.pop() {
                                Some(b) => table.push(b),
                                None => break,
                            }
                        }
                        if table.len() < need {
                            continue;
                        }
                        let len = tokens.len();
                        let start = kv.start(id, tokens, table);
                        assert!(slots.holds(table, tokens, start), "trusted a stale slot");
                        // Drafts d_1..d_k: forward k writes len + k - 2.
                        let mut extended = tokens.clone();
                        extended.extend((0..drafts).map(|_| rng.gen_range(0..3)));
                        let written = len + drafts - 1;
                        kv.will_write(table, start, written);
                        slots.write(table, &extended, start, written);
                        let accepted = rng.gen_range(0..=drafts);
                        tokens.extend_from_slice(&extended[len..len + accepted]);
                        tokens.push(rng.gen_range(0..3));
                        let valid = len + accepted.min(drafts - 1);
                        kv.settle(id, tokens, table, valid);
                        assert!(slots.holds(table, tokens, valid), "settled a wrong slot");
                    }
                }
            }
            assert!(kv.tracked() <= seqs.len());
        }
    }
}
