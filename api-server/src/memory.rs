//! Hands freed heap back to the OS once the server is idle.
//!
//! glibc keeps what a burst of requests freed (fragmented arenas), so RSS after 10k client
//! disconnects stayed ~4% above where it started (tests/disconnects.rs). `malloc_trim` returns
//! it, but one call on a fragmented 50 MB heap took 8–14 ms under glibc's arena lock
//! (docs/faults.md): called while requests run, that is a stall of every thread that allocates.
//! So it runs only when no generation request is in a handler or in the engine, once per idle
//! period.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::engine::EngineClient;

/// How often idleness is checked.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Activity of the generation routes, and which of it the last trim followed.
#[derive(Debug)]
pub struct IdleTrim {
    /// Generation requests that entered a handler, ever.
    started: AtomicU64,
    /// Of those, still inside their handler (before or while the engine runs them).
    in_handler: AtomicUsize,
    /// `started` as read just before the last trim; `u64::MAX` before the first.
    trimmed_at: AtomicU64,
}

impl Default for IdleTrim {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            in_handler: AtomicUsize::new(0),
            trimmed_at: AtomicU64::new(u64::MAX),
        }
    }
}

/// Leaves the handler count when the handler ends, however it ends (a client that disconnects
/// drops the handler's future).
struct InHandler<'a>(&'a AtomicUsize);

impl Drop for InHandler<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl IdleTrim {
    /// Whether a trim is due: nothing running, and requests started since the last trim.
    /// Returns the `started` count the trim will cover.
    pub fn due(&self, engine_in_flight: usize) -> Option<u64> {
        let started = self.started.load(Ordering::Acquire);
        (self.idle(engine_in_flight) && self.trimmed_at.load(Ordering::Acquire) != started)
            .then_some(started)
    }

    fn idle(&self, engine_in_flight: usize) -> bool {
        engine_in_flight == 0 && self.in_handler.load(Ordering::Acquire) == 0
    }

    /// Records a trim that followed every request up to `started`.
    pub fn trimmed(&self, started: u64) {
        self.trimmed_at.store(started, Ordering::Release);
    }

    /// True once the heap was trimmed after the last request finished (what `/health` shows,
    /// and what the leak tests wait for before reading RSS).
    pub fn trimmed_since_last_request(&self, engine_in_flight: usize) -> bool {
        self.idle(engine_in_flight)
            && self.trimmed_at.load(Ordering::Acquire) == self.started.load(Ordering::Acquire)
    }
}

/// Middleware for the generation routes: counts requests in and out of their handlers.
pub async fn track_activity(
    State(trim): State<Arc<IdleTrim>>,
    request: Request,
    next: Next,
) -> Response {
    trim.in_handler.fetch_add(1, Ordering::AcqRel);
    trim.started.fetch_add(1, Ordering::AcqRel);
    let _in_handler = InHandler(&trim.in_handler);
    next.run(request).await
}

/// Checks every [`CHECK_INTERVAL`] and trims once per idle period. Runs until the runtime stops.
pub async fn run(trim: Arc<IdleTrim>, engine: EngineClient) {
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(started) = trim.due(engine.in_flight()) else {
            continue;
        };
        // Off the runtime threads: it can hold glibc's arena lock for milliseconds.
        if tokio::task::spawn_blocking(trim_heap).await.is_ok() {
            trim.trimmed(started);
        }
    }
}

fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes glibc's arena locks itself; callable from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_per_idle_period_and_never_while_requests_run() {
        let trim = IdleTrim::default();
        // Startup: idle and never trimmed, so one trim is due (loading the model freed memory).
        let first = trim.due(0).expect("due at startup");
        trim.trimmed(first);
        assert!(trim.trimmed_since_last_request(0));
        assert_eq!(trim.due(0), None, "nothing happened since");

        // A request enters its handler: not due while it is there or in the engine.
        trim.in_handler.fetch_add(1, Ordering::AcqRel);
        trim.started.fetch_add(1, Ordering::AcqRel);
        let guard = InHandler(&trim.in_handler);
        assert_eq!(trim.due(0), None);
        assert!(!trim.trimmed_since_last_request(0));
        drop(guard);
        assert_eq!(trim.due(3), None, "engine still runs requests");
        let after = trim.due(0).expect("due once idle");
        assert_eq!(after, first + 1);

        // A request that starts during the trim makes another trim due afterwards.
        trim.started.fetch_add(1, Ordering::AcqRel);
        trim.trimmed(after);
        assert!(!trim.trimmed_since_last_request(0));
        assert_eq!(trim.due(0), Some(after + 1));
        trim.trimmed(after + 1);
        assert!(trim.trimmed_since_last_request(0));
    }
}
