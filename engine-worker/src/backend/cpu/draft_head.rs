//! The EAGLE-3 draft head's forward on the CPU (Li et al. 2025,
//! <https://arxiv.org/abs/2503.01840>; the layer as vLLM's `llama_eagle3` runs it): per token,
//! the token's embedding and an input hidden state (the target's three captured states fused by
//! `fc`, or the head's own output at the previous position) are normed apart, set side by side
//! and run through one Llama decoder layer over the head's own paged KV cache, which follows the
//! target's block tables; the final norm and an LM head over the draft vocabulary give logits.
//! The same kernels as the target's forward, so a row does not depend on its batch.

use super::attention::attention;
use super::kernels::Isa;
use super::kv_cache::{KvCache, KvLayout};
use super::llama::FlatBatch;
use super::matmul::{matmul, Job};
use super::ops::{add_in_place, rms_norm, silu_mul, RopeTable};
use crate::backend::{HeadForward, HeadInput, HeadOutput, SeqForward};
use crate::kv::KvDtype;
use crate::model::{HeadWeights, ModelConfig, WeightMatrix};
use crate::EngineError;

/// A draft head with its KV cache.
pub(crate) struct CpuHead {
    weights: HeadWeights,
    /// The head's decoder layer as a one-layer model (attention shapes).
    layer: ModelConfig,
    cache: KvCache,
}

