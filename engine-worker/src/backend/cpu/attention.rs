//! Causal self-attention over the paged KV cache, with grouped-query heads. Each (token, head)
//! is computed by the same instructions in a fixed order over the sequence's positions, so
//! results do not depend on the rest of the batch, nor on whether the token came in a prefill
//! or a decode. The portable path is here; `avx2.rs` and `avx512.rs` hold the SIMD ones for the
//! common head sizes, chosen by the backend's instruction set (the AVX-512 one serves a
//! sequence's tokens and a KV head's query heads together from each fetch of keys and values).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use super::kernels::{dot, Isa};
use super::kv_cache::KvCache;
use super::kv_rows::{with_kv_row, KvRow};
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
/// `[tokens, heads * head_dim]`. Keys and values are read in the cache's stored precision.
pub(crate) fn attention(
    cache: &KvCache,
    layer: usize,
    slots: &[TokenSlot<'_>],
    q: &[f32],
    out: &mut [f32],
    config: &ModelConfig,
    isa: Isa,
) {
    with_kv_row!(cache.dtype, R => attention_as::<R>(cache, layer, slots, q, out, config, isa))
}

fn attention_as<R: KvRow>(
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
    // Small batches stay on the calling thread: waking the pool costs more than a few short
    // dot products.
    let work: usize = slots.iter().map(|s| s.pos + 1).sum::<usize>() * shared.heads * head_dim;
    let parallel = work >= PARALLEL_MIN_WORK;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is only selected when the CPU has AVX-512F/VL, AVX2 and FMA;
        // `out` has `q`'s shape.
        unsafe {
            match head_dim {
                64 => return avx512::attention::<64, R>(&shared, out, parallel),
                128 => return avx512::attention::<128, R>(&shared, out, parallel),
                _ => {}
            }
        }
    }
    let one = |scratch: &mut Scratch, (item, o): (usize, &mut [f32])| {
        attend_dispatch::<R>(&shared, item, o, scratch, isa);
    };
    if !parallel {
        let mut scratch = Scratch::default();
        for item in out.chunks_mut(head_dim).enumerate() {
            one(&mut scratch, item);
        }
    } else {
        out.par_chunks_mut(head_dim)
            .enumerate()
            .with_min_len(4)
            .for_each_init(Scratch::default, one);
    }
}

/// A thread's reusable buffers: one item's scores, and one key row read back as f32 (the
/// portable path only).
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

fn attend_dispatch<R: KvRow>(
    s: &Shared<'_>,
    item: usize,
    o: &mut [f32],
    scratch: &mut Scratch,
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: a SIMD ISA is only selected when the CPU has AVX2 and FMA.
        unsafe {
            match s.head_dim {
                64 => return avx2::attend::<64, R>(s, item, o, &mut scratch.scores),
                128 => return avx2::attend::<128, R>(s, item, o, &mut scratch.scores),
                _ => {}
            }
        }
    }
    let _ = isa;
    attend::<R>(s, item, o, scratch);
}

/// One (token, head) item: scores over the token's positions, softmax, weighted sum of values.
#[inline(always)]
fn attend<R: KvRow>(s: &Shared<'_>, item: usize, o: &mut [f32], scratch: &mut Scratch) {
    let head_dim = s.head_dim;
    let Item {
        q: q_h,
        kv_head,
        len,
        blocks,
    } = s.item(item);
    let (bs, row_bytes) = (s.cache.block_size, s.cache.row_bytes());
    let Scratch { scores, row } = scratch;
    row.resize(head_dim, 0.0);

    scores.clear();
    for (bi, &block) in blocks.iter().enumerate() {
        let (keys, _) = s.cache.tile(s.layer, block as usize, kv_head);
        let in_block = (len - bi * bs).min(bs);
        for k in keys.chunks_exact(row_bytes).take(in_block) {
            for (i, x) in row.iter_mut().enumerate() {
                *x = R::get(k, i);
            }
            scores.push(dot(q_h, row) * s.scale);
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
        for (w, v) in weights.iter().zip(values.chunks_exact(row_bytes)) {
            for (i, o) in o.iter_mut().enumerate() {
                *o += w * R::get(v, i);
            }
        }
    }
    let inv = 1.0 / total;
    for o in o.iter_mut() {
        *o *= inv;
    }
}
