//! [`Shared`]: what the links, the liveness loop and the request handles share — the peers'
//! state, the in-flight registry and each worker's outbound queue — and what every frame from a
//! peer does to it. The links ([`super::links`]) only move frames; the decisions are here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use link::liveness::Heard;
use link::service::Watchdog;
use link::{Sweep, Sweeper};
use proto::api_worker::{Abort, ApiToWorker, WorkerToApi, MAX_PROBE_IDS};
use proto::tp_api::TpToApi;
use proto::RequestId;
use tokio::sync::mpsc;

use super::admission::{capacity, Admission, Capacity, WorkerCapacity};
use super::ids::IdAllocator;
use super::peers::{servable, TpPeer, WorkerPeer};
use super::registry::{Dispatch, Registry};
use super::{EngineClientConfig, EngineFailure};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (no multi-step updates
    // span a panic point), so poisoning is not fatal.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a link does after handing a frame over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    Nothing,
    /// Say our hello on this link now (the peer asked, or it is not alive for us).
    Hello,
}

impl From<Heard> for Reply {
    fn from(heard: Heard) -> Self {
        match heard {
            Heard::Known => Reply::Nothing,
            Heard::AskHello => Reply::Hello,
        }
    }
}

pub(crate) struct Shared {
    pub config: EngineClientConfig,
    /// Changes on every process start.
    pub epoch: u64,
    pub ids: IdAllocator,
    pub registry: Mutex<Registry>,
    pub workers: Mutex<Vec<WorkerPeer>>,
    pub tp: Mutex<TpPeer>,
    pub worker_tx: Vec<mpsc::Sender<ApiToWorker>>,
    pub accepting: AtomicBool,
    pub admission: Admission,
    sweeper: Mutex<Sweeper>,
    watchdog: Mutex<Watchdog>,
    /// When stalled requests were last looked for.
    stall_check: Mutex<Instant>,
    /// Since when the token-processor has been declared dead while requests wait for it.
    tp_outage: Mutex<Option<Instant>>,
}

impl Shared {
    pub fn new(config: EngineClientConfig, worker_tx: Vec<mpsc::Sender<ApiToWorker>>) -> Self {
        Self {
            epoch: link::identity::new_epoch(),
            ids: IdAllocator::random(),
            registry: Mutex::new(Registry::new(
                config.worker_endpoints.len(),
                config.max_in_flight,
            )),
            workers: Mutex::new(
                config
                    .worker_endpoints
                    .iter()
                    .cloned()
                    .map(WorkerPeer::new)
                    .collect(),
            ),
            tp: Mutex::new(TpPeer::new(config.liveness)),
            worker_tx,
            accepting: AtomicBool::new(true),
            admission: Admission::new(
                config.admission,
                config.max_sequences_per_request,
                config.request_share,
                config.admission_wait,
            ),
            sweeper: Mutex::new(Sweeper::new(config.liveness)),
            watchdog: Mutex::new(Watchdog::from_env()),
            stall_check: Mutex::new(Instant::now()),
            tp_outage: Mutex::new(None),
            config,
        }
    }

    /// What the servable workers' hellos say they hold: the default admission bound and
    /// their batch slots.
    pub fn worker_capacity(&self) -> Capacity {
        let tp = lock(&self.tp);
        let workers = lock(&self.workers);
        let reported: Vec<WorkerCapacity> = workers
            .iter()
            .filter(|w| servable(w, &tp))
            .filter_map(|w| w.hello.as_ref())
            .map(|h| WorkerCapacity {
                kv_capacity_tokens: h.kv_capacity_tokens,
                max_model_len: h.max_model_len,
                max_num_seqs: h.max_num_seqs,
            })
            .collect();
        capacity(&reported)
    }

    pub fn send_abort(&self, worker: usize, id: RequestId) {
        if let Some(tx) = self.worker_tx.get(worker) {
            // A full queue means the link is down; the worker drops our requests on its own
            // when it stops hearing from us.
            let _ = tx.try_send(ApiToWorker::Abort(Abort { id }));
        }
    }

