//! Weights in device memory: every matrix as bf16 (GGUF quantized types are dequantized at load;
//! bf16 sources are copied as they are; f16/f32 are rounded to bf16), norms and biases as f32.
//! q/k/v are fused into one `[q_dim + 2 * kv_dim, hidden]` matrix and gate/up into one
//! `[2 * intermediate, hidden]` matrix, so each becomes a single GEMM.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use half::bf16;
use rayon::prelude::*;

use super::device::unavailable;
use super::module::Kernels;
use crate::model::{ModelConfig, ModelWeights, WeightMatrix, WeightType};
use crate::EngineError;

pub struct DeviceLayer {
    pub attn_norm: CudaSlice<f32>,    // [hidden]
    pub wqkv: CudaSlice<u16>,         // [q_dim + 2 * kv_dim, hidden] bf16
    pub bqkv: Option<CudaSlice<f32>>, // [q_dim + 2 * kv_dim]
    pub wo: CudaSlice<u16>,           // [hidden, q_dim] bf16
    pub ffn_norm: CudaSlice<f32>,     // [hidden]
    pub w_gate_up: CudaSlice<u16>,    // [2 * intermediate, hidden] bf16
    pub w_down: CudaSlice<u16>,       // [hidden, intermediate] bf16
}

pub struct DeviceWeights {
    pub embed: CudaSlice<u16>, // [vocab, hidden] bf16
    /// `None` when tied to `embed`.
    pub lm_head: Option<CudaSlice<u16>>, // [vocab, hidden] bf16
    pub final_norm: CudaSlice<f32>, // [hidden]
    pub layers: Vec<DeviceLayer>,
}

impl DeviceWeights {
    pub fn lm_head(&self) -> &CudaSlice<u16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of device memory the weights take.
    pub fn device_bytes(&self) -> usize {
        let layer = |l: &DeviceLayer| {
            l.attn_norm.num_bytes()
                + l.wqkv.num_bytes()
                + l.bqkv.as_ref().map_or(0, |b| b.num_bytes())
                + l.wo.num_bytes()
                + l.ffn_norm.num_bytes()
                + l.w_gate_up.num_bytes()
                + l.w_down.num_bytes()
        };
        self.embed.num_bytes()
            + self.lm_head.as_ref().map_or(0, |m| m.num_bytes())
            + self.final_norm.num_bytes()
            + self.layers.iter().map(layer).sum::<usize>()
    }

    /// Uploads host weights (any stored type) as bf16.
    pub fn upload(
        stream: &Arc<CudaStream>,
        config: &ModelConfig,
        weights: &ModelWeights,
    ) -> Result<Self, EngineError> {
        let up16 = |data: Vec<u16>| upload(stream, &data);
        let up32 = |data: &[f32]| upload(stream, data);
        let tied = std::ptr::eq(
            weights.embed.bytes().as_ptr(),
            weights.lm_head.bytes().as_ptr(),
        );
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                let bqkv = if l.bq.is_some() || l.bk.is_some() || l.bv.is_some() {
                    let mut b = Vec::with_capacity(config.q_dim() + 2 * config.kv_dim());
                    b.extend(l.bq.clone().unwrap_or_else(|| vec![0.0; config.q_dim()]));
                    b.extend(l.bk.clone().unwrap_or_else(|| vec![0.0; config.kv_dim()]));
                    b.extend(l.bv.clone().unwrap_or_else(|| vec![0.0; config.kv_dim()]));
                    Some(up32(&b)?)
                } else {
                    None
                };
                Ok(DeviceLayer {
                    attn_norm: up32(&l.attn_norm)?,
                    wqkv: up16(to_bf16_bits(&[&l.wq, &l.wk, &l.wv]))?,
                    bqkv,
                    wo: up16(to_bf16_bits(&[&l.wo]))?,
                    ffn_norm: up32(&l.ffn_norm)?,
                    w_gate_up: up16(to_bf16_bits(&[&l.w_gate, &l.w_up]))?,
                    w_down: up16(to_bf16_bits(&[&l.w_down]))?,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(Self {
            embed: up16(to_bf16_bits(&[&weights.embed]))?,
            lm_head: if tied {
                None
            } else {
                Some(up16(to_bf16_bits(&[&weights.lm_head]))?)
            },
            final_norm: up32(&weights.final_norm)?,
            layers,
        })
    }

    /// Random weights generated on the device (uniform in ±sqrt(3 / fan_in), unit norms), for
    /// benchmarking shapes too large to build on the host quickly. Deterministic per seed, but
    /// not the same values as the host dummy loader.
    pub fn dummy_on_device(
        stream: &Arc<CudaStream>,
        kernels: &Kernels,
        config: &ModelConfig,
        seed: u32,
    ) -> Result<Self, EngineError> {
        let (h, q, kv, ff, v) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
            config.vocab_size,
        );
        let mut counter = seed;
        let mut random = |rows: usize, cols: usize| -> Result<CudaSlice<u16>, EngineError> {
            counter = counter.wrapping_mul(0x9e37_79b9).wrapping_add(1);
            let n = rows * cols;
            let mut out = alloc::<u16>(stream, n)?;
            let scale = (3.0 / cols as f32).sqrt();
            let n64 = n as u64;
            let mut launch = stream.launch_builder(&kernels.fill_uniform_bf16);
            launch.arg(&mut out).arg(&n64).arg(&counter).arg(&scale);
            // SAFETY: out holds n elements; the kernel writes indices < n.
            unsafe { launch.launch(grid_stride(n)) }.map_err(driver_err)?;
            Ok(out)
        };
        let ones = |n: usize| -> Result<CudaSlice<f32>, EngineError> {
            let mut out = alloc::<f32>(stream, n)?;
            let (n64, one) = (n as u64, 1.0f32);
            let mut launch = stream.launch_builder(&kernels.fill_f32);
            launch.arg(&mut out).arg(&n64).arg(&one);
            // SAFETY: out holds n elements; the kernel writes indices < n.
            unsafe { launch.launch(grid_stride(n)) }.map_err(driver_err)?;
            Ok(out)
        };
        let embed = random(v, h)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(random(v, h)?)
        };
        let mut layers = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            layers.push(DeviceLayer {
                attn_norm: ones(h)?,
                wqkv: random(q + 2 * kv, h)?,
                bqkv: None,
                wo: random(h, q)?,
                ffn_norm: ones(h)?,
                w_gate_up: random(2 * ff, h)?,
                w_down: random(h, ff)?,
            });
        }
        Ok(Self {
            embed,
            lm_head,
            final_norm: ones(h)?,
            layers,
        })
    }
}

