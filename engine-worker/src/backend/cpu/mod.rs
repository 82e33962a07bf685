//! CPU backend: f32 activations, quantized or f32 weights, multi-threaded.
//!
//! The weights stay in their stored form (mapped from the file); SIMD kernels decode them on
//! the fly ([`kernels`]). The paged KV cache holds keys and values in f32, f16, bf16 or Q8_0
//! ([`kv_cache`], [`kv_rows`]), read in that form by attention. Every sequence's logits
//! are bit-identical whatever else shares its batch.

mod aligned;
mod attention;
mod draft_head;
#[cfg(target_arch = "x86_64")]
mod folds;
mod kernels;
mod kv_cache;
pub(crate) mod kv_rows;
mod llama;
mod matmul;
mod ops;

pub use kernels::Isa;

use super::{Backend, HeadForward, HeadInput, HeadOutput, SeqForward};
use crate::kv::KvDtype;
use crate::model::{Model, ModelConfig};
use crate::EngineError;

/// Construction options of a [`CpuBackend`].
#[derive(Debug, Clone)]
pub struct CpuBackendOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks to allocate.
    pub num_blocks: usize,
    /// Worker threads (default: all cores).
    pub threads: Option<usize>,
    /// Force an instruction set (default: the best detected). Only for tests/comparisons.
    pub isa: Option<Isa>,
    /// Back every page of the KV cache at start instead of as blocks are first written.
    pub prefault_kv: bool,
    /// Precision of the KV cache.
    pub kv_dtype: KvDtype,
    /// Ask for transparent huge pages for the KV cache.
    pub kv_huge_pages: bool,
}

impl CpuBackendOptions {
    pub fn new(num_blocks: usize) -> Self {
        Self {
            block_size: 16,
            num_blocks,
            threads: None,
            isa: None,
            prefault_kv: false,
            kv_dtype: KvDtype::default(),
            kv_huge_pages: false,
        }
    }
}

/// A model on the CPU with its paged KV cache.
pub struct CpuBackend {
    model: Model,
    cache: kv_cache::KvCache,
    pool: rayon::ThreadPool,
    isa: Isa,
    /// Layers whose incoming residual stream every full forward keeps, and what the last one
    /// kept (`[tokens, layers * hidden]`).
    capture: llama::Capture,
    /// An EAGLE-3 draft head, when one drafts.
    head: Option<draft_head::CpuHead>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("model", &self.model.config.name)
            .field("block_size", &self.cache.block_size)
            .field("num_blocks", &self.cache.num_blocks)
            .field("threads", &self.pool.current_num_threads())
            .field("isa", &self.isa)
            .finish()
    }
}

impl CpuBackend {
    /// The forward through the first `layers` layers (all of them: the model's forward), then
    /// the final norm and LM head.
    fn forward_through(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        self.validate(seqs)?;
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let Self {
            model,
            cache,
            pool,
            isa,
            capture,
            ..
        } = self;
        // Early exit drafts; only the target's full forward feeds a draft head.
        let capture = (layers == model.config.num_layers).then_some(capture);
        Ok(pool.install(|| llama::forward(model, cache, *isa, seqs, layers, capture)))
    }
    pub fn new(model: Model, options: CpuBackendOptions) -> Result<Self, EngineError> {
        model.config.validate()?;
        let cache = kv_cache::KvCache::new(
            &model.config,
            kv_cache::KvLayout {
                block_size: options.block_size,
                num_blocks: options.num_blocks,
                dtype: options.kv_dtype,
                prefault: options.prefault_kv,
                huge_pages: options.kv_huge_pages,
            },
        )?;
        let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("cpu-forward-{i}"));
        if let Some(threads) = options.threads {
            pool = pool.num_threads(threads);
        }
        let pool = pool.build().map_err(|e| EngineError::BackendUnavailable {
            backend: "cpu".into(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            model,
            cache,
            pool,
            isa: Isa::supported_or_detect(options.isa),
            capture: llama::Capture::default(),
            head: None,
        })
    }

    /// Bytes of KV cache one block takes, to size `num_blocks` from a memory budget.
    pub fn kv_bytes_per_block(config: &ModelConfig, block_size: usize, dtype: KvDtype) -> usize {
        kv_cache::KvCache::bytes_per_block(config, block_size, dtype)
    }

