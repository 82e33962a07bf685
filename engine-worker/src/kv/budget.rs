//! Sizing the KV cache from a memory budget (`--kv-cache-memory`, vLLM's `--kv-cache-memory`):
//! how many blocks the budget holds at what one block takes, target and draft model together.

use super::KvDtype;
use crate::backend::cpu::CpuBackend;
use crate::model::ModelConfig;
use crate::EngineError;

/// A memory budget for the KV cache.
#[derive(Debug, Clone, Copy)]
pub struct KvBudget {
    pub bytes: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Most positions one sequence may take (clamped to the model's context).
    pub max_model_len: usize,
    /// Precision of the cache (target and draft alike).
    pub dtype: KvDtype,
}

impl KvBudget {
    /// Blocks the budget holds for `target` and, with a draft model, the draft's mirror of each
    /// block; an error naming the numbers when that is less than one sequence of the maximum
    /// context.
    pub fn blocks(
        &self,
        target: &ModelConfig,
        draft: Option<&ModelConfig>,
    ) -> Result<usize, EngineError> {
        if self.block_size == 0 {
            return Err(EngineError::InvalidConfig(
                "a KV block holds at least one token".into(),
            ));
        }
        let per_block = CpuBackend::kv_bytes_per_block(target, self.block_size, self.dtype)
            + draft.map_or(0, |d| {
                CpuBackend::kv_bytes_per_block(d, self.block_size, self.dtype)
            });
        let blocks = usize::try_from(self.bytes / per_block as u64).unwrap_or(usize::MAX);
        let context = self.max_model_len.min(target.max_position_embeddings);
        let needed = context.div_ceil(self.block_size);
        if blocks < needed {
            return Err(EngineError::InvalidConfig(format!(
                "--kv-cache-memory {} B holds {blocks} KV blocks of {} tokens ({per_block} B a \
                 block), fewer than the {needed} that one sequence of the maximum context \
                 ({context} tokens) needs: give at least {} B or lower --max-model-len",
                self.bytes,
                self.block_size,
                needed as u64 * per_block as u64
            )));
        }
        Ok(blocks)
    }
}

/// `1234`, `512MiB`, `2GiB`, `1.5GB`, `64k`: bytes (binary units for `KiB`/`MiB`/`GiB` and
/// `k`/`m`/`g`, decimal for `KB`/`MB`/`GB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => return Err(format!("unknown byte unit {other:?} in {text:?}")),
    };
    let bytes = number * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is not a byte count"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M: 30 layers, 3 KV heads of 64: 46,080 B a token in f32.
    fn smollm2() -> ModelConfig {
        ModelConfig::smollm2_135m()
    }

    #[test]
    fn units() {
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("2 parsecs").is_err());
        assert!(parse_bytes("0").is_err());
    }

    #[test]
    fn a_budget_gives_its_blocks_and_a_draft_shares_it() {
        let budget = KvBudget {
            bytes: 1 << 30,
            block_size: 16,
            max_model_len: 2048,
            dtype: KvDtype::F32,
        };
        let per_block = 46_080 * 16;
        assert_eq!(
            budget.blocks(&smollm2(), None).unwrap(),
            (1 << 30) / per_block
        );
        // A draft of the same shape halves it.
        assert_eq!(
            budget.blocks(&smollm2(), Some(&smollm2())).unwrap(),
            (1 << 30) / (2 * per_block)
        );
        // Q8_0 takes 34 bytes for 32 f32s' 128.
        let q8 = KvBudget {
            dtype: KvDtype::Q8_0,
            ..budget
        };
        assert_eq!(
            q8.blocks(&smollm2(), None).unwrap(),
            (1 << 30) / (per_block * 34 / 128)
        );
    }

    #[test]
    fn a_budget_below_one_full_sequence_names_the_numbers() {
        let budget = KvBudget {
            bytes: 64 << 20,
            block_size: 16,
            max_model_len: 2048,
            dtype: KvDtype::F32,
        };
        let err = budget.blocks(&smollm2(), None).unwrap_err().to_string();
        // 64 MiB / 737,280 B = 91 blocks; 2,048 tokens need 128 blocks = 94,371,840 B.
        for number in ["67108864", "91 KV blocks", "128", "2048 tokens", "94371840"] {
            assert!(err.contains(number), "{number} missing from: {err}");
        }
    }
}
