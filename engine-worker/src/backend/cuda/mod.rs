//! CUDA backend (feature `cuda`): a Llama-family decoder on one NVIDIA GPU through cudarc.
//!
//! - Weights live on the device as bf16 (GGUF quantized types dequantized at load, safetensors
//!   bf16 copied as is, f16/f32 rounded), or are generated on the device for benchmarks.
//! - The paged KV cache is bf16, `[num_blocks * block_size, kv_heads * head_dim]` per layer for
//!   keys and for values; the engine's block tables index it exactly as they do the CPU cache.
//! - GEMMs go through cuBLAS (bf16 in, f32 accumulate and out); the other kernels are CUDA C in
//!   `engine-worker/kernels/`, compiled once per process by NVRTC for the device's architecture
//!   (dynamic loading: building needs no CUDA toolkit, running needs the driver, cuBLAS and
//!   NVRTC libraries).
//! - [`Backend::forward`] returns f32 logits like every backend; for greedy batches
//!   [`Backend::forward_and_verify`] keeps token choice and draft acceptance on the device
//!   ([`CudaBackend::verify_on_device`]) so only token ids and accepted counts come back.
//!
//! Missing driver, libraries or device give [`EngineError::BackendUnavailable`].

mod batch;
pub mod device;
mod forward;
mod gemm;
pub mod harness;
pub mod kernels;
mod module;
mod verify;
mod weights;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

pub use batch::MetaLayout;
pub use device::{device_count, missing_libraries, parse_cuda_device};
pub use forward::MAX_HEAD_DIM;
pub use verify::StepTimings;

use self::device::unavailable;
use self::forward::Workspace;
use self::gemm::Gemm;
use self::module::Kernels;
use self::verify::VerifyWorkspace;
use self::weights::{alloc, DeviceWeights};
use crate::backend::{
    check_choices, forward_then_verify_on_host, Backend, SeqForward, TokenChoice,
};
use crate::model::{ModelConfig, ModelWeights};
use crate::spec::Verification;
use crate::EngineError;

/// How to set up the backend.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// CUDA device ordinal (`--device cuda:N`).
    pub ordinal: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks; `None` sizes the cache from `memory_fraction` of the device memory left after
    /// the weights and a workspace reserve.
    pub num_blocks: Option<usize>,
    /// Share of the free device memory the KV cache may take when `num_blocks` is `None`.
    pub memory_fraction: f32,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            ordinal: 0,
            block_size: 16,
            num_blocks: None,
            memory_fraction: 0.85,
        }
    }
}

/// Device memory kept free for activations, cuBLAS workspaces and the logits of big batches.
const WORKSPACE_RESERVE_BYTES: usize = 2 << 30;

pub struct CudaBackend {
    config: ModelConfig,
    block_size: usize,
    num_blocks: usize,
    device_name: String,
    compute_capability: (i32, i32),
    weights: DeviceWeights,
    /// Per layer: `[num_blocks * block_size, kv_dim]` bf16.
    k_cache: Vec<CudaSlice<u16>>,
    v_cache: Vec<CudaSlice<u16>>,
    workspace: Workspace,
    verify_ws: VerifyWorkspace,
    gemm: Gemm,
    kernels: Kernels,
    profiling: bool,
    last_timings: Option<StepTimings>,
    stream: Arc<CudaStream>,
    _ctx: Arc<CudaContext>,
}

impl CudaBackend {
    /// Uploads `weights` (from GGUF, safetensors or the dummy loader) to device `opts.ordinal`.
    pub fn new(
        config: &ModelConfig,
        weights: &ModelWeights,
        opts: &CudaOptions,
    ) -> Result<Self, EngineError> {
        Self::build(config, opts, |stream, _kernels| {
            DeviceWeights::upload(stream, config, weights)
        })
    }

    /// Random weights generated on the device (for benchmarks of large shapes).
    pub fn dummy_on_device(
        config: &ModelConfig,
        opts: &CudaOptions,
        seed: u32,
    ) -> Result<Self, EngineError> {
        Self::build(config, opts, |stream, kernels| {
            DeviceWeights::dummy_on_device(stream, kernels, config, seed)
        })
    }

