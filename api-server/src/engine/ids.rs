//! Engine request ids: a random 24-bit prefix per process in the high bits and a counter in the
//! low 40, so ids from several api-servers (and restarts) do not collide.

use std::sync::atomic::{AtomicU64, Ordering};

use proto::RequestId;

const COUNTER_BITS: u32 = 40;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

#[derive(Debug)]
pub struct IdAllocator {
    prefix: u64,
    counter: AtomicU64,
}

impl IdAllocator {
    pub fn new(prefix: u32) -> Self {
        Self {
            prefix: u64::from(prefix & 0xFF_FFFF) << COUNTER_BITS,
            counter: AtomicU64::new(0),
        }
    }

    pub fn random() -> Self {
        Self::new(rand::random::<u32>())
    }

    pub fn next(&self) -> RequestId {
        self.prefix | (self.counter.fetch_add(1, Ordering::Relaxed) & COUNTER_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keep_the_prefix_and_count_up() {
        let ids = IdAllocator::new(0xABCDEF);
        let a = ids.next();
        let b = ids.next();
        assert_eq!(a >> COUNTER_BITS, 0xABCDEF);
        assert_eq!(b, a + 1);
    }
}
