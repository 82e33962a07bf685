//! Llama-family models from GGUF files (llama.cpp's format): `llama` (also SmolLM2, Mistral
//! exported as llama), `mistral` and `qwen2` architectures.

use std::path::Path;
use std::sync::Arc;

use gguf::{GgufFile, Metadata, OptionalKey};

use super::config::{ModelConfig, RopeStyle};
use super::dtype::{dequantize_row, WeightType};
use super::tensor::{Blob, WeightMatrix};
use super::weights::{ModelWeights, TensorRole, TensorSource};
use super::{Model, TokenizerData};
use crate::huge_pages::HugeBuf;
use crate::EngineError;

struct GgufSource {
    file: Arc<GgufFile>,
    /// The file's bytes copied onto huge pages (see `huge_pages`): the weights the kernels
    /// stream every step, read through a few hundred TLB entries instead of tens of thousands.
    blob: Blob,
}

fn meta_err(path: &Path) -> impl Fn(gguf::GgufError) -> EngineError + '_ {
    move |source| EngineError::Gguf {
        path: path.display().to_string(),
        source,
    }
}

/// Opens a GGUF model: hyper-parameters, tokenizer fields and weights (still quantized, copied
/// onto huge pages).
pub fn load_gguf(path: &Path) -> Result<Model, EngineError> {
    let file = Arc::new(GgufFile::open(path).map_err(meta_err(path))?);
    let config = config_from_gguf(&file, path)?;
    let tokenizer = tokenizer_from_gguf(file.metadata()).map_err(meta_err(path))?;
    let copy = HugeBuf::copy_of(file.bytes()).map_err(|source| EngineError::ModelIo {
        path: path.display().to_string(),
        source,
    })?;
    let src = GgufSource {
        file,
        blob: Blob::Huge(Arc::new(copy)),
    };
    let weights = ModelWeights::load(&config, &src)?;
    Ok(Model {
        config,
        weights,
        tokenizer,
    })
}

/// Reads only the hyper-parameters of a GGUF model (e.g. for dummy weights of its shape).
pub fn gguf_config(path: &Path) -> Result<ModelConfig, EngineError> {
    let file = GgufFile::open(path).map_err(meta_err(path))?;
    config_from_gguf(&file, path)
}

fn config_from_gguf(file: &GgufFile, path: &Path) -> Result<ModelConfig, EngineError> {
    let m = file.metadata();
    let err = meta_err(path);
    let arch = m.get_str("general.architecture").map_err(&err)?;
    let (rope_style, attention_bias) = match arch {
        "llama" | "mistral" => (RopeStyle::Interleaved, false),
        // llama.cpp's converter leaves qwen2's q/k unpermuted and runs NeoX-style RoPE.
        "qwen2" => (RopeStyle::HalfSplit, true),
        other => {
            return Err(EngineError::UnsupportedArchitecture {
                architecture: other.to_owned(),
            })
        }
    };
    let key = |k: &str| format!("{arch}.{k}");
    let usize_key = |k: &str| m.get_usize(&key(k)).map_err(&err);

    let hidden_size = usize_key("embedding_length")?;
    let num_heads = usize_key("attention.head_count")?;
    let num_kv_heads = m
        .get_usize(&key("attention.head_count_kv"))
        .optional()
        .map_err(&err)?
        .unwrap_or(num_heads);
    let head_dim = m
        .get_usize(&key("attention.key_length"))
        .optional()
        .map_err(&err)?
        .unwrap_or(hidden_size / num_heads.max(1));
    check_rope(file, arch, head_dim, path)?;

    // The embedding's row count is the logits' width; the token list only names them.
    let vocab_size = match file.tensor("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        _ => m.get_array("tokenizer.ggml.tokens").map_err(&err)?.len(),
    };
    let eos_token_ids = eos_token_ids(m).map_err(&err)?;
    let config = ModelConfig {
        name: vocab::served_model_name(path),
        vocab_size,
        hidden_size,
        intermediate_size: usize_key("feed_forward_length")?,
        num_layers: usize_key("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: m
            .get_f32(&key("rope.freq_base"))
            .optional()
            .map_err(&err)?
            .unwrap_or(10_000.0),
        rope_style,
        rms_norm_eps: m
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .map_err(&err)?,
        max_position_embeddings: usize_key("context_length")?,
        attention_bias,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        bos_token_id: m
            .get_u32("tokenizer.ggml.bos_token_id")
            .optional()
            .map_err(&err)?,
        eos_token_ids,
    };
    config.validate()?;
    Ok(config)
}

/// Refuses the RoPE variants the backends do not implement: partial rotary embeddings, scaling
/// and frequency factors.
fn check_rope(
    file: &GgufFile,
    arch: &str,
    head_dim: usize,
    path: &Path,
) -> Result<(), EngineError> {
    let m = file.metadata();
    let err = meta_err(path);
    let key = |k: &str| format!("{arch}.{k}");
    let unsupported = |reason: String| EngineError::UnsupportedModel {
        path: path.display().to_string(),
        reason,
    };
    if let Some(rot) = m
        .get_usize(&key("rope.dimension_count"))
        .optional()
        .map_err(&err)?
    {
        if rot != head_dim {
            return Err(unsupported(format!(
                "partial rotary embeddings (rope.dimension_count {rot} != head_dim {head_dim})"
            )));
        }
    }
    if let Some(scaling) = m
        .get_str(&key("rope.scaling.type"))
        .optional()
        .map_err(&err)?
    {
        if scaling != "none" {
            return Err(unsupported(format!("RoPE scaling {scaling:?}")));
        }
    }
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(unsupported(
            "RoPE frequency factors (rope_freqs.weight)".into(),
        ));
    }

    Ok(())
}

