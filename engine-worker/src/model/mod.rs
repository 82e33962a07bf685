//! Model hyper-parameters and weights, loaded from GGUF, Hugging Face safetensors directories,
//! or generated (`--load-format dummy`).

mod config;
mod draft_head;
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
pub use draft_head::{default_aux_layers, HeadConfig, HeadWeights};
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

/// Where the weights come from (the worker's `--load-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    /// GGUF for a file, safetensors for a Hugging Face directory.
    Auto,
    Gguf,
    Safetensors,
    /// Random weights in the model's shape, read from the path (benchmarks).
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

impl Model {
    /// This model cut to its first `layers` layers, with its final norm and LM head: a draft
    /// model of the same vocabulary made without a file (tests; `scripts/make-draft.py` writes
    /// such drafts as GGUF).
    pub fn first_layers(&self, layers: usize) -> Model {
        let mut draft = self.clone();
        draft.weights.layers.truncate(layers);
        draft.config.num_layers = draft.weights.layers.len();
        draft.config.name = format!("{}-first{}", self.config.name, draft.config.num_layers);
        draft
    }
}

/// Why `draft` cannot draft for `target`: their vocabularies differ (in size, or in the bytes of
/// a token id, naming the first that differs). `None` when they agree. A draft token is an id
/// the target reads; the same id must mean the same text.
pub fn vocabulary_mismatch(target: &Model, draft: &Model) -> Option<String> {
    let (t, d) = (&target.config, &draft.config);
    if t.vocab_size != d.vocab_size {
        return Some(format!(
            "the draft {} has {} tokens, the target {} has {}",
            d.name, d.vocab_size, t.name, t.vocab_size
        ));
    }
    let (tt, dt) = match (&target.tokenizer, &draft.tokenizer) {
        (None, None) => return None,
        (Some(tt), Some(dt)) => (tt.token_bytes(), dt.token_bytes()),
        (Some(_), None) => return Some(format!("the draft {} has no vocabulary", d.name)),
        (None, Some(_)) => return Some(format!("the target {} has no vocabulary", t.name)),
    };
    if tt.len() != dt.len() {
        return Some(format!(
            "the draft {} names {} tokens, the target {} names {}",
            d.name,
            dt.len(),
            t.name,
            tt.len()
        ));
    }
    (0..tt.len() as u32)
        .find(|&id| tt.get(id) != dt.get(id) || tt.is_control(id) != dt.is_control(id))
        .map(|id| {
            format!(
                "token {id} differs: the target {} has {:?}, the draft {} has {:?}",
                t.name,
                String::from_utf8_lossy(tt.get(id)),
                d.name,
                String::from_utf8_lossy(dt.get(id))
            )
        })
}

#[cfg(test)]
mod vocabulary_tests {
    use super::*;

    fn with_tokens(name: &str, tokens: &[&str]) -> Model {
        let mut config = ModelConfig::tiny();
        config.name = name.into();
        config.vocab_size = tokens.len();
        let mut model = Model::dummy(config, WeightType::F32, 0).expect("tiny dummy model");
        model.tokenizer = Some(TokenizerData {
            model: Some("gpt2".into()),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            token_types: None,
        });
        model
    }

    #[test]
    fn the_first_differing_token_is_named() {
        let target = with_tokens("t", &["a", "b", "c", "d"]);
        assert_eq!(vocabulary_mismatch(&target, &target.clone()), None);
        let draft = with_tokens("d", &["a", "b", "x", "d"]);
        let why = vocabulary_mismatch(&target, &draft).expect("differs");
        assert!(
            why.contains("token 2") && why.contains("\"c\"") && why.contains("\"x\""),
            "{why}"
        );
        let shorter = with_tokens("d", &["a", "b", "c"]);
        assert!(vocabulary_mismatch(&target, &shorter)
            .expect("differs")
            .contains("3 tokens"));
    }
}
