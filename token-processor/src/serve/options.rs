//! The service's options: what `token-processor` (without a subcommand) takes.

use link::ipc::{default_tp_api_endpoint, default_tp_ingest_endpoint};

use crate::ingest::{DEFAULT_MAX_REQUESTS_PER_WORKER, DEFAULT_MAX_WORKERS};

/// The token-processor's options (flattened into the binary's command line; the doc comments of
/// the fields are its `--help`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// ZeroMQ endpoint the ROUTER socket binds for engine-workers (step batches in, acknowledgements out).
    #[arg(long, env = "SPECULA_INGEST_ENDPOINT", default_value_t = default_tp_ingest_endpoint())]
    pub ingest_endpoint: String,
    /// ZeroMQ endpoint the ROUTER socket binds for api-servers.
    #[arg(long, env = "SPECULA_TP_API_ENDPOINT", default_value_t = default_tp_api_endpoint())]
    pub api_endpoint: String,
    /// Address `/metrics` and `/health` listen on.
    #[arg(long, env = "SPECULA_METRICS_HOST", default_value = "127.0.0.1")]
    pub metrics_host: std::net::IpAddr,
    /// Port `/metrics` and `/health` listen on.
    #[arg(long, env = "SPECULA_METRICS_PORT", default_value_t = 9400)]
    pub metrics_port: u16,
    /// A client must send a request's headers within this many seconds, also the idle limit of
    /// a kept-alive connection: idle sockets cannot pile up on `/metrics`.
    #[arg(
        long,
        env = "SPECULA_TP_HTTP_HEADER_TIMEOUT_SECS",
        default_value_t = 10
    )]
    pub http_header_timeout_secs: u64,
    /// Most HTTP connections (`/metrics`, `/health`) open at once; more wait in the listen
    /// backlog, so scrapers and probes can never use the descriptors the ZeroMQ links need.
    #[arg(long, env = "SPECULA_TP_MAX_HTTP_CONNECTIONS", default_value_t = 4096)]
    pub max_http_connections: usize,
    /// In-flight requests tracked per worker; requests beyond it fail explicitly.
    #[arg(long, env = "SPECULA_TP_MAX_REQUESTS", default_value_t = DEFAULT_MAX_REQUESTS_PER_WORKER)]
    pub max_requests: usize,
    /// Workers tracked at once; hellos beyond it are refused.
    #[arg(long, env = "SPECULA_TP_MAX_WORKERS", default_value_t = DEFAULT_MAX_WORKERS)]
    pub max_workers: usize,
    /// A worker that left (goodbye, or silent past its window) keeps its series and totals
    /// this many seconds, then they are removed.
    #[arg(long, env = "SPECULA_TP_DEPARTED_RETENTION_SECS", default_value_t = crate::ingest::DEFAULT_DEPARTED_RETENTION.as_secs())]
    pub departed_retention_secs: u64,
    /// Largest K expected: the accepted-drafts-per-step histogram gets buckets 0..=this.
    #[arg(long, env = "SPECULA_TP_MAX_SPEC_TOKENS", default_value_t = 8)]
    pub max_spec_tokens: u32,
    /// Batches of outputs queued for the forwarder; while it is full, ingest holds further
    /// outputs back (merged per owner, at most 65,536) and drops them, counted, beyond that.
    #[arg(long, env = "SPECULA_TP_FORWARD_QUEUE", default_value_t = 256)]
    pub forward_queue: usize,
    /// Longest wait, on SIGTERM, for queued outputs to be sent.
    #[arg(long, env = "SPECULA_TP_SHUTDOWN_TIMEOUT_MS", default_value_t = 5_000)]
    pub shutdown_timeout_ms: u64,
    /// Request classes (comma-separated, a-z 0-9 _ -) that label the acceptance series, as the
    /// api-servers name them (`--request-classes` there too); any other class counts as
    /// `other`, so clients cannot grow the series. At most 32.
    #[arg(long, env = "SPECULA_REQUEST_CLASSES", value_delimiter = ',')]
    pub request_classes: Vec<String>,
    #[command(flatten)]
    pub service: link::service::ServiceArgs,
}

impl ServeConfig {
    /// [`ServeConfig::departed_retention_secs`] as a duration.
    pub fn departed_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.departed_retention_secs)
    }
}
