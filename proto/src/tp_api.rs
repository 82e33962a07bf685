//! token-processor ⇄ api-server. Each api-server connects (DEALER) to the token-processor's
//! ROUTER endpoint and says [`ApiToTp::Hello`]; it then receives the outputs of its own
//! requests only.

use serde::{Deserialize, Serialize};

use crate::api_worker::ApiHello;
use crate::{FinishReason, RequestId, SpeculateMetrics, TokenLogprob};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ApiToTp {
    Hello(ApiHello),
    Heartbeat { api_server_id: String, epoch: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpHello {
    pub protocol_version: u32,
    /// Changes on every token-processor start.
    pub epoch: u64,
    /// The engine-workers whose step batches the token-processor takes now (said hello, were
    /// admitted, not lost): an api-server routes only to these.
    pub workers: Vec<String>,
}

/// A request's token counts as the token-processor reports them at its end (the api-server
/// turns them into OpenAI's `usage`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCounts {
    pub prompt_tokens: u32,
    /// Of `prompt_tokens`, those served from the worker's prefix cache (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// What failed, for requests that end with [`FinishReason::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputErrorKind {
    /// The worker died, restarted (new epoch) or missed its heartbeats.
    WorkerLost,
    /// A step batch of the request's worker was lost; its figures would be wrong.
    StepGap,
    /// The worker refused or failed the request.
    Engine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputError {
    pub kind: OutputErrorKind,
    pub message: String,
}

/// New tokens of one request; the last output of a request carries `finish`, `usage` and
/// (when speculation is on) `speculate_metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestOutput {
    pub id: RequestId,
    /// Index in the request's output of `tokens[0]`; lets the api-server drop duplicates.
    pub first_index: u32,
    pub tokens: Vec<u32>,
    pub finish: Option<FinishReason>,
    pub usage: Option<TokenCounts>,
    /// Boxed: present once per request, and keeping it out of line makes an output ~70 bytes
    /// instead of ~230, which a 512-row batch's outputs feel (same encoding on the wire).
    pub speculate_metrics: Option<Box<SpeculateMetrics>>,
    pub error: Option<OutputError>,
    /// One per token of `tokens` when the request asked for logprobs, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// With the request's first tokens (`first_index` 0), when it asked for prompt logprobs:
    /// one per prompt token after the first. Else empty.
    pub prompt_logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TpToApi {
    Hello(TpHello),
    Outputs(Vec<RequestOutput>),
    /// The token-processor does not know the sender (forgot it, or restarted): say hello again.
    AskHello,
    /// The sender's hello was refused (e.g. its id is held by another live api-server).
    Refused {
        reason: String,
    },
}
