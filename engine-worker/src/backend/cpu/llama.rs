//! The Llama decoder forward pass (Llama, SmolLM2, Mistral; Qwen2's q/k/v biases).
//!
//! Reference: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models" (2023),
//! <https://arxiv.org/abs/2302.13971>: pre-norm blocks with RMSNorm, rotary position
//! embeddings (Su et al., RoFormer, <https://arxiv.org/abs/2104.09864>), SwiGLU MLP
//! (Shazeer, <https://arxiv.org/abs/2002.05202>), grouped-query attention (Ainslie et al.,
//! <https://arxiv.org/abs/2305.13245>). Layout as in llama.cpp's `llm_build_llama` and
//! Hugging Face `LlamaForCausalLM`.
//!
//! All sequences of a batch are flattened into one `[tokens, hidden]` activation matrix so
//! each weight row is read once per step; attention then goes back to each token's own
//! sequence through its block table.

use rayon::prelude::*;

use super::aligned::LineBuf;
use super::attention::{attention, TokenSlot};
use super::kernels::Isa;
use super::kv_cache::KvCache;
use super::matmul::{matmul, Job};
use super::ops::{add_in_place, rms_norm, silu_mul, RopeTable};
use crate::backend::{LogitsFor, SeqForward};
use crate::model::{LayerWeights, Model, ModelConfig};

/// Rows per parallel task of the element-wise steps.
const ROWS_PER_TASK: usize = 8;
/// Below this many tokens the element-wise steps run on the calling thread: waking the pool
/// would cost more than the work.
const PARALLEL_MIN_TOKENS: usize = 16;

/// Which layers' incoming residual streams a forward keeps, and what the last forward kept.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    layers: Vec<usize>,
    kept: Vec<f32>, // [tokens, layers * hidden]
}

impl Capture {
    pub(crate) fn of(layers: &[usize]) -> Self {
        Self {
            layers: layers.to_vec(),
            kept: Vec::new(),
        }
    }

    pub(crate) fn take(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.kept)
    }

    /// Before layer `l`: copies each token's row of `x` into its column block, if `l` is kept.
    fn keep(&mut self, l: usize, x: &[f32], hidden: usize) {
        let Some(slot) = self.layers.iter().position(|&k| k == l) else {
            return;
        };
        let width = self.layers.len() * hidden;
        for (out, row) in self
            .kept
            .chunks_exact_mut(width)
            .zip(x.chunks_exact(hidden))
        {
            out[slot * hidden..(slot + 1) * hidden].copy_from_slice(row);
        }
    }
}

/// Runs the batch (already validated) through the first `layers` layers (all of them but for an
/// early-exit draft) and returns `[logit rows, vocab]`. With `capture`, the residual stream
/// entering each of its layers is kept for every token.
pub(crate) fn forward(
    model: &Model,
    cache: &mut KvCache,
    isa: Isa,
    seqs: &[SeqForward<'_>],
    layers: usize,
    mut capture: Option<&mut Capture>,
) -> Vec<f32> {
    let cfg = &model.config;
    let batch = FlatBatch::new(seqs);
    let positions: Vec<usize> = batch.slots.iter().map(|s| s.pos).collect();
    let rope = RopeTable::new(&positions, cfg.head_dim, cfg.rope_theta);
    let hidden = cfg.hidden_size;
    let mut x = vec![0f32; batch.tokens() * hidden]; // [tokens, hidden]
    for (row, &tok) in x.chunks_exact_mut(hidden).zip(&batch.token_ids) {
        model.weights.embed.dequantize_row(tok as usize, row);
    }
    let mut act = Activations::new(batch.tokens(), cfg);
    let ctx = Pass {
        cfg,
        isa,
        batch: &batch,
        rope: &rope,
    };
    if let Some(c) = capture.as_deref_mut() {
        c.kept.clear();
        c.kept.resize(batch.tokens() * c.layers.len() * hidden, 0.0);
    }
    for (l, layer) in model.weights.layers.iter().take(layers).enumerate() {
        if let Some(c) = capture.as_deref_mut() {
            c.keep(l, &x, hidden);
        }
        ctx.attention_block(l, layer, cache, &mut x, &mut act);
        ctx.mlp_block(layer, &mut x, &mut act);
    }
    ctx.lm_head(model, &x)
}

/// The batch flattened: one entry per token.
pub(crate) struct FlatBatch<'a> {
    pub(crate) token_ids: Vec<u32>,
    pub(crate) slots: Vec<TokenSlot<'a>>,
    /// Tokens whose logits are wanted, in output order.
    pub(crate) logit_rows: Vec<usize>,
}

