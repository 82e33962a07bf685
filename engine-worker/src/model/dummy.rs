//! `--load-format dummy`: seeded random weights of a given shape, for benchmarks and tests
//! (as vLLM's dummy loader). Quantized types get random codes directly, so even an 8B shape
//! is generated in seconds.

use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::config::ModelConfig;
use super::dtype::{quantize_row, WeightType, QK};
use super::tensor::WeightMatrix;
use super::weights::{ModelWeights, TensorRole, TensorSource};
use super::Model;
use crate::EngineError;

struct DummySource {
    dtype: WeightType,
    seed: u64,
    tie: bool,
    bias: bool,
}

/// FNV-1a, to derive a per-tensor seed from its name.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl DummySource {
    fn row_rng(&self, name: &str, row: usize) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(name));
        rng.set_stream(row as u64);
        rng
    }

    /// One row with values roughly uniform in `[-scale, scale]`.
    fn row(&self, name: &str, r: usize, cols: usize, scale: f32, out: &mut Vec<u8>) {
        let mut rng = self.row_rng(name, r);
        match self.dtype {
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q8_0 => {
                let (_, block_bytes) = self.dtype.block_layout();
                let start = out.len();
                out.resize(start + cols / QK * block_bytes, 0);
                for block in out[start..].chunks_exact_mut(block_bytes) {
                    rng.fill_bytes(block);
                    let (d, header) = match self.dtype {
                        WeightType::Q8_0 => (scale / 127.0, 2),
                        WeightType::Q4_0 => (scale / 8.0, 2),
                        _ => (2.0 * scale / 15.0, 4),
                    };
                    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                    if header == 4 {
                        block[2..4].copy_from_slice(&f16::from_f32(-scale).to_le_bytes());
                    }
                }
            }
            dtype => {
                let values: Vec<f32> = (0..cols).map(|_| rng.gen_range(-scale..scale)).collect();
                quantize_row(dtype, &values, out);
            }
        }
    }
}

impl TensorSource for DummySource {
    fn name(&self, role: TensorRole, layer: usize) -> String {
        format!("{role:?}.{layer}")
    }

    fn has(&self, name: &str) -> bool {
        if name.starts_with("LmHead") {
            !self.tie
        } else if name.contains("Bias") {
            self.bias
        } else {
            true
        }
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, EngineError> {
        let (block_elems, _) = self.dtype.block_layout();
        if !cols.is_multiple_of(block_elems) {
            return Err(EngineError::InvalidConfig(format!(
                "{name}: {cols} columns are not a multiple of the {} block size {block_elems}",
                self.dtype
            )));
        }
        // Keeps activations O(1) through the residual stream.
        let scale = (3.0 / cols as f32).sqrt();
        let row_bytes = self.dtype.row_bytes(cols);
        let mut data = vec![0u8; rows * row_bytes];
        data.par_chunks_mut(row_bytes)
            .enumerate()
            .for_each(|(r, chunk)| {
                let mut row = Vec::with_capacity(row_bytes);
                self.row(name, r, cols, scale, &mut row);
                chunk.copy_from_slice(&row);
            });
        WeightMatrix::owned(name, self.dtype, rows, cols, data)
            .ok_or_else(|| EngineError::InvalidConfig(format!("{name}: bad dummy shape")))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        if name.contains("Norm") {
            return Ok(vec![1.0; len]);
        }
        let mut rng = self.row_rng(name, 0);
        Ok((0..len).map(|_| rng.gen_range(-0.1..0.1)).collect())
    }
}

impl Model {
    /// Random weights of `config`'s shape stored as `dtype`, reproducible from `seed`.
    pub fn dummy(config: ModelConfig, dtype: WeightType, seed: u64) -> Result<Model, EngineError> {
        config.validate()?;
        let src = DummySource {
            dtype,
            seed,
            tie: config.tie_word_embeddings,
            bias: config.attention_bias,
        };
        let weights = ModelWeights::load(&config, &src)?;
        Ok(Model {
            config,
            weights,
            tokenizer: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_is_reproducible_and_seed_dependent() {
        for dtype in [WeightType::Q4_1, WeightType::F16, WeightType::Q8_0] {
            let a = Model::dummy(ModelConfig::tiny(), dtype, 7).unwrap();
            let b = Model::dummy(ModelConfig::tiny(), dtype, 7).unwrap();
            let c = Model::dummy(ModelConfig::tiny(), dtype, 8).unwrap();
            let (wa, wb, wc) = (
                &a.weights.layers[1].wq,
                &b.weights.layers[1].wq,
                &c.weights.layers[1].wq,
            );
            assert_eq!(wa.bytes(), wb.bytes());
            assert_ne!(wa.bytes(), wc.bytes());
            let values = wa.to_f32();
            let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(max > 0.05 && max < 1.0, "{dtype}: max {max}");
            assert!(a.weights.layers[0].bq.is_none());
        }
        let mut config = ModelConfig::tiny();
        config.attention_bias = true;
        config.tie_word_embeddings = false;
        let m = Model::dummy(config, WeightType::F32, 1).unwrap();
        assert!(m.weights.layers[1].bk.is_some());
        assert_ne!(m.weights.lm_head.bytes(), m.weights.embed.bytes());
    }
}
