//! Request bodies of `/v1/completions` and `/v1/chat/completions`, with the fields vLLM accepts.
//! Numbers are read wide (i64/f64) so out-of-range values get a clear 400 from
//! [`validate`](super::validate) instead of a type error. Fields the server does not know land
//! in `unknown` and are refused with a 400 naming them: a field is served with its meaning or
//! refused, never dropped (vLLM drops them with a warning; a client asking for a JSON schema
//! would get free text with a 200).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// `prompt`: text, several texts, token ids, or several token-id lists.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling and stopping fields shared by both routes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub ignore_eos: Option<bool>,
    pub n: Option<i64>,
    pub user: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_p: Option<f64>,
    pub min_tokens: Option<i64>,
    pub logit_bias: Option<Value>,
    /// vLLM extension: words the output must not contain.
    pub bad_words: Option<Vec<String>>,
    pub response_format: Option<Value>,
    /// Accepted without effect on the output (OpenAI's stored-completion tags).
    pub metadata: Option<Value>,
    /// vLLM extension: logprobs name tokens as `token_id:<id>` instead of their text.
    pub return_tokens_as_token_ids: Option<bool>,
}

/// Fields of a request body that no struct field took, by name.
pub type UnknownFields = BTreeMap<String, Value>;

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub echo: Option<bool>,
    pub logprobs: Option<Value>,
    pub best_of: Option<i64>,
    pub suffix: Option<Value>,
    /// Must come after every other flattened field: serde gives it what they left.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// One content part of a chat message; only text parts are supported.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// vLLM extension: end the prompt with the assistant's turn header (default true).
    pub add_generation_prompt: Option<bool>,
    /// Must come after every other flattened field: serde gives it what they left.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `POST /tokenize` (vLLM's shape): a completion `prompt` or chat `messages`, exactly one.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// Default true for a prompt (BOS as the completions route adds it), false for messages
    /// (the template writes them).
    pub add_special_tokens: Option<bool>,
    /// Messages only (default true).
    pub add_generation_prompt: Option<bool>,
    /// Also return each token's text.
    pub return_token_strs: Option<bool>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
    #[serde(flatten)]
    pub unknown: UnknownFields,
}
