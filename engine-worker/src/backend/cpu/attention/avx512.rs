//! AVX-512 attention for the common head sizes. The AVX2 path spends most of a position on one
//! chain of dependent FMAs and a horizontal sum, then a scalar `exp`; here the scores of 16
//! positions are summed together by one transposing tree ([`hsum16`]), the exponentials are
//! taken 16 at a time ([`exp16`]), and the weighted sum of values alternates two sets of
//! accumulators (even and odd positions) to halve the FMA latency per position.
//!
//! Every position's score, and so every token's output, is computed by the same instructions
//! whatever its neighbours: a lane's sum depends only on its own vector, and the even/odd split
//! follows the position in its KV block (blocks hold an even number of positions).

use std::arch::x86_64::*;

use super::super::folds::{halves, pairs, quads};
use super::{Item, Shared};

/// Lane `p` = the sum of `v[p]`'s 16 lanes, every vector by the same tree (lane `i` + lane
/// `i + 8`, then `+ 4`, `+ 2`, `+ 1`), so a sum does not depend on the other vectors.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // Quarter k of the m-th: v[4m + k] folded to 4 lanes (no closure: it would not inherit
    // this function's target features, nor inline the folds).
    let u0 = quads(halves(v[0], v[1]), halves(v[2], v[3]));
    let u1 = quads(halves(v[4], v[5]), halves(v[6], v[7]));
    let u2 = quads(halves(v[8], v[9]), halves(v[10], v[11]));
    let u3 = quads(halves(v[12], v[13]), halves(v[14], v[15]));
    // Quarter k: [v[k] 2-lane fold, v[4 + k]'s] (and v[8 + k], v[12 + k] in `high`).
    let (low, high) = (pairs(u0, u1), pairs(u2, u3));
    // Quarter k: the sums of v[k], v[4 + k], v[8 + k], v[12 + k]: lane 4k + j holds v[4j + k].
    let sums = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(low, high),
        _mm512_shuffle_ps::<0xDD>(low, high),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, sums)
}

/// `e^x` lane by lane (Cephes' `expf`: a degree-6 polynomial on `x - n ln 2`, scaled by `2^n`;
/// within 2 ulp of the exact value). Inputs below -87.3 give about 1e-38 (softmax inputs are at
/// most 0, and such weights are far below an f32 step of the largest, which is 1).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.3));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    // ln 2 in two parts, so `r` keeps its low bits.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(
        p,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(y, n)
}

/// `q · k` for one key row: `HD / 16` FMAs in one chain.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
// Index loops over constant bounds unroll fully; iterator adapters are not inlined into a
// target-feature function (they were called, per row).
#[allow(clippy::needless_range_loop)]
unsafe fn dot<const HD: usize>(q: &[__m512; 8], k: *const f32) -> __m512 {
    let mut acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
    for c in 1..HD / 16 {
        acc = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k.add(16 * c)), acc);
    }
    acc
}

/// Scaled scores of the token's positions `0..len` into `scores`, 16 positions at a time.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
unsafe fn scores_of<const HD: usize>(
    s: &Shared<'_>,
    q: &[__m512; 8],
    kv_head: usize,
    block_table: &[u32],
    len: usize,
    scores: &mut Vec<f32>,
) {
    let bs = s.cache.block_size;
    let keys_of = |block: usize| {
        s.cache
            .tile(s.layer, block_table[block] as usize, kv_head)
            .0
    };
    let scale = _mm512_set1_ps(s.scale);
    scores.clear();
    scores.resize(len.next_multiple_of(16), 0.0);
    for start in (0..len).step_by(16) {
        // Consecutive positions: one division per chunk, then walk the block tiles.
        let (mut block, mut slot) = (start / bs, start % bs);
        let mut keys = keys_of(block);
        let first = keys[slot * HD..].as_ptr();
        // A short last chunk repeats its first row in the unused lanes (each lane is its own).
        let rows: [*const f32; 16] = std::array::from_fn(|j| {
            if start + j >= len {
                return first;
            }
            if slot == bs {
                (block, slot) = (block + 1, 0);
                keys = keys_of(block);
            }
            slot += 1;
            keys[(slot - 1) * HD..].as_ptr()
        });
        let dots: [__m512; 16] = std::array::from_fn(|j| dot::<HD>(q, rows[j]));
        let chunk = _mm512_mul_ps(hsum16(&dots), scale);
        _mm512_storeu_ps(scores.as_mut_ptr().add(start), chunk);
    }
    scores.truncate(len);
}

