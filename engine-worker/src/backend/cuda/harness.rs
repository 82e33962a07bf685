//! Runs single kernels on host data, so tests can check a kernel against a plain reference
//! without a whole model (the paged-attention test uses this).

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::device;
use super::module::Kernels;
use super::weights::{driver_err, upload};
use crate::EngineError;

/// Inputs of one `paged_attention` launch; shapes as in kernels/attention.cu.
#[derive(Debug, Clone)]
pub struct AttentionCase {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// `[tokens, q_heads * head_dim]`.
    pub q: Vec<f32>,
    /// `[slots, kv_heads * head_dim]` bf16 bits.
    pub k_cache: Vec<u16>,
    pub v_cache: Vec<u16>,
    /// `[seqs, max_blocks]`.
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
    /// Per query token: row of `block_tables`, and position (attends to `0..=position`).
    pub token_seq: Vec<u32>,
    pub positions: Vec<u32>,
    /// Run `paged_attention_grouped` (one block per kv head) instead of `paged_attention`.
    pub grouped: bool,
}

/// Runs `paged_attention` (or the grouped variant) on device `ordinal`; returns `[tokens, q_heads * head_dim]` as f32
/// (the kernel writes bf16).
pub fn paged_attention(ordinal: usize, case: &AttentionCase) -> Result<Vec<f32>, EngineError> {
    let dev = device::open(ordinal)?;
    let kernels = Kernels::load(&dev.ctx, dev.compute_capability)?;
    let s = &dev.stream;
    let tokens = case.positions.len();
    let q_dim = case.q_heads * case.head_dim;
    let q = upload(s, &case.q)?;
    let kc = upload(s, &case.k_cache)?;
    let vc = upload(s, &case.v_cache)?;
    let tables = upload(s, &case.block_tables)?;
    let token_seq = upload(s, &case.token_seq)?;
    let positions = upload(s, &case.positions)?;
    let mut out = upload(s, &vec![0u16; tokens * q_dim])?;
    let (q_stride, max_blocks, qh, kvh, hd, bs) = (
        q_dim as i32,
        case.max_blocks as i32,
        case.q_heads as i32,
        case.kv_heads as i32,
        case.head_dim as i32,
        case.block_size as i32,
    );
    let scale = 1.0 / (case.head_dim as f32).sqrt();
    // SAFETY: argument order and types match kernels/attention.cu; the caller's arrays have the
    // documented shapes (a wrong case reads out of bounds only inside its own buffers' sizes as
    // far as the caller's block tables and positions are consistent).
    unsafe {
        let (kernel, blocks_y) = if case.grouped {
            (&kernels.paged_attention_grouped, case.kv_heads)
        } else {
            (&kernels.paged_attention, case.q_heads)
        };
        s.launch_builder(kernel)
            .arg(&q)
            .arg(&kc)
            .arg(&vc)
            .arg(&tables)
            .arg(&token_seq)
            .arg(&positions)
            .arg(&mut out)
            .arg(&q_stride)
            .arg(&max_blocks)
            .arg(&qh)
            .arg(&kvh)
            .arg(&hd)
            .arg(&bs)
            .arg(&scale)
            .launch(LaunchConfig {
                grid_dim: (tokens as u32, blocks_y as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
            .map_err(driver_err)?;
    }
    let bits = s.clone_dtoh(&out).map_err(driver_err)?;
    s.synchronize().map_err(driver_err)?;
    Ok(bits
        .into_iter()
        .map(|b| half::bf16::from_bits(b).to_f32())
        .collect())
}
