use serde::Deserialize;

use crate::EngineError;

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotates adjacent pairs `(2i, 2i+1)`. GGUF `llama` files store q/k permuted for this.
    Interleaved,
    /// Rotates `(i, i + head_dim/2)` (GPT-NeoX / Hugging Face layout).
    HalfSplit,
}

/// Hyper-parameters of a Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2-style biases).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Short name for hellos and metric labels, e.g. "SmolLM2-135M-Instruct".
    pub name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    /// Dimension pairing of RoPE, fixed by the weight layout of the source format.
    pub rope_style: RopeStyle,
    pub rms_norm_eps: f32,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation (EOS, EOT, ...).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Checks that the shapes are consistent (non-zero, heads divide evenly).
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |reason: String| EngineError::InvalidConfig(reason);
        let dims = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{name} is zero")));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(format!("head_dim {} is odd", self.head_dim)));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(bad(format!(
                "rope_theta {} is not positive",
                self.rope_theta
            )));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(bad(format!(
                "rms_norm_eps {} is invalid",
                self.rms_norm_eps
            )));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Meta-Llama-3-8B's shape (for dummy-weight benchmarks).
    pub fn llama3_8b() -> Self {
        Self {
            name: "llama-3-8b".into(),
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rope_theta: 500_000.0,
            rope_style: RopeStyle::HalfSplit,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 8192,
            attention_bias: false,
            tie_word_embeddings: false,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001, 128_009],
        }
    }

    /// SmolLM2-135M's shape (the default model's, for dummy weights).
    pub fn smollm2_135m() -> Self {
        Self {
            name: "smollm2-135m".into(),
            vocab_size: 49_152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rope_theta: 100_000.0,
            rope_style: RopeStyle::Interleaved,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 8192,
            attention_bias: false,
            tie_word_embeddings: true,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
        }
    }

    /// A tiny model for fast tests: 2 layers, GQA 4:2, vocab 256.
    pub fn tiny() -> Self {
        Self {
            name: "tiny".into(),
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::Interleaved,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 2048,
            attention_bias: false,
            tie_word_embeddings: true,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
        }
    }

    /// A preset by name: `llama-3-8b`, `smollm2-135m` or `tiny`.
    pub fn preset(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "llama-3-8b" | "llama3-8b" => Some(Self::llama3_8b()),
            "smollm2-135m" => Some(Self::smollm2_135m()),
            "tiny" => Some(Self::tiny()),
            _ => None,
        }
    }

    /// Reads a Hugging Face `config.json` (Llama, Mistral, Qwen2 architectures).
    pub fn from_hf_config_json(json: &str, name: &str) -> Result<Self, EngineError> {
        let hf: HfConfig = serde_json::from_str(json)
            .map_err(|e| EngineError::InvalidConfig(format!("config.json: {e}")))?;
        let arch = hf
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or_else(|| hf.model_type.clone())
            .unwrap_or_default();
        let attention_bias = match arch.as_str() {
            "LlamaForCausalLM" | "MistralForCausalLM" | "llama" | "mistral" => {
                hf.attention_bias.unwrap_or(false)
            }
            "Qwen2ForCausalLM" | "qwen2" => true,
            other => {
                return Err(EngineError::UnsupportedArchitecture {
                    architecture: other.to_owned(),
                })
            }
        };
        if let Some(scaling) = &hf.rope_scaling {
            if !scaling.is_null() {
                return Err(EngineError::InvalidConfig(format!(
                    "rope_scaling {scaling} is not supported"
                )));
            }
        }
        let head_dim = hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        let eos_token_ids = match hf.eos_token_id {
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
            None => Vec::new(),
        };
        let config = Self {
            name: name.to_owned(),
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim,
            rope_theta: hf.rope_theta.unwrap_or(10_000.0),
            rope_style: RopeStyle::HalfSplit,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(2048),
            attention_bias,
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            bos_token_id: hf.bos_token_id,
            eos_token_ids,
        };
        config.validate()?;
        Ok(config)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// The fields of a Hugging Face `config.json` this engine reads.
#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    rms_norm_eps: Option<f32>,
    max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        for name in ["llama-3-8b", "smollm2-135m", "tiny"] {
            ModelConfig::preset(name).unwrap().validate().unwrap();
        }
        assert!(ModelConfig::preset("nope").is_none());
    }

    #[test]
    fn reads_hf_config() {
        let json = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":49152,"hidden_size":576,
            "intermediate_size":1536,"num_hidden_layers":30,"num_attention_heads":9,
            "num_key_value_heads":3,"rope_theta":100000.0,"rms_norm_eps":1e-5,
            "max_position_embeddings":8192,"tie_word_embeddings":true,"bos_token_id":1,
            "eos_token_id":2,"rope_scaling":null}"#;
        let c = ModelConfig::from_hf_config_json(json, "smol").unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.eos_token_ids, [2]);
        assert_eq!(c.rope_style, RopeStyle::HalfSplit);
        assert!(c.tie_word_embeddings && !c.attention_bias);

        let qwen = json.replace("LlamaForCausalLM", "Qwen2ForCausalLM");
        assert!(
            ModelConfig::from_hf_config_json(&qwen, "q")
                .unwrap()
                .attention_bias
        );
        let gpt = json.replace("LlamaForCausalLM", "GPT2LMHeadModel");
        assert!(matches!(
            ModelConfig::from_hf_config_json(&gpt, "g"),
            Err(EngineError::UnsupportedArchitecture { .. })
        ));
        let bad = json.replace("\"num_key_value_heads\":3", "\"num_key_value_heads\":2");
        assert!(matches!(
            ModelConfig::from_hf_config_json(&bad, "b"),
            Err(EngineError::InvalidConfig(_))
        ));
    }
}
