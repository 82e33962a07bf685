//! One sequence's block table: physical block of each `block_size` run of positions.

use super::BlockAllocator;

#[derive(Debug, Default)]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Starts an empty table with cached prefix blocks (from [`BlockAllocator::lookup`]).
    pub fn share_prefix(&mut self, alloc: &mut BlockAllocator, cached: &[u32]) {
        assert!(self.blocks.is_empty(), "a prefix starts the table");
        for &block in cached {
            alloc.share(block);
            self.blocks.push(block);
        }
    }

    /// Grows the table to hold `tokens` positions. All or nothing: on failure nothing is taken.
    pub fn reserve(&mut self, alloc: &mut BlockAllocator, tokens: usize) -> bool {
        let need = alloc.blocks_for(tokens).saturating_sub(self.blocks.len());
        if need > alloc.num_free() {
            return false;
        }
        for _ in 0..need {
            self.blocks
                .push(alloc.allocate().expect("free count checked above"));
        }
        true
    }

    /// Blocks `reserve(tokens)` would still have to take.
    pub fn missing_blocks(&self, alloc: &BlockAllocator, tokens: usize) -> usize {
        alloc.blocks_for(tokens).saturating_sub(self.blocks.len())
    }

    pub fn release_all(&mut self, alloc: &mut BlockAllocator) {
        for block in self.blocks.drain(..) {
            alloc.release(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut alloc = BlockAllocator::new(3, 4);
        let mut a = BlockTable::default();
        assert!(a.reserve(&mut alloc, 9)); // 3 blocks
        let mut b = BlockTable::default();
        assert!(!b.reserve(&mut alloc, 1));
        assert!(b.is_empty());
        assert!(a.reserve(&mut alloc, 12)); // still 3 blocks
        assert_eq!(a.len(), 3);
        a.release_all(&mut alloc);
        assert_eq!(alloc.num_free(), 3);
        assert!(b.reserve(&mut alloc, 5));
        assert_eq!(b.missing_blocks(&alloc, 9), 1);
    }
}
