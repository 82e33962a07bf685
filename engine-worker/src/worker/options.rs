//! The worker's options: everything `engine-worker` takes on its command line.

use std::path::PathBuf;

use link::ipc::{default_tp_ingest_endpoint, default_worker_endpoint};
use proto::worker_tp::MAX_SPEC_TOKENS;

use crate::backend::cpu::Isa;
use crate::backend::Device;
use crate::engine::EngineConfig;
use crate::kv::{parse_bytes, KvDtype};
use crate::model::LoadFormat;
use crate::EngineError;

/// The engine-worker's options (flattened into the binary's command line; the doc comments of
/// the fields are its `--help`).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerConfig {
    /// Model: a GGUF file or a Hugging Face directory (config.json + *.safetensors).
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    pub model: PathBuf,
    /// How to read `--model`.
    #[arg(long, env = "SPECULA_LOAD_FORMAT", value_enum, default_value = "auto")]
    pub load_format: LoadFormat,
    /// Weight type of `--load-format dummy` weights.
    #[arg(long, env = "SPECULA_DUMMY_DTYPE", default_value = "q4_1")]
    pub dummy_dtype: String,
    /// Device to run on: `cpu`, or `cuda:N` (needs a build with `--features cuda`).
    #[arg(long, env = "SPECULA_DEVICE", default_value = "cpu")]
    pub device: Device,
    #[command(flatten)]
    pub engine: EngineConfig,
    /// A draft model (GGUF file or Hugging Face directory) that drafts instead of `--proposer`.
    /// It must share the target's vocabulary (checked at load) and runs on the same device,
    /// with its own KV cache laid out like the target's (`scripts/make-draft.py` makes drafts
    /// from a target).
    #[arg(
        long,
        env = "SPECULA_DRAFT_MODEL",
        conflicts_with_all = ["draft_layers", "draft_head"]
    )]
    pub draft_model: Option<PathBuf>,
    /// An EAGLE-3 draft head (a directory in the published layout: `config.json` naming
    /// `LlamaForCausalLMEagle3`, safetensors with `fc`, `midlayer.*`, `lm_head`, `d2t`) that
    /// drafts from the target's own hidden states instead of `--proposer`; refused at start,
    /// naming what differs, unless it fits the target.
    #[arg(long, env = "SPECULA_DRAFT_HEAD", conflicts_with = "draft_layers")]
    pub draft_head: Option<PathBuf>,
    /// Precision the draft head's matrices are kept in: `q8_0` (a draft token reads a few
    /// percent of the target's bytes), `f16`, `bf16` or `f32`.
    #[arg(long, env = "SPECULA_DRAFT_HEAD_DTYPE", default_value = "q8_0")]
    pub draft_head_dtype: String,
    /// Self-speculation: the target's first N layers, its final norm and its LM head draft
    /// (early exit, no extra weights, in the target's own KV cache) instead of `--proposer`.
    #[arg(long, env = "SPECULA_DRAFT_LAYERS")]
    pub draft_layers: Option<usize>,
    /// KV-cache blocks (unless `--kv-cache-memory` sizes the cache).
    #[arg(long, env = "SPECULA_NUM_KV_BLOCKS", default_value_t = 2048)]
    pub num_kv_blocks: usize,
    /// Memory for the KV cache, target and draft model together: bytes, or with a unit
    /// (`512MiB`, `2GiB`, `1.5GB`). The block count follows from it; a budget that cannot hold
    /// one sequence of `--max-model-len` refuses to start.
    #[arg(long, env = "SPECULA_KV_CACHE_MEMORY", value_parser = parse_bytes)]
    pub kv_cache_memory: Option<u64>,
    /// Back every page of the KV cache at start (RSS then holds the whole cache from the start)
    /// instead of as blocks are first written; for tests that bound RSS growth, and where
    /// memory is overcommitted and must be reserved up front.
    #[arg(long, env = "SPECULA_KV_CACHE_PREFAULT", default_value_t = false, action = clap::ArgAction::Set)]
    pub kv_cache_prefault: bool,
    /// Precision the KV cache stores keys and values in: f32, f16, bf16 or q8_0 (ggml's
    /// 8-bit blocks). Attention reads the stored form directly; docs/benchmarks.md has what
    /// each costs in exactness and speed. Default: f16 on the CPU, f32 on CUDA (which stores
    /// f32 only).
    #[arg(long, env = "SPECULA_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Ask for transparent huge pages for the KV cache. Off by default: measured, they do not
    /// speed serving up at 1 or 8 clients, and each first write backs 2 MiB instead of 4 KiB
    /// (the weights stay on huge pages, where one stream gains).
    #[arg(long, env = "SPECULA_KV_CACHE_HUGE_PAGES", default_value_t = false, action = clap::ArgAction::Set)]
    pub kv_cache_huge_pages: bool,
    /// Tokens per KV block.
    #[arg(long, env = "SPECULA_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Forward-pass threads (default: all cores).
    #[arg(long, env = "SPECULA_THREADS")]
    pub threads: Option<usize>,
    /// CPU kernel instruction set: avx512, avx2 or scalar (default: the best this CPU has; an
    /// unsupported choice falls back to it).
    #[arg(long, env = "SPECULA_CPU_ISA")]
    pub cpu_isa: Option<Isa>,
    /// This worker's name in hellos, batches and metric labels; unique among the workers of a
    /// cluster (default: `worker@<host>/<api endpoint>`).
    #[arg(long, env = "SPECULA_WORKER_ID")]
    pub worker_id: Option<String>,
    /// ROUTER endpoint the api-servers connect to.
    #[arg(long, env = "SPECULA_WORKER_API_ENDPOINT", default_value_t = default_worker_endpoint())]
    pub api_endpoint: String,
    /// The token-processor's ingest (ROUTER) endpoint.
    #[arg(long, env = "SPECULA_TP_ENDPOINT", default_value_t = default_tp_ingest_endpoint())]
    pub tp_endpoint: String,
    /// Step batches queued for the token-processor before the worker drops them and resyncs.
    #[arg(long, env = "SPECULA_TP_QUEUE", default_value_t = 1024)]
    pub tp_queue: usize,
    /// Finished requests are kept (tokens and acceptance history) until their api-server
    /// acknowledges the final output, so a restarted or stalled token-processor can replay them:
    /// at most this many MiB (the oldest go first, counted); a resync must fit in one 16 MiB frame.
    #[arg(long, env = "SPECULA_RETAIN_MAX_MIB", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=12))]
    pub retain_max_mib: u32,

    /// How long a finished request is kept unacknowledged before it is dropped (longer than the
    /// api-server's `--tp-outage-window-secs`).
    #[arg(long, env = "SPECULA_RETAIN_MAX_AGE_SECS", default_value_t = 120)]
    pub retain_max_age_secs: u64,

    /// Write every step's acceptance events as JSON Lines to this file.
    /// The file is made 0600 and never through a symlink.
    #[arg(long, env = "SPECULA_TRACE_ACCEPTANCE")]
    pub trace_acceptance: Option<PathBuf>,
    /// Size (MiB) past which the acceptance trace is rotated to `PATH.1` (one kept).
    #[arg(long, env = "SPECULA_TRACE_ACCEPTANCE_MAX_MIB", default_value_t = crate::trace::DEFAULT_TRACE_MAX_MIB)]
    pub trace_acceptance_max_mib: u64,
    /// On SIGTERM: how long running requests may take to finish before they are aborted.
    #[arg(long, env = "SPECULA_DRAIN_TIMEOUT_SECS", default_value_t = 30)]
    pub drain_timeout_secs: u64,
    /// Seed of dummy weights.
    #[arg(long, env = "SPECULA_SEED", default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub service: link::service::ServiceArgs,
}

