//! AVX2 attention for the common head sizes: the query and the output accumulators live in
//! registers across all positions.

use std::arch::x86_64::*;

use super::super::folds::hsum8;
use super::super::kv_rows::KvRow;
use super::{Item, Shared};

/// # Safety
/// AVX2, FMA and F16C must be available; `HD == s.head_dim`, `o.len() == HD`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn attend<const HD: usize, R: KvRow>(
    s: &Shared<'_>,
    item: usize,
    o: &mut [f32],
    scores: &mut Vec<f32>,
) {
    assert!(HD.is_multiple_of(8) && s.head_dim == HD && o.len() == HD);
    let chunks = HD / 8;
    let Item {
        q,
        kv_head,
        len,
        blocks,
    } = s.item(item);
    let (bs, row_bytes) = (s.cache.block_size, s.cache.row_bytes());
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
        for k in keys.chunks_exact(row_bytes).take(in_block) {
            let k = k.as_ptr();
            let mut acc = _mm256_mul_ps(qv[0], R::load8(k, 0));
            for c in 1..chunks {
                acc = _mm256_fmadd_ps(qv[c], R::load8(k, 8 * c), acc);
            }
            scores.push(hsum8(acc) * s.scale);
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
        for (&w, v) in weights.iter().zip(values.chunks_exact(row_bytes)) {
            let w = _mm256_set1_ps(w);
            let v = v.as_ptr();
            for c in 0..chunks {
                acc[c] = _mm256_fmadd_ps(w, R::load8(v, 8 * c), acc[c]);
            }
        }
    }
    let inv = _mm256_set1_ps(1.0 / total);
    for c in 0..chunks {
        _mm256_storeu_ps(o.as_mut_ptr().add(8 * c), _mm256_mul_ps(acc[c], inv));
    }
}
