//! Response bodies and stream chunks, field for field as vLLM/OpenAI write them, plus each
//! choice's `speculate_metrics` (the spec's per-request acceptance figures, `null` when
//! speculation is off or, on a stream, in every chunk but a choice's last).

use proto::SpeculateMetrics;

use super::logprobs::{ChatLogprobs, CompletionLogprobs};
use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// OpenAI's breakdown of the prompt; absent when the engine did not report one (a request
    /// that ended without its final figures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the worker's prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// With the prefix-cache hits, when known.
    pub fn with_cached_tokens(mut self, cached_tokens: Option<u32>) -> Self {
        self.prompt_tokens_details =
            cached_tokens.map(|cached_tokens| PromptTokensDetails { cached_tokens });
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// The stop string that ended the choice (vLLM's field), else null.
    pub stop_reason: Option<String>,
    pub speculate_metrics: Option<SpeculateMetrics>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<String>,
    pub speculate_metrics: Option<SpeculateMetrics>,
}

/// A response answered whole (not streamed); `choices` holds [`CompletionChoice`]s or
/// [`ChatChoice`]s.
#[derive(Debug, Clone, Serialize)]
pub struct WholeResponse<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    pub speculate_metrics: Option<SpeculateMetrics>,
}

/// A stream chunk; `choices` holds [`CompletionChoice`]s or [`ChatChunkChoice`]s. `usage` is
/// omitted unless the client asked for it (`stream_options.include_usage`), then `null` in every
/// chunk but the last, which has no choices (OpenAI's contract).
#[derive(Debug, Clone, Serialize)]
pub struct Chunk<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "UsageField::is_omitted")]
    pub usage: UsageField,
}

/// `usage` on a chunk: absent, `null`, or the totals.
#[derive(Debug, Clone, Copy)]
pub enum UsageField {
    Omitted,
    Null,
    Totals(Usage),
}

impl UsageField {
    /// `usage` on the ordinary chunks of a stream: `null` when the client asked for a usage
    /// chunk (`stream_options.include_usage`), absent otherwise.
    pub fn for_stream_chunks(include_usage: bool) -> Self {
        if include_usage {
            Self::Null
        } else {
            Self::Omitted
        }
    }

    fn is_omitted(&self) -> bool {
        matches!(self, Self::Omitted)
    }
}

impl Serialize for UsageField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Omitted | Self::Null => s.serialize_none(),
            Self::Totals(u) => u.serialize(s),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub parent: Option<String>,
    pub max_model_len: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `cmpl-…` / `chatcmpl-…`: a prefix and 32 random hex digits, as vLLM makes them.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// `POST /tokenize`'s answer (vLLM's shape).
#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: u32,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize`'s answer (vLLM's shape).
#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
