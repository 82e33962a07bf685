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
use super::gemm::{Gemm, Shape};
use super::module::Kernels;
use super::weights::{alloc, driver_err, DeviceLayer, DeviceWeights};
use super::CudaBackend;
use crate::backend::SeqForward;
use crate::model::{ModelConfig, RopeStyle};
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

impl Workspace {
    /// Makes every buffer big enough for a batch of `d` and `meta_len` metadata words.
    fn grow(
        &mut self,
        stream: &Arc<CudaStream>,
        d: &Dims,
        meta_len: usize,
    ) -> Result<(), EngineError> {
        let (t, r, h) = (d.tokens, d.rows, d.hidden);
        ensure(stream, &mut self.meta, meta_len)?;
        ensure(stream, &mut self.x, t * h)?;
        ensure(stream, &mut self.xn, t.max(r) * h)?;
        ensure(stream, &mut self.qkv, t * d.qkv_dim)?;
        ensure(stream, &mut self.attn, t * d.q_dim)?;
        ensure(stream, &mut self.gate_up, t * 2 * d.ff)?;
        ensure(stream, &mut self.act, t * d.ff)?;
        ensure(stream, &mut self.logits, r * d.vocab)
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

/// Sizes one forward's launches share.
#[derive(Debug, Clone, Copy)]
struct Dims {
    /// Tokens and logit rows of the batch.
    tokens: usize,
    rows: usize,
    hidden: usize,
    q_dim: usize,
    kv_dim: usize,
    qkv_dim: usize,
    ff: usize,
    vocab: usize,
}

impl Dims {
    fn new(c: &ModelConfig, l: &MetaLayout) -> Self {
        Self {
            tokens: l.tokens,
            rows: l.rows,
            hidden: c.hidden_size,
            q_dim: c.q_dim(),
            kv_dim: c.kv_dim(),
            qkv_dim: c.q_dim() + 2 * c.kv_dim(),
            ff: c.intermediate_size,
            vocab: c.vocab_size,
        }
    }
}

/// What the launches of one forward read besides the workspace, weights and cache.
struct Pass<'a> {
    stream: &'a Arc<CudaStream>,
    kernels: &'a Kernels,
    gemm: &'a Gemm,
    config: &'a ModelConfig,
    layout: MetaLayout,
    dims: Dims,
    block_size: usize,
}

impl CudaBackend {
    /// Runs the forward of `seqs`, writing their keys/values into the cache and leaving the
    /// logits on the device (in the workspace); returns the batch layout. Asynchronous: the
    /// work is queued on the stream.
    pub fn forward_on_device(
        &mut self,
        seqs: &[SeqForward<'_>],
    ) -> Result<MetaLayout, EngineError> {
        self.forward_layers_on_device(seqs, self.weights.layers.len())
    }

    /// [`CudaBackend::forward_on_device`] through the first `layers` layers only (early exit),
    /// then the final norm and the LM head.
    pub fn forward_layers_on_device(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<MetaLayout, EngineError> {
        let meta = prepare(
            seqs,
            self.config.vocab_size,
            self.block_size,
            self.num_blocks,
        )?;
        let l = meta.layout;
        let dims = Dims::new(&self.config, &l);
        let ws = &mut self.workspace;
        ws.last = None;
        ws.grow(&self.stream, &dims, l.len)?;
        self.stream
            .memcpy_htod(&meta.packed, &mut ws.meta.slice_mut(0..l.len))
            .map_err(driver_err)?;
        let pass = Pass {
            stream: &self.stream,
            kernels: &self.kernels,
            gemm: &self.gemm,
            config: &self.config,
            layout: l,
            dims,
            block_size: self.block_size,
        };
        pass.embed(&self.weights, ws)?;
        for (layer, lw) in self.weights.layers.iter().take(layers).enumerate() {
            let (k_cache, v_cache) = (&mut self.k_cache[layer], &mut self.v_cache[layer]);
            pass.attention_block(lw, ws, k_cache, v_cache)?;
            pass.mlp_block(lw, ws)?;
        }
        pass.lm_head(&self.weights, ws)?;
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

impl Pass<'_> {
    /// `x = embed[ids]`.
    fn embed(&self, w: &DeviceWeights, ws: &mut Workspace) -> Result<(), EngineError> {
        let (l, t) = (&self.layout, self.dims.tokens);
        let ids = ws.meta.slice(l.ids..l.ids + t);
        let h_i = self.dims.hidden as i32;
        // SAFETY: argument types and order match kernels/embedding.cu; the buffers were sized
        // for this batch and `prepare` checked the token ids.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.embedding_gather)
                .arg(&w.embed)
                .arg(&ids)
                .arg(&mut ws.x)
                .arg(&h_i)
                .launch(rows_cfg(t, 256))
                .map_err(driver_err)?;
        }
        Ok(())
    }

    /// `xn = rmsnorm(x)` (bf16) of every token.
    fn norm_all(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        xn: &mut CudaSlice<u16>,
    ) -> Result<(), EngineError> {
        let no_rows: u64 = 0;
        let h_i = self.dims.hidden as i32;
        let eps = self.config.rms_norm_eps;
        // SAFETY: argument types and order match kernels/rmsnorm.cu (a null row list: every
        // row); the buffers were sized for this batch.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.rmsnorm_to_bf16)
                .arg(x)
                .arg(&no_rows)
                .arg(weight)
                .arg(xn)
                .arg(&h_i)
                .arg(&eps)
                .launch(rows_cfg(self.dims.tokens, 256))
                .map_err(driver_err)?;
        }
        Ok(())
    }

    /// `x += paged_attention(rope(qkv(rmsnorm(x))), cache) · Woᵀ`, writing the tokens' keys and
    /// values into the cache.
    fn attention_block(
        &self,
        lw: &DeviceLayer,
        ws: &mut Workspace,
        k_cache: &mut CudaSlice<u16>,
        v_cache: &mut CudaSlice<u16>,
    ) -> Result<(), EngineError> {
        let d = self.dims;
        self.norm_all(&ws.x, &lw.attn_norm, &mut ws.xn)?;
        let qkv_shape = Shape {
            rows: d.tokens,
            in_dim: d.hidden,
            out_dim: d.qkv_dim,
        };
        self.gemm
            .linear(&ws.xn, &lw.wqkv, &mut ws.qkv, qkv_shape, 0.0)?;
        if let Some(bias) = &lw.bqkv {
            let qkv_i = d.qkv_dim as i32;
            // SAFETY: argument types and order match kernels/activation.cu; `qkv` holds
            // `tokens` rows of `qkv_dim`.
            unsafe {
                self.stream
                    .launch_builder(&self.kernels.add_bias)
                    .arg(&mut ws.qkv)
                    .arg(bias)
                    .arg(&qkv_i)
                    .launch(rows_cfg(d.tokens, 256))
                    .map_err(driver_err)?;
            }
        }
        self.rope_and_cache(ws, k_cache, v_cache)?;
        self.attention(ws, k_cache, v_cache)?;
        let out_shape = Shape {
            rows: d.tokens,
            in_dim: d.q_dim,
            out_dim: d.hidden,
        };
        self.gemm
            .linear(&ws.attn, &lw.wo, &mut ws.x, out_shape, 1.0)
    }

    /// Rotates q and k in place, then writes k and v into the paged cache.
    fn rope_and_cache(
        &self,
        ws: &mut Workspace,
        k_cache: &mut CudaSlice<u16>,
        v_cache: &mut CudaSlice<u16>,
    ) -> Result<(), EngineError> {
        let (c, l, d) = (self.config, &self.layout, &self.dims);
        let positions = ws.meta.slice(l.positions..l.positions + d.tokens);
        let slots = ws.meta.slice(l.slots..l.slots + d.tokens);
        let (qkv_i, q_i, kv_i) = (d.qkv_dim as i32, d.q_dim as i32, d.kv_dim as i32);
        let v_off = (d.q_dim + d.kv_dim) as i32;
        let head_dim = c.head_dim as i32;
        let neox: i32 = match c.rope_style {
            RopeStyle::Interleaved => 0,
            RopeStyle::HalfSplit => 1,
        };
        // SAFETY: argument types and order match kernels/rope.cu and kernels/kv_cache.cu; the
        // buffers were sized for this batch and `prepare` checked positions and slots.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.rope_inplace)
                .arg(&mut ws.qkv)
                .arg(&positions)
                .arg(&qkv_i)
                .arg(&head_dim)
                .arg(&c.rope_theta)
                .arg(&neox)
                .launch(LaunchConfig {
                    grid_dim: (d.tokens as u32, (c.num_heads + c.num_kv_heads) as u32, 1),
                    block_dim: ((c.head_dim / 2) as u32, 1, 1),
                    shared_mem_bytes: 0,
                })
                .map_err(driver_err)?;
            self.stream
                .launch_builder(&self.kernels.kv_cache_write)
                .arg(&ws.qkv)
                .arg(&slots)
                .arg(&mut *k_cache)
                .arg(&mut *v_cache)
                .arg(&qkv_i)
                .arg(&q_i)
                .arg(&v_off)
                .arg(&kv_i)
                .launch(rows_cfg(d.tokens, 256))
                .map_err(driver_err)?;
        }
        Ok(())
    }

