//! engine-worker: loads the model, serves api-servers over a ZeroMQ ROUTER and pushes one step
//! batch per engine step to the token-processor. See `engine_worker::io` for the wiring.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions, Isa};
use engine_worker::backend::{Backend, Device};
use engine_worker::engine::{Engine, EngineConfig, RetainBounds};
use engine_worker::io::api::{bind_api, run_api_link, ApiAdmission, ApiLinkSettings};
use engine_worker::io::step_loop::{run_step_loop, step_loop_failure, step_loop_stall, StepLoopIo};
use engine_worker::io::tp::{run_tp_link, TpLinkConfig};
use engine_worker::io::{ApiOutbound, EngineCommand, TpOutbound, WorkerStatus};
use engine_worker::kv::{parse_bytes, KvBudget, KvDtype};
use engine_worker::model::{vocabulary_mismatch, LoadFormat, Model, TokenizerData, WeightType};
use engine_worker::spec::DraftSource;
use engine_worker::trace::{TraceRun, TraceWriter};
use link::ipc::{default_tp_ingest_endpoint, default_worker_endpoint};
use link::service;
use proto::worker_tp::MAX_SPEC_TOKENS;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "specula engine-worker: model, continuous batching, speculative decoding"
)]
struct Args {
    /// Model: a GGUF file or a Hugging Face directory (config.json + *.safetensors).
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// How to read `--model`.
    #[arg(long, env = "SPECULA_LOAD_FORMAT", value_enum, default_value = "auto")]
    load_format: LoadFormat,
    /// Weight type of `--load-format dummy` weights.
    #[arg(long, env = "SPECULA_DUMMY_DTYPE", default_value = "q4_1")]
    dummy_dtype: String,
    /// Device to run on: `cpu`, or `cuda:N` (needs a build with `--features cuda`).
    #[arg(long, env = "SPECULA_DEVICE", default_value = "cpu")]
    device: Device,
    #[command(flatten)]
    engine: EngineConfig,
    /// A draft model (GGUF file or Hugging Face directory) that drafts instead of `--proposer`.
    /// It must share the target's vocabulary (checked at load) and runs on the same device,
    /// with its own KV cache laid out like the target's (`scripts/make-draft.py` makes drafts
    /// from a target).
    #[arg(long, env = "SPECULA_DRAFT_MODEL", conflicts_with = "draft_layers")]
    draft_model: Option<PathBuf>,
    /// Self-speculation: the target's first N layers, its final norm and its LM head draft
    /// (early exit, no extra weights, in the target's own KV cache) instead of `--proposer`.
    #[arg(long, env = "SPECULA_DRAFT_LAYERS")]
    draft_layers: Option<usize>,
    /// KV-cache blocks (unless `--kv-cache-memory` sizes the cache).
    #[arg(long, env = "SPECULA_NUM_KV_BLOCKS", default_value_t = 2048)]
    num_kv_blocks: usize,
    /// Memory for the KV cache, target and draft model together: bytes, or with a unit
    /// (`512MiB`, `2GiB`, `1.5GB`). The block count follows from it; a budget that cannot hold
    /// one sequence of `--max-model-len` refuses to start.
    #[arg(long, env = "SPECULA_KV_CACHE_MEMORY", value_parser = parse_bytes)]
    kv_cache_memory: Option<u64>,
    /// Back every page of the KV cache at start (RSS then holds the whole cache from the start)
    /// instead of as blocks are first written; for tests that bound RSS growth, and where
    /// memory is overcommitted and must be reserved up front.
    #[arg(long, env = "SPECULA_KV_CACHE_PREFAULT", default_value_t = false, action = clap::ArgAction::Set)]
    kv_cache_prefault: bool,
    /// Precision the KV cache stores keys and values in: f32, f16, bf16 or q8_0 (ggml's
    /// 8-bit blocks). Attention reads the stored form directly; docs/benchmarks.md has what
    /// each costs in exactness and speed. Default: f16 on the CPU, f32 on CUDA (which stores
    /// f32 only).
    #[arg(long, env = "SPECULA_KV_CACHE_DTYPE")]
    kv_cache_dtype: Option<KvDtype>,
    /// Ask for transparent huge pages for the KV cache. Off by default: measured, they do not
    /// speed serving up at 1 or 8 clients, and each first write backs 2 MiB instead of 4 KiB
    /// (the weights stay on huge pages, where one stream gains).
    #[arg(long, env = "SPECULA_KV_CACHE_HUGE_PAGES", default_value_t = false, action = clap::ArgAction::Set)]
    kv_cache_huge_pages: bool,
    /// Tokens per KV block.
    #[arg(long, env = "SPECULA_BLOCK_SIZE", default_value_t = 16)]
    block_size: usize,
    /// Forward-pass threads (default: all cores).
    #[arg(long, env = "SPECULA_THREADS")]
    threads: Option<usize>,
    /// CPU kernel instruction set: avx512, avx2 or scalar (default: the best this CPU has; an
    /// unsupported choice falls back to it).
    #[arg(long, env = "SPECULA_CPU_ISA")]
    cpu_isa: Option<Isa>,
    /// This worker's name in hellos, batches and metric labels; unique among the workers of a
    /// cluster (default: `worker@<host>/<api endpoint>`).
    #[arg(long, env = "SPECULA_WORKER_ID")]
    worker_id: Option<String>,
    /// ROUTER endpoint the api-servers connect to.
    #[arg(long, env = "SPECULA_WORKER_API_ENDPOINT", default_value_t = default_worker_endpoint())]
    api_endpoint: String,
    /// The token-processor's ingest (ROUTER) endpoint.
    #[arg(long, env = "SPECULA_TP_ENDPOINT", default_value_t = default_tp_ingest_endpoint())]
    tp_endpoint: String,
    /// Step batches queued for the token-processor before the worker drops them and resyncs.
    #[arg(long, env = "SPECULA_TP_QUEUE", default_value_t = 1024)]
    tp_queue: usize,
    /// Finished requests are kept (tokens and acceptance history) until their api-server
    /// acknowledges the final output, so a restarted or stalled token-processor can replay them:
    /// at most this many MiB (the oldest go first, counted); a resync must fit in one 16 MiB frame.
    #[arg(long, env = "SPECULA_RETAIN_MAX_MIB", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=12))]
    retain_max_mib: u32,

