//! Paged KV-cache bookkeeping (the memory itself lives in the backend): fixed-size blocks handed
//! out from a free list, and per-sequence block tables mapping positions to physical blocks.

mod allocator;
mod block_table;

pub use allocator::BlockAllocator;
pub use block_table::BlockTable;