impl CpuHead {
    pub(crate) fn new(
        weights: HeadWeights,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, EngineError> {
        let layer = weights.config.as_layer_config();
        let cache = KvCache::new(
            &layer,
            KvLayout {
                block_size,
                num_blocks,
                // The head's cache is small (one layer); f32 keeps it exact.
                dtype: KvDtype::F32,
                prefault: false,
                huge_pages: false,
            },
        )?;
        Ok(Self {
            weights,
            layer,
            cache,
        })
    }

    pub(crate) fn weights(&self) -> &HeadWeights {
        &self.weights
    }

    pub(crate) fn kv_cache_bytes(&self) -> u64 {
        (KvCache::bytes_per_block(&self.layer, self.cache.block_size, KvDtype::F32)
            * self.cache.num_blocks) as u64
    }

    /// Runs the batch (validated by the caller): `target_embed` is the target's token embedding.
    pub(crate) fn forward(
        &mut self,
        isa: Isa,
        target_embed: &WeightMatrix,
        seqs: &[HeadForward<'_>],
    ) -> HeadOutput {
        let w = &self.weights;
        let c = &w.config;
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let as_target: Vec<SeqForward<'_>> = seqs
            .iter()
            .map(|s| SeqForward::new(s.tokens, s.start_pos, s.block_table, s.logits))
            .collect();
        let FlatBatch {
            token_ids,
            slots,
            logit_rows,
        } = FlatBatch::new(&as_target);
        let tokens = token_ids.len();
        let fused = self.input_hidden(isa, seqs, tokens); // [tokens, h]
                                                          // [tokens, 2h]: normed embedding | normed hidden.
        let embed = w.embed.as_ref().unwrap_or(target_embed);
        let mut z = vec![0f32; tokens * 2 * h];
        let mut row = vec![0f32; h];
        for (t, &tok) in token_ids.iter().enumerate() {
            embed.dequantize_row(tok as usize, &mut row);
            let (a, b) = z[t * 2 * h..(t + 1) * 2 * h].split_at_mut(h);
            rms_norm(&row, &w.input_norm, eps, a);
            rms_norm(&fused[t * h..(t + 1) * h], &w.hidden_norm, eps, b);
        }
        let mut x = match c.norm_before_residual {
            true => z
                .chunks_exact(2 * h)
                .flat_map(|r| r[h..].to_vec())
                .collect(),
            false => fused,
        }; // [tokens, h]: the residual stream
        let (q_dim, kv_dim) = (self.layer.q_dim(), self.layer.kv_dim());
        let (mut q, mut k, mut v) = (
            vec![0f32; tokens * q_dim],
            vec![0f32; tokens * kv_dim],
            vec![0f32; tokens * kv_dim],
        );
        matmul(
            isa,
            &z,
            tokens,
            &mut [
                Job {
                    w: &w.wq,
                    out: &mut q,
                },
                Job {
                    w: &w.wk,
                    out: &mut k,
                },
                Job {
                    w: &w.wv,
                    out: &mut v,
                },
            ],
        );
        let positions: Vec<usize> = slots.iter().map(|s| s.pos).collect();
        let rope = RopeTable::new(&positions, c.head_dim, c.rope_theta);
        rope.apply(&mut q, c.num_heads, self.layer.rope_style);
        rope.apply(&mut k, c.num_kv_heads, self.layer.rope_style);
        for (t, slot) in slots.iter().enumerate() {
            let block = slot.block_table[slot.pos / self.cache.block_size] as usize;
            self.cache.write(
                0,
                block,
                slot.pos % self.cache.block_size,
                &k[t * kv_dim..(t + 1) * kv_dim],
                &v[t * kv_dim..(t + 1) * kv_dim],
            );
        }
        let mut attn = vec![0f32; tokens * q_dim];
        attention(&self.cache, 0, &slots, &q, &mut attn, &self.layer, isa);
        let mut proj = vec![0f32; tokens * h];
        matmul(
            isa,
            &attn,
            tokens,
            &mut [Job {
                w: &w.wo,
                out: &mut proj,
            }],
        );
        add_in_place(&mut x, &proj);
        let ff = c.intermediate_size;
        let mut normed = vec![0f32; tokens * h];
        rms_norm(&x, &w.post_attn_norm, eps, &mut normed);
        let (mut gate, mut up) = (vec![0f32; tokens * ff], vec![0f32; tokens * ff]);
        matmul(
            isa,
            &normed,
            tokens,
            &mut [
                Job {
                    w: &w.w_gate,
                    out: &mut gate,
                },
                Job {
                    w: &w.w_up,
                    out: &mut up,
                },
            ],
        );
        silu_mul(&mut gate, &up);
        matmul(
            isa,
            &gate,
            tokens,
            &mut [Job {
                w: &w.w_down,
                out: &mut proj,
            }],
        );
        add_in_place(&mut x, &proj);
        // Rows that draft: their pre-norm output feeds the next position, their logits choose.
        let hidden: Vec<f32> = logit_rows
            .iter()
            .flat_map(|&r| x[r * h..(r + 1) * h].iter().copied())
            .collect(); // [rows, h]
        let mut picked = vec![0f32; hidden.len()];
        rms_norm(&hidden, &w.final_norm, eps, &mut picked);
        let mut logits = vec![0f32; logit_rows.len() * c.draft_vocab_size];
        matmul(
            isa,
            &picked,
            logit_rows.len(),
            &mut [Job {
                w: &w.lm_head,
                out: &mut logits,
            }],
        );
        HeadOutput { logits, hidden }
    }

    /// `[tokens, h]`: `fc` of the target's states where a sequence brings them, the head's own
    /// state as given elsewhere.
    fn input_hidden(&self, isa: Isa, seqs: &[HeadForward<'_>], tokens: usize) -> Vec<f32> {
        let w = &self.weights;
        let h = w.config.hidden_size;
        let target: Vec<f32> = seqs
            .iter()
            .filter_map(|s| match s.input {
                HeadInput::Target(g) => Some(g),
                HeadInput::Own(_) => None,
            })
            .flatten()
            .copied()
            .collect(); // [target rows, 3 * target_hidden]
        let target_rows = target.len() / w.fc.cols;
        let mut fused = vec![0f32; target_rows * h];
        matmul(
            isa,
            &target,
            target_rows,
            &mut [Job {
                w: &w.fc,
                out: &mut fused,
            }],
        );
        let mut out = Vec::with_capacity(tokens * h);
        let mut next = fused.chunks_exact(h);
        for s in seqs {
            match s.input {
                HeadInput::Target(_) => (0..s.tokens.len())
                    .for_each(|_| out.extend_from_slice(next.next().expect("one row per token"))),
                HeadInput::Own(f) => out.extend_from_slice(f),
            }
        }
        out
    }
}
