//! Per-request random streams.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The RNG for deciding output token `position` of a request seeded with `seed`: ChaCha8 keyed by
/// the seed, on its own stream per position. Independent of batch composition, step boundaries
/// and preemptions, so a seeded request is reproducible.
pub fn position_rng(seed: u64, position: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(position as u64);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: u64 = position_rng(42, 3).gen();
        assert_eq!(a, position_rng(42, 3).gen::<u64>());
        assert_ne!(a, position_rng(42, 4).gen::<u64>());
        assert_ne!(a, position_rng(43, 3).gen::<u64>());
    }
}
