use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::kv_cache::KvLayout;
use super::*;
use crate::kv::KvDtype;

/// A cache of `blocks` blocks filled with random keys and values, one layer.
fn random_cache(config: &ModelConfig, block_size: usize, blocks: usize) -> KvCache {
    random_cache_of(config, block_size, blocks, KvDtype::F32)
}

/// As [`random_cache`], stored in `dtype`.
fn random_cache_of(
    config: &ModelConfig,
    block_size: usize,
    blocks: usize,
    dtype: KvDtype,
) -> KvCache {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let layout = KvLayout {
        block_size,
        num_blocks: blocks,
        dtype,
        prefault: false,
        huge_pages: true,
    };
    let mut cache = KvCache::new(config, layout).unwrap();
    let width = config.num_kv_heads * config.head_dim;
    for block in 0..blocks {
        for slot in 0..block_size {
            let k: Vec<f32> = (0..width).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let v: Vec<f32> = (0..width).map(|_| rng.gen_range(-1.0..1.0)).collect();
            cache.write(0, block, slot, &k, &v);
        }
    }
    cache
}

fn run(
    cache: &KvCache,
    config: &ModelConfig,
    slots: &[TokenSlot<'_>],
    q: &[f32],
    isa: Isa,
) -> Vec<f32> {
    let mut out = vec![0.0; q.len()];
    attention(cache, 0, slots, q, &mut out, config, isa);
    out
}

/// Every SIMD path against the portable one, for every stored precision, over context lengths
/// around the 16-position chunks of the AVX-512 scores, with even and odd block sizes (the
/// tiles' walk), and each token's output the same bits alone as beside another token.
#[test]
fn simd_paths_match_the_portable_one_and_each_token_stands_alone() {
    let mut config = ModelConfig::tiny();
    (config.head_dim, config.num_heads, config.num_kv_heads) = (64, 6, 2);
    let width = config.num_heads * config.head_dim;
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for (block_size, dtype) in [16, 5]
        .into_iter()
        .flat_map(|b| KvDtype::ALL.map(|d| (b, d)))
    {
        let cache = random_cache_of(&config, block_size, 24, dtype);
        // A scrambled block table, as a paged cache hands out.
        let table: Vec<u32> = (0..24u32).map(|b| (b * 7) % 24).collect();
        for len in [1, 2, 15, 16, 17, 33, 40, 100] {
            let q: Vec<f32> = (0..2 * width).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let slots = [
                TokenSlot {
                    block_table: &table,
                    pos: len - 1,
                },
                TokenSlot {
                    block_table: &table,
                    pos: (len + 9).min(24 * block_size - 1),
                },
            ];
            let want = run(&cache, &config, &slots, &q, Isa::Scalar);
            for isa in Isa::testable(&[Isa::Avx512, Isa::Avx2], "backend::cpu::attention::tests") {
                let got = run(&cache, &config, &slots, &q, isa);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() < 1e-5 * (1.0 + w.abs()),
                        "{isa:?} {dtype} block size {block_size} len {len} [{i}]: {g} vs {w}"
                    );
                }
                let alone = run(&cache, &config, &slots[1..], &q[width..], isa);
                assert!(
                    alone.iter().zip(&got[width..]).all(|(a, g)| a.to_bits() == g.to_bits()),
                    "{isa:?} {dtype} block size {block_size} len {len}: a token's output depends on its batch"
                );
            }
        }
    }
}

