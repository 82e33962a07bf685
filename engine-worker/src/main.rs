//! engine-worker: loads the model, serves api-servers over a ZeroMQ ROUTER and pushes one step
//! batch per engine step to the token-processor. The wiring is `engine_worker::worker`; this
//! binary parses the options, starts the worker and waits for SIGTERM or a step-loop failure.

use clap::Parser;
use engine_worker::worker::{Worker, WorkerConfig};
use link::service;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "specula engine-worker: model, continuous batching, speculative decoding"
)]
struct Args {
    #[command(flatten)]
    worker: WorkerConfig,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.worker.service.init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args.worker))
}

async fn run(config: WorkerConfig) -> anyhow::Result<()> {
    let starting = Worker::start(config).await?;
    let running = tokio::select! {
        loaded = starting.loaded() => loaded?,
        _ = service::shutdown_signal() => {
            tracing::info!("stopped while loading; exiting");
            return Ok(());
        }
    };
    let status = running.status();
    tracing::info!(worker_id = %status.worker_id, model = %status.hello().model, "ready");
    service::notify_ready();

    tokio::select! {
        _ = service::shutdown_signal() => tracing::info!("draining"),
        why = running.failure() => {
            // Heartbeats would stay green while nothing steps: exit so that systemd restarts us.
            tracing::error!(reason = %why, "step loop failed; exiting");
            anyhow::bail!("step loop failed: {why}");
        }
    }
    service::notify_stopping();
    running.drain_and_stop().await;
    tracing::info!("bye");
    Ok(())
}
