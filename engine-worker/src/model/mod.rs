//! Model hyper-parameters and weights, loaded from GGUF, Hugging Face safetensors directories,
//! or generated (`--load-format dummy`).

mod config;
mod dtype;
mod dummy;
mod gguf_loader;
mod safetensors_loader;
mod tensor;
mod weights;

#[cfg(test)]
mod loader_tests;

use std::path::Path;

pub use config::{ModelConfig, RopeStyle};
pub use dtype::{dequantize_row, quantize_row, WeightType, QK};
pub use gguf_loader::{gguf_config, load_gguf};
pub use safetensors_loader::{hf_config, load_hf_dir};
pub use tensor::{Blob, WeightMatrix};
pub use weights::{LayerWeights, ModelWeights, TensorRole};

use crate::EngineError;

/// Vocabulary fields as GGUF names them (`tokenizer.ggml.*`), for stop-string decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerData {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: Option<String>,
    /// Token strings, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (3 = control).
    pub token_types: Option<Vec<i32>>,
}

impl TokenizerData {
    /// The bytes each token id decodes to, for stop strings.
    pub fn token_bytes(&self) -> vocab::TokenBytes {
        let kind = vocab::VocabKind::from_gguf_model(self.model.as_deref());
        vocab::TokenBytes::new(&self.tokens, self.token_types.as_deref(), kind)
    }
}

/// A loaded model: hyper-parameters, weights, and the vocabulary when the source has one.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Option<TokenizerData>,
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFormat {
    /// GGUF for a file, Hugging Face for a directory.
    Auto,
    Gguf,
    Safetensors,
    /// Random weights with the shape read from the path (GGUF or `config.json`).
    Dummy,
}

impl Model {
    /// Loads the model at `path`. With [`LoadFormat::Dummy`] only the shape is read from `path`
    /// and the weights are random (`dummy_dtype`, `seed`); for a preset shape use
    /// [`Model::dummy`] with [`ModelConfig::preset`].
    pub fn load(
        path: &Path,
        format: LoadFormat,
        dummy_dtype: WeightType,
        seed: u64,
    ) -> Result<Model, EngineError> {
        let is_dir = path.is_dir();
        match format {
            LoadFormat::Auto if is_dir => load_hf_dir(path),
            LoadFormat::Auto | LoadFormat::Gguf => {
                if !path.exists() {
                    return Err(EngineError::ModelIo {
                        path: path.display().to_string(),
                        source: std::io::ErrorKind::NotFound.into(),
                    });
                }
                load_gguf(path)
            }
            LoadFormat::Safetensors => load_hf_dir(path),
            LoadFormat::Dummy => {
                let config = if is_dir {
                    hf_config(path)?
                } else {
                    gguf_config(path)?
                };
                Model::dummy(config, dummy_dtype, seed)
            }
        }
    }
}