    /// How long a finished request is kept unacknowledged before it is dropped (longer than the
    /// api-server's `--tp-outage-window-secs`).
    #[arg(long, env = "SPECULA_RETAIN_MAX_AGE_SECS", default_value_t = 120)]
    retain_max_age_secs: u64,

    /// Write every step's acceptance events as JSON Lines to this file.
    #[arg(long, env = "SPECULA_TRACE_ACCEPTANCE")]
    trace_acceptance: Option<PathBuf>,
    /// On SIGTERM: how long running requests may take to finish before they are aborted.
    #[arg(long, env = "SPECULA_DRAIN_TIMEOUT_SECS", default_value_t = 30)]
    drain_timeout_secs: u64,
    /// Seed of dummy weights.
    #[arg(long, env = "SPECULA_SEED", default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    service: link::service::ServiceArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.service.init_tracing();
    anyhow::ensure!(
        args.engine.num_spec_tokens <= MAX_SPEC_TOKENS as usize,
        "--num-spec-tokens {} exceeds the largest K the token-processor accepts ({MAX_SPEC_TOKENS})",
        args.engine.num_spec_tokens
    );
    anyhow::ensure!(
        args.engine.ngram_min >= 1 && args.engine.ngram_min <= args.engine.ngram_max,
        "need 1 <= --ngram-min <= --ngram-max"
    );
    anyhow::ensure!(
        args.block_size > 0 && args.num_kv_blocks > 0,
        "the KV cache needs blocks"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(mut args: Args) -> anyhow::Result<()> {
    let worker_id = args
        .worker_id
        .get_or_insert_with(|| link::identity::default_id("worker", &args.api_endpoint))
        .clone();
    // The proposer labels metric series: refuse a name that cannot be one (a draft file name
    // too long, say) now, not at the token-processor.
    proto::worker_tp::check_proposer(&proposer_name(&args))
        .map_err(|why| anyhow::anyhow!("cannot name the proposer: {why}; rename the draft file"))?;
    let status = worker_status(&args, &worker_id);
    let heartbeat = args.service.liveness().interval;
    let link_secret = link::auth::secret_for(
        args.service.link_secret_file.as_ref(),
        &[&args.api_endpoint, &args.tp_endpoint],
    )?;
    let router = bind_api(&args.api_endpoint)
        .await
        .with_context(|| format!("cannot bind {}", args.api_endpoint))?;
    tracing::info!(endpoint = %args.api_endpoint, "api endpoint bound; loading the model");

    let (cmd_tx, cmd_rx) = std::sync::mpsc::sync_channel(4096);
    let (tp_tx, tp_rx) = tokio::sync::mpsc::channel(args.tp_queue.max(1));
    let (api_tx, api_rx) = tokio::sync::mpsc::channel(4096);
    let (admission_tx, admission_rx) = tokio::sync::watch::channel(None);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();

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
            endpoint: args.tp_endpoint.clone(),
            heartbeat_interval: heartbeat,
            send_timeout: Duration::from_secs(2),
            linger: Duration::from_millis(300),
        },
        status.clone(),
        tp_rx,
    ));

    let drain = Duration::from_secs(args.drain_timeout_secs);
    let stall = step_loop_stall(args.engine.max_num_batched_tokens);
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
        .spawn(move || step_loop_thread(&args, &worker_id, engine_status, ends))?;

    tokio::select! {
        loaded = loaded_rx => {
            loaded.unwrap_or_else(|_| Err(anyhow::anyhow!("step loop died while loading")))?;
        }
        _ = service::shutdown_signal() => {
            tracing::info!("stopped while loading; exiting");
            return Ok(());
        }
    }
    tracing::info!(worker_id = %status.worker_id, model = %status.hello().model, "ready");
    service::notify_ready();

    tokio::select! {
        _ = service::shutdown_signal() => tracing::info!("draining"),
        why = step_loop_failure(&status, &engine_thread, stall) => {
            // Heartbeats would stay green while nothing steps: exit so that systemd restarts us.
            tracing::error!(reason = %why, "step loop failed; exiting");
            anyhow::bail!("step loop failed: {why}");
        }
    }
    service::notify_stopping();
    status.start_draining();
    let _ = cmd_tx.send(EngineCommand::Drain {
        deadline: Instant::now() + drain,
    });
    let running = Running {
        tp_task,
        api_task,
        engine_thread,
        shutdown: shutdown_tx,
    };
    running.stop(drain).await;
    tracing::info!("bye");
    Ok(())
}

