//! Free-list allocator of fixed-size KV blocks.

/// Hands out physical block ids `0..num_blocks`. Double frees and frees of unknown ids are
/// bookkeeping bugs and panic (they would silently corrupt another sequence's cache).
#[derive(Debug)]
pub struct BlockAllocator {
    block_size: usize,
    /// LIFO: the most recently freed block is reused first (warm in cache).
    free: Vec<u32>,
    in_use: Vec<bool>,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let num_blocks = u32::try_from(num_blocks).expect("block ids fit in u32");
        Self {
            block_size,
            free: (0..num_blocks).rev().collect(),
            in_use: vec![false; num_blocks as usize],
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.in_use.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Tokens the whole cache holds.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks() * self.block_size
    }

    pub fn allocate(&mut self) -> Option<u32> {
        let block = self.free.pop()?;
        self.in_use[block as usize] = true;
        Some(block)
    }

    pub fn release(&mut self, block: u32) {
        let slot = self
            .in_use
            .get_mut(block as usize)
            .expect("released block id out of range");
        assert!(*slot, "block {block} released twice");
        *slot = false;
        self.free.push(block);
    }

    /// Whether `block` is currently allocated (for invariant checks).
    pub fn is_allocated(&self, block: u32) -> bool {
        self.in_use.get(block as usize).copied().unwrap_or(false)
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
}
