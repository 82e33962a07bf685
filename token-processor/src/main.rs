//! token-processor: specula's acceptance-tracking sidecar (see the crate docs), and
//! `token-processor replay FILE` for acceptance traces.

/// mimalloc: a 512-row batch allocates ~500 small token vectors that the forwarder frees on
/// another thread; measured in docs/history/benchmarks-notebook.md (token-processor, allocator).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{mpsc, watch};
use zeromq::{RouterSocket, Socket};

use link::ipc::{default_tp_api_endpoint, default_tp_ingest_endpoint};
use link::service::{self, Watchdog};
use token_processor::error::TpError;
use token_processor::ingest::{self, Ingest, IngestConfig, IngestHealth, IngestIo};
use token_processor::replay::{self, Batching, Trace};
use token_processor::tracker::RequestClasses;
use token_processor::{forward, http, memory, metrics, whatif};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "specula token-processor: per-request acceptance tracking, /metrics, output forwarding"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replays an acceptance trace (a golden case file or the engine-worker's JSON Lines) and
    /// prints {"requests": {...}, "global": {...}}; with --what-if, re-scores a worker's trace
    /// at every K' <= K under the fixed and goodput policies and writes a report.
    Replay {
        /// The trace file.
        #[arg(required_unless_present = "what_if", conflicts_with = "what_if")]
        file: Option<PathBuf>,
        /// A trace the engine-worker wrote with --trace-acceptance, to re-score.
        #[arg(long, requires = "out")]
        what_if: Option<PathBuf>,
        /// Where --what-if writes report.html and report.json (created if missing).
        #[arg(long, requires = "what_if")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// ZeroMQ endpoint the ROUTER socket binds for engine-workers (step batches in, acknowledgements out).
    #[arg(long, env = "SPECULA_INGEST_ENDPOINT", default_value_t = default_tp_ingest_endpoint())]
    ingest_endpoint: String,
    /// ZeroMQ endpoint the ROUTER socket binds for api-servers.
    #[arg(long, env = "SPECULA_TP_API_ENDPOINT", default_value_t = default_tp_api_endpoint())]
    api_endpoint: String,
    /// Address `/metrics` and `/health` listen on.
    #[arg(long, env = "SPECULA_METRICS_HOST", default_value = "127.0.0.1")]
    metrics_host: std::net::IpAddr,
    /// Port `/metrics` and `/health` listen on.
    #[arg(long, env = "SPECULA_METRICS_PORT", default_value_t = 9400)]
    metrics_port: u16,
    /// A client must send a request's headers within this many seconds, also the idle limit of
    /// a kept-alive connection: idle sockets cannot pile up on `/metrics`.
    #[arg(
        long,
        env = "SPECULA_TP_HTTP_HEADER_TIMEOUT_SECS",
        default_value_t = 10
    )]
    http_header_timeout_secs: u64,
    /// Most HTTP connections (`/metrics`, `/health`) open at once; more wait in the listen
    /// backlog, so scrapers and probes can never use the descriptors the ZeroMQ links need.
    #[arg(long, env = "SPECULA_TP_MAX_HTTP_CONNECTIONS", default_value_t = 4096)]
    max_http_connections: usize,
    /// In-flight requests tracked per worker; requests beyond it fail explicitly.
    #[arg(long, env = "SPECULA_TP_MAX_REQUESTS", default_value_t = 65_536)]
    max_requests: usize,
    /// Workers tracked at once; hellos beyond it are refused.
    #[arg(long, env = "SPECULA_TP_MAX_WORKERS", default_value_t = 256)]
    max_workers: usize,
    /// Largest K expected: the accepted-drafts-per-step histogram gets buckets 0..=this.
    #[arg(long, env = "SPECULA_TP_MAX_SPEC_TOKENS", default_value_t = 8)]
    max_spec_tokens: u32,
    /// Batches of outputs queued for the forwarder; while it is full, ingest holds further
    /// outputs back (merged per owner, at most 65,536) and drops them, counted, beyond that.
    #[arg(long, env = "SPECULA_TP_FORWARD_QUEUE", default_value_t = 256)]
    forward_queue: usize,
    /// Longest wait, on SIGTERM, for queued outputs to be sent.
    #[arg(long, env = "SPECULA_TP_SHUTDOWN_TIMEOUT_MS", default_value_t = 5_000)]
    shutdown_timeout_ms: u64,
    /// Request classes (comma-separated, a-z 0-9 _ -) that label the acceptance series, as the
    /// api-servers name them (`--request-classes` there too); any other class counts as
    /// `other`, so clients cannot grow the series. At most 32.
    #[arg(long, env = "SPECULA_REQUEST_CLASSES", value_delimiter = ',')]
    request_classes: Vec<String>,
    #[command(flatten)]
    service: service::ServiceArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Replay {
            what_if: Some(trace),
            out: Some(dir),
            ..
        }) => what_if(&trace, &dir),
        Some(Command::Replay { file, .. }) => {
            let file = file.context("a trace file is required")?;
            let trace = Trace::load(&file)?;
            let result = replay::run(&trace, Batching::Packed);
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
        None => {
            cli.serve.service.init_tracing();
            if let Err(e) = memory::disable_transparent_huge_pages() {
                tracing::warn!(error = %e, "could not turn transparent huge pages off; batches may stall on 2 MiB page faults");
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(return_idle_memory)
                .build()?;
            runtime.block_on(serve(cli.serve))
        }
    }
}

