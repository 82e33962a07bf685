//! Causal self-attention over the paged KV cache, with grouped-query heads. Each (token, head)
//! is computed on its own, in a fixed order over the sequence's positions, so results do not
//! depend on the rest of the batch, nor on whether the token came in a prefill or a decode.

use rayon::prelude::*;

use super::kernels::{dot, Isa};
use super::kv_cache::KvCache;
use crate::model::ModelConfig;

/// Multiply-adds below which attention stays on one thread.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Where a token sits: its sequence's block table and its position.
pub(crate) struct TokenSlot<'a> {
    pub block_table: &'a [u32],
    pub pos: usize,
}

/// The inputs every (token, head) item reads.
struct Shared<'a> {
    cache: &'a KvCache,
    layer: usize,
    slots: &'a [TokenSlot<'a>],
    q: &'a [f32],
    heads: usize,
    group: usize,
    head_dim: usize,
    scale: f32,
}

/// Where one (token, head) item reads: its query, its KV head and its token's blocks.
struct Item<'a> {
    /// `[head_dim]`.
    q: &'a [f32],
    kv_head: usize,
    /// Positions attended: the token's own and every one before it.
    len: usize,
    /// The block table's entries that hold those positions.
    blocks: &'a [u32],
}

impl Shared<'_> {
    fn item(&self, item: usize) -> Item<'_> {
        let (t, h) = (item / self.heads, item % self.heads);
        let slot = &self.slots[t];
        let len = slot.pos + 1;
        Item {
            q: &self.q[item * self.head_dim..(item + 1) * self.head_dim],
            kv_head: h / self.group,
            len,
            blocks: &slot.block_table[..len.div_ceil(self.cache.block_size)],
        }
    }
}

/// `out[t, h] = softmax(q[t, h] · K[0..=pos]ᵀ / √d) · V[0..=pos]`; `q` and `out` are
/// `[tokens, heads * head_dim]`.
pub(crate) fn attention(
    cache: &KvCache,
    layer: usize,
    slots: &[TokenSlot<'_>],
    q: &[f32],
    out: &mut [f32],
    config: &ModelConfig,
    isa: Isa,
) {
    let head_dim = config.head_dim;
    let shared = Shared {
        cache,
        layer,
        slots,
        q,
        heads: config.num_heads,
        group: config.num_heads / config.num_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let one = |scores: &mut Vec<f32>, (item, o): (usize, &mut [f32])| {
        attend_dispatch(&shared, item, o, scores, isa);
    };
    // Small batches stay on the calling thread: waking the pool costs more than a few short
    // dot products.
    let work: usize = slots.iter().map(|s| s.pos + 1).sum::<usize>() * shared.heads * head_dim;
    if work < PARALLEL_MIN_WORK {
        let mut scores = Vec::new();
        for item in out.chunks_mut(head_dim).enumerate() {
            one(&mut scores, item);
        }
    } else {
        out.par_chunks_mut(head_dim)
            .enumerate()
            .with_min_len(4)
            .for_each_init(Vec::new, one);
    }
}

fn attend_dispatch(s: &Shared<'_>, item: usize, o: &mut [f32], scores: &mut Vec<f32>, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is only selected when the CPU has AVX-512F/VL, AVX2 and FMA.
        unsafe {
            match s.head_dim {
                64 => return avx512::attend::<64>(s, item, o, scores),
                128 => return avx512::attend::<128>(s, item, o, scores),
                _ => {}
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: a SIMD ISA is only selected when the CPU has AVX2 and FMA.
        unsafe {
            match s.head_dim {
                64 => return simd::attend::<64>(s, item, o, scores),
                128 => return simd::attend::<128>(s, item, o, scores),
                _ => {}
            }
        }
    }
    let _ = isa;
    attend(s, item, o, scores);
}

#[cfg(target_arch = "x86_64")]
mod avx512;

/// AVX2 attention for the common head sizes: the query and the output accumulators live in
/// registers across all positions.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Item, Shared};

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn hsum(v: __m256) -> f32 {
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
    }

    /// # Safety
    /// AVX2 and FMA must be available; `HD == s.head_dim`, `o.len() == HD`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn attend<const HD: usize>(
        s: &Shared<'_>,
        item: usize,
        o: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        debug_assert!(HD.is_multiple_of(8) && s.head_dim == HD && o.len() == HD);
        let chunks = HD / 8;
        let Item {
            q,
            kv_head,
            len,
            blocks,
        } = s.item(item);
        let bs = s.cache.block_size;
        let q = q.as_ptr();
        // Index loops over a constant bound: they unroll fully (iterator adapters would not be
        // inlined into this target-feature function).
        let mut qv = [_mm256_setzero_ps(); 16];
        for c in 0..chunks {
            qv[c] = _mm256_loadu_ps(q.add(8 * c));
        }

        scores.clear();
        for (bi, &block) in blocks.iter().enumerate() {
            let (keys, _) = s.cache.tile(s.layer, block as usize, kv_head);
            let in_block = (len - bi * bs).min(bs);
            for k in keys.chunks_exact(HD).take(in_block) {
                let k = k.as_ptr();
                let mut acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k));
                for c in 1..chunks {
                    acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k.add(8 * c)), acc);
                }
                scores.push(hsum(acc) * s.scale);
            }
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for score in scores.iter_mut() {
            *score = (*score - max).exp();
            total += *score;
        }

        let mut acc = [_mm256_setzero_ps(); 16];
        for (bi, &block) in blocks.iter().enumerate() {
            let (_, values) = s.cache.tile(s.layer, block as usize, kv_head);
            let weights = &scores[bi * bs..(bi * bs + bs).min(len)];
            for (&w, v) in weights.iter().zip(values.chunks_exact(HD)) {
                let w = _mm256_set1_ps(w);
                let v = v.as_ptr();
                for c in 0..chunks {
                    acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * c)), acc[c]);
                }
            }
        }
        let inv = _mm256_set1_ps(1.0 / total);
        for c in 0..chunks {
            _mm256_storeu_ps(o.as_mut_ptr().add(8 * c), _mm256_mul_ps(acc[c], inv));
        }
    }
}

