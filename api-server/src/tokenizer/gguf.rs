//! Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (llama.cpp's layout):
//! `model` = "gpt2" (byte-level BPE), `tokens`, `merges`, `token_type` (3 = control token,
//! matched whole), `bos_token_id` / `eos_token_id`, `add_bos_token`, and `pre`, the
//! pre-tokenizer's name.

use gguf::Metadata;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use vocab::token_bytes::{TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};
use vocab::{TokenBytes, VocabKind};

use super::{BosPolicy, Tokenizer};
use crate::error::ApiError;

fn load_err(reason: impl Into<String>) -> ApiError {
    ApiError::ModelLoad {
        what: "GGUF tokenizer".into(),
        reason: reason.into(),
    }
}

fn meta_err(e: gguf::GgufError) -> ApiError {
    load_err(e.to_string())
}

/// Pre-tokenizers by GGUF `tokenizer.ggml.pre` name. Each name is a regex recipe in llama.cpp;
/// the ones supported here are GPT-2's byte-level split, optionally after splitting digits.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, ApiError> {
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        // SmolLM / StarCoder: every digit on its own, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" => {
            Ok(Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into())
        }
        "default" | "gpt2" | "gpt-2" => Ok(byte_level.into()),
        other => Err(load_err(format!("unsupported pre-tokenizer {other:?}"))),
    }
}

/// Builds the tokenizer from GGUF metadata.
pub fn from_metadata(meta: &Metadata) -> Result<Tokenizer, ApiError> {
    let model = meta.get_str("tokenizer.ggml.model").map_err(meta_err)?;
    if model != "gpt2" {
        return Err(load_err(format!(
            "unsupported tokenizer model {model:?} (only gpt2 BPE)"
        )));
    }
    let tokens = meta
        .get_str_array("tokenizer.ggml.tokens")
        .map_err(meta_err)?;
    let merges = meta
        .get_str_array("tokenizer.ggml.merges")
        .map_err(meta_err)?;
    let types = match meta.get_i32_array("tokenizer.ggml.token_type") {
        Ok(t) => t,
        Err(_) => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(load_err("token_type and tokens differ in length"));
    }
    let pre = meta.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let bos_id = meta.get_u32("tokenizer.ggml.bos_token_id").ok();
    let eos_id = meta.get_u32("tokenizer.ggml.eos_token_id").ok();
    let add_bos = meta
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(false);

    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    let merge_pairs = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| load_err(format!("merge {m:?} is not a pair")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merge_pairs)
        .build()
        .map_err(|e| load_err(e.to_string()))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    // Control and user-defined tokens are matched whole in text.
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
        .map(|(token, &ty)| AddedToken::from(token.clone(), ty == TOKEN_TYPE_CONTROL))
        .collect();
    inner.add_special_tokens(&added);
    let token_bytes = TokenBytes::new(tokens, Some(&types), VocabKind::ByteLevel);

    for (name, id) in [("bos_token_id", bos_id), ("eos_token_id", eos_id)] {
        if id.is_some_and(|id| id as usize >= tokens.len()) {
            return Err(load_err(format!("{name} outside the vocabulary")));
        }
    }
    let bos_policy = if add_bos {
        BosPolicy::Prepend
    } else {
        BosPolicy::Never
    };
    Ok(Tokenizer::from_parts(
        inner,
        token_bytes,
        bos_id,
        eos_id,
        bos_policy,
    ))
}
