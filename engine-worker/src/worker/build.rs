//! The engine the options ask for: model, draft, KV cache, backend, and the acceptance trace.

use std::time::{Duration, Instant};

use super::WorkerConfig;
use crate::backend::cpu::{CpuBackend, CpuBackendOptions};
use crate::backend::{Backend, Device};
use crate::engine::{Engine, RetainBounds};
use crate::kv::KvBudget;
use crate::model::{
    vocabulary_mismatch, HeadWeights, LoadFormat, Model, TokenizerData, WeightType,
};
use crate::spec::DraftSource;
use crate::trace::{TraceRun, TraceWriter};
use crate::EngineError;

/// The engine on whichever backend `--device` chose.
pub(super) type WorkerEngine = Engine<Box<dyn Backend>>;

/// The engine and, when asked for, its acceptance trace.
pub(super) fn load_engine(
    config: &WorkerConfig,
    worker_id: &str,
) -> Result<(WorkerEngine, Option<TraceWriter>), EngineError> {
    let engine = build_engine(config)?;
    let trace = match &config.trace_acceptance {
        None => None,
        Some(path) => Some(
            TraceWriter::create(
                path,
                &TraceRun {
                    num_spec_tokens: config.engine.num_spec_tokens,
                    model: &engine.backend().config().name,
                    worker_id,
                    proposer: engine.proposer_name(),
                    verify_cost: &engine.planner().cost_points(),
                },
                config.trace_acceptance_max_mib.max(1) << 20,
            )
            .map_err(|source| EngineError::Trace {
                path: path.display().to_string(),
                source,
            })?,
        ),
    };
    Ok((engine, trace))
}

fn build_engine(config: &WorkerConfig) -> Result<WorkerEngine, EngineError> {
    let format = config.load_format;
    let dtype = WeightType::parse(&config.dummy_dtype)
        .ok_or_else(|| EngineError::UnknownDummyDtype(config.dummy_dtype.clone()))?;
    let started = Instant::now();
    let model = Model::load(&config.model, format, dtype, config.seed).map_err(|source| {
        EngineError::Load {
            path: config.model.display().to_string(),
            source: Box::new(source),
        }
    })?;
    let vocab = model.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let draft = load_draft(config, &model, format, dtype)?;
    let num_blocks = kv_blocks(config, &model, draft.as_ref())?;
    let backend = build_backend(config, model, num_blocks)?;
    tracing::info!(
        model = %backend.config().name,
        load_ms = started.elapsed().as_millis() as u64,
        kv_cache_dtype = %config.kv_dtype(),
        "model loaded"
    );
    let head = load_head(config, backend.config())?;
    let draft = match (draft, head) {
        (_, Some(head)) => Some(DraftSource::Head(Box::new(head))),
        (Some(draft), None) => Some(DraftSource::Model(build_backend(
            config, draft, num_blocks,
        )?)),
        (None, None) => config.draft_layers.map(DraftSource::TargetLayers),
    };
    let mut engine = Engine::with_drafter(backend, config.engine.clone(), vocab, draft)?;
    if let Some(drafter) = engine.drafter() {
        tracing::info!(
            drafter = drafter.name(),
            draft_kv_bytes = drafter.kv_cache_bytes(engine.backend()),
            "model drafter ready"
        );
    }
    engine.set_retain_bounds(RetainBounds {
        max_bytes: (config.retain_max_mib as usize) << 20,
        max_age: Duration::from_secs(config.retain_max_age_secs),
    });
    Ok(engine)
}

/// The draft head of `--draft-head`, refused unless it fits the target.
fn load_head(
    config: &WorkerConfig,
    target: &crate::model::ModelConfig,
) -> Result<Option<HeadWeights>, EngineError> {
    let Some(path) = &config.draft_head else {
        return Ok(None);
    };
    let dtype = WeightType::parse(&config.draft_head_dtype)
        .ok_or_else(|| EngineError::UnknownDummyDtype(config.draft_head_dtype.clone()))?;
    let head = HeadWeights::load(path, target, dtype).map_err(|source| EngineError::LoadDraft {
        path: path.display().to_string(),
        source: Box::new(source),
    })?;
    tracing::info!(
        head = %head.config.name,
        draft_vocab = head.config.draft_vocab_size,
        layers = ?head.config.aux_layers,
        bytes_per_token = head.bytes_per_token(),
        "draft head loaded"
    );
    Ok(Some(head))
}

/// KV-cache blocks: `--num-kv-blocks`, or what `--kv-cache-memory` holds.
fn kv_blocks(
    config: &WorkerConfig,
    model: &Model,
    draft: Option<&Model>,
) -> Result<usize, EngineError> {
    let Some(bytes) = config.kv_cache_memory else {
        return Ok(config.num_kv_blocks);
    };
    let budget = KvBudget {
        bytes,
        block_size: config.block_size,
        max_model_len: config.engine.max_model_len,
        dtype: config.kv_dtype(),
    };
    let blocks = budget.blocks(&model.config, draft.map(|d| &d.config))?;
    tracing::info!(
        budget_bytes = budget.bytes,
        blocks,
        capacity_tokens = blocks * config.block_size,
        "KV cache sized by --kv-cache-memory"
    );
    Ok(blocks)
}

/// The draft model of `--draft-model`, refused unless it shares the target's vocabulary.
fn load_draft(
    config: &WorkerConfig,
    target: &Model,
    format: LoadFormat,
    dtype: WeightType,
) -> Result<Option<Model>, EngineError> {
    let Some(path) = &config.draft_model else {
        return Ok(None);
    };
    if config.engine.num_spec_tokens == 0 {
        tracing::warn!("--draft-model is unused with --num-spec-tokens 0");
        return Ok(None);
    }
    let draft =
        Model::load(path, format, dtype, config.seed.wrapping_add(1)).map_err(|source| {
            EngineError::LoadDraft {
                path: path.display().to_string(),
                source: Box::new(source),
            }
        })?;
    if let Some(reason) = vocabulary_mismatch(target, &draft) {
        return Err(EngineError::DraftVocabulary {
            draft: path.display().to_string(),
            target: config.model.display().to_string(),
            reason,
        });
    }
    Ok(Some(draft))
}

fn build_backend(
    config: &WorkerConfig,
    model: Model,
    num_blocks: usize,
) -> Result<Box<dyn Backend>, EngineError> {
    match config.device {
        Device::Cpu => {
            let mut options = CpuBackendOptions::new(num_blocks);
            options.block_size = config.block_size;
            options.threads = config.threads;
            options.isa = config.cpu_isa;
            options.prefault_kv = config.kv_cache_prefault;
            options.kv_dtype = config.kv_dtype();
            options.kv_huge_pages = config.kv_cache_huge_pages;
            Ok(Box::new(CpuBackend::new(model, options)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            use crate::backend::cuda::{CudaBackend, CudaOptions};
            use crate::kv::KvDtype;
            if config.kv_dtype() != KvDtype::F32 {
                return Err(EngineError::Options(format!(
                    "--kv-cache-dtype {} is served by the CPU backend only; the CUDA backend \
                     stores the KV cache in f32",
                    config.kv_dtype()
                )));
            }
            let options = CudaOptions {
                ordinal,
                block_size: config.block_size,
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
        Device::Cuda(ordinal) => Err(EngineError::BackendUnavailable {
            backend: format!("cuda:{ordinal}"),
            reason: "this engine-worker was built without the `cuda` feature".into(),
        }),
    }
}