impl<'a> FlatBatch<'a> {
    pub(crate) fn new(seqs: &[SeqForward<'a>]) -> Self {
        let mut token_ids = Vec::new();
        let mut slots = Vec::new();
        let mut logit_rows = Vec::new();
        for seq in seqs {
            let first = token_ids.len();
            for (i, &tok) in seq.tokens.iter().enumerate() {
                token_ids.push(tok);
                slots.push(TokenSlot {
                    block_table: seq.block_table,
                    pos: seq.start_pos + i,
                });
            }
            match seq.logits {
                LogitsFor::Last => logit_rows.push(token_ids.len() - 1),
                LogitsFor::All => logit_rows.extend(first..token_ids.len()),
            }
        }
        Self {
            token_ids,
            slots,
            logit_rows,
        }
    }

    pub(crate) fn tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// Per-layer scratch buffers, allocated once per forward. The matmul inputs (`normed`, `attn`,
/// `gate`) start on a cache line, so `matmul` reads them in place instead of copying them.
struct Activations {
    normed: LineBuf, // [tokens, hidden]
    q: Vec<f32>,     // [tokens, heads * head_dim]
    k: Vec<f32>,     // [tokens, kv_heads * head_dim]
    v: Vec<f32>,     // [tokens, kv_heads * head_dim]
    attn: LineBuf,   // [tokens, heads * head_dim]
    proj: Vec<f32>,  // [tokens, hidden]
    gate: LineBuf,   // [tokens, intermediate]
    up: Vec<f32>,    // [tokens, intermediate]
}

impl Activations {
    fn new(tokens: usize, cfg: &ModelConfig) -> Self {
        let (hidden, q_dim, kv_dim, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        Self {
            normed: LineBuf::zeroed(tokens * hidden),
            q: vec![0f32; tokens * q_dim],
            k: vec![0f32; tokens * kv_dim],
            v: vec![0f32; tokens * kv_dim],
            attn: LineBuf::zeroed(tokens * q_dim),
            proj: vec![0f32; tokens * hidden],
            gate: LineBuf::zeroed(tokens * ff),
            up: vec![0f32; tokens * ff],
        }
    }
}

/// What every block of one forward shares.
struct Pass<'a> {
    cfg: &'a ModelConfig,
    isa: Isa,
    batch: &'a FlatBatch<'a>,
    rope: &'a RopeTable,
}

impl Pass<'_> {
    /// `x += wo · attention(rope(q), cache ∪ rope(k), v)` of `rmsnorm(x)`; writes the tokens'
    /// keys and values into the cache.
    fn attention_block(
        &self,
        l: usize,
        layer: &LayerWeights,
        cache: &mut KvCache,
        x: &mut [f32],
        act: &mut Activations,
    ) {
        let (cfg, isa, tokens) = (self.cfg, self.isa, self.batch.tokens());
        norm_rows(
            x,
            &layer.attn_norm,
            cfg.rms_norm_eps,
            act.normed.as_mut_slice(),
        );
        matmul(
            isa,
            act.normed.as_slice(),
            tokens,
            &mut [
                Job {
                    w: &layer.wq,
                    out: &mut act.q,
                },
                Job {
                    w: &layer.wk,
                    out: &mut act.k,
                },
                Job {
                    w: &layer.wv,
                    out: &mut act.v,
                },
            ],
        );
        for (buf, bias) in [
            (&mut act.q, &layer.bq),
            (&mut act.k, &layer.bk),
            (&mut act.v, &layer.bv),
        ] {
            if let Some(bias) = bias {
                buf.chunks_exact_mut(bias.len())
                    .for_each(|row| add_in_place(row, bias));
            }
        }
        self.rope.apply(&mut act.q, cfg.num_heads, cfg.rope_style);
        self.rope
            .apply(&mut act.k, cfg.num_kv_heads, cfg.rope_style);
        let kv_dim = cfg.kv_dim();
        for (t, slot) in self.batch.slots.iter().enumerate() {
            let block = slot.block_table[slot.pos / cache.block_size] as usize;
            cache.write(
                l,
                block,
                slot.pos % cache.block_size,
                &act.k[t * kv_dim..(t + 1) * kv_dim],
                &act.v[t * kv_dim..(t + 1) * kv_dim],
            );
        }
        attention(
            cache,
            l,
            &self.batch.slots,
            &act.q,
            act.attn.as_mut_slice(),
            cfg,
            isa,
        );
        matmul(
            isa,
            act.attn.as_slice(),
            tokens,
            &mut [Job {
                w: &layer.wo,
                out: &mut act.proj,
            }],
        );
        add_in_place(x, &act.proj);
    }

    /// `x += down(silu(gate(x)) * up(x))` of `rmsnorm(x)`.
    fn mlp_block(&self, layer: &LayerWeights, x: &mut [f32], act: &mut Activations) {
        let (cfg, isa, tokens) = (self.cfg, self.isa, self.batch.tokens());
        let ff = cfg.intermediate_size;
        norm_rows(
            x,
            &layer.ffn_norm,
            cfg.rms_norm_eps,
            act.normed.as_mut_slice(),
        );
        matmul(
            isa,
            act.normed.as_slice(),
            tokens,
            &mut [
                Job {
                    w: &layer.w_gate,
                    out: act.gate.as_mut_slice(),
                },
                Job {
                    w: &layer.w_up,
                    out: &mut act.up,
                },
            ],
        );
        if tokens < PARALLEL_MIN_TOKENS {
            silu_mul(act.gate.as_mut_slice(), &act.up);
        } else {
            act.gate
                .as_mut_slice()
                .par_chunks_mut(ff * ROWS_PER_TASK)
                .zip(act.up.par_chunks(ff * ROWS_PER_TASK))
                .for_each(|(g, u)| silu_mul(g, u));
        }
        matmul(
            isa,
            act.gate.as_slice(),
            tokens,
            &mut [Job {
                w: &layer.w_down,
                out: &mut act.proj,
            }],
        );
        add_in_place(x, &act.proj);
    }

    /// Final norm and LM head, only on the rows that need logits: `[logit rows, vocab]`.
    fn lm_head(&self, model: &Model, x: &[f32]) -> Vec<f32> {
        let (cfg, w) = (self.cfg, &model.weights);
        let hidden = cfg.hidden_size;
        let rows = &self.batch.logit_rows;
        let picked: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x[r * hidden..(r + 1) * hidden].iter().copied())
            .collect(); // [logit rows, hidden]
        let mut picked_normed = vec![0f32; picked.len()];
        norm_rows(&picked, &w.final_norm, cfg.rms_norm_eps, &mut picked_normed);
        let mut logits = vec![0f32; rows.len() * cfg.vocab_size]; // [logit rows, vocab]
        matmul(
            self.isa,
            &picked_normed,
            rows.len(),
            &mut [Job {
                w: &w.lm_head,
                out: &mut logits,
            }],
        );
        logits
    }
}

/// RMSNorm of every row, rows spread over the pool.
fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    if x.len() < dim * PARALLEL_MIN_TOKENS {
        rms_norm(x, weight, eps, out);
        return;
    }
    out.par_chunks_mut(dim * ROWS_PER_TASK)
        .zip(x.par_chunks(dim * ROWS_PER_TASK))
        .for_each(|(o, x)| rms_norm(x, weight, eps, o));
}
