//! EAGLE-3 draft heads (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
//! Language Models via Training-Time Test", <https://arxiv.org/abs/2503.01840>), in the
//! checkpoint layout vLLM and SGLang load: a Hugging Face `config.json` whose architecture is
//! `LlamaForCausalLMEagle3` (or `Eagle3LlamaForCausalLM`) with `draft_vocab_size` and
//! `eagle_config.eagle_aux_hidden_state_layer_ids`, and safetensors holding `fc` (the fusion of
//! the target's low, middle and high hidden states), one decoder layer (`midlayer.*`, or
//! `layers.0.*`) whose attention reads `[embedding, hidden]` side by side, `norm`, `lm_head` over
//! the draft vocabulary and `d2t`/`t2d`, the map between draft and target token ids (target id =
//! draft id + `d2t[draft id]`). The token embedding is the target's unless the file has its own
//! `embed_tokens.weight`.
//!
//! A head is refused at load time, naming what differs, when it does not fit the target.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::config::ModelConfig;
use super::dtype::{quantize_row, WeightType};
use super::tensor::WeightMatrix;
use crate::EngineError;

/// Architectures a draft head's `config.json` may name.
const ARCHITECTURES: [&str; 2] = ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"];

/// EAGLE-3's default layers for a target of `num_layers`: the residual stream entering layers
/// 2, N/2 and N-3 (low, middle, high), as vLLM and SpecForge take them.
pub fn default_aux_layers(num_layers: usize) -> Vec<usize> {
    vec![
        2.min(num_layers.saturating_sub(1)),
        num_layers / 2,
        num_layers.saturating_sub(3),
    ]
}

/// A draft head's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadConfig {
    /// Directory name, for `proposer="head:<name>"`.
    pub name: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub max_position_embeddings: usize,
    /// The target's vocabulary size.
    pub vocab_size: usize,
    pub draft_vocab_size: usize,
    /// Target layers whose incoming hidden states the head reads, in order.
    pub aux_layers: Vec<usize>,
    /// Hidden size of the target's states (`fc` reads three of them).
    pub target_hidden_size: usize,
    /// `norm_before_residual`: the residual is the normed hidden state (false in EAGLE-3's own
    /// checkpoints).
    pub norm_before_residual: bool,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    vocab_size: usize,
    draft_vocab_size: Option<usize>,
    #[serde(default = "one")]
    num_hidden_layers: usize,
    target_hidden_size: Option<usize>,
    #[serde(default)]
    norm_before_residual: bool,
    eagle_config: Option<RawEagleConfig>,
    /// The speculators format puts the layer ids at the top level.
    eagle_aux_hidden_state_layer_ids: Option<Vec<usize>>,
}

#[derive(Deserialize)]
struct RawEagleConfig {
    eagle_aux_hidden_state_layer_ids: Option<Vec<usize>>,
    use_aux_hidden_state: Option<bool>,
}

fn default_eps() -> f32 {
    1e-5
}
fn default_theta() -> f32 {
    10_000.0
}
fn default_max_pos() -> usize {
    8192
}
fn one() -> usize {
    1
}

