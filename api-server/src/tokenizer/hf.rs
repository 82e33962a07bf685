//! Loads an HF model directory's `tokenizer.json` (with `tokenizer_config.json` for the special
//! tokens and chat template).

use std::path::Path;

use serde_json::Value;

use vocab::{bytelevel, pieces};

use super::{BosPolicy, Tokenizer};
use crate::error::ApiError;

fn load_err(path: &Path, reason: impl std::fmt::Display) -> ApiError {
    ApiError::ModelLoad {
        what: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// What `tokenizer_config.json` adds to `tokenizer.json`.
#[derive(Debug, Default, Clone)]
pub struct HfTokenizerConfig {
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// `"<s>"` or `{"content": "<s>", ...}`.
fn token_field(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

pub fn read_config(dir: &Path) -> Result<HfTokenizerConfig, ApiError> {
    let path = dir.join("tokenizer_config.json");
    if !path.exists() {
        return Ok(HfTokenizerConfig::default());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| load_err(&path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| load_err(&path, e))?;
    let chat_template = match v.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        // A list of named templates: take the default one.
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template").and_then(Value::as_str).map(str::to_owned)),
        _ => None,
    };
    let chat_template = match chat_template {
        Some(t) => Some(t),
        // Newer checkouts keep it beside the config.
        None => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    Ok(HfTokenizerConfig {
        chat_template,
        bos_token: v.get("bos_token").and_then(token_field),
        eos_token: v.get("eos_token").and_then(token_field),
    })
}

/// Raw bytes of a vocabulary entry: byte-level text, a `<0xAB>` byte-fallback token, or a
/// SentencePiece piece (`▁` for a space).
fn piece_bytes(piece: &str) -> Vec<u8> {
    // A byte token is spelled in the byte-level alphabet too, so it must be tried first.
    if pieces::byte_token(piece).is_none() {
        if let Some(bytes) = bytelevel::token_to_bytes(piece) {
            return bytes;
        }
    }
    pieces::sentencepiece_bytes(piece)
}

pub fn load(dir: &Path, config: &HfTokenizerConfig) -> Result<Tokenizer, ApiError> {
    let path = dir.join("tokenizer.json");
    let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| load_err(&path, e))?;
    let size = inner.get_vocab_size(true);
    let added = inner.get_added_tokens_decoder();
    let mut token_bytes = Vec::with_capacity(size);
    let mut special = Vec::with_capacity(size);
    for id in 0..size as u32 {
        match (added.get(&id), inner.id_to_token(id)) {
            (Some(tok), _) => {
                token_bytes.push(tok.content.as_bytes().to_vec());
                special.push(tok.special);
            }
            (None, Some(piece)) => {
                token_bytes.push(piece_bytes(&piece));
                special.push(false);
            }
            (None, None) => {
                token_bytes.push(Vec::new());
                special.push(false);
            }
        }
    }
    let id_of = |t: &Option<String>| t.as_deref().and_then(|t| inner.token_to_id(t));
    let bos_id = id_of(&config.bos_token);
    let eos_id = id_of(&config.eos_token);
    Ok(Tokenizer::from_parts(
        inner,
        token_bytes,
        special,
        bos_id,
        eos_id,
        BosPolicy::PostProcessor,
    ))
}
