//! An in-process engine for route tests: no sockets, every request plays the same script of
//! engine events (then waits forever), under a real admission bound.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_server::auth::ApiKey;
use api_server::engine::admission::{Admission, AdmissionBound, Admitted, Capacity, ClientKey};
use api_server::engine::{EngineEvent, EngineRequest, ServingEngine, SubmitRequest};
use api_server::error::ApiError;
use api_server::routes::router;

/// How long a request waits for room under the admission bound before its 429.
pub const ADMISSION_WAIT: Duration = Duration::from_millis(100);

#[derive(Clone)]
pub struct ScriptedEngine {
    inner: Arc<Inner>,
}

struct Inner {
    script: Vec<EngineEvent>,
    admission: Admission,
    submitted: Mutex<Vec<SubmitRequest>>,
    live: AtomicUsize,
    /// Requests dropped before their end: those a real engine would be told to abort.
    abandoned: AtomicUsize,
}

impl ScriptedEngine {
    /// Admits at most `bound` sequences at once, all of them to one request if it asks.
    pub fn new(script: Vec<EngineEvent>, bound: usize) -> Self {
        Self::with_share(script, bound, 1.0)
    }

    /// Admits at most `bound` sequences at once, `share` of them to one request.
    pub fn with_share(script: Vec<EngineEvent>, bound: usize, share: f64) -> Self {
        Self {
            inner: Arc::new(Inner {
                script,
                admission: Admission::new(AdmissionBound::Fixed(bound), 1, share, ADMISSION_WAIT),
                submitted: Mutex::default(),
                live: AtomicUsize::new(0),
                abandoned: AtomicUsize::new(0),
            }),
        }
    }

    pub fn submitted(&self) -> Vec<SubmitRequest> {
        self.inner.submitted.lock().unwrap().clone()
    }

    pub fn abandoned(&self) -> usize {
        self.inner.abandoned.load(Ordering::SeqCst)
    }

    /// The api-server's router over this engine.
    pub fn router(&self) -> axum::Router {
        self.router_with_write_timeout(Duration::from_secs(30))
    }

    /// The router, dropping streams whose client reads nothing for `write_timeout`.
    pub fn router_with_write_timeout(&self, write_timeout: Duration) -> axum::Router {
        let mut state = super::state(self.clone(), Duration::from_secs(10));
        state.stream_write_timeout = write_timeout;
        router(state, ApiKey(None))
    }

    /// Sequences admitted now.
    pub fn admitted(&self) -> usize {
        self.inner.admission.in_flight()
    }
}

impl ServingEngine for ScriptedEngine {
    type Request = ScriptedRequest;

    async fn admit(&self, sequences: usize, client: &ClientKey) -> Result<Vec<Admitted>, ApiError> {
        self.inner
            .admission
            .admit(sequences, client, Capacity::default())
            .await
    }

    fn submit(&self, request: SubmitRequest) -> Result<ScriptedRequest, ApiError> {
        self.inner.submitted.lock().unwrap().push(request);
        self.inner.live.fetch_add(1, Ordering::SeqCst);
        Ok(ScriptedRequest {
            events: self.inner.script.clone().into(),
            ended: false,
            engine: Arc::clone(&self.inner),
        })
    }

    fn max_model_len(&self) -> Option<u32> {
        Some(2048)
    }

    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({ "in_flight": self.in_flight() })
    }

    fn in_flight(&self) -> usize {
        self.inner.live.load(Ordering::SeqCst)
    }
}

pub struct ScriptedRequest {
    events: VecDeque<EngineEvent>,
    ended: bool,
    engine: Arc<Inner>,
}

impl EngineRequest for ScriptedRequest {
    async fn next(&mut self) -> EngineEvent {
        match self.events.pop_front() {
            Some(event) => {
                self.ended |= !matches!(event, EngineEvent::Tokens(_));
                event
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for ScriptedRequest {
    fn drop(&mut self) {
        self.engine.live.fetch_sub(1, Ordering::SeqCst);
        if !self.ended {
            self.engine.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}
