//! The kernels loaded into a context. The combined source is compiled at most once per process
//! and architecture (cached), then loaded into each context that needs it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::device::unavailable;
use super::kernels::{combined_source, compile, CompileTarget};
use crate::EngineError;

/// A compiled module image: CUBIN for the exact architecture, or PTX as the fallback.
#[derive(Clone)]
enum Image {
    Cubin(Arc<Vec<u8>>),
    Ptx(Arc<String>),
}

fn compiled(arch: u32) -> Result<Image, EngineError> {
    static CACHE: OnceLock<Mutex<HashMap<u32, Image>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(image) = cache.get(&arch) {
        return Ok(image.clone());
    }
    let source = combined_source();
    let image = match compile("specula_kernels.cu", &source, CompileTarget::Cubin(arch)) {
        Ok(cubin) => Image::Cubin(Arc::new(cubin)),
        Err(cubin_err) => {
            tracing::warn!(arch, error = %cubin_err, "CUBIN compilation failed, trying PTX");
            let ptx = compile("specula_kernels.cu", &source, CompileTarget::Ptx(arch))
                .map_err(|e| unavailable(format!("kernels do not compile for sm_{arch}: {e}")))?;
            Image::Ptx(Arc::new(String::from_utf8_lossy(&ptx).into_owned()))
        }
    };
    cache.insert(arch, image.clone());
    Ok(image)
}

/// Every kernel entry point of the backend.
pub struct Kernels {
    _module: Arc<CudaModule>,
    pub embedding_gather: CudaFunction,
    pub rmsnorm_to_bf16: CudaFunction,
    pub rope_inplace: CudaFunction,
    pub kv_cache_write: CudaFunction,
    pub paged_attention: CudaFunction,
    pub paged_attention_grouped: CudaFunction,
    pub silu_mul: CudaFunction,
    pub add_bias: CudaFunction,
    pub argmax_rows: CudaFunction,
    pub greedy_accept: CudaFunction,
    pub fill_uniform_bf16: CudaFunction,
    pub fill_f32: CudaFunction,
}

impl Kernels {
    /// Compiles (once per process) and loads the kernels for a device of compute capability
    /// `(major, minor)`.
    pub fn load(
        ctx: &Arc<CudaContext>,
        compute_capability: (i32, i32),
    ) -> Result<Self, EngineError> {
        let arch = (compute_capability.0 * 10 + compute_capability.1) as u32;
        let module = match compiled(arch)? {
            Image::Cubin(bytes) => {
                match ctx.load_module(Ptx::from_binary(bytes.as_ref().clone())) {
                    Ok(module) => module,
                    Err(e) => {
                        // A CUBIN from an NVRTC newer than the driver can be refused; the driver
                        // JIT-compiles PTX of an ISA it knows instead.
                        tracing::warn!(arch, error = ?e, "loading the CUBIN failed, trying PTX");
                        let ptx = compile(
                            "specula_kernels.cu",
                            &combined_source(),
                            CompileTarget::Ptx(arch),
                        )
                        .map_err(|e| {
                            unavailable(format!("kernels do not compile for compute_{arch}: {e}"))
                        })?;
                        ctx.load_module(Ptx::from_src(String::from_utf8_lossy(&ptx).into_owned()))
                            .map_err(|e| {
                                unavailable(format!("cannot load the kernels on the device: {e:?}"))
                            })?
                    }
                }
            }
            Image::Ptx(text) => ctx
                .load_module(Ptx::from_src(text.as_ref().clone()))
                .map_err(|e| {
                    unavailable(format!("cannot load the kernels on the device: {e:?}"))
                })?,
        };
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| unavailable(format!("kernel {name} missing from the module: {e:?}")))
        };
        Ok(Self {
            embedding_gather: f("embedding_gather")?,
            rmsnorm_to_bf16: f("rmsnorm_to_bf16")?,
            rope_inplace: f("rope_inplace")?,
            kv_cache_write: f("kv_cache_write")?,
            paged_attention: f("paged_attention")?,
            paged_attention_grouped: f("paged_attention_grouped")?,
            silu_mul: f("silu_mul")?,
            add_bias: f("add_bias")?,
            argmax_rows: f("argmax_rows")?,
            greedy_accept: f("greedy_accept")?,
            fill_uniform_bf16: f("fill_uniform_bf16")?,
            fill_f32: f("fill_f32")?,
            _module: module,
        })
    }
}
