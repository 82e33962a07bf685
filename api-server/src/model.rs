//! What the api-server needs from the model: tokenizer, chat template and context length, read
//! from a GGUF file (metadata only) or an HF directory.

use std::path::Path;
use std::sync::Arc;

use crate::error::ApiError;
use crate::template::ChatTemplate;
use crate::tokenizer::{self, Tokenizer};

/// The model's text side.
#[derive(Debug)]
pub struct ModelAssets {
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    /// Training context length, when the model states one.
    pub context_length: Option<u32>,
}

fn load_err(path: &Path, reason: impl std::fmt::Display) -> ApiError {
    ApiError::ModelLoad {
        what: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl ModelAssets {
    /// Loads from a `.gguf` file or an HF model directory.
    pub fn load(path: &Path) -> Result<Self, ApiError> {
        if path.is_dir() {
            Self::from_hf_dir(path)
        } else {
            Self::from_gguf(path)
        }
    }

    pub fn from_gguf(path: &Path) -> Result<Self, ApiError> {
        let file = gguf::GgufFile::open(path).map_err(|e| load_err(path, e))?;
        let meta = file.metadata();
        let tokenizer = tokenizer::gguf::from_metadata(meta)?;
        let context_length = meta
            .get_str("general.architecture")
            .ok()
            .and_then(|arch| meta.get_u32(&format!("{arch}.context_length")).ok());
        let chat_template = match meta.get_str("tokenizer.chat_template") {
            Ok(source) => Some(Self::template(source, &tokenizer)?),
            Err(_) => None,
        };
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            chat_template,
            context_length,
        })
    }

    pub fn from_hf_dir(dir: &Path) -> Result<Self, ApiError> {
        let config = tokenizer::hf::read_config(dir)?;
        let tokenizer = tokenizer::hf::load(dir, &config)?;
        let chat_template = match &config.chat_template {
            Some(source) => Some(ChatTemplate::new(
                source,
                config.bos_token.clone().unwrap_or_default(),
                config.eos_token.clone().unwrap_or_default(),
            )?),
            None => None,
        };
        let context_length = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("max_position_embeddings").and_then(|n| n.as_u64()))
            .and_then(|n| u32::try_from(n).ok());
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            chat_template,
            context_length,
        })
    }

    fn template(source: &str, tokenizer: &Tokenizer) -> Result<ChatTemplate, ApiError> {
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
        };
        ChatTemplate::new(source, text(tokenizer.bos_id()), text(tokenizer.eos_id()))
    }
}

/// Every name a request may use for the model: the served name, the `--model` argument as
/// given (vLLM's default name), its file name and the file name without `.gguf`.
pub fn model_aliases(served: &str, model_arg: &Path) -> Vec<String> {
    let mut names = vec![served.to_owned(), model_arg.display().to_string()];
    if let Some(file) = model_arg
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
    {
        if let Some(stem) = file.strip_suffix(".gguf") {
            names.push(stem.to_owned());
        }
        names.push(file);
    }
    names.push(vocab::served_model_name(model_arg));
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_include_the_argument_and_its_file_names() {
        // The default name itself is tested in `vocab::model_name`.
        let aliases = model_aliases("smol", Path::new("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
        for a in [
            "smol",
            "models/SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct.Q4_1",
            "SmolLM2-135M-Instruct",
        ] {
            assert!(aliases.iter().any(|x| x == a), "{a}");
        }
    }
}
