//! The step-loop thread: loads the model, says so, then steps until a drain ends.

use std::sync::Arc;

use super::build::load_engine;
use super::WorkerConfig;
use crate::io::api::ApiAdmission;
use crate::io::step_loop::{run_step_loop, StepLoopIo};
use crate::io::{ApiOutbound, EngineCommand, TpOutbound, WorkerStatus};
use crate::EngineError;

/// The step loop's ends of the worker's channels.
pub(super) struct EngineEnds {
    pub commands: std::sync::mpsc::Receiver<EngineCommand>,
    pub to_tp: tokio::sync::mpsc::Sender<TpOutbound>,
    pub to_api: tokio::sync::mpsc::Sender<ApiOutbound>,
    /// Tells the api link what it needs to admit requests, once the model is loaded.
    pub admission: tokio::sync::watch::Sender<Option<ApiAdmission>>,
    /// Whether loading worked.
    pub loaded: tokio::sync::oneshot::Sender<Result<(), EngineError>>,
}

/// Loads the model and says so (to the api link, the status and `ends.loaded`), then steps
/// until a drain ends.
pub(super) fn step_loop_thread(
    config: &WorkerConfig,
    worker_id: &str,
    status: Arc<WorkerStatus>,
    ends: EngineEnds,
) {
    let (engine, trace) = match load_engine(config, worker_id) {
        Ok(loaded) => loaded,
        Err(err) => {
            let _ = ends.loaded.send(Err(err));
            return;
        }
    };
    let _ = ends.admission.send(Some(ApiAdmission {
        max_waiting: engine.config().max_waiting,
        grammars: engine.grammars().cloned(),
    }));
    status.set_kv_bytes(engine.kv_cache_bytes(), engine.draft_kv_bytes());
    status.set_ready(
        engine.backend().config().name.clone(),
        engine.config().max_model_len,
        engine.kv_capacity_tokens(),
        engine.config().max_num_seqs,
    );
    // The token-processor saw a not-ready hello; a resync is preceded by a fresh hello.
    status.request_resync();
    let _ = ends.loaded.send(Ok(()));
    let watchdog = link::service::Watchdog::from_env();
    run_step_loop(
        engine,
        StepLoopIo {
            commands: ends.commands,
            to_tp: ends.to_tp,
            to_api: ends.to_api,
            status,
            trace,
            watchdog,
        },
    );
}
