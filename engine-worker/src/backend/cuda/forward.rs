//! The batched Llama forward pass on the device (Touvron et al. 2023, "LLaMA"; the layer order
//! and conventions of Hugging Face's `modeling_llama.py`):
//!
//! ```text
//! x = embed[ids]                                   // [tokens, hidden] f32 residual stream
//! per layer:
//!   qkv = rmsnorm(x) · Wqkvᵀ (+ bias)              // [tokens, q_dim + 2 kv_dim]
//!   rope(q, k); write k, v into the paged cache
//!   x += paged_attention(q, cache) · Woᵀ           // GEMM with beta = 1
//!   x += (silu(g) * u)(rmsnorm(x) · Wgate_upᵀ) · Wdownᵀ
//! logits = rmsnorm(x[rows that need logits]) · lm_headᵀ   // [rows, vocab] f32
//! ```
//!
//! GEMM inputs are bf16, everything accumulated and kept between kernels is f32.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use super::batch::{prepare, MetaLayout};
use super::gemm::Shape;
use super::weights::{alloc, driver_err};
use super::CudaBackend;
use crate::backend::SeqForward;
use crate::model::RopeStyle;
use crate::EngineError;

/// Warps per attention block; must match ATTN_WARPS in kernels/attention.cu.
const ATTN_THREADS: u32 = 4 * 32;
/// Largest head_dim the attention kernels handle (32 lanes × ATTN_MAX_PER_LANE).
pub const MAX_HEAD_DIM: usize = 256;
/// Largest GQA group (query heads per kv head) of the grouped attention kernel; larger groups
/// use the one-block-per-query-head kernel. Must match ATTN_MAX_GROUP in kernels/attention.cu.
pub const MAX_ATTENTION_GROUP: usize = 8;

/// Grow-only activation buffers, reused across steps so steady-state decoding allocates nothing.
pub struct Workspace {
    pub meta: CudaSlice<u32>,
    pub x: CudaSlice<f32>,       // [tokens, hidden]
    pub xn: CudaSlice<u16>,      // [max(tokens, rows), hidden] bf16
    pub qkv: CudaSlice<f32>,     // [tokens, q_dim + 2 kv_dim]
    pub attn: CudaSlice<u16>,    // [tokens, q_dim] bf16
    pub gate_up: CudaSlice<f32>, // [tokens, 2 intermediate]
    pub act: CudaSlice<u16>,     // [tokens, intermediate] bf16
    pub logits: CudaSlice<f32>,  // [rows, vocab]
    /// Layout of the batch whose logits `logits` holds.
    pub last: Option<MetaLayout>,
}

impl Workspace {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, EngineError> {
        Ok(Self {
            meta: alloc(stream, 1)?,
            x: alloc(stream, 1)?,
            xn: alloc(stream, 1)?,
            qkv: alloc(stream, 1)?,
            attn: alloc(stream, 1)?,
            gate_up: alloc(stream, 1)?,
            act: alloc(stream, 1)?,
            logits: alloc(stream, 1)?,
            last: None,
        })
    }
}

fn ensure<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    len: usize,
) -> Result<(), EngineError> {
    if buf.len() < len {
        // Room to grow by half again, so a slowly growing batch does not reallocate each step.
        *buf = alloc(stream, len.max(buf.len() + buf.len() / 2))?;
    }
    Ok(())
}

fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Runs the forward of `seqs`, writing their keys/values into the cache and leaving the
    /// logits on the device (in the workspace); returns the batch layout. Asynchronous: the
    /// work is queued on the stream.
    pub fn forward_on_device(
        &mut self,
        seqs: &[SeqForward<'_>],
    ) -> Result<MetaLayout, EngineError> {
        let c = &self.config;
        let meta = prepare(seqs, c.vocab_size, self.block_size, self.num_blocks)?;
        let l = meta.layout;
        let (t, r) = (l.tokens, l.rows);
        let (h, q_dim, kv_dim, ff, vocab) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.vocab_size,
        );
        let qkv_dim = q_dim + 2 * kv_dim;
        let stream = self.stream.clone();
        let ws = &mut self.workspace;
        ws.last = None;
        ensure(&stream, &mut ws.meta, l.len)?;
        ensure(&stream, &mut ws.x, t * h)?;
        ensure(&stream, &mut ws.xn, t.max(r) * h)?;
        ensure(&stream, &mut ws.qkv, t * qkv_dim)?;
        ensure(&stream, &mut ws.attn, t * q_dim)?;
        ensure(&stream, &mut ws.gate_up, t * 2 * ff)?;
        ensure(&stream, &mut ws.act, t * ff)?;
        ensure(&stream, &mut ws.logits, r * vocab)?;
        stream
            .memcpy_htod(&meta.packed, &mut ws.meta.slice_mut(0..l.len))
            .map_err(driver_err)?;

        let k = &self.kernels;
        let w = &self.weights;
        let meta_buf = &ws.meta;
        let ids = meta_buf.slice(l.ids..l.ids + t);
        let positions = meta_buf.slice(l.positions..l.positions + t);
        let token_seq = meta_buf.slice(l.token_seq..l.token_seq + t);
        let slots = meta_buf.slice(l.slots..l.slots + t);
        let logit_rows = meta_buf.slice(l.logit_rows..l.logit_rows + r);
        let tables = meta_buf.slice(l.block_tables..l.len);

        let (h_i, qkv_i, q_i, kv_i, ff_i) = (
            h as i32,
            qkv_dim as i32,
            q_dim as i32,
            kv_dim as i32,
            ff as i32,
        );
        let v_off = (q_dim + kv_dim) as i32;
        let eps = c.rms_norm_eps;
        let theta = c.rope_theta;
        let neox: i32 = match c.rope_style {
            RopeStyle::Interleaved => 0,
            RopeStyle::HalfSplit => 1,
        };
        let (n_heads, n_kv, head_dim) =
            (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let block_size = self.block_size as i32;
        let max_blocks = l.max_blocks as i32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let no_rows: u64 = 0;
        // Grouped kernel: one block per (token, kv head) serving its query heads.
        let grouped = c.num_heads / c.num_kv_heads <= MAX_ATTENTION_GROUP;
        let (attention, attention_blocks_y) = if grouped {
            (&self.kernels.paged_attention_grouped, c.num_kv_heads as u32)
        } else {
            (&self.kernels.paged_attention, c.num_heads as u32)
        };

        // SAFETY (every launch below): argument types and order match the kernel signatures in
        // kernels/*.cu; every buffer was sized above for this batch; indices inside the kernels
        // come from `prepare`, which checked tokens, blocks and positions.
        unsafe {
            stream
                .launch_builder(&k.embedding_gather)
                .arg(&w.embed)
                .arg(&ids)
                .arg(&mut ws.x)
                .arg(&h_i)
                .launch(rows_cfg(t, 256))
                .map_err(driver_err)?;
        }
        for (layer, lw) in w.layers.iter().enumerate() {
            let (k_cache, v_cache) = (&mut self.k_cache[layer], &mut self.v_cache[layer]);
            unsafe {
                stream
                    .launch_builder(&k.rmsnorm_to_bf16)
                    .arg(&ws.x)
                    .arg(&no_rows)
                    .arg(&lw.attn_norm)
                    .arg(&mut ws.xn)
                    .arg(&h_i)
                    .arg(&eps)
                    .launch(rows_cfg(t, 256))
                    .map_err(driver_err)?;
            }
            self.gemm.linear(
                &ws.xn,
                &lw.wqkv,
                &mut ws.qkv,
                Shape {
                    rows: t,
                    in_dim: h,
                    out_dim: qkv_dim,
                },
                0.0,
            )?;
            if let Some(bias) = &lw.bqkv {
                unsafe {
                    stream
                        .launch_builder(&k.add_bias)
                        .arg(&mut ws.qkv)
                        .arg(bias)
                        .arg(&qkv_i)
                        .launch(rows_cfg(t, 256))
                        .map_err(driver_err)?;
                }
            }
            unsafe {
                stream
                    .launch_builder(&k.rope_inplace)
                    .arg(&mut ws.qkv)
                    .arg(&positions)
                    .arg(&qkv_i)
                    .arg(&head_dim)
                    .arg(&theta)
                    .arg(&neox)
                    .launch(LaunchConfig {
                        grid_dim: (t as u32, (c.num_heads + c.num_kv_heads) as u32, 1),
                        block_dim: ((c.head_dim / 2) as u32, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map_err(driver_err)?;
                stream
                    .launch_builder(&k.kv_cache_write)
                    .arg(&ws.qkv)
                    .arg(&slots)
                    .arg(&mut *k_cache)
                    .arg(&mut *v_cache)
                    .arg(&qkv_i)
                    .arg(&q_i)
                    .arg(&v_off)
                    .arg(&kv_i)
                    .launch(rows_cfg(t, 256))
                    .map_err(driver_err)?;
                stream
                    .launch_builder(attention)
                    .arg(&ws.qkv)
                    .arg(&*k_cache)
                    .arg(&*v_cache)
                    .arg(&tables)
                    .arg(&token_seq)
                    .arg(&positions)
                    .arg(&mut ws.attn)
                    .arg(&qkv_i)
                    .arg(&max_blocks)
                    .arg(&n_heads)
                    .arg(&n_kv)
                    .arg(&head_dim)
                    .arg(&block_size)
                    .arg(&scale)
                    .launch(LaunchConfig {
                        grid_dim: (t as u32, attention_blocks_y, 1),
                        block_dim: (ATTN_THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map_err(driver_err)?;
            }
            self.gemm.linear(
                &ws.attn,
                &lw.wo,
                &mut ws.x,
                Shape {
                    rows: t,
                    in_dim: q_dim,
                    out_dim: h,
                },
                1.0,
            )?;
            unsafe {
                stream
                    .launch_builder(&k.rmsnorm_to_bf16)
                    .arg(&ws.x)
                    .arg(&no_rows)
                    .arg(&lw.ffn_norm)
                    .arg(&mut ws.xn)
                    .arg(&h_i)
                    .arg(&eps)
                    .launch(rows_cfg(t, 256))
                    .map_err(driver_err)?;
            }
            self.gemm.linear(
                &ws.xn,
                &lw.w_gate_up,
                &mut ws.gate_up,
                Shape {
                    rows: t,
                    in_dim: h,
                    out_dim: 2 * ff,
                },
                0.0,
            )?;
            unsafe {
                stream
                    .launch_builder(&k.silu_mul)
                    .arg(&ws.gate_up)
                    .arg(&mut ws.act)
                    .arg(&ff_i)
                    .launch(rows_cfg(t, 256))
                    .map_err(driver_err)?;
            }
            self.gemm.linear(
                &ws.act,
                &lw.w_down,
                &mut ws.x,
                Shape {
                    rows: t,
                    in_dim: ff,
                    out_dim: h,
                },
                1.0,
            )?;
        }
        unsafe {
            stream
                .launch_builder(&k.rmsnorm_to_bf16)
                .arg(&ws.x)
                .arg(&logit_rows)
                .arg(&w.final_norm)
                .arg(&mut ws.xn)
                .arg(&h_i)
                .arg(&eps)
                .launch(rows_cfg(r, 256))
                .map_err(driver_err)?;
        }
        self.gemm.linear(
            &ws.xn,
            w.lm_head(),
            &mut ws.logits,
            Shape {
                rows: r,
                in_dim: h,
                out_dim: vocab,
            },
            0.0,
        )?;
        ws.last = Some(l);
        Ok(l)
    }

    /// Copies the last forward's logits, `[rows, vocab]`, to the host.
    pub fn logits_to_host(&mut self) -> Result<Vec<f32>, EngineError> {
        let l = self
            .workspace
            .last
            .ok_or_else(|| EngineError::InvalidBatch("no forward has produced logits".into()))?;
        let n = l.rows * self.config.vocab_size;
        let out = self
            .stream
            .clone_dtoh(&self.workspace.logits.slice(0..n))
            .map_err(driver_err)?;
        self.stream.synchronize().map_err(driver_err)?;
        Ok(out)
    }
}
