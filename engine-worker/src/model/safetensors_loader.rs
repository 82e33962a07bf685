//! Hugging Face model directories: `config.json`, one or more `*.safetensors` (f32/f16/bf16)
//! and, optionally, `tokenizer.json`. q/k stay in the Hugging Face layout, which RoPE reads
//! half-split ([`RopeStyle::HalfSplit`](super::RopeStyle)).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::config::ModelConfig;
use super::dtype::WeightType;
use super::tensor::{Blob, WeightMatrix};
use super::weights::{ModelWeights, TensorRole, TensorSource};
use super::{Model, TokenizerData};
use crate::EngineError;

struct Entry {
    blob: Blob,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute offset of the data in the blob.
    offset: usize,
    len: usize,
}

struct SafetensorsSource {
    tensors: HashMap<String, Entry>,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::ModelIo {
        path: path.display().to_string(),
        source,
    }
}

/// Loads a Hugging Face model directory.
pub fn load_hf_dir(dir: &Path) -> Result<Model, EngineError> {
    let config = hf_config(dir)?;
    let mut tensors = HashMap::new();
    for path in &safetensors_files(dir)? {
        let file = std::fs::File::open(path).map_err(io_err(path))?;
        // SAFETY: read-only mapping of a model file that is not modified while in use.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?);
        let bad = |reason: String| EngineError::UnsupportedModel {
            path: path.display().to_string(),
            reason,
        };
        let (header_len, meta) =
            SafeTensors::read_metadata(&map[..]).map_err(|e| bad(e.to_string()))?;
        for (name, info) in meta.tensors() {
            let (start, end) = info.data_offsets;
            tensors.insert(
                name,
                Entry {
                    blob: Blob::Mmap(map.clone()),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset: 8 + header_len + start,
                    len: end - start,
                },
            );
        }
    }
    let src = SafetensorsSource { tensors };
    let weights = ModelWeights::load(&config, &src)?;
    let tokenizer = hf_tokenizer(dir, config.vocab_size)?;
    Ok(Model {
        config,
        weights,
        tokenizer,
    })
}

/// The `*.safetensors` files of `dir`, in name order (at least one).
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::UnsupportedModel {
            path: dir.display().to_string(),
            reason: "no *.safetensors files".into(),
        });
    }
    Ok(files)
}

/// Reads `config.json` of a Hugging Face model directory.
pub fn hf_config(dir: &Path) -> Result<ModelConfig, EngineError> {
    let path = dir.join("config.json");
    let json = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    ModelConfig::from_hf_config_json(&json, &vocab::served_model_name(dir))
}

fn weight_type(dtype: Dtype) -> Option<WeightType> {
    match dtype {
        Dtype::F32 => Some(WeightType::F32),
        Dtype::F16 => Some(WeightType::F16),
        Dtype::BF16 => Some(WeightType::BF16),
        _ => None,
    }
}

impl SafetensorsSource {
    fn entry(&self, name: &str, expected: &[usize]) -> Result<(&Entry, WeightType), EngineError> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_owned(),
            })?;
        if e.shape != expected {
            return Err(EngineError::TensorShape {
                name: name.to_owned(),
                expected: expected.to_vec(),
                actual: e.shape.clone(),
            });
        }
        let dtype = weight_type(e.dtype).ok_or_else(|| EngineError::UnsupportedTensorType {
            name: name.to_owned(),
            dtype: format!("{:?}", e.dtype),
        })?;
        let want = dtype.row_bytes(expected.iter().product());
        if e.len != want || e.offset + e.len > e.blob.bytes().len() {
            return Err(EngineError::InvalidConfig(format!(
                "tensor {name}: {} data bytes, expected {want}",
                e.len
            )));
        }
        Ok((e, dtype))
    }
}

impl TensorSource for SafetensorsSource {
    fn name(&self, role: TensorRole, layer: usize) -> String {
        let l = |s: &str| format!("model.layers.{layer}.{s}");
        match role {
            TensorRole::Embed => "model.embed_tokens.weight".into(),
            TensorRole::FinalNorm => "model.norm.weight".into(),
            TensorRole::LmHead => "lm_head.weight".into(),
            TensorRole::AttnNorm => l("input_layernorm.weight"),
            TensorRole::Q => l("self_attn.q_proj.weight"),
            TensorRole::K => l("self_attn.k_proj.weight"),
            TensorRole::V => l("self_attn.v_proj.weight"),
            TensorRole::O => l("self_attn.o_proj.weight"),
            TensorRole::QBias => l("self_attn.q_proj.bias"),
            TensorRole::KBias => l("self_attn.k_proj.bias"),
            TensorRole::VBias => l("self_attn.v_proj.bias"),
            TensorRole::FfnNorm => l("post_attention_layernorm.weight"),
            TensorRole::Gate => l("mlp.gate_proj.weight"),
            TensorRole::Up => l("mlp.up_proj.weight"),
            TensorRole::Down => l("mlp.down_proj.weight"),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, EngineError> {
        let (e, dtype) = self.entry(name, &[rows, cols])?;
        WeightMatrix::new(name, dtype, rows, cols, e.blob.clone(), e.offset)
            .ok_or_else(|| EngineError::InvalidConfig(format!("tensor {name} out of bounds")))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let (e, dtype) = self.entry(name, &[len])?;
        let bytes = &e.blob.bytes()[e.offset..e.offset + e.len];
        Ok(match dtype {
            WeightType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            WeightType::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }
}

#[derive(Deserialize)]
struct HfTokenizer {
    model: HfTokenizerModel,
    #[serde(default)]
    added_tokens: Vec<HfAddedToken>,
    decoder: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct HfTokenizerModel {
    #[serde(default)]
    vocab: HashMap<String, u32>,
}

#[derive(Deserialize)]
struct HfAddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
}

/// Token strings from `tokenizer.json`, in the GGUF convention (`model` "gpt2" for byte-level
/// BPE, "llama" for SentencePiece-style; special added tokens are control tokens, the other
/// added tokens user-defined, as the api-server reads them).
fn hf_tokenizer(dir: &Path, vocab_size: usize) -> Result<Option<TokenizerData>, EngineError> {
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        return Ok(None);
    }
    let json = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    let tok: HfTokenizer = serde_json::from_str(&json)
        .map_err(|e| EngineError::InvalidConfig(format!("{}: {e}", path.display())))?;
    let decoder = tok.decoder.as_ref().map(|d| d.to_string());
    let byte_level =
        vocab::VocabKind::from_hf_decoder(decoder.as_deref()) == vocab::VocabKind::ByteLevel;
    let mut tokens = vec![String::new(); vocab_size];
    let mut token_types = vec![1i32; vocab_size];
    for (text, id) in tok.model.vocab {
        if let Some(slot) = tokens.get_mut(id as usize) {
            *slot = text;
        }
    }
    for added in tok.added_tokens {
        let id = added.id as usize;
        if id < vocab_size {
            tokens[id] = added.content;
            token_types[id] = if added.special {
                vocab::token_bytes::TOKEN_TYPE_CONTROL
            } else {
                vocab::token_bytes::TOKEN_TYPE_USER_DEFINED
            };
        }
    }
    Ok(Some(TokenizerData {
        model: Some(if byte_level { "gpt2" } else { "llama" }.into()),
        tokens,
        token_types: Some(token_types),
    }))
}