/// The end-of-sequence, end-of-turn and end-of-message ids, each once.
fn eos_token_ids(m: &Metadata) -> Result<Vec<u32>, gguf::GgufError> {
    let mut eos_token_ids = Vec::new();
    for k in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = m.get_u32(k).optional()? {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    Ok(eos_token_ids)
}

fn tokenizer_from_gguf(m: &Metadata) -> Result<Option<TokenizerData>, gguf::GgufError> {
    let Some(tokens) = m.get_str_array("tokenizer.ggml.tokens").optional()? else {
        return Ok(None);
    };
    Ok(Some(TokenizerData {
        model: m
            .get_str("tokenizer.ggml.model")
            .optional()?
            .map(str::to_owned),
        tokens: tokens.to_vec(),
        token_types: m.get_i32_array("tokenizer.ggml.token_type").optional()?,
    }))
}

impl TensorSource for GgufSource {
    fn name(&self, role: TensorRole, layer: usize) -> String {
        let blk = |s: &str| format!("blk.{layer}.{s}");
        match role {
            TensorRole::Embed => "token_embd.weight".into(),
            TensorRole::FinalNorm => "output_norm.weight".into(),
            TensorRole::LmHead => "output.weight".into(),
            TensorRole::AttnNorm => blk("attn_norm.weight"),
            TensorRole::Q => blk("attn_q.weight"),
            TensorRole::K => blk("attn_k.weight"),
            TensorRole::V => blk("attn_v.weight"),
            TensorRole::O => blk("attn_output.weight"),
            TensorRole::QBias => blk("attn_q.bias"),
            TensorRole::KBias => blk("attn_k.bias"),
            TensorRole::VBias => blk("attn_v.bias"),
            TensorRole::FfnNorm => blk("ffn_norm.weight"),
            TensorRole::Gate => blk("ffn_gate.weight"),
            TensorRole::Up => blk("ffn_up.weight"),
            TensorRole::Down => blk("ffn_down.weight"),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix, EngineError> {
        let info = self.info(name)?;
        let dtype = self.dtype(info)?;
        // ggml lists the contiguous dimension first.
        let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if shape != [rows, cols] {
            return Err(EngineError::TensorShape {
                name: name.to_owned(),
                expected: vec![rows, cols],
                actual: shape,
            });
        }
        let offset = (self.file.data_offset() + info.offset) as usize;
        WeightMatrix::new(name, dtype, rows, cols, self.blob.clone(), offset)
            .ok_or_else(|| EngineError::InvalidConfig(format!("tensor {name} data out of bounds")))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let info = self.info(name)?;
        let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if shape != [len] {
            return Err(EngineError::TensorShape {
                name: name.to_owned(),
                expected: vec![len],
                actual: shape,
            });
        }
        let dtype = self.dtype(info)?;
        let bytes = self
            .file
            .tensor_info_data(info)
            .map_err(|source| EngineError::Gguf {
                path: name.to_owned(),
                source,
            })?;
        let mut out = vec![0.0; len];
        dequantize_row(dtype, bytes, &mut out);
        Ok(out)
    }
}

impl GgufSource {
    fn info(&self, name: &str) -> Result<&gguf::TensorInfo, EngineError> {
        self.file
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_owned(),
            })
    }

    fn dtype(&self, info: &gguf::TensorInfo) -> Result<WeightType, EngineError> {
        WeightType::from_ggml(info.ggml_type).ok_or_else(|| EngineError::UnsupportedTensorType {
            name: info.name.clone(),
            dtype: info.ggml_type.to_string(),
        })
    }
}