    fn build(
        config: &ModelConfig,
        opts: &CudaOptions,
        weights: impl FnOnce(&Arc<CudaStream>, &Kernels) -> Result<DeviceWeights, EngineError>,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        if config.head_dim > MAX_HEAD_DIM {
            return Err(unavailable(format!(
                "head_dim {} is above the attention kernel's limit {MAX_HEAD_DIM}",
                config.head_dim
            )));
        }
        if opts.block_size == 0 {
            return Err(EngineError::InvalidConfig(
                "block_size must be positive".into(),
            ));
        }
        let dev = device::open(opts.ordinal)?;
        let kernels = Kernels::load(&dev.ctx, dev.compute_capability)?;
        let gemm = Gemm::new(dev.stream.clone())?;
        let weights = weights(&dev.stream, &kernels)?;
        let workspace = Workspace::new(&dev.stream)?;
        let verify_ws = VerifyWorkspace::new(&dev.stream)?;

        let block_bytes = 2 * config.num_layers * opts.block_size * config.kv_dim() * 2;
        let num_blocks = match opts.num_blocks {
            Some(n) => n,
            None => {
                dev.stream.synchronize().map_err(weights::driver_err)?;
                let (free, _total) = dev.ctx.mem_get_info().map_err(weights::driver_err)?;
                let usable = (free.saturating_sub(WORKSPACE_RESERVE_BYTES) as f64
                    * f64::from(opts.memory_fraction.clamp(0.0, 1.0)))
                    as usize;
                usable / block_bytes
            }
        };
        // Slots are 32-bit signed in the kernels.
        let num_blocks = num_blocks.min(i32::MAX as usize / opts.block_size);
        if num_blocks == 0 {
            return Err(unavailable(
                "no device memory left for the KV cache".to_string(),
            ));
        }
        let slots = num_blocks * opts.block_size * config.kv_dim();
        let mut k_cache = Vec::with_capacity(config.num_layers);
        let mut v_cache = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            k_cache.push(alloc::<u16>(&dev.stream, slots)?);
            v_cache.push(alloc::<u16>(&dev.stream, slots)?);
        }
        dev.stream.synchronize().map_err(weights::driver_err)?;
        tracing::info!(
            device = %dev.name,
            compute_capability = ?dev.compute_capability,
            weight_bytes = weights.device_bytes(),
            kv_blocks = num_blocks,
            block_size = opts.block_size,
            "CUDA backend ready"
        );
        Ok(Self {
            config: config.clone(),
            block_size: opts.block_size,
            num_blocks,
            device_name: dev.name,
            compute_capability: dev.compute_capability,
            weights,
            k_cache,
            v_cache,
            workspace,
            verify_ws,
            gemm,
            kernels,
            profiling: false,
            last_timings: None,
            stream: dev.stream,
            _ctx: dev.ctx,
        })
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Device memory taken by the weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.device_bytes()
    }

    /// Turns per-phase timing of [`CudaBackend::verify_on_device`] on or off (benchmarks).
    pub fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
        self.last_timings = None;
    }

    /// The phases of the last profiled verify step.
    pub fn last_timings(&self) -> Option<StepTimings> {
        self.last_timings
    }

    /// Waits until all queued work is done (timing, tests).
    pub fn synchronize(&self) -> Result<(), EngineError> {
        self.stream.synchronize().map_err(weights::driver_err)
    }
}

impl Backend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn forward(&mut self, seqs: &[SeqForward<'_>]) -> Result<Vec<f32>, EngineError> {
        self.forward_on_device(seqs)?;
        self.logits_to_host()
    }

    fn forward_first_layers(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        if layers == 0 || layers > self.config.num_layers {
            return Err(EngineError::InvalidConfig(format!(
                "early exit after {layers} layers: the model has {}",
                self.config.num_layers
            )));
        }
        self.forward_layers_on_device(seqs, layers)?;
        self.logits_to_host()
    }

    fn kv_cache_bytes(&self) -> u64 {
        // Keys and values, bf16, per layer.
        (2 * self.config.num_layers * self.num_blocks * self.block_size * self.config.kv_dim() * 2)
            as u64
    }

    /// Greedy batches choose on the device: argmax over the same logits with the same tie rule
    /// is exactly the host's choice. A batch with a sampled request is decided on the host,
    /// whose seeded draws the device's kernels do not reproduce.
    fn forward_and_verify(
        &mut self,
        seqs: &[SeqForward<'_>],
        choices: &[TokenChoice<'_>],
    ) -> Result<Vec<Verification>, EngineError> {
        check_choices(seqs, choices)?;
        // Penalties and bias need the host's processors; plain greedy rows are chosen on the GPU.
        if choices.iter().all(TokenChoice::is_plain_greedy) {
            return self.verify_on_device(seqs);
        }
        forward_then_verify_on_host(self, seqs, choices)
    }
}
