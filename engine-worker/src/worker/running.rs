//! Starting and stopping a worker: the links on tokio, the step loop on its own thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::step_thread::{step_loop_thread, EngineEnds};
use super::WorkerConfig;
use crate::io::api::{bind_api, run_api_link, ApiLinkSettings};
use crate::io::step_loop::{step_loop_failure, step_loop_stall};
use crate::io::tp::{run_tp_link, TpLinkConfig};
use crate::io::{EngineCommand, WorkerStatus};
use crate::EngineError;

/// Commands queued for the step loop, and outputs queued for the api link.
const QUEUE: usize = 4096;

/// An engine-worker in this process (see [`Worker::start`]).
pub struct Worker;

impl Worker {
    /// Checks the options, binds the api endpoint, starts the api and token-processor links
    /// and the step-loop thread, which loads the model: the worker says it is not ready until
    /// [`Starting::loaded`] resolves. Must run inside a tokio runtime.
    pub async fn start(config: WorkerConfig) -> Result<Starting, EngineError> {
        config.check()?;
        let worker_id = config.worker_id();
        // The proposer labels metric series: refuse a name that cannot be one (a draft file
        // name too long, say) now, not at the token-processor.
        proto::worker_tp::check_proposer(&config.proposer_name())
            .map_err(EngineError::ProposerName)?;
        let status = worker_status(&config, &worker_id);
        let heartbeat = config.service.liveness().interval;
        let link_secret = link::auth::secret_for(
            config.service.link_secret_file.as_ref(),
            &[&config.api_endpoint, &config.tp_endpoint],
        )?;
        let router = bind_api(&config.api_endpoint).await?;
        tracing::info!(endpoint = %config.api_endpoint, "api endpoint bound; loading the model");

        let (cmd_tx, cmd_rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (tp_tx, tp_rx) = tokio::sync::mpsc::channel(config.tp_queue.max(1));
        let (api_tx, api_rx) = tokio::sync::mpsc::channel(QUEUE);
        let (admission_tx, admission_rx) = tokio::sync::watch::channel(None);
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();

        let api_task = tokio::spawn(run_api_link(
            router,
            status.clone(),
            cmd_tx.clone(),
            api_rx,
            admission_rx,
            ApiLinkSettings {
                heartbeat_interval: heartbeat,
                gate: link::auth::Gate::new(link_secret.clone()),
            },
            shutdown_rx,
        ));
        let tp_task = tokio::spawn(run_tp_link(
            TpLinkConfig {
                secret: link_secret,
                endpoint: config.tp_endpoint.clone(),
                heartbeat_interval: heartbeat,
                send_timeout: Duration::from_secs(2),
                linger: Duration::from_millis(300),
            },
            status.clone(),
            tp_rx,
        ));

        let drain = Duration::from_secs(config.drain_timeout_secs);
        let stall = step_loop_stall(config.engine.max_num_batched_tokens);
        let ends = EngineEnds {
            commands: cmd_rx,
            to_tp: tp_tx,
            to_api: api_tx,
            admission: admission_tx,
            loaded: loaded_tx,
        };
        let engine_status = status.clone();
        let engine_thread = std::thread::Builder::new()
            .name("step-loop".into())
            .spawn(move || step_loop_thread(&config, &worker_id, engine_status, ends))
            .map_err(EngineError::Thread)?;
        Ok(Starting {
            loaded: loaded_rx,
            running: Running {
                status,
                commands: cmd_tx,
                tp_task,
                api_task,
                engine_thread,
                shutdown: shutdown_tx,
                drain,
                stall,
            },
        })
    }
}

/// What the worker says of itself in hellos and heartbeats, before the model is loaded.
fn worker_status(config: &WorkerConfig, worker_id: &str) -> Arc<WorkerStatus> {
    let epoch = link::identity::new_epoch();
    // The same name the loader gives the model, so metric labels do not change when the
    // not-ready hello is followed by the ready one.
    let model_label = vocab::served_model_name(&config.model);
    Arc::new(WorkerStatus::new(
        worker_id.to_owned(),
        epoch,
        model_label,
        config.engine.num_spec_tokens as u32,
        config.proposer_name(),
        config.service.heartbeat_interval_ms,
    ))
}

/// A worker whose links run while the step loop loads the model.
pub struct Starting {
    loaded: tokio::sync::oneshot::Receiver<Result<(), EngineError>>,
    running: Running,
}

impl Starting {
    /// What the worker says of itself (not ready yet).
    pub fn status(&self) -> &Arc<WorkerStatus> {
        &self.running.status
    }

    /// Resolves once the model is loaded and the worker takes requests, or with why loading
    /// failed.
    pub async fn loaded(self) -> Result<Running, EngineError> {
        self.loaded
            .await
            .unwrap_or(Err(EngineError::StepLoopDied))?;
        Ok(self.running)
    }
}

/// A serving worker: its tasks and the step-loop thread.
pub struct Running {
    status: Arc<WorkerStatus>,
    /// To the step loop (the drain).
    commands: std::sync::mpsc::SyncSender<EngineCommand>,
    tp_task: tokio::task::JoinHandle<()>,
    api_task: tokio::task::JoinHandle<()>,
    engine_thread: std::thread::JoinHandle<()>,
    /// Ends the api link.
    shutdown: tokio::sync::watch::Sender<bool>,
    /// `--drain-timeout-secs`.
    drain: Duration,
    /// How long the step loop may go without a pass before it counts as stalled.
    stall: Duration,
}

impl Running {
    /// What the worker says of itself in hellos and heartbeats.
    pub fn status(&self) -> &Arc<WorkerStatus> {
        &self.status
    }

    /// Resolves only if the step loop fails (its thread ended, or it stopped turning), with
    /// why: heartbeats would stay green while nothing steps, so the caller should exit.
    pub async fn failure(&self) -> String {
        step_loop_failure(&self.status, &self.engine_thread, self.stall).await
    }

    /// Stops taking requests, lets those running finish within the drain timeout (then aborts
    /// them), and returns once the links and the step loop have ended.
    pub async fn drain_and_stop(self) {
        self.status.start_draining();
        let _ = self.commands.send(EngineCommand::Drain {
            deadline: Instant::now() + self.drain,
        });
        self.stop().await;
    }

    /// After the drain was asked for: waits for the step loop's goodbye to reach the
    /// token-processor, then ends the api link and the step loop.
    async fn stop(self) {
        // The link ends after sending the step loop's goodbye; bound the wait regardless.
        if tokio::time::timeout(self.drain + Duration::from_secs(10), self.tp_task)
            .await
            .is_err()
        {
            tracing::error!("token-processor link did not finish in time");
        }
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.api_task).await;
        let engine_thread = self.engine_thread;
        let _ = tokio::task::spawn_blocking(move || engine_thread.join()).await;
    }
}