impl WorkerConfig {
    /// Refuses options that cannot work together, naming the option.
    pub fn check(&self) -> Result<(), EngineError> {
        let engine = &self.engine;
        if engine.num_spec_tokens > MAX_SPEC_TOKENS as usize {
            return Err(EngineError::Options(format!(
                "--num-spec-tokens {} exceeds the largest K the token-processor accepts ({MAX_SPEC_TOKENS})",
                engine.num_spec_tokens
            )));
        }
        if !(engine.ngram_min >= 1 && engine.ngram_min <= engine.ngram_max) {
            return Err(EngineError::Options(
                "need 1 <= --ngram-min <= --ngram-max".into(),
            ));
        }
        if self.block_size == 0 || self.num_kv_blocks == 0 {
            return Err(EngineError::Options("the KV cache needs blocks".into()));
        }
        Ok(())
    }

    /// `--worker-id`, else the default name for the api endpoint.
    pub fn worker_id(&self) -> String {
        self.worker_id
            .clone()
            .unwrap_or_else(|| link::identity::default_id("worker", &self.api_endpoint))
    }

    /// What the worker will draft with, as hellos, `/health` and metric labels name it (the
    /// names `ModelDrafter` and the proposers give themselves).
    pub fn proposer_name(&self) -> String {
        if self.engine.num_spec_tokens == 0 {
            return "none".into();
        }
        if let Some(path) = &self.draft_head {
            return format!("head:{}", vocab::served_model_name(path));
        }
        match (&self.draft_model, self.draft_layers) {
            (Some(path), _) => format!("draft:{}", vocab::served_model_name(path)),
            (None, Some(n)) => format!("layers:{n}"),
            (None, None) => self.engine.proposer.name().into(),
        }
    }

    /// The KV cache's precision: as asked, else the device's default.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_cache_dtype.unwrap_or(match self.device {
            Device::Cpu => KvDtype::SERVING_DEFAULT,
            Device::Cuda(_) => KvDtype::F32,
        })
    }
}
