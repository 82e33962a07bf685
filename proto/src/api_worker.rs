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
}

impl SamplingParams {
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: None,
    };
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Abort {
    pub id: RequestId,
}

/// Most request ids in one [`ApiToWorker::Probe`].
pub const MAX_PROBE_IDS: usize = 1024;

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
