//! AVX-512 attention for the common head sizes. The AVX2 path spends most of a position on one
//! chain of dependent FMAs and a horizontal sum, then a scalar `exp`; here the scores of 16
//! positions are summed together by one transposing tree ([`hsum16`]), the exponentials are
//! taken 16 at a time ([`exp16`]), and the weighted sum of values alternates two sets of
//! accumulators (even and odd positions) to halve the FMA latency per position.
//!
//! Work is cut into runs ([`Run`]): up to [`RUN_TOKENS`] consecutive tokens of one sequence
//! and one KV head, with every query head that reads it (grouped-query attention). A run
//! reads each chunk of keys and each block of values once from the cache and serves all its
//! query rows from the first level cache: one row at a time, each key and value row was fetched
//! again for every query head and token, and at a few hundred positions attention waited on
//! the second level cache rather than on its FMAs.
//!
//! Every position's score, and so every token's output, is computed by the same instructions
//! whatever its neighbours: a lane's sum depends only on its own vector, the even/odd split
//! follows the position in its KV block (blocks hold an even number of positions), and a row's
//! accumulators go through memory between blocks, which does not change their values.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::folds::{halves, pairs, quads};
use super::super::kv_rows::KvRow;
use super::Shared;

/// Most tokens of one sequence in a [`Run`]: enough rows to share each key and value fetch,
/// few enough that a long prompt still splits into many parallel runs.
const RUN_TOKENS: usize = 8;
/// Runs per pool thread below which runs get shorter, for load balance.
const RUNS_PER_THREAD: usize = 4;

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
unsafe fn dot<const HD: usize, R: KvRow>(q: &[__m512; 8], k: *const u8) -> __m512 {
    let mut acc = _mm512_mul_ps(q[0], R::load16(k, 0));
    for c in 1..HD / 16 {
        acc = _mm512_fmadd_ps(q[c], R::load16(k, 16 * c), acc);
    }
    acc
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

/// Consecutive tokens of one sequence (they share a block table) and query heads of one KV
/// head: the query rows are every (token, head) pair, token-major.
struct Run {
    /// The run's tokens in the batch: `first..first + tokens`.
    first: usize,
    tokens: usize,
    kv_head: usize,
    /// The run's query heads among `kv_head`'s group: `heads.start..heads.end`.
    heads: std::ops::Range<usize>,
}

/// The batch cut into [`Run`]s: tokens that share a block table and follow each other, times
/// every KV head with all its query heads; at most [`RUN_TOKENS`] tokens a run, and with more
/// than one thread, smaller runs (fewer tokens, then fewer heads) when the batch would
/// otherwise give each of `threads` threads under [`RUNS_PER_THREAD`] runs (one sequence's
/// single decode token would be three runs for two threads). Only the split depends on the
/// batch: a row's arithmetic does not.
fn runs(s: &Shared<'_>, threads: usize) -> Vec<Run> {
    let kv_heads = s.heads / s.group;
    let rows_per_run = if threads == 1 {
        usize::MAX
    } else {
        (s.slots.len() * s.heads / (threads * RUNS_PER_THREAD)).max(1)
    };
    let tokens_per_run = (rows_per_run / s.group).clamp(1, RUN_TOKENS);
    let heads_per_run = rows_per_run.min(s.group);
    let mut out = Vec::new();
    let mut first = 0;
    while first < s.slots.len() {
        let table = s.slots[first].block_table;
        let mut tokens = 1;
        while tokens < tokens_per_run
            && first + tokens < s.slots.len()
            && std::ptr::eq(s.slots[first + tokens].block_table, table)
        {
            tokens += 1;
        }
        for kv_head in 0..kv_heads {
            for start in (0..s.group).step_by(heads_per_run) {
                out.push(Run {
                    first,
                    tokens,
                    kv_head,
                    heads: start..(start + heads_per_run).min(s.group),
                });
            }
        }
        first += tokens;
    }
    out
}

/// Where the runs write: `[tokens, heads * head_dim]`. Runs write disjoint (token, head) rows.
#[derive(Clone, Copy)]
struct OutRows(*mut f32);
// SAFETY: each run writes only its own (token, query head) rows of the output, which
// `attention` borrows exclusively for the whole call.
unsafe impl Send for OutRows {}
unsafe impl Sync for OutRows {}

/// A thread's scratch: per query row of a run, its scores and its output accumulators.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    /// Per row, the sum of its softmax weights.
    totals: Vec<f32>,
    /// Per row, `[even; 8]` then `[odd; 8]` (see [`attend_run`]).
    acc: Vec<[__m512; 16]>,
}

