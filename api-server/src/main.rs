//! api-server: specula's OpenAI-compatible HTTP front end (see the crate docs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use api_server::auth::ApiKey;
use api_server::body::BodyLimits;
use api_server::engine::{EngineClient, EngineClientConfig, EngineOptions};
use api_server::memory::IdleTrim;
use api_server::model::ModelAssets;
use api_server::openai::validate::Limits;
use api_server::request_class::RequestClasses;
use api_server::routes::{router, AppState};
use clap::Parser;

/// OpenAI-compatible API for specula: completions and chat with per-request speculative
/// decoding figures.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SPECULA_API_HOST", default_value = "127.0.0.1")]
    host: String,
    /// HTTP port.
    #[arg(long, env = "SPECULA_API_PORT", default_value_t = 8000)]
    port: u16,
    /// The model: a GGUF file or an HF directory (tokenizer.json + tokenizer_config.json).
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// Name clients use in `model` (default: the model file's name without `.gguf` and
    /// quantization tag; the --model argument as given is accepted too, as vLLM does).
    #[arg(long, env = "SPECULA_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer <key>` on every route but /health.
    #[arg(long, env = "SPECULA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Context length (prompt + completion); defaults to the model's.
    #[arg(long, env = "SPECULA_MAX_MODEL_LEN")]
    max_model_len: Option<u32>,
    /// Upper bound on any request's duration; past it the request is aborted with an error.
    #[arg(long, env = "SPECULA_REQUEST_TIMEOUT_SECS", default_value_t = 600)]
    request_timeout_secs: u64,
    /// A client must send a request's headers within this many seconds, also the idle limit of
    /// a kept-alive connection (a silent or slow client cannot hold a connection).
    #[arg(long, env = "SPECULA_HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    http_header_timeout_secs: u64,
    /// Most HTTP connections open at once; more wait in the listen backlog. Keep it under the
    /// process's file-descriptor limit (the systemd unit sets LimitNOFILE=65536).
    #[arg(long, env = "SPECULA_MAX_CONNECTIONS", default_value_t = 16_384)]
    max_connections: usize,
    /// Connections the kernel queues for the listener before they are accepted (capped by
    /// `net.core.somaxconn`); a burst of new connections past it waits a handshake
    /// retransmission (1 s) before the server sees it.
    #[arg(long, env = "SPECULA_LISTEN_BACKLOG", default_value_t = 4096)]
    listen_backlog: u32,
    /// A response whose client reads nothing for this many seconds is dropped: a stream's
    /// sequences are aborted and their room under the admission bound given back; a whole
    /// response's connection is closed and its buffers freed.
    #[arg(long, env = "SPECULA_STREAM_WRITE_TIMEOUT_SECS", default_value_t = 30)]
    stream_write_timeout_secs: u64,
    /// A request's body must arrive within this many seconds of its headers (a client that
    /// trickles its body cannot hold a connection and a handler); past it a 408.
    #[arg(long, env = "SPECULA_HTTP_BODY_TIMEOUT_SECS", default_value_t = 30)]
    http_body_timeout_secs: u64,
    /// Web origins (`scheme://host[:port]`, comma-separated; `*` for any) whose pages may call
    /// the API; a request with any other `Origin` header gets a 403. None by default: a page
    /// the operator opens cannot drive the server. Clients other than browsers send no Origin.
    #[arg(long, env = "SPECULA_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Request classes (comma-separated, a-z 0-9 _ -, at most 32) that label the
    /// token-processor's acceptance series (give it the same list); a request names its class
    /// with the header below or `metadata.class`, and any class not listed counts as `other`.
    #[arg(long, env = "SPECULA_REQUEST_CLASSES", value_delimiter = ',')]
    request_classes: Vec<String>,
    /// The header a request's class is read from, before `metadata.class` (none: metadata only).
    #[arg(long, env = "SPECULA_REQUEST_CLASS_HEADER")]
    request_class_header: Option<String>,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "SPECULA_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// On SIGTERM, how long in-flight requests may run before the server exits anyway.
    #[arg(long, env = "SPECULA_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    shutdown_grace_secs: u64,
    #[command(flatten)]
    engine: EngineOptions,
    #[command(flatten)]
    service: link::service::ServiceArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.service.init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(run(args));
    // Background socket tasks may still be parked in connects; don't wait on them.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.engine.worker_endpoints.is_empty() {
        anyhow::bail!("--worker-endpoints must name at least one engine-worker");
    }
    let (model, max_model_len) = load_model(&args)?;
    let api_server_id = args
        .engine
        .api_server_id
        .clone()
        .unwrap_or_else(|| link::identity::default_id("api", &format!("port-{}", args.port)));
    let engine = EngineClient::start(engine_config(&args, api_server_id.clone())?);
    let idle_trim = Arc::new(IdleTrim::default());
    tokio::spawn(api_server::memory::run(idle_trim.clone(), engine.clone()));
    let request_classes =
        RequestClasses::new(&args.request_classes, args.request_class_header.as_deref())
            .map_err(|reason| anyhow::anyhow!("request classes: {reason}"))?;
    let mut state = app_state(&args, model, max_model_len, engine.clone(), idle_trim);
    state.request_classes = Arc::new(request_classes);
    let app = router(state, ApiKey(args.api_key.clone().map(Into::into)));

    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("bad listen address {}:{}", args.host, args.port))?;
    let listener =
        link::http::bind(addr, args.listen_backlog).with_context(|| format!("binding {addr}"))?;
    tracing::info!(
        %addr,
        %api_server_id,
        workers = args.engine.worker_endpoints.len(),
        tp = %args.engine.tp_endpoint,
        "listening"
    );
    tokio::spawn(api_server::notify::run(engine.clone()));
    serve_until_shutdown(&args, listener, app, &engine).await;
    engine.shutdown(Duration::from_secs(2)).await;
    tracing::info!("stopped");
    Ok(())
}

