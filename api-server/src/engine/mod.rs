//! The engine client: ZeroMQ links to every engine-worker and to the token-processor
//! ([`links`], which only move frames), what each frame and tick does (the pure state machine
//! [`state`], over the peers' liveness in [`peers`] and the in-flight requests and their output
//! channels in [`registry`]), what carries its effects out ([`shared`]), the handle a route
//! holds for one engine request ([`client`]), and the bound on sequences in flight
//! ([`admission`]). Imports go one way: client → links → shared → state → peers, registry,
//! admission.
//! The routes see only the [`ServingEngine`] trait, so their tests can run on an in-process fake.

pub mod admission;
pub mod client;
pub mod ids;
pub mod links;
pub mod options;
pub mod peers;
pub mod registry;
pub(crate) mod shared;
pub(crate) mod state;

use std::future::Future;
use std::time::Duration;

use link::Liveness;

use admission::{AdmissionBound, Admitted, ClientKey};

use proto::api_worker::{RejectReason, SamplingParams, StopConditions};
use proto::tp_api::TokenCounts;
use proto::{FinishReason, SpeculateMetrics};

use crate::error::ApiError;

pub use client::{EngineClient, RequestHandle};
pub use options::EngineOptions;

/// What the routes need of an engine. [`EngineClient`] is the real one; route tests use an
/// in-process fake. Both calls that wait return `Send` futures, so handlers stay `Send`.
pub trait ServingEngine: Clone + Send + Sync + 'static {
    type Request: EngineRequest;

    /// Admits one request of `sequences` engine sequences (its choices) from `client` under the
    /// admission bound, waiting briefly for its turn; a 429 past that. Each [`Admitted`] is one
    /// lane: the request holds at most its share of the bound and runs its choices through
    /// them (empty: no bound yet, every choice at once).
    fn admit(
        &self,
        sequences: usize,
        client: &ClientKey,
    ) -> impl Future<Output = Result<Vec<Admitted>, ApiError>> + Send;

    /// Starts one engine request; dropping the returned request before its end aborts it.
    fn submit(&self, request: SubmitRequest) -> Result<Self::Request, ApiError>;

    /// The context length of the workers requests go to (None before any is servable).
    fn max_model_len(&self) -> Option<u32>;

    /// `Ok` when a request could complete now; otherwise why not.
    fn readiness(&self) -> Result<(), String>;

    /// What `/health` shows operators.
    fn status(&self) -> serde_json::Value;

    /// Engine requests in flight.
    fn in_flight(&self) -> usize;
}

/// One engine request as a route sees it.
pub trait EngineRequest: Send + 'static {
    /// Next event; after a `Finished` or `Failed` the request is over.
    fn next(&mut self) -> impl Future<Output = EngineEvent> + Send;
}

/// One engine request to submit.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    pub max_tokens: u32,
    /// The request's resolved class (a configured one, or `other`).
    pub class: String,
}

/// How long a request may wait for room under the admission bound before its 429, by default.
pub const DEFAULT_ADMISSION_WAIT: Duration = Duration::from_millis(250);

/// How this api-server reaches its engine.
#[derive(Debug, Clone)]
pub struct EngineClientConfig {
    pub worker_endpoints: Vec<String>,
    pub tp_endpoint: String,
    pub api_server_id: String,
    /// Our heartbeat period and the liveness rule, also for the token-processor's hellos.
    pub liveness: Liveness,
    /// Most engine requests in flight at once; more get a 429 (a hard cap on the registry; the
    /// admission bound below is what normally refuses).
    pub max_in_flight: usize,
    /// Engine sequences admitted at once (`admission`); past it a request waits up to
    /// `admission_wait`, then gets a 429.
    pub admission: AdmissionBound,
    pub admission_wait: Duration,
    /// Of the bound, what one request holds at most (and one client while others wait).
    pub request_share: f64,
    /// The most sequences (prompts × n) one request may carry: the admission bound's floor.
    pub max_sequences_per_request: usize,
    /// Proven to peers that require it, right after each connect (`link::auth`).
    pub link_secret: Option<link::auth::Secret>,
    /// A request without output for this long is checked with its worker; if the worker no
    /// longer holds it, it ends with an error instead of waiting for the request timeout.
    pub stall_timeout: Duration,
    /// While the token-processor is gone, in-flight requests wait this long for it (a restart
    /// replays their outputs) before they end with an error; new requests get a 503 meanwhile.
    pub tp_outage_window: Duration,
}