/// `out[t, h] = softmax(q[t, h] · K[0..=pos]ᵀ / √d) · V[0..=pos]` for every token and head.
///
/// On the pool when `parallel` (the caller's judgement of the batch's work), else on this
/// thread.
///
/// # Safety
/// AVX-512F/VL, AVX2 and FMA must be available; `HD == s.head_dim` (at most 128, a multiple
/// of 16), `out.len() == s.q.len()`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn attention<const HD: usize, R: KvRow>(
    s: &Shared<'_>,
    out: &mut [f32],
    parallel: bool,
) {
    assert!(HD.is_multiple_of(16) && HD <= 128 && s.head_dim == HD);
    assert_eq!(out.len(), s.q.len(), "attention output");
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let runs = runs(s, threads);
    let out = OutRows(out.as_mut_ptr());
    // SAFETY (both arms): the caller vouches for the CPU and the shapes; runs write disjoint
    // rows of `out` (see `OutRows`).
    if threads == 1 {
        let mut scratch = Scratch::default();
        for run in &runs {
            attend_run::<HD, R>(s, run, out, &mut scratch);
        }
    } else {
        runs.par_iter()
            .for_each_init(Scratch::default, |scratch, run| unsafe {
                attend_run::<HD, R>(s, run, out, scratch)
            });
    }
}

/// One run: every row's scores, softmax weights and weighted sum of values, a chunk of keys
/// and a block of values at a time for all rows.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
// Index loops over constant bounds unroll fully (as in `dot`).
#[allow(clippy::needless_range_loop)]
unsafe fn attend_run<const HD: usize, R: KvRow>(
    s: &Shared<'_>,
    run: &Run,
    out: OutRows,
    scratch: &mut Scratch,
) {
    let (heads, bs, row_bytes) = (run.heads.len(), s.cache.block_size, s.cache.row_bytes());
    let rows = run.tokens * heads;
    // Row `r` = (token `first + r / heads`, query head `heads.start + r % heads` of the group).
    let slot = |r: usize| &s.slots[run.first + r / heads];
    let item = |r: usize| {
        (run.first + r / heads) * s.heads + run.kv_head * s.group + run.heads.start + r % heads
    };
    let len = |r: usize| slot(r).pos + 1;
    let max_len = (0..rows).map(len).max().unwrap_or(0);
    let table = &slot(0).block_table[..max_len.div_ceil(bs)];
    let stride = max_len.next_multiple_of(16);
    scratch.scores.clear();
    scratch.scores.resize(rows * stride, 0.0);
    scratch.acc.clear();
    scratch.acc.resize(rows, [_mm512_setzero_ps(); 16]);

    // Scores, 16 positions at a time: the chunk's keys are fetched once for every row.
    let keys_of = |block: usize| s.cache.tile(s.layer, table[block] as usize, run.kv_head).0;
    let scale = _mm512_set1_ps(s.scale);
    for start in (0..max_len).step_by(16) {
        let (mut block, mut slot_in) = (start / bs, start % bs);
        let mut keys = keys_of(block);
        let first = keys[slot_in * row_bytes..].as_ptr();
        // Past the run's longest row, lanes repeat the chunk's first key; a row's lanes past its
        // own length are dropped with its scores (each lane is its own).
        let key_rows: [*const u8; 16] = std::array::from_fn(|j| {
            if start + j >= max_len {
                return first;
            }
            if slot_in == bs {
                (block, slot_in) = (block + 1, 0);
                keys = keys_of(block);
            }
            slot_in += 1;
            keys[(slot_in - 1) * row_bytes..].as_ptr()
        });
        for r in 0..rows {
            if len(r) <= start {
                continue;
            }
            let q = query::<HD>(s, item(r));
            let dots: [__m512; 16] = std::array::from_fn(|j| dot::<HD, R>(&q, key_rows[j]));
            let chunk = _mm512_mul_ps(hsum16(&dots), scale);
            _mm512_storeu_ps(scratch.scores.as_mut_ptr().add(r * stride + start), chunk);
        }
    }
    scratch.totals.clear();
    for r in 0..rows {
        let total = exponentiate(&mut scratch.scores[r * stride..r * stride + len(r)]);
        scratch.totals.push(total);
    }

    // Weighted values, a block at a time for every row, each row's accumulators kept in
    // memory between blocks.
    for (bi, &block) in table.iter().enumerate() {
        let (_, values) = s.cache.tile(s.layer, block as usize, run.kv_head);
        for r in 0..rows {
            let end = len(r).min((bi + 1) * bs);
            if end <= bi * bs {
                continue;
            }
            let weights = &scratch.scores[r * stride + bi * bs..r * stride + end];
            add_weighted_values::<HD, R>(&mut scratch.acc[r], weights, values, row_bytes);
        }
    }
    for r in 0..rows {
        let (acc, inv) = (&scratch.acc[r], _mm512_set1_ps(1.0 / scratch.totals[r]));
        let o = out.0.add(item(r) * HD);
        for c in 0..HD / 16 {
            let sum = _mm512_add_ps(acc[c], acc[8 + c]);
            _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(sum, inv));
        }
    }
}

