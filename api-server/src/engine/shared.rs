//! [`Shared`]: what the links, the liveness loop and the request handles share: the engine
//! state ([`super::state::EngineState`], behind its one lock), each worker's outbound queue and
//! the admission books. Each input decodes here, goes to the state with the time it arrived, and
//! the effects the state returns are carried out after the lock is released.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use link::service::Watchdog;
use proto::api_worker::{ApiToWorker, WorkerToApi};
use proto::tp_api::TpToApi;
use tokio::sync::mpsc;

use super::admission::Admission;
use super::ids::IdAllocator;
use super::state::{Effects, EngineState, Reply};
use super::EngineClientConfig;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state machine changes nothing across a panic point it could leave half done, so
    // poisoning is not fatal.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Shared {
    pub config: EngineClientConfig,
    /// Changes on every process start.
    pub epoch: u64,
    pub ids: IdAllocator,
    pub state: Mutex<EngineState>,
    pub worker_tx: Vec<mpsc::Sender<ApiToWorker>>,
    pub admission: Admission,
    watchdog: Mutex<Watchdog>,
}

impl Shared {
    pub fn new(config: EngineClientConfig, worker_tx: Vec<mpsc::Sender<ApiToWorker>>) -> Self {
        Self {
            epoch: link::identity::new_epoch(),
            ids: IdAllocator::random(),
            state: Mutex::new(EngineState::new(&config, Instant::now())),
            worker_tx,
            admission: Admission::new(
                config.admission,
                config.max_sequences_per_request,
                config.request_share,
                config.admission_wait,
            ),
            watchdog: Mutex::new(Watchdog::from_env()),
            config,
        }
    }

    pub fn state(&self) -> MutexGuard<'_, EngineState> {
        lock(&self.state)
    }

    /// Hands the effects' frames to their workers' links and returns the reply for the link
    /// the input came on.
    pub fn apply(&self, effects: Effects) -> Reply {
        for (worker, frame) in effects.to_workers {
            if let Some(tx) = self.worker_tx.get(worker) {
                // A full queue means the link is down or behind. What is lost: an abort (the
                // worker drops our requests when it stops hearing from us), an acknowledgement
                // (it drops the output at its retention age bound) or a probe (asked again).
                let _ = tx.try_send(frame);
            }
        }
        effects.reply
    }

    pub fn on_worker_frame(&self, worker: usize, frame: &[u8]) -> Reply {
        let msg = match proto::decode::<WorkerToApi>(frame) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(worker, error = %e, "undecodable frame from engine-worker");
                return Reply::Nothing;
            }
        };
        let effects = self.state().on_worker_message(Instant::now(), worker, msg);
        self.apply(effects)
    }

    pub fn on_tp_frame(&self, frame: &[u8]) -> Reply {
        let msg = match proto::decode::<TpToApi>(frame) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable frame from token-processor");
                return Reply::Nothing;
            }
        };
        let effects = self.state().on_tp_message(Instant::now(), msg);
        self.apply(effects)
    }

    /// One liveness pass (the api-server's main loop, which also feeds systemd's watchdog).
    pub fn check_liveness(&self) {
        let now = Instant::now();
        lock(&self.watchdog).feed(now);
        let effects = self.state().tick(now);
        self.apply(effects);
    }
}
