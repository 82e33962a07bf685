//! Reference-counted KV blocks: a free list, and behind it the unreferenced blocks that still
//! hold a cached prompt prefix ([`PrefixIndex`]), reused least recently released first.

use std::collections::BTreeMap;

use super::prefix_index::{BlockLink, PrefixIndex};

/// Hands out physical block ids `0..num_blocks`. Releasing a block no table holds is a
/// bookkeeping bug and panics (it would silently corrupt another sequence's cache).
#[derive(Debug)]
pub struct BlockAllocator {
    block_size: usize,
    /// LIFO: the most recently freed block is reused first (warm in cache). Holds no prefix.
    free: Vec<u32>,
    /// Per block: how many block tables hold it.
    refs: Vec<u32>,
    /// Unreferenced blocks that hold a registered prefix, keyed by when they were released:
    /// taken only once `free` is empty, the oldest first.
    evictable: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
    prefixes: PrefixIndex,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let count = u32::try_from(num_blocks).expect("block ids fit in u32");
        Self {
            block_size,
            free: (0..count).rev().collect(),
            refs: vec![0; num_blocks],
            evictable: BTreeMap::new(),
            released_at: vec![0; num_blocks],
            clock: 0,
            prefixes: PrefixIndex::new(num_blocks),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no table holds (including those that still cache a prefix).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks no table holds that keep a prompt prefix (taken for new work only when no free
    /// block is left).
    pub fn num_evictable(&self) -> usize {
        self.evictable.len()
    }

    /// Blocks registered as holding a prompt prefix, held or not.
    pub fn num_cached(&self) -> usize {
        self.prefixes.len()
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Tokens the whole cache holds.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks() * self.block_size
    }

    /// A block for one table to write: a free one, else the least recently released cached
    /// one, whose prefix is forgotten.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let (_, block) = self.evictable.pop_first()?;
                self.prefixes.remove(block);
                block
            }
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// One more table holds `block`, a cached prefix block found by [`Self::lookup`].
    pub fn share(&mut self, block: u32) {
        assert!(
            self.prefixes.contains(block),
            "only cached blocks are shared"
        );
        let refs = &mut self.refs[block as usize];
        if *refs == 0 {
            self.evictable
                .remove(&self.released_at[block as usize])
                .expect("an unreferenced cached block is evictable");
        }
        *refs += 1;
    }

    pub fn release(&mut self, block: u32) {
        let refs = self
            .refs
            .get_mut(block as usize)
            .expect("released block id out of range");
        assert!(*refs > 0, "block {block} released twice");
        *refs -= 1;
        if *refs > 0 {
            return;
        }
        if self.prefixes.contains(block) {
            self.clock += 1;
            self.released_at[block as usize] = self.clock;
            self.evictable.insert(self.clock, block);
        } else {
            self.free.push(block);
        }
    }

    /// Whether some table holds `block` (for invariant checks).
    pub fn is_allocated(&self, block: u32) -> bool {
        self.ref_count(block) > 0
    }

    /// How many tables hold `block`.
    pub fn ref_count(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// Whether `block` holds a registered prefix.
    pub fn is_cached(&self, block: u32) -> bool {
        self.prefixes.contains(block)
    }

    /// The cached blocks that hold `tokens`' first full blocks, at most `max_blocks`.
    pub fn lookup(&self, tokens: &[u32], max_blocks: usize) -> Vec<u32> {
        let mut parent = None;
        let mut found = Vec::new();
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some(block) = self.prefixes.find(parent, chunk) else {
                break;
            };
            found.push(block);
            parent = Some(self.prefixes.link(block));
        }
        found
    }

    /// Registers `table`'s blocks, which hold `tokens` (whole blocks, every position written),
    /// as the cached continuation of `parent` (None: they start a sequence). A block whose
    /// content is cached already (taken by [`Self::lookup`], or a twin computed in the same
    /// step) is left as it is, and the chain goes on through the cached one. Returns the link
    /// of the last block's content: the parent of the sequence's next block.
    pub fn register(
        &mut self,
        parent: Option<BlockLink>,
        tokens: &[u32],
        table: &[u32],
    ) -> Option<BlockLink> {
        let mut parent = parent;
        for (chunk, &block) in tokens.chunks_exact(self.block_size).zip(table) {
            assert!(self.is_allocated(block), "only held blocks are registered");
            let cached = match self.prefixes.find(parent, chunk) {
                Some(cached) => cached,
                None => {
                    // Not found by its content, so allocated fresh: it caches nothing else.
                    let inserted = self.prefixes.insert(parent, chunk, block);
                    assert!(inserted, "block {block} already caches other content");
                    block
                }
            };
            parent = Some(self.prefixes.link(cached));
        }
        parent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn allocates_every_block_once_then_runs_dry() {
        let mut alloc = BlockAllocator::new(4, 16);
        let mut got: Vec<u32> = (0..4).map(|_| alloc.allocate().unwrap()).collect();
        assert_eq!(alloc.allocate(), None);
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(alloc.blocks_for(0), 0);
        assert_eq!(alloc.blocks_for(16), 1);
        assert_eq!(alloc.blocks_for(17), 2);
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn double_free_panics() {
        let mut alloc = BlockAllocator::new(2, 4);
        let b = alloc.allocate().unwrap();
        alloc.release(b);
        alloc.release(b);
    }

    #[test]
    fn random_alloc_free_never_loses_a_block() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut alloc = BlockAllocator::new(64, 8);
        let mut held = Vec::new();
        for _ in 0..10_000 {
            if rng.gen_bool(0.55) {
                if let Some(b) = alloc.allocate() {
                    assert!(!held.contains(&b));
                    held.push(b);
                } else {
                    assert_eq!(held.len(), 64);
                }
            } else if !held.is_empty() {
                let i = rng.gen_range(0..held.len());
                alloc.release(held.swap_remove(i));
            }
            assert_eq!(alloc.num_free() + held.len(), 64);
        }
        for b in held.drain(..) {
            alloc.release(b);
        }
        assert_eq!(alloc.num_free(), 64);
    }

    #[test]
    fn cached_blocks_are_reused_only_after_free_ones_oldest_first() {
        let mut alloc = BlockAllocator::new(4, 2);
        let a: Vec<u32> = (0..4).map(|_| alloc.allocate().unwrap()).collect();
        let link = alloc.register(None, &[1, 2], &a[..1]);
        alloc.register(link, &[3, 4], &a[1..2]);
        alloc.register(None, &[9, 9], &a[2..3]);
        assert_eq!(alloc.num_cached(), 3);
        // Released in the order a[2], a[0], a[1], a[3]: a[3] caches nothing.
        for &i in &[2, 0, 1, 3] {
            alloc.release(a[i]);
        }
        assert_eq!(alloc.num_free(), 4);
        assert_eq!(alloc.lookup(&[1, 2, 3, 4, 5], 8), vec![a[0], a[1]]);
        assert_eq!(alloc.allocate(), Some(a[3]), "the uncached block first");
        assert_eq!(
            alloc.allocate(),
            Some(a[2]),
            "then the least recently released"
        );
        assert!(alloc.lookup(&[9, 9], 1).is_empty());
        assert_eq!(
            alloc.lookup(&[1, 2, 3, 4], 1),
            vec![a[0]],
            "at most max_blocks"
        );
        // A shared block leaves the evictable pool until its last holder lets go.
        alloc.share(a[0]);
        alloc.share(a[0]);
        assert_eq!(alloc.ref_count(a[0]), 2);
        assert_eq!(alloc.allocate(), Some(a[1]));
        assert_eq!(alloc.allocate(), None, "a held cached block is never taken");
        alloc.release(a[0]);
        alloc.release(a[0]);
        assert_eq!(alloc.allocate(), Some(a[0]));
        assert_eq!(alloc.num_cached(), 0);
        assert!(alloc.lookup(&[1, 2], 1).is_empty());
    }

    #[test]
    fn a_twin_registers_only_where_it_differs_and_chains_through_the_first() {
        let mut alloc = BlockAllocator::new(6, 2);
        let first: Vec<u32> = (0..2).map(|_| alloc.allocate().unwrap()).collect();
        let twin: Vec<u32> = (0..3).map(|_| alloc.allocate().unwrap()).collect();
        alloc.register(None, &[1, 2, 3, 4], &first);
        // Computed in the same step as the first: the same two blocks, then its own.
        alloc.register(None, &[1, 2, 3, 4, 5, 6], &twin);
        assert_eq!(alloc.num_cached(), 3);
        assert!(!alloc.is_cached(twin[0]) && !alloc.is_cached(twin[1]));
        assert_eq!(
            alloc.lookup(&[1, 2, 3, 4, 5, 6], 3),
            vec![first[0], first[1], twin[2]]
        );
        // Registering again what is registered changes nothing.
        alloc.register(None, &[1, 2, 3, 4], &first);
        assert_eq!(alloc.num_cached(), 3);
    }
}
