//! [`EngineClient`]: submits engine requests to the least-loaded live worker, hands each route a
//! [`RequestHandle`] that yields the request's outputs and aborts it when dropped, and fails
//! in-flight requests when their worker or the token-processor is declared dead.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::api_worker::{AddRequest, ApiToWorker};
use proto::{FinishReason, RequestId};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::admission::{Admitted, ClientKey};
use super::registry::REQUEST_CHANNEL_CAPACITY;
use super::shared::{lock, Shared};
use super::state::SubmitRefused;
use super::{
    links, EngineClientConfig, EngineEvent, EngineFailure, EngineRequest, ServingEngine,
    SubmitRequest,
};
use crate::error::ApiError;

/// Frames queued per worker link (requests and aborts) while it sends or reconnects.
const WORKER_QUEUE: usize = 4096;
/// How often liveness is checked (the api-server's main loop; it feeds the watchdog).
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);

/// Cheap to clone; every clone talks to the same links.
#[derive(Clone)]
pub struct EngineClient {
    shared: Arc<Shared>,
    shutdown: Arc<watch::Sender<bool>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl EngineClient {
    /// Starts the links and the liveness watchdog on the current tokio runtime.
    pub fn start(config: EngineClientConfig) -> Self {
        let mut worker_tx = Vec::new();
        let mut worker_rx = Vec::new();
        for _ in &config.worker_endpoints {
            let (tx, rx) = mpsc::channel(WORKER_QUEUE);
            worker_tx.push(tx);
            worker_rx.push(rx);
        }
        let shared = Arc::new(Shared::new(config, worker_tx));
        let (shutdown, _) = watch::channel(false);
        let mut tasks = Vec::new();
        for (i, rx) in worker_rx.into_iter().enumerate() {
            let endpoint = shared.config.worker_endpoints[i].clone();
            tasks.push(tokio::spawn(links::run_worker_link(
                Arc::clone(&shared),
                i,
                endpoint,
                rx,
                shutdown.subscribe(),
            )));
        }
        tasks.push(tokio::spawn(links::run_tp_link(
            Arc::clone(&shared),
            shutdown.subscribe(),
        )));
        let watchdog_shared = Arc::clone(&shared);
        let mut stop = shutdown.subscribe();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(LIVENESS_PERIOD);
            loop {
                tokio::select! {
                    _ = tick.tick() => watchdog_shared.check_liveness(),
                    _ = stop.changed() => break,
                }
            }
        }));
        Self {
            shared,
            shutdown: Arc::new(shutdown),
            tasks: Arc::new(Mutex::new(tasks)),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.shared.state().in_flight()
    }

    /// Stops taking new requests (in-flight ones go on).
    pub fn stop_accepting(&self) {
        self.shared.state().stop_accepting();
    }

    /// Ends every in-flight request, closes the links and waits (bounded) for their tasks.
    pub async fn shutdown(&self, wait: Duration) {
        let effects = self.shared.state().shut_down();
        self.shared.apply(effects);
        let _ = self.shutdown.send(true);
        let tasks: Vec<_> = std::mem::take(&mut *lock(&self.tasks));
        let _ = tokio::time::timeout(wait, futures::future::join_all(tasks)).await;
    }
}

impl ServingEngine for EngineClient {
    type Request = RequestHandle;

    async fn admit(&self, sequences: usize, client: &ClientKey) -> Result<Vec<Admitted>, ApiError> {
        let workers = self.shared.state().worker_capacity();
        self.shared
            .admission
            .admit(sequences, client, workers)
            .await
    }