    /// `attn = paged_attention(q, cache)` (bf16), each token over its own sequence.
    fn attention(
        &self,
        ws: &mut Workspace,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
    ) -> Result<(), EngineError> {
        let (c, l, d) = (self.config, &self.layout, &self.dims);
        let meta = &ws.meta;
        let positions = meta.slice(l.positions..l.positions + d.tokens);
        let token_seq = meta.slice(l.token_seq..l.token_seq + d.tokens);
        let tables = meta.slice(l.block_tables..l.len);
        let qkv_i = d.qkv_dim as i32;
        let max_blocks = l.max_blocks as i32;
        let (n_heads, n_kv, head_dim) =
            (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let block_size = self.block_size as i32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        // Grouped kernel: one block per (token, kv head) serving its query heads.
        let (attention, attention_blocks_y) = if c.num_heads / c.num_kv_heads <= MAX_ATTENTION_GROUP
        {
            (&self.kernels.paged_attention_grouped, c.num_kv_heads as u32)
        } else {
            (&self.kernels.paged_attention, c.num_heads as u32)
        };
        // SAFETY: argument types and order match kernels/attention.cu; the buffers were sized
        // for this batch and `prepare` checked the block tables.
        unsafe {
            self.stream
                .launch_builder(attention)
                .arg(&ws.qkv)
                .arg(k_cache)
                .arg(v_cache)
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
                    grid_dim: (d.tokens as u32, attention_blocks_y, 1),
                    block_dim: (ATTN_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
                .map_err(driver_err)?;
        }
        Ok(())
    }

    /// `x += (silu(g) * u)(rmsnorm(x) · Wgate_upᵀ) · Wdownᵀ`.
    fn mlp_block(&self, lw: &DeviceLayer, ws: &mut Workspace) -> Result<(), EngineError> {
        let d = self.dims;
        self.norm_all(&ws.x, &lw.ffn_norm, &mut ws.xn)?;
        let gate_up_shape = Shape {
            rows: d.tokens,
            in_dim: d.hidden,
            out_dim: 2 * d.ff,
        };
        self.gemm
            .linear(&ws.xn, &lw.w_gate_up, &mut ws.gate_up, gate_up_shape, 0.0)?;
        let ff_i = d.ff as i32;
        // SAFETY: argument types and order match kernels/activation.cu; `gate_up` and `act`
        // hold `tokens` rows.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.silu_mul)
                .arg(&ws.gate_up)
                .arg(&mut ws.act)
                .arg(&ff_i)
                .launch(rows_cfg(d.tokens, 256))
                .map_err(driver_err)?;
        }
        let down_shape = Shape {
            rows: d.tokens,
            in_dim: d.ff,
            out_dim: d.hidden,
        };
        self.gemm
            .linear(&ws.act, &lw.w_down, &mut ws.x, down_shape, 1.0)
    }

    /// `logits = rmsnorm(x[rows that need logits]) · lm_headᵀ`.
    fn lm_head(&self, w: &DeviceWeights, ws: &mut Workspace) -> Result<(), EngineError> {
        let (l, d) = (&self.layout, &self.dims);
        let logit_rows = ws.meta.slice(l.logit_rows..l.logit_rows + d.rows);
        let h_i = d.hidden as i32;
        let eps = self.config.rms_norm_eps;
        // SAFETY: argument types and order match kernels/rmsnorm.cu; `logit_rows` indexes
        // tokens of this batch.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.rmsnorm_to_bf16)
                .arg(&ws.x)
                .arg(&logit_rows)
                .arg(&w.final_norm)
                .arg(&mut ws.xn)
                .arg(&h_i)
                .arg(&eps)
                .launch(rows_cfg(d.rows, 256))
                .map_err(driver_err)?;
        }
        let shape = Shape {
            rows: d.rows,
            in_dim: d.hidden,
            out_dim: d.vocab,
        };
        self.gemm
            .linear(&ws.xn, w.lm_head(), &mut ws.logits, shape, 0.0)
    }
}
