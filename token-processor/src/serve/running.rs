//! Starting and stopping the service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::pipeline::{
    bind, drain, spawn_http, spawn_upkeep, start_pipeline, Pipeline, PipelineContext,
};
use super::ServeConfig;
use crate::error::TpError;
use crate::ingest::IngestHealth;
use crate::tracker::RequestClasses;
use crate::{http, metrics};

/// A token-processor in this process (see [`TokenProcessor::start`]).
pub struct TokenProcessor;

impl TokenProcessor {
    /// Installs the metrics recorder (once per process), binds the ingest and api ROUTERs and
    /// the HTTP listener, and starts the ingest, the forwarder, metrics upkeep and `/metrics`.
    /// Must run inside a tokio runtime.
    pub async fn start(config: ServeConfig) -> Result<Running, TpError> {
        let origin = Instant::now();
        let tp_epoch = link::identity::new_epoch();
        let classes =
            Arc::new(RequestClasses::new(&config.request_classes).map_err(TpError::Config)?);
        let prometheus = metrics::install(config.max_spec_tokens, config.departed_retention())?;
        let link_secret = link::auth::secret_for(
            config.service.link_secret_file.as_ref(),
            &[&config.ingest_endpoint, &config.api_endpoint],
        )?;
        let bound = bind(&config).await?;

        let health = Arc::new(IngestHealth::new(origin));
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let pipeline = start_pipeline(
            &config,
            bound.ingest,
            bound.api,
            PipelineContext {
                tp_epoch,
                classes,
                link_secret,
                health: health.clone(),
                shutdown: shutdown_rx.clone(),
            },
        );
        let upkeep = spawn_upkeep(prometheus.clone());
        let limits = link::http::HttpLimits {
            header_read_timeout: Duration::from_secs(config.http_header_timeout_secs.max(1)),
            // A scrape that stops reading holds its response no longer than a silent one.
            write_timeout: Duration::from_secs(config.http_header_timeout_secs.max(1)),
            max_connections: config.max_http_connections,
        };
        let server = spawn_http(
            bound.http,
            http::router(prometheus, health),
            limits,
            shutdown_rx,
        );
        Ok(Running {
            http_addr: bound.http_addr,
            shutdown: shutdown_tx,
            pipeline,
            upkeep,
            server,
            shutdown_timeout_ms: config.shutdown_timeout_ms,
        })
    }
}

/// A serving token-processor: its tasks.
pub struct Running {
    http_addr: SocketAddr,
    /// Stops the ingest and the HTTP server.
    shutdown: watch::Sender<bool>,
    pipeline: Pipeline,
    upkeep: tokio::task::JoinHandle<()>,
    server: tokio::task::JoinHandle<()>,
    /// `--shutdown-timeout-ms`.
    shutdown_timeout_ms: u64,
}

impl Running {
    /// Where `/metrics` and `/health` listen.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Stops the ingest, waits (bounded) for queued outputs to be sent, then ends the rest.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        drain(self.pipeline, self.shutdown_timeout_ms).await;
        self.upkeep.abort();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.server).await;
    }
}
