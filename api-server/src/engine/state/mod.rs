//! [`EngineState`]: what this api-server decides about its engine, as one state machine with no
//! I/O and no clock of its own, shaped like the token-processor's `Ingest`. It holds the peers
//! ([`super::peers`]), the in-flight requests ([`super::registry`]) and the token-processor's
//! outage. Every input (a peer's message, a liveness tick, a submit, a request handle that ends)
//! comes with the time it happened; every output is [`Effects`]: frames for the workers' links
//! and whether to say our hello. [`super::shared::Shared`] owns it behind one lock and carries
//! the effects out; the unit tests here drive it directly, without ZeroMQ.

mod effects;
mod health;
#[cfg(test)]
mod randomized;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use link::peers::{hello_rule, HelloRule};
use link::{Sweep, Sweeper};
use proto::api_worker::WorkerToApi;
use proto::tp_api::{RequestOutput, TpToApi};
use proto::worker_tp::WorkerHello;
use proto::RequestId;
use tokio::sync::mpsc;

use super::admission::{capacity, Capacity, WorkerCapacity};
use super::peers::{least_loaded, servable, TpPeer, WorkerPeer};
use super::registry::{Dispatch, Registry};
use super::{EngineClientConfig, EngineEvent, EngineFailure};

pub(crate) use effects::{Effects, Reply};

/// How often requests without progress are looked for.
const STALL_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why a request could not be submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubmitRefused {
    ShuttingDown,
    NoTokenProcessor,
    NoWorker,
    /// The registry is at its cap.
    Full,
}

pub(crate) struct EngineState {
    registry: Registry,
    workers: Vec<WorkerPeer>,
    tp: TpPeer,
    sweeper: Sweeper,
    accepting: bool,
    /// When stalled requests were last looked for.
    stall_check: Instant,
    /// Since when the token-processor has been declared dead while requests wait for it.
    tp_outage: Option<Instant>,
    stall_timeout: Duration,
    tp_outage_window: Duration,
}

