//! What `/health` says of the engine: whether a request could complete now (and why not), and
//! each peer as this api-server sees it.

use std::time::Instant;

use super::super::peers::{servable, WorkerPeer};
use super::EngineState;

impl EngineState {
    /// `Ok` when a request could complete now; otherwise why not.
    pub fn readiness(&self, now: Instant) -> Result<(), String> {
        if !self.accepting {
            return Err("shutting down".into());
        }
        let tp = &self.tp;
        if let Some(reason) = &tp.refused {
            return Err(format!(
                "the token-processor refused this api-server: {reason}"
            ));
        }
        if !tp.alive() {
            return Err(match self.tp_outage(now) {
                Some(gone) => format!(
                    "token-processor has not said hello recently (gone {:.1} s; in-flight requests wait up to {} s for it)",
                    gone.as_secs_f64(),
                    self.tp_outage_window.as_secs()
                ),
                None => "token-processor has not said hello recently".into(),
            });
        }
        let workers = &self.workers;
        if workers.iter().any(|w| servable(w, tp)) {
            return Ok(());
        }
        let alive = workers.iter().filter(|w| w.alive()).count();
        let routable: Vec<&str> = workers
            .iter()
            .filter(|w| w.routable())
            .filter_map(WorkerPeer::worker_id)
            .collect();
        if routable.is_empty() {
            let refusals: Vec<&str> = workers
                .iter()
                .filter_map(|w| w.refused.as_deref())
                .collect();
            return Err(format!(
                "no live engine-worker accepts requests ({alive} of {} alive){}",
                workers.len(),
                if refusals.is_empty() {
                    String::new()
                } else {
                    format!("; refused: {}", refusals.join("; "))
                }
            ));
        }
        Err(format!(
            "the token-processor does not take the step batches of engine-worker(s) {} (it lists {:?}; see its log)",
            routable.join(", "),
            tp.hello.as_ref().map(|h| h.workers.clone()).unwrap_or_default()
        ))
    }
}

impl EngineState {
    /// In-flight requests here, the token-processor's outage, and each worker's liveness and
    /// load as its last heartbeat reported it.
    pub fn status(&self, now: Instant) -> serde_json::Value {
        let tp = &self.tp;
        let workers: Vec<_> = self
            .workers
            .iter()
            .map(|w| {
                serde_json::json!({
                    "endpoint": w.endpoint,
                    "worker_id": w.worker_id(),
                    "alive": w.alive(),
                    "connected": w.connected,
                    "accepting": w.accepting,
                    "ready": w.hello.as_ref().is_some_and(|h| h.ready),
                    "token_processor_takes_its_batches": w.worker_id().is_some_and(|id| tp.takes_batches_of(id)),
                    "running_and_waiting": w.reported_load,
                    "retained_unacknowledged": w.retained.unacknowledged,
                    "retained_bytes": w.retained.bytes,
                    "retained_dropped_total": w.retained.dropped_total,
                    "token_processor_acknowledges": w.tp_link.acknowledges,
                    "step_batches_unacknowledged": w.tp_link.batches_unacknowledged,
                })
            })
            .collect();
        serde_json::json!({
            "in_flight": self.in_flight(),
            "token_processor_alive": tp.alive(),
            "token_processor_outage_s": self.tp_outage(now).map(|d| d.as_secs_f64()),
            "workers": workers,
        })
    }
}