    pub fn set_worker_connected(&self, worker: usize, connected: bool) {
        if let Some(w) = lock(&self.workers).get_mut(worker) {
            w.connected = connected;
        }
    }

    pub fn set_tp_connected(&self, connected: bool) {
        lock(&self.tp).connected = connected;
    }

    /// While a peer is not alive for us, each heartbeat of ours is a hello instead: the peer
    /// answers a hello with its own, so two running processes always find each other again.
    pub fn worker_alive(&self, worker: usize) -> bool {
        lock(&self.workers).get(worker).is_some_and(|w| w.alive())
    }

    pub fn tp_alive(&self) -> bool {
        lock(&self.tp).alive()
    }

    pub fn on_worker_frame(&self, worker: usize, frame: &[u8]) -> Reply {
        let msg = match proto::decode::<WorkerToApi>(frame) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(worker, error = %e, "undecodable frame from engine-worker");
                return Reply::Nothing;
            }
        };
        let now = Instant::now();
        match msg {
            WorkerToApi::Hello(hello) => {
                if let Err(e) = proto::check_version(&hello.worker_id, hello.protocol_version) {
                    tracing::error!(worker, error = %e, "engine-worker speaks another protocol");
                    return Reply::Nothing;
                }
                tracing::info!(
                    worker, worker_id = %hello.worker_id, epoch = hello.epoch,
                    num_spec_tokens = hello.num_spec_tokens, ready = hello.ready,
                    max_model_len = hello.max_model_len,
                    "engine-worker said hello"
                );
                let mut workers = lock(&self.workers);
                let holder = workers.iter().enumerate().find(|(i, w)| {
                    *i != worker
                        && w.alive()
                        && w.hello
                            .as_ref()
                            .is_some_and(|h| h.worker_id == hello.worker_id)
                });
                if let Some((other, _)) = holder {
                    tracing::error!(worker, other, worker_id = %hello.worker_id, "engine-worker refused: another live engine-worker holds this id");
                    let reason = format!(
                        "{} (the live one is at {})",
                        link::peers::duplicate_id_reason("worker", &hello.worker_id, "worker-id"),
                        workers[other].endpoint
                    );
                    workers[worker].on_refused(reason);
                    return Reply::Nothing;
                }
                let restarted = workers[worker].on_hello(hello, now);
                drop(workers);
                if restarted {
                    let lost =
                        lock(&self.registry).fail_all(Some(worker), EngineFailure::WorkerLost);
                    tracing::warn!(worker, requests = lost.len(), "engine-worker restarted");
                }
                Reply::Nothing
            }
            WorkerToApi::Heartbeat(hb) => lock(&self.workers)[worker].on_heartbeat(&hb, now).into(),
            WorkerToApi::Rejected { id, reason } => {
                tracing::debug!(request_id = id, ?reason, "engine-worker rejected request");
                lock(&self.registry).fail(id, EngineFailure::Rejected(reason));
                Reply::Nothing
            }
            WorkerToApi::AskHello => {
                tracing::info!(worker, "engine-worker asks for our hello");
                Reply::Hello
            }
            WorkerToApi::NotHeld { ids } => {
                let mut registry = lock(&self.registry);
                let mut lost = 0;
                for id in ids {
                    if registry.worker_of(id) == Some(worker) {
                        registry.fail(id, EngineFailure::NotHeld);
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
                Reply::Nothing
            }
            WorkerToApi::Refused { reason } => {
                tracing::error!(worker, %reason, "engine-worker refused our hello");
                lock(&self.workers)[worker].on_refused(reason);
                Reply::Nothing
            }
        }
    }

    pub fn on_tp_frame(&self, frame: &[u8]) -> Reply {
        let msg = match proto::decode::<TpToApi>(frame) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable frame from token-processor");
                return Reply::Nothing;
            }
        };
        match msg {
            TpToApi::Hello(hello) => {
                if let Err(e) = proto::check_version("token-processor", hello.protocol_version) {
                    tracing::error!(error = %e, "token-processor speaks another protocol");
                    return Reply::Nothing;
                }
                let mut tp = lock(&self.tp);
                let new_epoch = tp.hello.as_ref().is_some_and(|h| h.epoch != hello.epoch);
                let changed = tp
                    .hello
                    .as_ref()
                    .is_none_or(|h| h.epoch != hello.epoch || h.workers != hello.workers);
                let back = tp.hello.is_some() && (!tp.alive() || new_epoch);
                if !tp.alive() || changed {
                    tracing::info!(epoch = hello.epoch, workers = ?hello.workers, "token-processor said hello");
                }
                tp.on_hello(hello, Instant::now());
                drop(tp);
                if back {
                    self.tp_back();
                }
                Reply::Nothing
            }
            TpToApi::Outputs(outputs) => {
                let heard = lock(&self.tp).on_outputs(Instant::now());
                self.dispatch(outputs);
                heard.into()
            }
            TpToApi::AskHello => {
                tracing::info!("token-processor asks for our hello");
                Reply::Hello
            }
            TpToApi::Refused { reason } => {
                tracing::error!(%reason, "token-processor refused our hello");
                lock(&self.tp).on_refused(reason);
                Reply::Nothing
            }
        }
    }

    /// Hands outputs to their requests' readers. Tells each worker which requests it may forget
    /// (their final output is here) and which to stop (ended in an error, or their reader fell
    /// behind), and asks it to replay requests whose outputs arrived with a gap.
    fn dispatch(&self, outputs: Vec<proto::tp_api::RequestOutput>) {
        let workers = self.worker_tx.len();
        let mut delivered: Vec<Vec<RequestId>> = vec![Vec::new(); workers];
        let mut gaps: Vec<Vec<RequestId>> = vec![Vec::new(); workers];
        let mut stop = Vec::new();
        let mut dropped = 0;
        {
            let mut registry = lock(&self.registry);
            for out in outputs {
                let id = out.id;
                match registry.dispatch(out) {
                    Dispatch::Finished { worker } => delivered[worker].push(id),
                    Dispatch::Failed { worker } => stop.push((worker, id)),
                    Dispatch::Dropped { worker } => {
                        dropped += 1;
                        stop.push((worker, id));
                    }
                    Dispatch::Gap {
                        probe: Some(worker),
                    } => gaps[worker].push(id),
                    Dispatch::Delivered | Dispatch::Gap { probe: None } | Dispatch::Unknown => {}
                }
            }
        }
        if dropped > 0 {
            tracing::warn!(requests = dropped, "readers fell behind; requests aborted");
        }
        for (worker, id) in stop {
            self.send_abort(worker, id);
        }
        for (worker, ids) in delivered.into_iter().enumerate() {
            for chunk in ids.chunks(MAX_PROBE_IDS) {
                // Lost to a full queue: the worker drops it at its retention age bound.
                let _ = self.worker_tx[worker].try_send(ApiToWorker::Delivered {
                    ids: chunk.to_vec(),
                });
            }
        }
        self.probe(gaps);
    }

    /// Asks each worker about requests of ours: it replays those it holds (through a resync of
    /// the token-processor) and names those it does not. `by_worker[w]` are worker `w`'s.
    fn probe(&self, by_worker: Vec<Vec<RequestId>>) {
        for (worker, ids) in by_worker.into_iter().enumerate() {
            for chunk in ids.chunks(MAX_PROBE_IDS) {
                // A full queue: the link is down or behind; they are probed again later.
                let _ = self.worker_tx[worker].try_send(ApiToWorker::Probe {
                    ids: chunk.to_vec(),
                });
            }
        }
    }

    /// The token-processor is back (restarted, or resumed after we declared it dead): the
    /// outage ends, and every worker replays what it holds of our requests.
    fn tp_back(&self) {
        let waited = lock(&self.tp_outage).take();
        let in_flight = lock(&self.registry).probe_all(Instant::now());
        tracing::info!(
            requests = in_flight.len(),
            outage_ms = waited.map(|t| t.elapsed().as_millis() as u64),
            "token-processor is back; asking the workers to replay our requests"
        );
        let mut by_worker: Vec<Vec<RequestId>> = vec![Vec::new(); self.worker_tx.len()];
        for (worker, id) in in_flight {
            if let Some(ids) = by_worker.get_mut(worker) {
                ids.push(id);
            }
        }
        self.probe(by_worker);
    }

    /// How long the token-processor has been gone while requests wait for it.
    pub fn tp_outage(&self) -> Option<Duration> {
        lock(&self.tp_outage).map(|t| t.elapsed())
    }

    /// One liveness pass (the api-server's main loop, which also feeds systemd's watchdog):
    /// declares silent peers dead and fails their requests, or forgives everyone when this
    /// process was paused.
    pub fn check_liveness(&self) {
        let now = Instant::now();
        lock(&self.watchdog).feed(now);
        if let Sweep::Forgive { .. } = lock(&self.sweeper).begin(now) {
            lock(&self.workers)
                .iter_mut()
                .for_each(|w| w.clock.forgive(now));
            lock(&self.tp).clock.forgive(now);
            return;
        }
        let dead: Vec<usize> = lock(&self.workers)
            .iter_mut()
            .enumerate()
            .filter_map(|(i, w)| w.check_liveness(now).then_some(i))
            .collect();
        for worker in dead {
            let lost = lock(&self.registry).fail_all(Some(worker), EngineFailure::WorkerLost);
            tracing::warn!(worker, requests = lost.len(), "engine-worker declared dead");
            // If it was only paused, it must not go on computing for nobody.
            for (id, worker) in lost {
                self.send_abort(worker, id);
            }
        }
        self.probe_stalled(now);
        if lock(&self.tp).check_liveness(now) {
            *lock(&self.tp_outage) = Some(now);
            tracing::warn!(
                requests = lock(&self.registry).len(),
                window_s = self.config.tp_outage_window.as_secs(),
                "token-processor declared dead; in-flight requests wait for it"
            );
        }
        let expired = lock(&self.tp_outage).is_some_and(|since| {
            now.saturating_duration_since(since) > self.config.tp_outage_window
        });
        if expired {
            *lock(&self.tp_outage) = None;
            let lost = lock(&self.registry).fail_all(None, EngineFailure::TokenProcessorLost);
            tracing::warn!(
                requests = lost.len(),
                "token-processor gone past the outage window; its requests end with an error"
            );
            // Their outputs can no longer reach us: stop the work (and what the workers keep).
            for (id, worker) in lost {
                self.send_abort(worker, id);
            }
        }
    }

    /// Once a second: asks each worker about our requests that made no progress for the stall
    /// timeout (a lost final output, a dropped rejection); its `NotHeld` answer ends them.
    fn probe_stalled(&self, now: Instant) {
        {
            let mut last = lock(&self.stall_check);
            if now.saturating_duration_since(*last) < Duration::from_secs(1) {
                return;
            }
            *last = now;
        }
        let stalled = lock(&self.registry).stalled(now, self.config.stall_timeout);
        let mut by_worker: Vec<Vec<RequestId>> = vec![Vec::new(); self.worker_tx.len()];
        for (worker, id) in stalled {
            if let Some(ids) = by_worker.get_mut(worker) {
                ids.push(id);
            }
        }
        self.probe(by_worker);
    }

    /// `Ok` when a request could complete now; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err("shutting down".into());
        }
        let tp = lock(&self.tp);
        if let Some(reason) = &tp.refused {
            return Err(format!(
                "the token-processor refused this api-server: {reason}"
            ));
        }
        if !tp.alive() {
            return Err(match self.tp_outage() {
                Some(gone) => format!(
                    "token-processor has not said hello recently (gone {:.1} s; in-flight requests wait up to {} s for it)",
                    gone.as_secs_f64(),
                    self.config.tp_outage_window.as_secs()
                ),
                None => "token-processor has not said hello recently".into(),
            });
        }
        let workers = lock(&self.workers);
        if workers.iter().any(|w| servable(w, &tp)) {
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

    /// The context length requests are validated against: the smallest of the servable
    /// workers' (what the worker a request lands on accepts), or None before any.
    pub fn max_model_len(&self) -> Option<u32> {
        let tp = lock(&self.tp);
        lock(&self.workers)
            .iter()
            .filter(|w| servable(w, &tp))
            .filter_map(WorkerPeer::max_model_len)
            .min()
    }
}