    /// The precision of the KV cache.
    pub fn kv_dtype(&self) -> KvDtype {
        self.cache.dtype
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// A head batch's tokens, blocks and input rows fit the head and the cache.
    fn validate_head(&self, seqs: &[HeadForward<'_>]) -> Result<(), EngineError> {
        let Some(head) = &self.head else {
            return Err(EngineError::InvalidBatch(
                "no draft head is attached".into(),
            ));
        };
        let c = &head.weights().config;
        let as_target: Vec<SeqForward<'_>> = seqs
            .iter()
            .map(|s| SeqForward::new(s.tokens, s.start_pos, s.block_table, s.logits))
            .collect();
        self.validate(&as_target)?;
        for (i, s) in seqs.iter().enumerate() {
            let (rows, width) = match s.input {
                HeadInput::Target(g) => (g.len(), 3 * c.target_hidden_size),
                HeadInput::Own(f) => (f.len(), c.hidden_size),
            };
            if rows != s.tokens.len() * width {
                return Err(EngineError::InvalidBatch(format!(
                    "head sequence {i}: {rows} input values for {} tokens of {width}",
                    s.tokens.len()
                )));
            }
        }
        Ok(())
    }

    fn validate(&self, seqs: &[SeqForward<'_>]) -> Result<(), EngineError> {
        let bad = |i: usize, what: String| {
            Err(EngineError::InvalidBatch(format!("sequence {i}: {what}")))
        };
        let vocab = self.model.config.vocab_size;
        let bs = self.cache.block_size;
        for (i, seq) in seqs.iter().enumerate() {
            if seq.tokens.is_empty() {
                return bad(i, "no tokens".into());
            }
            if let Some(&tok) = seq.tokens.iter().find(|&&t| t as usize >= vocab) {
                return bad(
                    i,
                    format!("token {tok} is outside the vocabulary of {vocab}"),
                );
            }
            let end = seq.start_pos + seq.tokens.len();
            let needed = end.div_ceil(bs);
            if seq.block_table.len() < needed {
                return bad(
                    i,
                    format!(
                        "{} blocks cannot hold {end} positions (block size {bs})",
                        seq.block_table.len()
                    ),
                );
            }
            if let Some(&b) = seq.block_table[..needed]
                .iter()
                .find(|&&b| b as usize >= self.cache.num_blocks)
            {
                return bad(
                    i,
                    format!(
                        "block {b} is outside the cache of {} blocks",
                        self.cache.num_blocks
                    ),
                );
            }
        }
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn block_size(&self) -> usize {
        self.cache.block_size
    }

    fn num_blocks(&self) -> usize {
        self.cache.num_blocks
    }

    fn forward(&mut self, seqs: &[SeqForward<'_>]) -> Result<Vec<f32>, EngineError> {
        let layers = self.model.config.num_layers;
        self.forward_through(seqs, layers)
    }

    fn token_group(&self) -> usize {
        self.isa.token_group()
    }

    fn forward_first_layers(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        if layers == 0 || layers > self.model.config.num_layers {
            return Err(EngineError::InvalidConfig(format!(
                "early exit after {layers} layers: the model has {}",
                self.model.config.num_layers
            )));
        }
        self.forward_through(seqs, layers)
    }

    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        let num_layers = self.model.config.num_layers;
        if let Some(&bad) = layers.iter().find(|&&l| l >= num_layers) {
            return Err(EngineError::InvalidConfig(format!(
                "cannot capture the hidden state entering layer {bad}: {} has {num_layers} layers",
                self.model.config.name
            )));
        }
        self.capture = llama::Capture::of(layers);
        Ok(())
    }

    fn take_hidden(&mut self) -> Vec<f32> {
        self.capture.take()
    }

    fn attach_draft_head(&mut self, head: crate::model::HeadWeights) -> Result<(), EngineError> {
        if let Some(reason) = head
            .config
            .mismatch(&self.model.config, head.embed.is_some())
        {
            return Err(EngineError::DraftHeadMismatch {
                head: head.config.name.clone(),
                target: self.model.config.name.clone(),
                reason,
            });
        }
        self.head = Some(draft_head::CpuHead::new(
            head,
            self.cache.block_size,
            self.cache.num_blocks,
        )?);
        Ok(())
    }

    fn head_forward(&mut self, seqs: &[HeadForward<'_>]) -> Result<HeadOutput, EngineError> {
        self.validate_head(seqs)?;
        if seqs.is_empty() {
            return Ok(HeadOutput::default());
        }
        let Self {
            model,
            pool,
            isa,
            head,
            ..
        } = self;
        let head = head.as_mut().expect("validated");
        Ok(pool.install(|| head.forward(*isa, &model.weights.embed, seqs)))
    }

    fn head_kv_cache_bytes(&self) -> u64 {
        self.head
            .as_ref()
            .map_or(0, draft_head::CpuHead::kv_cache_bytes)
    }

    fn kv_cache_bytes(&self) -> u64 {
        (kv_cache::KvCache::bytes_per_block(
            &self.model.config,
            self.cache.block_size,
            self.cache.dtype,
        ) * self.cache.num_blocks) as u64
    }
}

#[cfg(test)]
mod tests;
