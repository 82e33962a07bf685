//! The weights of a Llama-family decoder, whatever file they came from.

use super::config::ModelConfig;
use super::tensor::WeightMatrix;
use crate::EngineError;

/// One decoder block.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,  // [hidden]
    pub wq: WeightMatrix,     // [heads * head_dim, hidden]
    pub wk: WeightMatrix,     // [kv_heads * head_dim, hidden]
    pub wv: WeightMatrix,     // [kv_heads * head_dim, hidden]
    pub wo: WeightMatrix,     // [hidden, heads * head_dim]
    pub bq: Option<Vec<f32>>, // [heads * head_dim]
    pub bk: Option<Vec<f32>>, // [kv_heads * head_dim]
    pub bv: Option<Vec<f32>>, // [kv_heads * head_dim]
    pub ffn_norm: Vec<f32>,   // [hidden]
    pub w_gate: WeightMatrix, // [intermediate, hidden]
    pub w_up: WeightMatrix,   // [intermediate, hidden]
    pub w_down: WeightMatrix, // [hidden, intermediate]
}

/// All weights. With tied embeddings `lm_head` shares `embed`'s bytes.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub embed: WeightMatrix, // [vocab, hidden]
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,  // [hidden]
    pub lm_head: WeightMatrix, // [vocab, hidden]
}

/// Which role a tensor plays; sources map roles to their own names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    Embed,
    FinalNorm,
    LmHead,
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    FfnNorm,
    Gate,
    Up,
    Down,
}

/// A file (or generator) the weights are read from.
pub(crate) trait TensorSource {
    /// The source's name for a role (`layer` is ignored for global tensors).
    fn name(&self, role: TensorRole, layer: usize) -> String;
    fn has(&self, name: &str) -> bool;
    /// A `[rows, cols]` matrix, checked against the expected shape.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, EngineError>;
    /// A vector of `len` elements, converted to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError>;
}

impl ModelWeights {
    /// Reads every tensor the config calls for. A missing `lm_head` falls back to the
    /// embedding (tied weights).
    pub(crate) fn load(config: &ModelConfig, src: &dyn TensorSource) -> Result<Self, EngineError> {
        let (h, q, kv, ff) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
        );
        let embed = src.matrix(&src.name(TensorRole::Embed, 0), config.vocab_size, h)?;
        let head_name = src.name(TensorRole::LmHead, 0);
        let lm_head = if src.has(&head_name) {
            src.matrix(&head_name, config.vocab_size, h)?
        } else {
            embed.clone()
        };
        let final_norm = src.vector(&src.name(TensorRole::FinalNorm, 0), h)?;
        let layers = (0..config.num_layers)
            .map(|i| {
                let name = |role| src.name(role, i);
                let bias = |role, len| {
                    let n = name(role);
                    if src.has(&n) {
                        src.vector(&n, len).map(Some)
                    } else if config.attention_bias {
                        Err(EngineError::MissingTensor { name: n })
                    } else {
                        Ok(None)
                    }
                };
                Ok(LayerWeights {
                    attn_norm: src.vector(&name(TensorRole::AttnNorm), h)?,
                    wq: src.matrix(&name(TensorRole::Q), q, h)?,
                    wk: src.matrix(&name(TensorRole::K), kv, h)?,
                    wv: src.matrix(&name(TensorRole::V), kv, h)?,
                    wo: src.matrix(&name(TensorRole::O), h, q)?,
                    bq: bias(TensorRole::QBias, q)?,
                    bk: bias(TensorRole::KBias, kv)?,
                    bv: bias(TensorRole::VBias, kv)?,
                    ffn_norm: src.vector(&name(TensorRole::FfnNorm), h)?,
                    w_gate: src.matrix(&name(TensorRole::Gate), ff, h)?,
                    w_up: src.matrix(&name(TensorRole::Up), ff, h)?,
                    w_down: src.matrix(&name(TensorRole::Down), h, ff)?,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(Self {
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }
}
