//! Paged KV-cache bookkeeping (the memory itself lives in the backend): fixed-size blocks handed
//! out from a free list, per-sequence block tables mapping positions to physical blocks, and the
//! index of blocks that cache a prompt prefix for later requests to share.

mod allocator;
mod block_table;
mod budget;
mod dtype;
mod prefix_index;

pub use allocator::BlockAllocator;
pub use block_table::BlockTable;
pub use budget::{parse_bytes, KvBudget};
pub use dtype::{KvDtype, Q8_0_BLOCK};
pub use prefix_index::BlockLink;