/// The tokenizer and chat template, and the context length (the flag's, else the model's).
fn load_model(args: &Args) -> anyhow::Result<(ModelAssets, u32)> {
    let model = ModelAssets::load(&args.model)
        .with_context(|| format!("loading the tokenizer of {}", args.model.display()))?;
    let max_model_len = match (args.max_model_len, model.context_length) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => anyhow::bail!("the model states no context length; pass --max-model-len"),
    };
    tracing::info!(
        model = %args.model.display(),
        vocab = model.tokenizer.vocab_size(),
        max_model_len,
        chat_template = model.chat_template.is_some(),
        "tokenizer loaded"
    );
    Ok((model, max_model_len))
}

fn engine_config(args: &Args, api_server_id: String) -> anyhow::Result<EngineClientConfig> {
    let secret = link::auth::secret_for(
        args.service.link_secret_file.as_ref(),
        &args.engine.endpoints(),
    )?;
    Ok(args
        .engine
        .client_config(api_server_id, args.service.liveness(), secret))
}

fn app_state(
    args: &Args,
    model: ModelAssets,
    max_model_len: u32,
    engine: EngineClient,
    idle_trim: Arc<IdleTrim>,
) -> AppState {
    let served_model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| vocab::served_model_name(&args.model));
    let model_names = api_server::model::model_aliases(&served_model_name, &args.model);
    AppState {
        model: Arc::new(model),
        served_model_name: served_model_name.into(),
        model_names: model_names.into(),
        model_root: args.model.display().to_string().into(),
        limits: Arc::new(Limits::new(max_model_len)),
        engine,
        request_timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
        stream_write_timeout: Duration::from_secs(args.stream_write_timeout_secs.max(1)),
        allowed_origins: api_server::origin::AllowedOrigins(args.allowed_origins.clone().into()),
        body: BodyLimits::new(
            args.max_body_bytes,
            Duration::from_secs(args.http_body_timeout_secs.max(1)),
            std::thread::available_parallelism().map_or(2, |n| n.get()),
        ),
        started_unix: api_server::openai::responses::unix_now(),
        idle_trim,
        request_classes: Arc::default(),
    }
}

/// Serves until a shutdown signal, then drains in-flight requests for at most the grace period.
async fn serve_until_shutdown(
    args: &Args,
    listener: tokio::net::TcpListener,
    app: axum::Router,
    engine: &EngineClient,
) {
    let (signalled_tx, signalled_rx) = tokio::sync::watch::channel(false);
    let drain_engine = engine.clone();
    let graceful = async move {
        link::service::shutdown_signal().await;
        tracing::info!("shutdown requested; draining in-flight requests");
        link::service::notify_stopping();
        drain_engine.stop_accepting();
        let _ = signalled_tx.send(true);
    };
    let limits = link::http::HttpLimits {
        header_read_timeout: Duration::from_secs(args.http_header_timeout_secs.max(1)),
        write_timeout: Duration::from_secs(args.stream_write_timeout_secs.max(1)),
        max_connections: args.max_connections,
    };
    let server = link::http::serve(listener, app, limits, graceful);
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let mut signalled = signalled_rx;
    let deadline = async move {
        let _ = signalled.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = server => {}
        _ = deadline => tracing::warn!(in_flight = engine.in_flight(), "grace period over; exiting"),
    }
}
