//! api-server ⇄ engine-worker. The api-server connects (DEALER) to each worker's ROUTER
//! endpoint, says [`ApiHello`] on every (re)connect, then sends requests and aborts; the worker
//! answers with its [`WorkerHello`](crate::worker_tp::WorkerHello) and heartbeats.

use serde::{Deserialize, Serialize};

use crate::worker_tp::{Heartbeat, WorkerHello};
use crate::RequestId;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiHello {
    pub protocol_version: u32,
    /// Stable name of the api-server; outputs for its requests are routed to it.
    pub api_server_id: String,
    /// Changes on every process start, so a peer can tell a restart from a reconnect.
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 1.0 means off.
    pub top_p: f32,
    /// 0 means off.
    pub top_k: u32,
    /// Per-request seed; the same request with the same seed gives the same tokens.
    pub seed: Option<u64>,
    /// Penalties, bias and the like, applied to the logits before the choice.
    pub processors: LogitsProcessors,
    /// `Some(n)`: every emitted token comes with its logprob and the `n` most likely tokens'
    /// (at most [`MAX_TOP_LOGPROBS`](crate::MAX_TOP_LOGPROBS)); `None`: no logprobs.
    pub logprobs: Option<u8>,
    /// `Some(n)`: every prompt token after the first comes with its logprob under the model
    /// (raw logits, no processors) and the `n` most likely tokens' at its position, as vLLM's
    /// `prompt_logprobs` (what completions' `echo` with `logprobs` reports); such a prompt does
    /// not reuse the prefix cache, whose positions have no logits. `None`: none.
    pub prompt_logprobs: Option<u8>,
    /// What the output must be (OpenAI's `response_format`); `None`: free text.
    pub structured: Option<StructuredOutput>,
}

/// A constraint on a request's output: every token is chosen among those that keep it valid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StructuredOutput {
    /// Any JSON object.
    JsonObject,
    /// JSON matching this JSON schema (its text, at most 64 KiB).
    JsonSchema(String),
}

impl SamplingParams {
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: None,
        processors: LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
}

/// Most `bad_words` sequences a request may carry (each word counts twice: with and without a
/// leading space).
pub const MAX_BAD_WORDS: usize = 128;
/// Most tokens one `bad_words` sequence may have.
pub const MAX_BAD_WORD_TOKENS: usize = 32;

/// Logits processors with vLLM's meanings. [`LogitsProcessors::NONE`] changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsProcessors {
    /// Subtracted from the logit of every token the output holds (OpenAI's range -2..2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output.
    pub frequency_penalty: f32,
    /// A token in the prompt or the output has a positive logit divided, a negative one
    /// multiplied, by this (CTRL, Keskar et al. 2019); 1 means off.
    pub repetition_penalty: f32,
    /// Sampling keeps only tokens whose probability is at least this times the top token's;
    /// 0 means off (greedy choices are unaffected).
    pub min_p: f32,
    /// Before this many output tokens, EOS and the stop tokens cannot be chosen and stop
    /// strings do not end the request.
    pub min_tokens: u32,
    /// Added to the listed tokens' logits, `(token id, bias)`.
    pub logit_bias: Vec<(u32, f32)>,
    /// Token sequences the output must not contain (vLLM's `bad_words`, tokenized): the last
    /// token of one is ruled out wherever the output ends with the rest of it.
    pub bad_words: Vec<Vec<u32>>,
}

impl LogitsProcessors {
    pub const NONE: Self = Self {
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        repetition_penalty: 1.0,
        min_p: 0.0,
        min_tokens: 0,
        logit_bias: Vec::new(),
        bad_words: Vec::new(),
    };

    /// Whether any processor changes the logits (min_p acts later, on the distribution).
    pub fn changes_logits(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
            || self.min_tokens > 0
            || !self.logit_bias.is_empty()
            || !self.bad_words.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StopConditions {
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
    /// Stop strings, checked by the worker on the decoded bytes of the output.
    pub stop_strings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddRequest {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    pub max_tokens: u32,
    /// Wall-clock arrival at the api-server, milliseconds since the Unix epoch.
    pub arrival_unix_ms: u64,
    /// `api_server_id` of the api-server that owns the request.
    pub owner: String,
    /// The request's class (one of the operator's configured classes, or `other`): a label of
    /// the token-processor's acceptance series, passed through by the worker.
    pub class: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Abort {
    pub id: RequestId,
}

/// Most request ids in one [`ApiToWorker::Probe`].
pub const MAX_PROBE_IDS: usize = 1024;

// Requests are what this link carries; a box would cost each one an allocation to save the
// space of a decoded hello or abort, which live for a moment.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ApiToWorker {
    Hello(ApiHello),
    Add(AddRequest),
    Abort(Abort),
    /// Liveness; a worker aborts the requests of an api-server it has not heard from in time.
    Heartbeat {
        api_server_id: String,
        epoch: u64,
    },
    /// Requests of the sender whose outputs stalled or arrived with a gap: the worker answers
    /// with [`WorkerToApi::NotHeld`] for those it does not hold (at most [`MAX_PROBE_IDS`]), and
    /// resyncs the token-processor (which replays the rest) when it holds any.
    Probe {
        ids: Vec<RequestId>,
    },
    /// The final outputs of these requests reached the sender (at most [`MAX_PROBE_IDS`]): the
    /// worker forgets them. Until then it keeps them for a resync.
    Delivered {
        ids: Vec<RequestId>,
    },
}

/// Why a worker refused a request outright (before any step ran).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RejectReason {
    /// Draining for shutdown, or not ready yet.
    NotAccepting,
    /// Waiting queue full.
    Overloaded,
    /// Prompt plus max_tokens exceed the model length, or an invalid parameter.
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerToApi {
    Hello(WorkerHello),
    Heartbeat(Heartbeat),
    Rejected {
        id: RequestId,
        reason: RejectReason,
    },
    /// The worker does not know the sender (forgot it, or restarted): say hello again.
    AskHello,
    /// Answer to [`ApiToWorker::Probe`]: of the probed requests, those this worker does not
    /// hold (finished, aborted, or never received); their outputs will not come.
    NotHeld {
        ids: Vec<RequestId>,
    },
    /// The sender's hello was refused (e.g. its id is held by another live api-server).
    Refused {
        reason: String,
    },
}