/// `replay --what-if TRACE --out DIR`: the report, and a one-line summary per setting.
fn what_if(path: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    let trace = whatif::WhatIfTrace::load(path)?;
    let (recorded, predictions) = whatif::predict(&trace);
    println!(
        "recorded: K={} {:.1} tokens/s ({} tokens in {:.2} s)",
        recorded.num_spec_tokens, recorded.tokens_per_s, recorded.tokens, recorded.seconds
    );
    for p in &predictions {
        println!(
            "{:?} K'={}: {:.3} accepted/step, predicted {:.1} tokens/s",
            p.policy, p.num_spec_tokens, p.accepted_per_step, p.predicted_tokens_per_s
        );
    }
    let report = whatif::Report {
        trace: path.display().to_string(),
        proposer: trace.proposer.clone(),
        model: trace.model.clone(),
        recorded,
        what_if: predictions,
        method: whatif::METHOD.to_vec(),
    };
    whatif::write_report(dir, &report)?;
    println!("wrote {}", dir.join("report.html").display());
    Ok(())
}

/// Called as a runtime thread goes idle: at most once a second per thread, hands that thread's
/// empty mimalloc pages back and purges expired free ranges, so RSS after a burst falls back to
/// live memory instead of holding the burst's peak until the thread next allocates.
fn return_idle_memory() {
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = Instant::now();
    if LAST
        .get()
        .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
    {
        return;
    }
    LAST.set(Some(now));
    // SAFETY: mi_collect only walks the calling thread's own heap and the shared arenas, under
    // mimalloc's own synchronisation; it is callable from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) };
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let origin = Instant::now();
    let tp_epoch = link::identity::new_epoch();
    let classes = Arc::new(RequestClasses::new(&args.request_classes).map_err(TpError::Config)?);
    let prometheus =
        metrics::install(args.max_spec_tokens).context("installing the metrics recorder")?;
    let link_secret = link::auth::secret_for(
        args.service.link_secret_file.as_ref(),
        &[&args.ingest_endpoint, &args.api_endpoint],
    )?;
    let bound = bind(&args).await?;

    let health = Arc::new(IngestHealth::new(origin));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let pipeline = start_pipeline(
        &args,
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
        header_read_timeout: Duration::from_secs(args.http_header_timeout_secs.max(1)),
        max_connections: args.max_http_connections,
    };
    let server = spawn_http(
        bound.http,
        http::router(prometheus, health),
        limits,
        shutdown_rx.clone(),
    );

    tracing::info!(ingest = %args.ingest_endpoint, api = %args.api_endpoint, http = %bound.http_addr, "token-processor ready");
    service::notify_ready();

    service::shutdown_signal().await;
    tracing::info!("shutting down: stopping ingest, flushing outputs");
    service::notify_stopping();
    let _ = shutdown_tx.send(true);
    drain(pipeline, args.shutdown_timeout_ms).await;
    upkeep.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    Ok(())
}

/// The sockets and listener `serve` binds before anything runs.
struct Bound {
    ingest: RouterSocket,
    api: RouterSocket,
    http: tokio::net::TcpListener,
    http_addr: SocketAddr,
}

async fn bind(args: &ServeArgs) -> anyhow::Result<Bound> {
    for endpoint in [&args.ingest_endpoint, &args.api_endpoint] {
        link::ipc::prepare_bind(endpoint).with_context(|| format!("preparing {endpoint}"))?;
    }
    let mut ingest = RouterSocket::new();
    ingest
        .bind(&args.ingest_endpoint)
        .await
        .with_context(|| format!("binding ingest on {}", args.ingest_endpoint))?;
    let mut api = RouterSocket::new();
    api.bind(&args.api_endpoint)
        .await
        .with_context(|| format!("binding api endpoint on {}", args.api_endpoint))?;
    let http_addr = SocketAddr::new(args.metrics_host, args.metrics_port);
    let http = link::http::bind(http_addr, HTTP_LISTEN_BACKLOG)
        .with_context(|| format!("binding HTTP on {http_addr}"))?;
    Ok(Bound {
        ingest,
        api,
        http,
        http_addr,
    })
}

/// What the ingest and the forwarder are started with besides their sockets.
struct PipelineContext {
    tp_epoch: u64,
    classes: Arc<RequestClasses>,
    link_secret: Option<link::auth::Secret>,
    health: Arc<IngestHealth>,
    shutdown: watch::Receiver<bool>,
}

/// The ingest (step batches in) and the forwarder (outputs out), running.
struct Pipeline {
    ingest: tokio::task::JoinHandle<Ingest>,
    forwarder: tokio::task::JoinHandle<()>,
}

/// Starts the forwarder, then the ingest that feeds it outputs and the list of live workers.
fn start_pipeline(
    args: &ServeArgs,
    ingest_router: RouterSocket,
    api_router: RouterSocket,
    context: PipelineContext,
) -> Pipeline {
    let (forward_tx, forward_rx) = mpsc::channel(args.forward_queue.max(1));
    let liveness = args.service.liveness();
    let (live_workers_tx, live_workers_rx) = watch::channel(Vec::new());
    let forwarder = tokio::spawn(forward::run(
        api_router,
        forward_rx,
        live_workers_rx,
        liveness,
        context.tp_epoch,
        link::auth::Gate::new(context.link_secret.clone()),
    ));

    let config = IngestConfig {
        max_requests_per_worker: args.max_requests,
        max_workers: args.max_workers,
        classes: context.classes,
    };
    let ingest = tokio::spawn(ingest::run(
        ingest_router,
        Ingest::new(config),
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
fn spawn_upkeep(prometheus: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            prometheus.run_upkeep();
        }
    })
}

/// Connections the kernel queues for the HTTP listener before they are accepted.
const HTTP_LISTEN_BACKLOG: u32 = 1024;

/// Serves `/metrics` and `/health` until shutdown.
fn spawn_http(
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
async fn drain(pipeline: Pipeline, shutdown_timeout_ms: u64) {
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