/// A prompt chunk or a row's verify tokens (consecutive tokens of one sequence) beside another
/// sequence, short and long contexts, one and several threads: every token's output has the
/// bits it has alone, whatever run, head split or thread computed it, and stays within
/// rounding of the portable path.
#[test]
fn a_sequences_tokens_computed_together_have_the_bits_each_has_alone() {
    let mut config = ModelConfig::tiny();
    (config.head_dim, config.num_heads, config.num_kv_heads) = (64, 9, 3);
    let width = config.num_heads * config.head_dim;
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let cache = random_cache(&config, 16, 64);
    // Scrambled block tables of 40 blocks (up to 640 positions), as a paged cache hands out.
    let (table_a, table_b): (Vec<u32>, Vec<u32>) = (
        (0..40u32).map(|b| (b * 5) % 64).collect(),
        (0..40u32).map(|b| (b * 3 + 1) % 64).collect(),
    );
    let pools = [1, 3].map(|n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    });
    for (start, count) in [(0, 12), (3, 17), (200, 5), (480, 12)] {
        let mut slots: Vec<TokenSlot<'_>> = (0..count)
            .map(|i| TokenSlot {
                block_table: &table_a,
                pos: start + i,
            })
            .collect();
        slots.push(TokenSlot {
            block_table: &table_b,
            pos: start + 40,
        });
        let q: Vec<f32> = (0..slots.len() * width)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let want = run(&cache, &config, &slots, &q, Isa::Scalar);
        for isa in Isa::testable(&[Isa::Avx512, Isa::Avx2], "backend::cpu::attention::tests") {
            for pool in &pools {
                let got = pool.install(|| run(&cache, &config, &slots, &q, isa));
                for (t, slot) in slots.iter().enumerate() {
                    let row = t * width..(t + 1) * width;
                    let one = std::slice::from_ref(slot);
                    let alone = run(&cache, &config, one, &q[row.clone()], isa);
                    assert!(
                        alone
                            .iter()
                            .zip(&got[row.clone()])
                            .all(|(a, g)| a.to_bits() == g.to_bits()),
                        "{isa:?}, {} threads, token {t} at {}: output depends on its batch",
                        pool.current_num_threads(),
                        slot.pos
                    );
                    for (g, w) in got[row.clone()].iter().zip(&want[row]) {
                        assert!(
                            (g - w).abs() < 1e-5 * (1.0 + w.abs()),
                            "{isa:?}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Attention cost probe (not a correctness test): `cargo test --release -p engine-worker
/// --lib attention_throughput -- --ignored --nocapture`. SmolLM2's heads (9 query, 3 KV,
/// 64 wide), 8 tokens at each context length, the ISAs interleaved; per ISA the fastest of
/// several runs, since a disturbed run is only ever slower.
#[test]
#[ignore]
fn attention_throughput() {
    let mut config = ModelConfig::tiny();
    (config.head_dim, config.num_heads, config.num_kv_heads) = (64, 9, 3);
    let width = config.num_heads * config.head_dim;
    let caches = KvDtype::ALL.map(|d| random_cache_of(&config, 16, 64, d));
    let table: Vec<u32> = (0..64).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let q: Vec<f32> = (0..8 * width).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let isas = Isa::testable(&[Isa::Avx512, Isa::Avx2], "backend::cpu::attention::tests");
    let cases: Vec<(Isa, &KvCache)> = isas
        .iter()
        .flat_map(|&isa| caches.iter().map(move |c| (isa, c)))
        .collect();
    for len in [64, 256, 1024] {
        let slots: Vec<TokenSlot<'_>> = (0..8)
            .map(|t| TokenSlot {
                block_table: &table,
                pos: len - 8 + t,
            })
            .collect();
        let mut fastest = vec![f64::INFINITY; cases.len()];
        for _ in 0..15 {
            for (i, &(isa, cache)) in cases.iter().enumerate() {
                let start = std::time::Instant::now();
                for _ in 0..10 {
                    run(cache, &config, &slots, &q, isa);
                }
                fastest[i] = fastest[i].min(start.elapsed().as_secs_f64() / 10.0);
            }
        }
        for ((isa, cache), seconds) in cases.iter().zip(&fastest) {
            let per_position = seconds * 1e9 / (8.0 * 9.0 * len as f64);
            println!(
                "context {len:4} {isa:?} {}: {:.2} ns per position and head",
                cache.dtype, per_position
            );
        }
    }
}