/// One (token, head) item: scores over the token's positions, softmax, weighted sum of values.
#[inline(always)]
fn attend(s: &Shared<'_>, item: usize, o: &mut [f32], scores: &mut Vec<f32>) {
    let head_dim = s.head_dim;
    let Item {
        q: q_h,
        kv_head,
        len,
        blocks,
    } = s.item(item);
    let bs = s.cache.block_size;

    scores.clear();
    for (bi, &block) in blocks.iter().enumerate() {
        let (keys, _) = s.cache.tile(s.layer, block as usize, kv_head);
        let in_block = (len - bi * bs).min(bs);
        for k in keys.chunks_exact(head_dim).take(in_block) {
            scores.push(dot(q_h, k) * s.scale);
        }
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        total += *score;
    }

    o.fill(0.0);
    for (bi, &block) in blocks.iter().enumerate() {
        let (_, values) = s.cache.tile(s.layer, block as usize, kv_head);
        let weights = &scores[bi * bs..(bi * bs + bs).min(len)];
        for (w, v) in weights.iter().zip(values.chunks_exact(head_dim)) {
            for (o, v) in o.iter_mut().zip(v) {
                *o += w * v;
            }
        }
    }
    let inv = 1.0 / total;
    for o in o.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// A cache of `blocks` blocks filled with random keys and values, one layer.
    fn random_cache(config: &ModelConfig, block_size: usize, blocks: usize) -> KvCache {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut cache = KvCache::new(config, block_size, blocks).unwrap();
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

    /// Every SIMD path against the portable one, over context lengths around the 16-position
    /// chunks of the AVX-512 scores, with even and odd block sizes (the tiles' walk), and each
    /// token's output the same bits alone as beside another token.
    #[test]
    fn simd_paths_match_the_portable_one_and_each_token_stands_alone() {
        let mut config = ModelConfig::tiny();
        (config.head_dim, config.num_heads, config.num_kv_heads) = (64, 6, 2);
        let width = config.num_heads * config.head_dim;
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for block_size in [16, 5] {
            let cache = random_cache(&config, block_size, 24);
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
                for isa in [Isa::Avx512, Isa::Avx2]
                    .into_iter()
                    .filter(|i| i.is_supported())
                {
                    let got = run(&cache, &config, &slots, &q, isa);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() < 1e-5 * (1.0 + w.abs()),
                            "{isa:?} block size {block_size} len {len} [{i}]: {g} vs {w}"
                        );
                    }
                    let alone = run(&cache, &config, &slots[1..], &q[width..], isa);
                    assert!(
                        alone.iter().zip(&got[width..]).all(|(a, g)| a.to_bits() == g.to_bits()),
                        "{isa:?} block size {block_size} len {len}: a token's output depends on its batch"
                    );
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
        let cache = random_cache(&config, 16, 64);
        let table: Vec<u32> = (0..64).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let q: Vec<f32> = (0..8 * width).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect();
        for len in [64, 256, 1024] {
            let slots: Vec<TokenSlot<'_>> = (0..8)
                .map(|t| TokenSlot {
                    block_table: &table,
                    pos: len - 8 + t,
                })
                .collect();
            let mut fastest = vec![f64::INFINITY; isas.len()];
            for _ in 0..15 {
                for (i, &isa) in isas.iter().enumerate() {
                    let start = std::time::Instant::now();
                    for _ in 0..10 {
                        run(&cache, &config, &slots, &q, isa);
                    }
                    fastest[i] = fastest[i].min(start.elapsed().as_secs_f64() / 10.0);
                }
            }
            for (isa, seconds) in isas.iter().zip(&fastest) {
                let per_position = seconds * 1e9 / (8.0 * 9.0 * len as f64);
                println!(
                    "context {len:4} {isa:?}: {:.2} ns per position and head",
                    per_position
                );
            }
        }
    }
}