/// The worker's tasks and thread, once serving.
struct Running {
    tp_task: tokio::task::JoinHandle<()>,
    api_task: tokio::task::JoinHandle<()>,
    engine_thread: std::thread::JoinHandle<()>,
    /// Ends the api link.
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl Running {
    /// After the drain was asked for: waits for the step loop's goodbye to reach the
    /// token-processor, then ends the api link and the step loop.
    async fn stop(self, drain: Duration) {
        // The link ends after sending the step loop's goodbye; bound the wait regardless.
        if tokio::time::timeout(drain + Duration::from_secs(10), self.tp_task)
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

/// What the worker says of itself in hellos and heartbeats, before the model is loaded.
fn worker_status(args: &Args, worker_id: &str) -> Arc<WorkerStatus> {
    let epoch = link::identity::new_epoch();
    // The same name the loader gives the model, so metric labels do not change when the
    // not-ready hello is followed by the ready one.
    let model_label = vocab::served_model_name(&args.model);
    let proposer = proposer_name(args);
    Arc::new(WorkerStatus::new(
        worker_id.to_owned(),
        epoch,
        model_label,
        args.engine.num_spec_tokens as u32,
        proposer,
        args.service.heartbeat_interval_ms,
    ))
}

/// What the worker will draft with, as hellos, `/health` and metric labels name it (the names
/// `ModelDrafter` and the proposers give themselves).
fn proposer_name(args: &Args) -> String {
    if args.engine.num_spec_tokens == 0 {
        return "none".into();
    }
    match (&args.draft_model, args.draft_layers) {
        (Some(path), _) => format!("draft:{}", vocab::served_model_name(path)),
        (None, Some(n)) => format!("layers:{n}"),
        (None, None) => args.engine.proposer.name().into(),
    }
}

/// The engine on whichever backend `--device` chose.
type WorkerEngine = Engine<Box<dyn Backend>>;

/// The step loop's ends of the worker's channels.
struct EngineEnds {
    commands: std::sync::mpsc::Receiver<EngineCommand>,
    to_tp: tokio::sync::mpsc::Sender<TpOutbound>,
    to_api: tokio::sync::mpsc::Sender<ApiOutbound>,
    /// Tells the api link what it needs to admit requests, once the model is loaded.
    admission: tokio::sync::watch::Sender<Option<ApiAdmission>>,
    /// Whether loading worked.
    loaded: tokio::sync::oneshot::Sender<anyhow::Result<()>>,
}

/// The step-loop thread: loads the model and says so (to the api link, the status and
/// `ends.loaded`), then steps until a drain ends.
fn step_loop_thread(args: &Args, worker_id: &str, status: Arc<WorkerStatus>, ends: EngineEnds) {
    let (engine, trace) = match load_engine(args, worker_id) {
        Ok(loaded) => loaded,
        Err(err) => {
            let _ = ends.loaded.send(Err(err));
            return;
        }
    };
    let _ = ends.admission.send(Some(ApiAdmission {
        max_waiting: engine.config().max_waiting,
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

/// The engine and, when asked for, its acceptance trace.
fn load_engine(
    args: &Args,
    worker_id: &str,
) -> anyhow::Result<(WorkerEngine, Option<TraceWriter>)> {
    let engine = build_engine(args)?;
    let trace = match &args.trace_acceptance {
        None => None,
        Some(path) => Some(
            TraceWriter::create(
                path,
                &TraceRun {
                    num_spec_tokens: args.engine.num_spec_tokens,
                    model: &engine.backend().config().name,
                    worker_id,
                    proposer: engine.proposer_name(),
                    verify_cost: &engine.planner().cost_points(),
                },
            )
            .map_err(|err| anyhow::anyhow!("cannot create trace {}: {err}", path.display()))?,
        ),
    };
    Ok((engine, trace))
}

fn build_engine(args: &Args) -> anyhow::Result<WorkerEngine> {
    let format = args.load_format;
    let dtype = WeightType::parse(&args.dummy_dtype)
        .with_context(|| format!("unknown --dummy-dtype {}", args.dummy_dtype))?;
    let started = Instant::now();
    let model = Model::load(&args.model, format, dtype, args.seed)
        .with_context(|| format!("cannot load {}", args.model.display()))?;
    let vocab = model.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let draft = load_draft(args, &model, format, dtype)?;
    let num_blocks = match args.kv_cache_memory {
        None => args.num_kv_blocks,
        Some(budget) => {
            let budget = KvBudget {
                bytes: budget,
                block_size: args.block_size,
                max_model_len: args.engine.max_model_len,
                dtype: kv_dtype(args),
            };
            let blocks = budget.blocks(&model.config, draft.as_ref().map(|d| &d.config))?;
            tracing::info!(
                budget_bytes = budget.bytes,
                blocks,
                capacity_tokens = blocks * args.block_size,
                "KV cache sized by --kv-cache-memory"
            );
            blocks
        }
    };
    let backend = build_backend(args, model, num_blocks)?;
    tracing::info!(
        model = %backend.config().name,
        load_ms = started.elapsed().as_millis() as u64,
        kv_cache_dtype = %kv_dtype(args),
        "model loaded"
    );
    let draft = match draft {
        Some(draft) => Some(DraftSource::Model(build_backend(args, draft, num_blocks)?)),
        None => args.draft_layers.map(DraftSource::TargetLayers),
    };
    let mut engine = Engine::with_drafter(backend, args.engine.clone(), vocab, draft)?;
    if let Some(drafter) = engine.drafter() {
        tracing::info!(
            drafter = drafter.name(),
            draft_kv_bytes = drafter.kv_cache_bytes(),
            "model drafter ready"
        );
    }
    engine.set_retain_bounds(RetainBounds {
        max_bytes: (args.retain_max_mib as usize) << 20,
        max_age: Duration::from_secs(args.retain_max_age_secs),
    });
    Ok(engine)
}

/// The draft model of `--draft-model`, refused unless it shares the target's vocabulary.
fn load_draft(
    args: &Args,
    target: &Model,
    format: LoadFormat,
    dtype: WeightType,
) -> anyhow::Result<Option<Model>> {
    let Some(path) = &args.draft_model else {
        return Ok(None);
    };
    if args.engine.num_spec_tokens == 0 {
        tracing::warn!("--draft-model is unused with --num-spec-tokens 0");
        return Ok(None);
    }
    let draft = Model::load(path, format, dtype, args.seed.wrapping_add(1))
        .with_context(|| format!("cannot load draft model {}", path.display()))?;
    if let Some(why) = vocabulary_mismatch(target, &draft) {
        anyhow::bail!(
            "draft model {} cannot draft for {}: {why}",
            path.display(),
            args.model.display()
        );
    }
    Ok(Some(draft))
}

/// The KV cache's precision: as asked, else the device's default.
fn kv_dtype(args: &Args) -> KvDtype {
    args.kv_cache_dtype.unwrap_or(match args.device {
        Device::Cpu => KvDtype::SERVING_DEFAULT,
        Device::Cuda(_) => KvDtype::F32,
    })
}

fn build_backend(args: &Args, model: Model, num_blocks: usize) -> anyhow::Result<Box<dyn Backend>> {
    match args.device {
        Device::Cpu => {
            let mut options = CpuBackendOptions::new(num_blocks);
            options.block_size = args.block_size;
            options.threads = args.threads;
            options.isa = args.cpu_isa;
            options.prefault_kv = args.kv_cache_prefault;
            options.kv_dtype = kv_dtype(args);
            options.kv_huge_pages = args.kv_cache_huge_pages;
            Ok(Box::new(CpuBackend::new(model, options)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            use engine_worker::backend::cuda::{CudaBackend, CudaOptions};
            if kv_dtype(args) != KvDtype::F32 {
                anyhow::bail!(
                    "--kv-cache-dtype {} is served by the CPU backend only; the CUDA backend \
                     stores the KV cache in f32",
                    kv_dtype(args)
                );
            }
            let options = CudaOptions {
                ordinal,
                block_size: args.block_size,
                num_blocks: Some(num_blocks),
                ..CudaOptions::default()
            };
            Ok(Box::new(CudaBackend::new(
                &model.config,
                &model.weights,
                &options,
            )?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(ordinal) => Err(engine_worker::EngineError::BackendUnavailable {
            backend: format!("cuda:{ordinal}"),
            reason: "this engine-worker was built without the `cuda` feature".into(),
        }
        .into()),
    }
}
