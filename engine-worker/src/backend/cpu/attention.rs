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

/// AVX2 attention for the common head sizes: the query and the output accumulators live in
/// registers across all positions.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::Shared;

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
        let (t, h) = (item / s.heads, item % s.heads);
        let slot = &s.slots[t];
        let kv_head = h / s.group;
        let bs = s.cache.block_size;
        let len = slot.pos + 1;
        let blocks = len.div_ceil(bs);
        let q = s.q[item * HD..(item + 1) * HD].as_ptr();
        // Index loops over a constant bound: they unroll fully (iterator adapters would not be
        // inlined into this target-feature function).
        let mut qv = [_mm256_setzero_ps(); 16];
        for c in 0..chunks {
            qv[c] = _mm256_loadu_ps(q.add(8 * c));
        }

        scores.clear();
        for (bi, &block) in slot.block_table[..blocks].iter().enumerate() {
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
        for (bi, &block) in slot.block_table[..blocks].iter().enumerate() {
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
    let (t, h) = (item / s.heads, item % s.heads);
    let slot = &s.slots[t];
    let q_h = &s.q[item * head_dim..(item + 1) * head_dim];
    let kv_head = h / s.group;
    let bs = s.cache.block_size;
    let len = slot.pos + 1;
    let blocks = len.div_ceil(bs);

    scores.clear();
    for (bi, &block) in slot.block_table[..blocks].iter().enumerate() {
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
    for (bi, &block) in slot.block_table[..blocks].iter().enumerate() {
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