/// Softmax weights in place (unnormalised: `e^(x - max)`); returns their sum.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
unsafe fn exponentiate(scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max_v = _mm512_set1_ps(max);
    let mut total = _mm512_setzero_ps();
    let mut chunks = scores.chunks_exact_mut(16);
    for chunk in &mut chunks {
        let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), max_v));
        _mm512_storeu_ps(chunk.as_mut_ptr(), e);
        total = _mm512_add_ps(total, e);
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut lanes = [f32::NEG_INFINITY; 16];
        lanes[..tail.len()].copy_from_slice(tail);
        // Absent lanes: e^(-inf) clamps to about 1e-38; they are masked out of the sum.
        let mask = (1u16 << tail.len()) - 1;
        let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(lanes.as_ptr()), max_v));
        _mm512_storeu_ps(lanes.as_mut_ptr(), e);
        tail.copy_from_slice(&lanes[..tail.len()]);
        total = _mm512_mask_add_ps(total, mask, total, e);
    }
    _mm512_reduce_add_ps(total)
}

/// # Safety
/// AVX-512F/VL, AVX2 and FMA must be available; `HD == s.head_dim` (at most 128, a multiple
/// of 16), `o.len() == HD`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // as in `dot`
pub(super) unsafe fn attend<const HD: usize>(
    s: &Shared<'_>,
    item: usize,
    o: &mut [f32],
    scores: &mut Vec<f32>,
) {
    debug_assert!(HD.is_multiple_of(16) && HD <= 128 && s.head_dim == HD && o.len() == HD);
    let Item {
        q: q_h,
        kv_head,
        len,
        blocks: block_table,
    } = s.item(item);
    let bs = s.cache.block_size;
    let q_ptr = q_h.as_ptr();
    let mut q = [_mm512_setzero_ps(); 8];
    for c in 0..HD / 16 {
        q[c] = _mm512_loadu_ps(q_ptr.add(16 * c));
    }

    scores_of::<HD>(s, &q, kv_head, block_table, len, scores);
    let total = exponentiate(scores);

    // Even and odd positions into separate accumulators: two FMA chains per output vector.
    let mut even = [_mm512_setzero_ps(); 8];
    let mut odd = [_mm512_setzero_ps(); 8];
    for (bi, &block) in block_table.iter().enumerate() {
        let (_, values) = s.cache.tile(s.layer, block as usize, kv_head);
        let weights = &scores[bi * bs..(bi * bs + bs).min(len)];
        let mut rows = weights.iter().zip(values.chunks_exact(HD));
        while let Some((&w0, v0)) = rows.next() {
            let (w0, v0) = (_mm512_set1_ps(w0), v0.as_ptr());
            for c in 0..HD / 16 {
                even[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0.add(16 * c)), even[c]);
            }
            if let Some((&w1, v1)) = rows.next() {
                let (w1, v1) = (_mm512_set1_ps(w1), v1.as_ptr());
                for c in 0..HD / 16 {
                    odd[c] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1.add(16 * c)), odd[c]);
                }
            }
        }
    }
    let inv = _mm512_set1_ps(1.0 / total);
    for c in 0..HD / 16 {
        let sum = _mm512_add_ps(even[c], odd[c]);
        _mm512_storeu_ps(o.as_mut_ptr().add(16 * c), _mm512_mul_ps(sum, inv));
    }
}
