//! Loads an HF model directory's `tokenizer.json` (with `tokenizer_config.json` for the special
//! tokens and chat template).

use std::path::Path;

use serde_json::Value;

use vocab::{Entry, TokenBytes, VocabKind};

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

pub fn load(dir: &Path, config: &HfTokenizerConfig) -> Result<Tokenizer, ApiError> {
    let path = dir.join("tokenizer.json");
    let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| load_err(&path, e))?;
    let size = inner.get_vocab_size(true);
    let added = inner.get_added_tokens_decoder();
    let pieces: Vec<Option<String>> = (0..size as u32).map(|id| inner.id_to_token(id)).collect();
    let entries =
        pieces
            .iter()
            .enumerate()
            .map(|(id, piece)| match (added.get(&(id as u32)), piece) {
                (Some(tok), _) if tok.special => Entry::Control(&tok.content),
                (Some(tok), _) => Entry::UserDefined(&tok.content),
                (None, Some(piece)) => Entry::Piece(piece),
                (None, None) => Entry::Missing,
            });
    let decoder = inner
        .get_decoder()
        .and_then(|d| serde_json::to_string(d).ok());
    let token_bytes =
        TokenBytes::from_entries(entries, VocabKind::from_hf_decoder(decoder.as_deref()));
    let id_of = |t: &Option<String>| t.as_deref().and_then(|t| inner.token_to_id(t));
    let bos_id = id_of(&config.bos_token);
    let eos_id = id_of(&config.eos_token);
    Ok(Tokenizer::from_parts(
        inner,
        token_bytes,
        bos_id,
        eos_id,
        BosPolicy::PostProcessor,
    ))
}