impl EngineState {
    pub fn new(config: &EngineClientConfig, now: Instant) -> Self {
        Self {
            registry: Registry::new(config.worker_endpoints.len(), config.max_in_flight),
            workers: config
                .worker_endpoints
                .iter()
                .cloned()
                .map(WorkerPeer::new)
                .collect(),
            tp: TpPeer::new(config.liveness),
            sweeper: Sweeper::new(config.liveness),
            accepting: true,
            stall_check: now,
            tp_outage: None,
            stall_timeout: config.stall_timeout,
            tp_outage_window: config.tp_outage_window,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.registry.len()
    }

    /// Stops taking new requests (in-flight ones go on).
    pub fn stop_accepting(&mut self) {
        self.accepting = false;
    }

    /// What the servable workers' hellos say they hold: the default admission bound and
    /// their batch slots.
    pub fn worker_capacity(&self) -> Capacity {
        let reported: Vec<WorkerCapacity> = self
            .servable_workers()
            .filter_map(|w| w.hello.as_ref())
            .map(|h| WorkerCapacity {
                kv_capacity_tokens: h.kv_capacity_tokens,
                max_model_len: h.max_model_len,
                max_num_seqs: h.max_num_seqs,
            })
            .collect();
        capacity(&reported)
    }

    /// The context length requests are validated against: the smallest of the servable
    /// workers' (what the worker a request lands on accepts), or None before any.
    pub fn max_model_len(&self) -> Option<u32> {
        self.servable_workers()
            .filter_map(WorkerPeer::max_model_len)
            .min()
    }

    fn servable_workers(&self) -> impl Iterator<Item = &WorkerPeer> {
        self.workers.iter().filter(|w| servable(w, &self.tp))
    }

    pub fn set_worker_connected(&mut self, worker: usize, connected: bool) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.connected = connected;
        }
    }

    pub fn set_tp_connected(&mut self, connected: bool) {
        self.tp.connected = connected;
    }

    /// While a peer is not alive for us, each heartbeat of ours is a hello instead: the peer
    /// answers a hello with its own, so two running processes always find each other again.
    pub fn worker_alive(&self, worker: usize) -> bool {
        self.workers.get(worker).is_some_and(WorkerPeer::alive)
    }

    pub fn tp_alive(&self) -> bool {
        self.tp.alive()
    }

    /// How long the token-processor has been gone while requests wait for it.
    pub fn tp_outage(&self, now: Instant) -> Option<Duration> {
        self.tp_outage.map(|t| now.saturating_duration_since(t))
    }

    /// Registers request `id` on the least-loaded servable worker, whose index it returns.
    pub fn submit(
        &mut self,
        now: Instant,
        id: RequestId,
        tx: mpsc::Sender<EngineEvent>,
    ) -> Result<usize, SubmitRefused> {
        if !self.accepting {
            return Err(SubmitRefused::ShuttingDown);
        }
        if !self.tp.alive() {
            return Err(SubmitRefused::NoTokenProcessor);
        }
        let registry = &self.registry;
        let worker = least_loaded(&self.workers, &self.tp, |i| registry.in_flight_on(i))
            .ok_or(SubmitRefused::NoWorker)?;
        if !self.registry.insert(id, worker, tx, now) {
            return Err(SubmitRefused::Full);
        }
        Ok(worker)
    }

    /// A submitted request whose frame never left (its link's queue was full): forgotten,
    /// with nothing to stop.
    pub fn unsend(&mut self, id: RequestId) {
        self.registry.remove(id);
    }

    /// A request whose reader is done with it (it ended, or the client went away): forgotten,
    /// and stopped at its worker if it was still running there.
    pub fn withdraw(&mut self, id: RequestId) -> Effects {
        let mut effects = Effects::default();
        if let Some(worker) = self.registry.remove(id) {
            effects.abort(worker, id);
        }
        effects
    }

    /// Stops taking requests and ends every in-flight one (stopping it at its worker).
    pub fn shut_down(&mut self) -> Effects {
        self.accepting = false;
        let mut effects = Effects::default();
        for (id, worker) in self.registry.fail_all(None, EngineFailure::ShuttingDown) {
            effects.abort(worker, id);
        }
        effects
    }

    /// One message from worker link `worker`.
    pub fn on_worker_message(&mut self, now: Instant, worker: usize, msg: WorkerToApi) -> Effects {
        let mut effects = Effects::default();
        if worker >= self.workers.len() {
            return effects;
        }
        match msg {
            WorkerToApi::Hello(hello) => {
                if let Err(e) = proto::check_version(&hello.worker_id, hello.protocol_version) {
                    tracing::error!(worker, error = %e, "engine-worker speaks another protocol");
                    return effects;
                }
                tracing::info!(
                    worker, worker_id = %hello.worker_id, epoch = hello.epoch,
                    num_spec_tokens = hello.num_spec_tokens, ready = hello.ready,
                    max_model_len = hello.max_model_len,
                    "engine-worker said hello"
                );
                if let Some(other) = self.duplicate_holder_of(&hello, worker) {
                    tracing::error!(worker, other, worker_id = %hello.worker_id, "engine-worker refused: another live engine-worker holds this id");
                    let reason = format!(
                        "{} (the live one is at {})",
                        link::peers::duplicate_id_reason("worker", &hello.worker_id, "worker-id"),
                        self.workers[other].endpoint
                    );
                    self.refuse_worker(worker, reason, &mut effects);
                    return effects;
                }
                if self.workers[worker].on_hello(hello, now) {
                    // Its requests died with its previous epoch: nothing to stop there.
                    let lost = self
                        .registry
                        .fail_all(Some(worker), EngineFailure::WorkerLost);
                    tracing::warn!(worker, requests = lost.len(), "engine-worker restarted");
                }
            }
            WorkerToApi::Heartbeat(hb) => {
                effects.reply = self.workers[worker].on_heartbeat(&hb, now).into();
            }
            WorkerToApi::Rejected { id, reason } => {
                tracing::debug!(request_id = id, ?reason, "engine-worker rejected request");
                if self.registry.worker_of(id) == Some(worker) {
                    self.registry.fail(id, EngineFailure::Rejected(reason));
                }
            }
            WorkerToApi::AskHello => {
                tracing::info!(worker, "engine-worker asks for our hello");
                effects.reply = Reply::Hello;
            }
            WorkerToApi::NotHeld { ids } => self.on_not_held(worker, ids),
            WorkerToApi::Refused { reason } => {
                tracing::error!(worker, %reason, "engine-worker refused our hello");
                self.refuse_worker(worker, reason, &mut effects);
            }
        }
        effects
    }

    /// Another worker link whose worker holds the hello's id, where link's hello rule refuses the
    /// hello as a duplicate (that holder is alive, of another epoch).
    fn duplicate_holder_of(&self, hello: &WorkerHello, worker: usize) -> Option<usize> {
        self.workers.iter().enumerate().position(|(i, w)| {
            i != worker
                && w.worker_id() == Some(&hello.worker_id)
                && hello_rule(w.holder(), hello.epoch) == HelloRule::RefuseDuplicate
        })
    }

    /// A worker that refused us, or that we refused, is not alive for us: its requests end
    /// as on its death (and are stopped there, in case it still runs them).
    fn refuse_worker(&mut self, worker: usize, reason: String, effects: &mut Effects) {
        self.workers[worker].on_refused(reason);
        self.fail_worker(worker, effects);
    }

    fn fail_worker(&mut self, worker: usize, effects: &mut Effects) {
        let lost = self
            .registry
            .fail_all(Some(worker), EngineFailure::WorkerLost);
        if !lost.is_empty() {
            tracing::warn!(
                worker,
                requests = lost.len(),
                "engine-worker's requests ended"
            );
        }
        // If it was only paused, it must not go on computing for nobody.
        for (id, worker) in lost {
            effects.abort(worker, id);
        }
    }

    fn on_not_held(&mut self, worker: usize, ids: Vec<RequestId>) {
        let mut lost = 0;
        for id in ids {
            if self.registry.worker_of(id) == Some(worker) {
                self.registry.fail(id, EngineFailure::NotHeld);
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::warn!(
                worker,
                requests = lost,
                "stalled requests the engine-worker no longer holds ended with an error"
            );
        }
    }

    /// One message from the token-processor's link.
    pub fn on_tp_message(&mut self, now: Instant, msg: TpToApi) -> Effects {
        let mut effects = Effects::default();
        match msg {
            TpToApi::Hello(hello) => {
                if let Err(e) = proto::check_version("token-processor", hello.protocol_version) {
                    tracing::error!(error = %e, "token-processor speaks another protocol");
                    return effects;
                }
                let was_alive = self.tp.alive();
                let workers_changed =
                    self.tp.hello.as_ref().map(|h| &h.workers) != Some(&hello.workers);
                let rule = self.tp.on_hello(hello, now);
                // Back: restarted, or alive again after we declared it dead (or it refused us).
                let back =
                    rule == HelloRule::Restart || (rule == HelloRule::SameProcess && !was_alive);
                if let Some(h) = self.tp.hello.as_ref() {
                    if back || rule == HelloRule::Admit || workers_changed {
                        tracing::info!(epoch = h.epoch, workers = ?h.workers, "token-processor said hello");
                    }
                }
                if back {
                    self.tp_back(now, &mut effects);
                }
            }
            TpToApi::Outputs(outputs) => {
                effects.reply = self.tp.on_outputs(now).into();
                self.dispatch(now, outputs, &mut effects);
            }
            TpToApi::AskHello => {
                tracing::info!("token-processor asks for our hello");
                effects.reply = Reply::Hello;
            }
            TpToApi::Refused { reason } => {
                tracing::error!(%reason, "token-processor refused our hello");
                if self.tp.alive() {
                    // As on its death: requests wait for it through the outage window.
                    self.tp_outage.get_or_insert(now);
                }
                self.tp.on_refused(reason);
            }
        }
        effects
    }

    /// Hands outputs to their requests' readers. Tells each worker which requests it may forget
    /// (their final output is here) and which to stop (ended in an error, or their reader fell
    /// behind), and asks it to replay requests whose outputs arrived with a gap.
    fn dispatch(&mut self, now: Instant, outputs: Vec<RequestOutput>, effects: &mut Effects) {
        let workers = self.workers.len();
        let mut delivered: Vec<Vec<RequestId>> = vec![Vec::new(); workers];
        let mut gaps: Vec<Vec<RequestId>> = vec![Vec::new(); workers];
        let mut dropped = 0;
        for out in outputs {
            let id = out.id;
            match self.registry.dispatch(out, now) {
                Dispatch::Finished { worker } => delivered[worker].push(id),
                Dispatch::Failed { worker } => effects.abort(worker, id),
                Dispatch::Dropped { worker } => {
                    dropped += 1;
                    effects.abort(worker, id);
                }
                Dispatch::Gap {
                    probe: Some(worker),
                } => gaps[worker].push(id),
                Dispatch::Delivered | Dispatch::Gap { probe: None } | Dispatch::Unknown => {}
            }
        }
        if dropped > 0 {
            tracing::warn!(requests = dropped, "readers fell behind; requests aborted");
        }
        effects.delivered(delivered);
        // Not those a later output of the same batch ended.
        for ids in &mut gaps {
            ids.retain(|id| self.registry.worker_of(*id).is_some());
        }
        effects.probe(gaps);
    }

    /// The token-processor is back (restarted, or resumed after we declared it dead): the
    /// outage ends, and every worker replays what it holds of our requests.
    fn tp_back(&mut self, now: Instant, effects: &mut Effects) {
        let waited = self.tp_outage.take();
        let in_flight = self.registry.probe_all(now);
        tracing::info!(
            requests = in_flight.len(),
            outage_ms = waited.map(|t| now.saturating_duration_since(t).as_millis() as u64),
            "token-processor is back; asking the workers to replay our requests"
        );
        effects.probe(self.by_worker(in_flight));
    }

    fn by_worker(&self, requests: Vec<(usize, RequestId)>) -> Vec<Vec<RequestId>> {
        let mut by_worker: Vec<Vec<RequestId>> = vec![Vec::new(); self.workers.len()];
        for (worker, id) in requests {
            if let Some(ids) = by_worker.get_mut(worker) {
                ids.push(id);
            }
        }
        by_worker
    }

    /// One liveness pass (the api-server's main loop): declares silent peers dead and fails
    /// their requests, or forgives everyone when this process was paused.
    pub fn tick(&mut self, now: Instant) -> Effects {
        let mut effects = Effects::default();
        if let Sweep::Forgive { .. } = self.sweeper.begin(now) {
            self.workers.iter_mut().for_each(|w| w.clock.forgive(now));
            self.tp.clock.forgive(now);
            return effects;
        }
        let dead: Vec<usize> = self
            .workers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, w)| w.check_liveness(now).then_some(i))
            .collect();
        for worker in dead {
            tracing::warn!(worker, "engine-worker declared dead");
            self.fail_worker(worker, &mut effects);
        }
        if self.tp.check_liveness(now) {
            self.tp_outage = Some(now);
            tracing::warn!(
                requests = self.registry.len(),
                window_s = self.tp_outage_window.as_secs(),
                "token-processor declared dead; in-flight requests wait for it"
            );
        }
        let expired = self
            .tp_outage
            .is_some_and(|since| now.saturating_duration_since(since) > self.tp_outage_window);
        if expired {
            self.tp_outage = None;
            let lost = self
                .registry
                .fail_all(None, EngineFailure::TokenProcessorLost);
            tracing::warn!(
                requests = lost.len(),
                "token-processor gone past the outage window; its requests end with an error"
            );
            // Their outputs can no longer reach us: stop the work (and what the workers keep).
            for (id, worker) in lost {
                effects.abort(worker, id);
            }
        }
        // Last: only what is still in flight is asked about.
        self.probe_stalled(now, &mut effects);
        effects
    }

    /// Once a second: asks each worker about our requests that made no progress for the stall
    /// timeout (a lost final output, a dropped rejection); its `NotHeld` answer ends them.
    fn probe_stalled(&mut self, now: Instant, effects: &mut Effects) {
        if now.saturating_duration_since(self.stall_check) < STALL_CHECK_EVERY {
            return;
        }
        self.stall_check = now;
        let stalled = self.registry.stalled(now, self.stall_timeout);
        effects.probe(self.by_worker(stalled));
    }
}

/// What the tests read of the state.
#[cfg(test)]
impl EngineState {
    pub fn workers(&self) -> &[WorkerPeer] {
        &self.workers
    }

    pub fn tp(&self) -> &TpPeer {
        &self.tp
    }

    pub fn accepting(&self) -> bool {
        self.accepting
    }
}