impl HeadConfig {
    /// Parses a head's `config.json` for a target of `target_layers` layers (the default
    /// layer ids depend on it).
    pub fn from_json(json: &str, name: &str, target_layers: usize) -> Result<Self, EngineError> {
        let bad =
            |reason: String| EngineError::InvalidConfig(format!("draft head {name}: {reason}"));
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if !raw
            .architectures
            .iter()
            .any(|a| ARCHITECTURES.contains(&a.as_str()))
        {
            return Err(bad(format!(
                "architectures {:?} name no EAGLE-3 head (expected one of {ARCHITECTURES:?})",
                raw.architectures
            )));
        }
        if raw.num_hidden_layers != 1 {
            return Err(bad(format!(
                "{} decoder layers: only one-layer heads are served",
                raw.num_hidden_layers
            )));
        }
        let eagle = raw.eagle_config.as_ref();
        if eagle.and_then(|e| e.use_aux_hidden_state) == Some(false) {
            return Err(bad(
                "use_aux_hidden_state is false (an EAGLE-1/2 head)".into()
            ));
        }
        let aux_layers = eagle
            .and_then(|e| e.eagle_aux_hidden_state_layer_ids.clone())
            .or(raw.eagle_aux_hidden_state_layer_ids)
            .unwrap_or_else(|| default_aux_layers(target_layers));
        if aux_layers.len() != 3 {
            return Err(bad(format!(
                "{} auxiliary layers {aux_layers:?}: EAGLE-3 fuses three",
                aux_layers.len()
            )));
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if raw.num_attention_heads == 0 || num_kv_heads == 0 {
            return Err(bad("no attention heads".into()));
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        let cfg = Self {
            name: name.to_owned(),
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw.rope_theta,
            max_position_embeddings: raw.max_position_embeddings,
            vocab_size: raw.vocab_size,
            draft_vocab_size: raw.draft_vocab_size.unwrap_or(raw.vocab_size),
            aux_layers,
            target_hidden_size: raw.target_hidden_size.unwrap_or(raw.hidden_size),
            norm_before_residual: raw.norm_before_residual,
        };
        cfg.as_layer_config()
            .validate()
            .map_err(|e| bad(e.to_string()))?;
        if cfg.draft_vocab_size == 0 || cfg.draft_vocab_size > cfg.vocab_size {
            return Err(bad(format!(
                "draft_vocab_size {} must be 1 to vocab_size {}",
                cfg.draft_vocab_size, cfg.vocab_size
            )));
        }
        Ok(cfg)
    }

    /// Why this head cannot draft for `target`, naming each field that differs (`None` when
    /// it fits). `own_embedding`: the file brings its own token embedding.
    pub fn mismatch(&self, target: &ModelConfig, own_embedding: bool) -> Option<String> {
        let mut diffs = Vec::new();
        let mut differs = |field: &str, head: String, target: String| {
            if head != target {
                diffs.push(format!(
                    "{field} is {head} in the head, {target} in the target"
                ));
            }
        };
        differs(
            "vocab_size",
            self.vocab_size.to_string(),
            target.vocab_size.to_string(),
        );
        differs(
            "target_hidden_size",
            self.target_hidden_size.to_string(),
            target.hidden_size.to_string(),
        );
        if !own_embedding {
            // The target's embedding rows sit beside the head's hidden state.
            differs(
                "hidden_size",
                self.hidden_size.to_string(),
                target.hidden_size.to_string(),
            );
        }
        if let Some(&l) = self.aux_layers.iter().find(|&&l| l >= target.num_layers) {
            diffs.push(format!(
                "auxiliary layer {l} is past the target's {} layers",
                target.num_layers
            ));
        }
        (!diffs.is_empty()).then(|| diffs.join("; "))
    }

    /// The head's decoder layer as a one-layer model shape (its KV cache and attention).
    pub fn as_layer_config(&self) -> ModelConfig {
        ModelConfig {
            name: self.name.clone(),
            vocab_size: self.draft_vocab_size.max(1),
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: 1,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rope_theta: self.rope_theta,
            rope_style: super::RopeStyle::HalfSplit,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            attention_bias: false,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        }
    }
}

/// A draft head's weights, matrices in the precision the worker asked for.
#[derive(Debug, Clone)]
pub struct HeadWeights {
    pub config: HeadConfig,
    /// `[hidden, 3 * target_hidden]`: fuses the three captured states.
    pub fc: WeightMatrix,
    pub input_norm: Vec<f32>,
    pub hidden_norm: Vec<f32>,
    /// `[q_dim, 2 * hidden]`, `[kv_dim, 2 * hidden]` twice, `[hidden, q_dim]`.
    pub wq: WeightMatrix,
    pub wk: WeightMatrix,
    pub wv: WeightMatrix,
    pub wo: WeightMatrix,
    pub post_attn_norm: Vec<f32>,
    pub w_gate: WeightMatrix,
    pub w_up: WeightMatrix,
    pub w_down: WeightMatrix,
    pub final_norm: Vec<f32>,
    /// `[draft_vocab, hidden]`.
    pub lm_head: WeightMatrix,
    /// Target id of each draft id.
    pub draft_to_target: Vec<u32>,
    /// `[vocab, hidden]` when the file has its own embedding (else the target's is used).
    pub embed: Option<WeightMatrix>,
}

impl HeadWeights {
    /// Loads the head in directory `dir` for `target`, its matrices stored as `dtype` (F32,
    /// F16, BF16 or Q8_0).
    pub fn load(dir: &Path, target: &ModelConfig, dtype: WeightType) -> Result<Self, EngineError> {
        let name = vocab::served_model_name(dir);
        let path = dir.join("config.json");
        let json = std::fs::read_to_string(&path).map_err(|source| EngineError::ModelIo {
            path: path.display().to_string(),
            source,
        })?;
        let config = HeadConfig::from_json(&json, &name, target.num_layers)?;
        let tensors = HeadTensors::read(dir)?;
        let own_embedding = tensors.has("embed_tokens.weight");
        if let Some(reason) = config.mismatch(target, own_embedding) {
            return Err(EngineError::DraftHeadMismatch {
                head: name,
                target: target.name.clone(),
                reason,
            });
        }
        let c = &config;
        let (h, q, kv, ff) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        let m = |n: &str, rows, cols| tensors.matrix(n, rows, cols, dtype);
        let v = |n: &str, len| tensors.vector(n, len);
        let draft_to_target = tensors.draft_to_target(c.draft_vocab_size, c.vocab_size)?;
        Ok(Self {
            fc: m("fc.weight", h, 3 * c.target_hidden_size)?,
            input_norm: v("midlayer.input_layernorm.weight", h)?,
            hidden_norm: v("midlayer.hidden_norm.weight", h)?,
            wq: m("midlayer.self_attn.q_proj.weight", q, 2 * h)?,
            wk: m("midlayer.self_attn.k_proj.weight", kv, 2 * h)?,
            wv: m("midlayer.self_attn.v_proj.weight", kv, 2 * h)?,
            wo: m("midlayer.self_attn.o_proj.weight", h, q)?,
            post_attn_norm: v("midlayer.post_attention_layernorm.weight", h)?,
            w_gate: m("midlayer.mlp.gate_proj.weight", ff, h)?,
            w_up: m("midlayer.mlp.up_proj.weight", ff, h)?,
            w_down: m("midlayer.mlp.down_proj.weight", h, ff)?,
            final_norm: v("norm.weight", h)?,
            lm_head: m("lm_head.weight", c.draft_vocab_size, h)?,
            embed: match own_embedding {
                true => Some(m("embed_tokens.weight", c.vocab_size, h)?),
                false => None,
            },
            draft_to_target,
            config,
        })
    }

    /// Bytes of weights one draft token reads (every matrix once; the embedding row aside).
    pub fn bytes_per_token(&self) -> usize {
        [
            &self.fc,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
            &self.lm_head,
        ]
        .iter()
        .map(|w| w.rows * w.row_bytes())
        .sum()
    }
}

/// The tensors of a head's safetensors files, decoded to f32 (heads are small).
struct HeadTensors {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl HeadTensors {
    fn read(dir: &Path) -> Result<Self, EngineError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| EngineError::ModelIo { path, source }
        };
        let mut tensors = HashMap::new();
        for path in super::safetensors_loader::safetensors_files(dir)? {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let st =
                SafeTensors::deserialize(&bytes).map_err(|e| EngineError::UnsupportedModel {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            for (name, view) in st.tensors() {
                // vLLM's own names for the layer and a `model.` prefix are read as the published ones.
                let name = name
                    .trim_start_matches("model.")
                    .replace("layers.0.", "midlayer.");
                let values = decode(&name, view.dtype(), view.data())?;
                tensors.insert(name, (view.shape().to_vec(), values));
            }
        }
        Ok(Self { tensors })
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<&[f32], EngineError> {
        let (actual, values) =
            self.tensors
                .get(name)
                .ok_or_else(|| EngineError::MissingTensor {
                    name: name.to_owned(),
                })?;
        if actual != shape {
            return Err(EngineError::TensorShape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                actual: actual.clone(),
            });
        }
        Ok(values)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        Ok(self.get(name, &[len])?.to_vec())
    }

    fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        dtype: WeightType,
    ) -> Result<WeightMatrix, EngineError> {
        let values = self.get(name, &[rows, cols])?;
        let (block, _) = dtype.block_layout();
        // A quantized type needs whole blocks per row; keep such a matrix in f32.
        let dtype = match cols.is_multiple_of(block) {
            true => dtype,
            false => WeightType::F32,
        };
        let mut data = Vec::with_capacity(rows * dtype.row_bytes(cols));
        for row in values.chunks_exact(cols) {
            quantize_row(dtype, row, &mut data);
        }
        WeightMatrix::owned(name, dtype, rows, cols, data)
            .ok_or_else(|| EngineError::InvalidConfig(format!("tensor {name} out of bounds")))
    }

    /// `d2t` as target ids (checked to be inside the vocabulary and distinct), or the identity
    /// for a head over the whole vocabulary.
    fn draft_to_target(&self, draft_vocab: usize, vocab: usize) -> Result<Vec<u32>, EngineError> {
        let Some((shape, offsets)) = self.tensors.get("d2t") else {
            if draft_vocab == vocab {
                return Ok((0..vocab as u32).collect());
            }
            return Err(EngineError::MissingTensor { name: "d2t".into() });
        };
        if shape.as_slice() != [draft_vocab] {
            return Err(EngineError::TensorShape {
                name: "d2t".into(),
                expected: vec![draft_vocab],
                actual: shape.clone(),
            });
        }
        let mut seen = vec![false; vocab];
        offsets
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let id = i as i64 + d as i64;
                match usize::try_from(id).ok().filter(|&t| t < vocab) {
                    Some(t) if !std::mem::replace(&mut seen[t], true) => Ok(t as u32),
                    _ => Err(EngineError::InvalidConfig(format!(
                        "d2t maps draft token {i} to {id}, outside the vocabulary of {vocab} or twice"
                    ))),
                }
            })
            .collect()
    }
}

/// A tensor's values as f32 (`d2t`'s int64 offsets are exact in f32 up to 2^24).
fn decode(name: &str, dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, EngineError> {
    Ok(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        Dtype::BOOL | Dtype::U8 => data.iter().map(|&b| f32::from(b)).collect(),
        other => {
            return Err(EngineError::UnsupportedTensorType {
                name: name.to_owned(),
                dtype: format!("{other:?}"),
            })
        }
    })
}