pub(crate) fn grid_stride(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn driver_err(e: cudarc::driver::DriverError) -> EngineError {
    unavailable(format!("CUDA driver error: {e:?}"))
}

pub(crate) fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, EngineError> {
    stream.alloc_zeros::<T>(len.max(1)).map_err(|e| {
        unavailable(format!(
            "cannot allocate {} bytes of device memory: {e:?}",
            len * std::mem::size_of::<T>()
        ))
    })
}

pub(crate) fn upload<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
) -> Result<CudaSlice<T>, EngineError> {
    stream.clone_htod(data).map_err(|e| {
        unavailable(format!(
            "cannot copy {} bytes to the device: {e:?}",
            std::mem::size_of_val(data)
        ))
    })
}

/// The rows of `matrices`, stacked, as bf16 bit patterns.
fn to_bf16_bits(matrices: &[&WeightMatrix]) -> Vec<u16> {
    let cols = matrices[0].cols;
    let rows: usize = matrices.iter().map(|m| m.rows).sum();
    let mut out = vec![0u16; rows * cols];
    let mut start = 0;
    for m in matrices {
        debug_assert_eq!(m.cols, cols);
        let dst = &mut out[start * cols..(start + m.rows) * cols];
        if m.dtype == WeightType::BF16 {
            // Already bf16 (little-endian): copied bit for bit.
            for (d, b) in dst.iter_mut().zip(m.bytes().chunks_exact(2)) {
                *d = u16::from_le_bytes([b[0], b[1]]);
            }
        } else {
            dst.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
                let mut f = vec![0f32; cols];
                m.dequantize_row(r, &mut f);
                for (d, v) in row.iter_mut().zip(&f) {
                    *d = bf16::from_f32(*v).to_bits();
                }
            });
        }
        start += m.rows;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_rows_and_rounds_to_bf16() {
        let a = WeightMatrix::owned(
            "a",
            WeightType::F32,
            1,
            2,
            [1.0f32, 1.0 / 3.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        )
        .unwrap();
        let b_bits = [
            bf16::from_f32(-2.5).to_bits(),
            bf16::from_f32(0.125).to_bits(),
        ];
        let b = WeightMatrix::owned(
            "b",
            WeightType::BF16,
            1,
            2,
            b_bits.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .unwrap();
        let bits = to_bf16_bits(&[&a, &b]);
        assert_eq!(
            bits,
            vec![
                bf16::from_f32(1.0).to_bits(),
                bf16::from_f32(1.0 / 3.0).to_bits(),
                b_bits[0],
                b_bits[1],
            ]
        );
    }
}
