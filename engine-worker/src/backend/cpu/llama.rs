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

use super::attention::{attention, TokenSlot};
use super::kernels::Isa;
use super::kv_cache::KvCache;
use super::matmul::{matmul, Job};
use super::ops::{add_in_place, rms_norm, silu_mul, RopeTable};
use crate::backend::{LogitsFor, SeqForward};
use crate::model::Model;

/// Rows per parallel task of the element-wise steps.
const ROWS_PER_TASK: usize = 8;
/// Below this many tokens the element-wise steps run on the calling thread: waking the pool
/// would cost more than the work.
const PARALLEL_MIN_TOKENS: usize = 16;

/// Runs the batch (already validated) and returns `[logit rows, vocab]`.
pub(crate) fn forward(
    model: &Model,
    cache: &mut KvCache,
    isa: Isa,
    seqs: &[SeqForward<'_>],
) -> Vec<f32> {
    let cfg = &model.config;
    let w = &model.weights;
    let (hidden, q_dim, kv_dim, ff) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );

    // Flatten the batch: one entry per token.
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
    let tokens = token_ids.len();
    let positions: Vec<usize> = slots.iter().map(|s| s.pos).collect();
    let rope = RopeTable::new(&positions, cfg.head_dim, cfg.rope_theta);

    let mut x = vec![0f32; tokens * hidden]; // [tokens, hidden]
    for (row, &tok) in x.chunks_exact_mut(hidden).zip(&token_ids) {
        w.embed.dequantize_row(tok as usize, row);
    }

    let mut normed = vec![0f32; tokens * hidden]; // [tokens, hidden]
    let mut q = vec![0f32; tokens * q_dim]; // [tokens, heads * head_dim]
    let mut k = vec![0f32; tokens * kv_dim]; // [tokens, kv_heads * head_dim]
    let mut v = vec![0f32; tokens * kv_dim]; // [tokens, kv_heads * head_dim]
    let mut attn = vec![0f32; tokens * q_dim]; // [tokens, heads * head_dim]
    let mut proj = vec![0f32; tokens * hidden]; // [tokens, hidden]
    let mut gate = vec![0f32; tokens * ff]; // [tokens, intermediate]
    let mut up = vec![0f32; tokens * ff]; // [tokens, intermediate]

    for (l, layer) in w.layers.iter().enumerate() {
        // Attention block.
        norm_rows(&x, &layer.attn_norm, cfg.rms_norm_eps, &mut normed);
        matmul(
            isa,
            &normed,
            tokens,
            &mut [
                Job {
                    w: &layer.wq,
                    out: &mut q,
                },
                Job {
                    w: &layer.wk,
                    out: &mut k,
                },
                Job {
                    w: &layer.wv,
                    out: &mut v,
                },
            ],
        );
        for (buf, bias) in [
            (&mut q, &layer.bq),
            (&mut k, &layer.bk),
            (&mut v, &layer.bv),
        ] {
            if let Some(bias) = bias {
                buf.chunks_exact_mut(bias.len())
                    .for_each(|row| add_in_place(row, bias));
            }
        }
        rope.apply(&mut q, cfg.num_heads, cfg.rope_style);
        rope.apply(&mut k, cfg.num_kv_heads, cfg.rope_style);
        for (t, slot) in slots.iter().enumerate() {
            let block = slot.block_table[slot.pos / cache.block_size] as usize;
            cache.write(
                l,
                block,
                slot.pos % cache.block_size,
                &k[t * kv_dim..(t + 1) * kv_dim],
                &v[t * kv_dim..(t + 1) * kv_dim],
            );
        }
        attention(cache, l, &slots, &q, &mut attn, cfg, isa);
        matmul(
            isa,
            &attn,
            tokens,
            &mut [Job {
                w: &layer.wo,
                out: &mut proj,
            }],
        );
        add_in_place(&mut x, &proj);

        // MLP block: down(silu(gate(x)) * up(x)).
        norm_rows(&x, &layer.ffn_norm, cfg.rms_norm_eps, &mut normed);
        matmul(
            isa,
            &normed,
            tokens,
            &mut [
                Job {
                    w: &layer.w_gate,
                    out: &mut gate,
                },
                Job {
                    w: &layer.w_up,
                    out: &mut up,
                },
            ],
        );
        if tokens < PARALLEL_MIN_TOKENS {
            silu_mul(&mut gate, &up);
        } else {
            gate.par_chunks_mut(ff * ROWS_PER_TASK)
                .zip(up.par_chunks(ff * ROWS_PER_TASK))
                .for_each(|(g, u)| silu_mul(g, u));
        }
        matmul(
            isa,
            &gate,
            tokens,
            &mut [Job {
                w: &layer.w_down,
                out: &mut proj,
            }],
        );
        add_in_place(&mut x, &proj);
    }

    // Final norm and LM head, only on the rows that need logits.
    let picked: Vec<f32> = logit_rows
        .iter()
        .flat_map(|&r| x[r * hidden..(r + 1) * hidden].iter().copied())
        .collect(); // [logit rows, hidden]
    let mut picked_normed = vec![0f32; picked.len()];
    norm_rows(&picked, &w.final_norm, cfg.rms_norm_eps, &mut picked_normed);
    let mut logits = vec![0f32; logit_rows.len() * cfg.vocab_size]; // [logit rows, vocab]
    matmul(
        isa,
        &picked_normed,
        logit_rows.len(),
        &mut [Job {
            w: &w.lm_head,
            out: &mut logits,
        }],
    );
    logits
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