    /// Sends one engine request to the least-loaded live worker.
    fn submit(&self, request: SubmitRequest) -> Result<RequestHandle, ApiError> {
        let shared = &self.shared;
        let id = shared.ids.next();
        let (tx, rx) = mpsc::channel(REQUEST_CHANNEL_CAPACITY);
        let worker = shared
            .state()
            .submit(Instant::now(), id, tx)
            .map_err(refusal)?;
        let add = AddRequest {
            id,
            prompt_token_ids: request.prompt_token_ids,
            sampling: request.sampling,
            stop: request.stop,
            max_tokens: request.max_tokens,
            arrival_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            owner: shared.config.api_server_id.clone(),
            class: request.class,
        };
        if shared.worker_tx[worker]
            .try_send(ApiToWorker::Add(add))
            .is_err()
        {
            shared.state().unsend(id);
            return Err(ApiError::Overloaded {
                message: "the engine queue is full; retry later".into(),
            });
        }
        tracing::debug!(request_id = id, worker, "engine request submitted");
        Ok(RequestHandle {
            id,
            rx,
            shared: Arc::clone(shared),
            done: false,
        })
    }

    /// The context length of the workers requests go to (None before any is servable).
    fn max_model_len(&self) -> Option<u32> {
        self.shared.state().max_model_len()
    }

    /// `Ok` when a request could complete now: a worker is routable, the token-processor
    /// takes its step batches, and the token-processor's outputs reach us. Otherwise why not.
    fn readiness(&self) -> Result<(), String> {
        self.shared.state().readiness(Instant::now())
    }

    /// In-flight requests here, and each worker's liveness and load as its last heartbeat
    /// reported it.
    fn status(&self) -> serde_json::Value {
        let (engine, capacity) = {
            let state = self.shared.state();
            (state.status(Instant::now()), state.worker_capacity())
        };
        let admission = &self.shared.admission;
        let bound = admission.bound(capacity.auto_bound);
        let mut status = engine;
        status["admission"] = serde_json::json!({
            "sequences_in_flight": admission.in_flight(),
            "bound": bound,
            "per_request": bound.map(|b| admission.request_cap(b, capacity.running)),
            "waiting_clients": admission.waiting_clients(),
        });
        status
    }

    fn in_flight(&self) -> usize {
        EngineClient::in_flight(self)
    }
}

/// One engine request as a route sees it. Dropping it before the request finished aborts the
/// request at its worker (client disconnect, timeout, error elsewhere).
pub struct RequestHandle {
    id: RequestId,
    rx: mpsc::Receiver<EngineEvent>,
    shared: Arc<Shared>,
    done: bool,
}

impl RequestHandle {
    pub fn id(&self) -> RequestId {
        self.id
    }
}

impl EngineRequest for RequestHandle {
    async fn next(&mut self) -> EngineEvent {
        if self.done {
            return EngineEvent::Failed(EngineFailure::Dropped);
        }
        let event = match self.rx.recv().await {
            // We never ask for an abort and keep reading (a dropped handle reads nothing), so an
            // abort cut the answer short on the engine's side: an error, never a short 200.
            Some(EngineEvent::Finished(f)) if f.reason == FinishReason::Abort => {
                EngineEvent::Failed(EngineFailure::StoppedByEngine)
            }
            Some(event) => event,
            None => EngineEvent::Failed(EngineFailure::Dropped),
        };
        if !matches!(
            event,
            EngineEvent::Tokens(_) | EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_)
        ) {
            self.done = true;
            // Gone already unless the channel closed under us.
            let effects = self.shared.state().withdraw(self.id);
            self.shared.apply(effects);
        }
        event
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let effects = self.shared.state().withdraw(self.id);
        if !effects.is_empty() {
            tracing::debug!(request_id = self.id, "engine request abandoned; aborting");
            self.shared.apply(effects);
        }
    }
}

/// The client-facing error for a request the engine state could not take.
fn refusal(why: SubmitRefused) -> ApiError {
    match why {
        SubmitRefused::ShuttingDown => ApiError::unavailable("the server is shutting down"),
        SubmitRefused::NoTokenProcessor => {
            ApiError::unavailable("the token processor is not available")
        }
        SubmitRefused::NoWorker => ApiError::unavailable("no engine worker is available"),
        SubmitRefused::Full => ApiError::Overloaded {
            message: "too many requests in flight; retry later".into(),
        },
    }
}
