//! Which physical blocks hold which prompt prefixes (automatic prefix caching, as vLLM's
//! `--enable-prefix-caching`: Kwon et al., "Efficient Memory Management for Large Language Model
//! Serving with PagedAttention", 2023, §4.4 "shared prefix").
//!
//! A full block is known by its own tokens and by the block before it (its parent), so a
//! lookup walks a prompt block by block from the start. The key holds the tokens themselves,
//! not a hash of them: a hash collision would silently hand one request another's cache. A
//! parent is named by its block id and that block's generation, which moves on whenever the
//! block's cached content is dropped: a child whose parent was evicted and reused can never
//! match again, so no chain of evictions has to be followed.

use std::collections::HashMap;

/// A block as a parent: its id and the generation of its content.
pub type BlockLink = (u32, u64);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    parent: Option<BlockLink>,
    tokens: Box<[u32]>,
}

#[derive(Debug)]
pub struct PrefixIndex {
    by_key: HashMap<BlockKey, u32>,
    /// Per block: the key it is registered under.
    key_of: Vec<Option<BlockKey>>,
    /// Per block: bumped when its registered content is dropped.
    generation: Vec<u64>,
}

impl PrefixIndex {
    pub fn new(num_blocks: usize) -> Self {
        Self {
            by_key: HashMap::new(),
            key_of: vec![None; num_blocks],
            generation: vec![0; num_blocks],
        }
    }

    /// Registered blocks (each holds one entry).
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn contains(&self, block: u32) -> bool {
        self.key_of[block as usize].is_some()
    }

    /// `block` as the parent of the next block of its prefix.
    pub fn link(&self, block: u32) -> BlockLink {
        (block, self.generation[block as usize])
    }

    /// The block registered after `parent` (None: the prefix starts) with `tokens`.
    pub fn find(&self, parent: Option<BlockLink>, tokens: &[u32]) -> Option<u32> {
        let key = BlockKey {
            parent,
            tokens: tokens.into(),
        };
        self.by_key.get(&key).copied()
    }

    /// Registers `block` as holding `tokens` after `parent`. False (and nothing changes) when
    /// that content is already registered, or the block already holds other content.
    pub fn insert(&mut self, parent: Option<BlockLink>, tokens: &[u32], block: u32) -> bool {
        if self.contains(block) {
            return false;
        }
        let key = BlockKey {
            parent,
            tokens: tokens.into(),
        };
        if self.by_key.contains_key(&key) {
            return false;
        }
        self.by_key.insert(key.clone(), block);
        self.key_of[block as usize] = Some(key);
        true
    }

    /// Forgets what `block` held (it is about to be overwritten); its children stop matching.
    pub fn remove(&mut self, block: u32) {
        if let Some(key) = self.key_of[block as usize].take() {
            self.by_key.remove(&key);
            self.generation[block as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_found_block_by_block_and_only_after_its_parent() {
        let mut index = PrefixIndex::new(8);
        assert!(index.insert(None, &[1, 2], 5));
        assert!(index.insert(Some(index.link(5)), &[3, 4], 2));
        assert_eq!(index.find(None, &[1, 2]), Some(5));
        assert_eq!(index.find(Some(index.link(5)), &[3, 4]), Some(2));
        // The same tokens after another start are another prefix.
        assert_eq!(index.find(None, &[3, 4]), None);
        assert_eq!(index.find(Some(index.link(2)), &[3, 4]), None);
        // One entry per content, one content per block.
        assert!(!index.insert(None, &[1, 2], 6));
        assert!(!index.insert(None, &[9, 9], 5));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn a_removed_parent_orphans_its_children_even_when_its_block_returns() {
        let mut index = PrefixIndex::new(4);
        index.insert(None, &[1], 0);
        let old_link = index.link(0);
        index.insert(Some(old_link), &[2], 1);
        index.remove(0);
        assert_eq!(index.find(None, &[1]), None);
        // Block 0 comes back holding the same tokens: block 1's entry names the old content.
        index.insert(None, &[1], 0);
        assert_ne!(index.link(0), old_link);
        assert_eq!(index.find(Some(index.link(0)), &[2]), None);
        assert!(
            index.contains(1),
            "the orphan stays until its own block is reused"
        );
        index.remove(1);
        assert_eq!(index.len(), 1);
    }
}