/// One row's weighted values of one KV block (`weights[i]` for the block's row `i`) into its
/// accumulators (`[even; 8]` then `[odd; 8]`): even and odd positions of the block alternate,
/// two FMA chains per output vector.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // as in `dot`
unsafe fn add_weighted_values<const HD: usize, R: KvRow>(
    acc: &mut [__m512; 16],
    weights: &[f32],
    values: &[u8],
    row_bytes: usize,
) {
    let (mut even, mut odd) = ([_mm512_setzero_ps(); 8], [_mm512_setzero_ps(); 8]);
    for c in 0..HD / 16 {
        (even[c], odd[c]) = (acc[c], acc[8 + c]);
    }
    let mut pairs = weights.iter().zip(values.chunks_exact(row_bytes));
    while let Some((&w0, v0)) = pairs.next() {
        let (w0, v0) = (_mm512_set1_ps(w0), v0.as_ptr());
        for c in 0..HD / 16 {
            even[c] = _mm512_fmadd_ps(w0, R::load16(v0, 16 * c), even[c]);
        }
        if let Some((&w1, v1)) = pairs.next() {
            let (w1, v1) = (_mm512_set1_ps(w1), v1.as_ptr());
            for c in 0..HD / 16 {
                odd[c] = _mm512_fmadd_ps(w1, R::load16(v1, 16 * c), odd[c]);
            }
        }
    }
    acc[..HD / 16].copy_from_slice(&even[..HD / 16]);
    acc[8..8 + HD / 16].copy_from_slice(&odd[..HD / 16]);
}

/// The query of (token, head) item `item`, `HD / 16` vectors.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // as in `dot`
unsafe fn query<const HD: usize>(s: &Shared<'_>, item: usize) -> [__m512; 8] {
    let q_ptr = s.q.as_ptr().add(item * HD);
    let mut q = [_mm512_setzero_ps(); 8];
    for c in 0..HD / 16 {
        q[c] = _mm512_loadu_ps(q_ptr.add(16 * c));
    }
    q
}
