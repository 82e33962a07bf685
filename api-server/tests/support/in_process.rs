//! An in-process engine for route tests: no sockets, every request plays the same script of
//! engine events (then waits forever), under a real admission bound.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_server::auth::ApiKey;
use api_server::engine::admission::{Admission, AdmissionBound, Admitted};
use api_server::engine::{Engine, EngineEvent, EngineRequest, SubmitRequest};
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
    /// Admits at most `bound` sequences at once.
    pub fn new(script: Vec<EngineEvent>, bound: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                script,
                admission: Admission::new(AdmissionBound::Fixed(bound), 1, ADMISSION_WAIT),
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
        router(
            super::state(self.clone(), Duration::from_secs(10)),
            ApiKey(None),
        )
    }
}

impl Engine for ScriptedEngine {
    type Request = ScriptedRequest;

    async fn admit(&self, sequences: usize) -> Result<Vec<Admitted>, ApiError> {
        self.inner.admission.admit(sequences, 0).await
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
