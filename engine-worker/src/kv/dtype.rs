//! The precision the KV cache stores keys and values in (vLLM's `--kv-cache-dtype`, llama.cpp's
//! `-ctk`/`-ctv`). Activations stay f32; attention reads the stored form directly (see the CPU
//! backend's `kv_rows`), so a narrower cache costs no widened copy per step.

use crate::EngineError;

/// Elements one `q8_0` block quantizes together under one scale (ggml's `QK8_0`).
pub const Q8_0_BLOCK: usize = 32;

/// How one row of keys or values (`head_dim` elements) is stored. The library's default is
/// exact ([`KvDtype::F32`]); the worker serves [`KvDtype::SERVING_DEFAULT`] on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// IEEE single precision: exact.
    #[default]
    F32,
    /// IEEE half precision (11-bit significand), rounded to nearest.
    F16,
    /// bfloat16 (8-bit significand, f32's range), rounded to nearest.
    Bf16,
    /// ggml's Q8_0: blocks of 32 signed bytes under one f16 scale (`amax / 127`), 34 bytes
    /// for 32 elements.
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0];

    /// The CPU worker's default: the cheapest precision whose greedy continuations equal the
    /// golden ones on every reference prompt (`golden_smollm2`'s precision test holds this
    /// choice to that rule; the figures are in docs/benchmarks.md). bf16 ties on size and
    /// passes too, with 4-7x f16's logit error.
    pub const SERVING_DEFAULT: KvDtype = KvDtype::F16;

    /// The name `--kv-cache-dtype` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8_0 => "q8_0",
        }
    }

    /// Bytes one row of `head_dim` elements takes.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * head_dim,
            KvDtype::F16 | KvDtype::Bf16 => 2 * head_dim,
            KvDtype::Q8_0 => head_dim / Q8_0_BLOCK * (2 + Q8_0_BLOCK),
        }
    }

    /// Refuses a head size this precision cannot store: Q8_0 rows are whole blocks.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), EngineError> {
        if self == KvDtype::Q8_0 && !head_dim.is_multiple_of(Q8_0_BLOCK) {
            return Err(EngineError::InvalidConfig(format!(
                "--kv-cache-dtype q8_0 stores rows in blocks of {Q8_0_BLOCK}; this model's \
                 head size is {head_dim}"
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    /// `f32`, `f16`, `bf16` or `q8_0` (any case; `float32`, `float16`, `half` and `q8` too).
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(KvDtype::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(KvDtype::F16),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "q8_0" | "q8" => Ok(KvDtype::Q8_0),
            other => Err(format!(
                "unknown KV cache dtype {other:?}: expected f32, f16, bf16 or q8_0"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_rows_have_their_sizes() {
        for dtype in KvDtype::ALL {
            assert_eq!(dtype.name().parse::<KvDtype>().unwrap(), dtype);
        }
        assert_eq!("FP16".parse::<KvDtype>().unwrap(), KvDtype::F16);
        assert!("int4".parse::<KvDtype>().unwrap_err().contains("int4"));
        let sizes = KvDtype::ALL.map(|d| d.row_bytes(64));
        assert_eq!(sizes, [256, 128, 128, 68]);
        assert!(KvDtype::Q8_0.check_head_dim(48).is_err());
        assert!(KvDtype::F16.check_head_dim(48).is_ok());
    }
}