impl EngineClientConfig {
    pub fn new(worker_endpoints: Vec<String>, tp_endpoint: String, api_server_id: String) -> Self {
        Self {
            worker_endpoints,
            tp_endpoint,
            api_server_id,
            liveness: Liveness::default(),
            stall_timeout: Duration::from_secs(options::DEFAULT_STALL_TIMEOUT_SECS),
            tp_outage_window: Duration::from_secs(options::DEFAULT_TP_OUTAGE_WINDOW_SECS),
            max_in_flight: 4096,
            admission: AdmissionBound::Auto,
            admission_wait: DEFAULT_ADMISSION_WAIT,
            request_share: admission::DEFAULT_REQUEST_SHARE,
            max_sequences_per_request: admission::MAX_SEQUENCES_PER_REQUEST,
            link_secret: None,
        }
    }
}

/// The end of a request that ran to completion (or was aborted by us).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub usage: Option<TokenCounts>,
    pub speculate_metrics: Option<SpeculateMetrics>,
}

/// Why an engine request ended without a result.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineFailure {
    WorkerLost,
    TokenProcessorLost,
    /// Tokens went missing between the engine and us.
    OutputGap,
    Rejected(RejectReason),
    /// The worker failed the request.
    Engine,
    /// Our reader fell behind and its outputs were dropped.
    Dropped,
    /// The output stopped and the worker no longer holds the request.
    NotHeld,
    /// The worker stopped the request without our asking (its drain deadline passed, or it
    /// lost contact with this server): the text so far is not the whole answer.
    StoppedByEngine,
    ShuttingDown,
}

impl EngineFailure {
    /// Client-facing text; says what happened without internal detail.
    pub fn message(&self) -> String {
        match self {
            Self::WorkerLost => "the engine worker running this request was lost".into(),
            Self::TokenProcessorLost => "the token processor was lost".into(),
            Self::OutputGap => "part of this request's output was lost".into(),
            Self::Rejected(RejectReason::NotAccepting) => {
                "the engine is not accepting requests".into()
            }
            Self::Rejected(RejectReason::Overloaded) => "the engine is overloaded".into(),
            Self::Rejected(RejectReason::Invalid(why)) => {
                format!(
                    "the engine refused the request: {}",
                    why.chars().take(200).collect::<String>()
                )
            }
            Self::Engine => "the engine failed this request".into(),
            Self::Dropped => "the request's output could not be delivered in time".into(),
            Self::NotHeld => {
                "the request's output stopped and the engine no longer holds it; retry it".into()
            }
            Self::StoppedByEngine => {
                "the engine stopped this request before it finished; retry it".into()
            }
            Self::ShuttingDown => "the server is shutting down".into(),
        }
    }
}

/// What a request's channel carries.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// New output tokens, in order, never repeated.
    Tokens(Vec<u32>),
    /// The logprobs of the tokens of the next [`Tokens`](Self::Tokens), one per token (only
    /// for requests that asked for them).
    Logprobs(Vec<proto::TokenLogprob>),
    /// The prompt's logprobs, one per prompt token after the first, before the first
    /// [`Tokens`](Self::Tokens) (only for requests that asked for them).
    PromptLogprobs(Vec<proto::TokenLogprob>),
    Finished(Finished),
    Failed(EngineFailure),
}
