//! The service's parts: its sockets, the ingest and the forwarder, metrics upkeep, HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{mpsc, watch};
use zeromq::{RouterSocket, Socket};

use super::ServeConfig;
use crate::error::TpError;
use crate::forward;
use crate::ingest::{self, Ingest, IngestConfig, IngestHealth, IngestIo};
use crate::tracker::RequestClasses;
use link::service::Watchdog;

/// Connections the kernel queues for the HTTP listener before they are accepted.
const HTTP_LISTEN_BACKLOG: u32 = 1024;

/// The sockets and listener the service binds before anything runs.
pub(super) struct Bound {
    pub ingest: RouterSocket,
    pub api: RouterSocket,
    pub http: tokio::net::TcpListener,
    pub http_addr: SocketAddr,
}

pub(super) async fn bind(config: &ServeConfig) -> Result<Bound, TpError> {
    let ingest = bind_router("ingest", &config.ingest_endpoint).await?;
    let api = bind_router("api endpoint", &config.api_endpoint).await?;
    let http_addr = SocketAddr::new(config.metrics_host, config.metrics_port);
    let http = link::http::bind(http_addr, HTTP_LISTEN_BACKLOG).map_err(|e| TpError::Bind {
        what: "HTTP",
        endpoint: http_addr.to_string(),
        message: e.to_string(),
    })?;
    Ok(Bound {
        ingest,
        api,
        http,
        http_addr,
    })
}

async fn bind_router(what: &'static str, endpoint: &str) -> Result<RouterSocket, TpError> {
    let refused = |message: String| TpError::Bind {
        what,
        endpoint: endpoint.to_owned(),
        message,
    };
    link::ipc::prepare_bind(endpoint).map_err(|e| refused(e.to_string()))?;
    let mut socket = RouterSocket::new();
    socket
        .bind(endpoint)
        .await
        .map_err(|e| refused(e.to_string()))?;
    Ok(socket)
}

/// What the ingest and the forwarder are started with besides their sockets.
pub(super) struct PipelineContext {
    pub tp_epoch: u64,
    pub classes: Arc<RequestClasses>,
    pub link_secret: Option<link::auth::Secret>,
    pub health: Arc<IngestHealth>,
    pub shutdown: watch::Receiver<bool>,
}

/// The ingest (step batches in) and the forwarder (outputs out), running.
pub(super) struct Pipeline {
    ingest: tokio::task::JoinHandle<Ingest>,
    forwarder: tokio::task::JoinHandle<()>,
}

/// Starts the forwarder, then the ingest that feeds it outputs and the list of live workers.
pub(super) fn start_pipeline(
    config: &ServeConfig,
    ingest_router: RouterSocket,
    api_router: RouterSocket,
    context: PipelineContext,
) -> Pipeline {
    let (forward_tx, forward_rx) = mpsc::channel(config.forward_queue.max(1));
    let liveness = config.service.liveness();
    let (live_workers_tx, live_workers_rx) = watch::channel(Vec::new());
    let forwarder = tokio::spawn(forward::run(
        api_router,
        forward_rx,
        live_workers_rx,
        liveness,
        context.tp_epoch,
        link::auth::Gate::new(context.link_secret.clone()),
    ));

    let ingest_config = IngestConfig {
        max_requests_per_worker: config.max_requests,
        max_workers: config.max_workers,
        classes: context.classes,
        departed_retention: config.departed_retention(),
    };
    let ingest = tokio::spawn(ingest::run(
        ingest_router,
        Ingest::new(ingest_config),
        IngestIo {
            forward: forward_tx,
            health: context.health,
            live_workers: live_workers_tx,
            shutdown: context.shutdown,
            watchdog: Watchdog::from_env(),
            gate: link::auth::Gate::new(context.link_secret),
        },
    ));
    Pipeline { ingest, forwarder }
}

/// Histograms buffer raw samples until upkeep folds them in: bound that buffer.
pub(super) fn spawn_upkeep(prometheus: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut ticks = 0u64;
        loop {
            tick.tick().await;
            ticks += 1;
            crate::metrics::keep_process_series_alive();
            prometheus.run_upkeep();
            // The recorder starts a series' idle clock when a render first sees its latest
            // update, so a departed worker's series would outlive the retention by however
            // long nobody scraped: a render each second starts the clocks on time.
            if ticks.is_multiple_of(4) {
                drop(prometheus.render());
            }
        }
    })
}

/// Serves `/metrics` and `/health` until shutdown.
pub(super) fn spawn_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: link::http::HttpLimits,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(link::http::serve(listener, app, limits, async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    }))
}

/// Waits, at most `shutdown_timeout_ms`, for the ingest to stop and the forwarder to send what
/// is queued.
pub(super) async fn drain(pipeline: Pipeline, shutdown_timeout_ms: u64) {
    let bound = Duration::from_millis(shutdown_timeout_ms);
    let drained = tokio::time::timeout(bound, async {
        let ingest = pipeline.ingest.await;
        let _ = pipeline.forwarder.await;
        ingest
    })
    .await;
    match drained {
        Ok(Ok(ingest)) => {
            tracing::info!(in_flight = ingest.in_flight(), "outputs flushed; exiting")
        }
        Ok(Err(e)) => tracing::error!(error = %e, "ingest task failed"),
        Err(_) => tracing::warn!(
            timeout_ms = shutdown_timeout_ms,
            "shutdown bound reached; exiting"
        ),
    }
}
