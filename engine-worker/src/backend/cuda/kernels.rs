//! The CUDA kernel sources (`engine-worker/kernels/*.cu`, embedded at build time) and their
//! compilation with NVRTC. Nothing here needs a GPU: compiling to PTX or to a CUBIN for a named
//! architecture only needs libnvrtc, which is what the `nvrtc` test checks on CPU-only machines.
//!
//! Each `.cu` file is compiled with `common.cuh` prepended (NVRTC gets no include paths: the
//! kernels use no CUDA headers, so the PyPI `nvidia-cuda-nvrtc-cu12` wheel alone suffices). At
//! run time every file is compiled once per process into one CUBIN for the device's exact
//! architecture (`sm_XY`), falling back to PTX for `compute_XY` if the CUBIN path fails.

use std::ffi::{c_char, CStr, CString};

use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};

/// Helpers every kernel file starts with.
pub const COMMON_HEADER: &str = include_str!("../../../kernels/common.cuh");

/// One kernel file and the entry points the backend loads from it.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    pub functions: &'static [&'static str],
}

/// Every kernel file of the backend.
pub const KERNEL_FILES: &[KernelFile] = &[
    KernelFile {
        name: "embedding.cu",
        source: include_str!("../../../kernels/embedding.cu"),
        functions: &["embedding_gather"],
    },
    KernelFile {
        name: "rmsnorm.cu",
        source: include_str!("../../../kernels/rmsnorm.cu"),
        functions: &["rmsnorm_to_bf16"],
    },
    KernelFile {
        name: "rope.cu",
        source: include_str!("../../../kernels/rope.cu"),
        functions: &["rope_inplace"],
    },
    KernelFile {
        name: "kv_cache.cu",
        source: include_str!("../../../kernels/kv_cache.cu"),
        functions: &["kv_cache_write"],
    },
    KernelFile {
        name: "attention.cu",
        source: include_str!("../../../kernels/attention.cu"),
        functions: &["paged_attention", "paged_attention_grouped"],
    },
    KernelFile {
        name: "activation.cu",
        source: include_str!("../../../kernels/activation.cu"),
        functions: &["silu_mul", "add_bias"],
    },
    KernelFile {
        name: "sampling.cu",
        source: include_str!("../../../kernels/sampling.cu"),
        functions: &["argmax_rows"],
    },
    KernelFile {
        name: "acceptance.cu",
        source: include_str!("../../../kernels/acceptance.cu"),
        functions: &["greedy_accept"],
    },
    KernelFile {
        name: "init.cu",
        source: include_str!("../../../kernels/init.cu"),
        functions: &["fill_uniform_bf16", "fill_f32"],
    },
];

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileTarget {
    /// PTX for virtual architecture `compute_{0}` (JIT-compiled by the driver at load).
    Ptx(u32),
    /// Machine code for real architecture `sm_{0}` (NVRTC runs ptxas itself).
    Cubin(u32),
}

impl CompileTarget {
    fn arch_option(self) -> String {
        match self {
            CompileTarget::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
            CompileTarget::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
        }
    }
}

/// Why a kernel did not compile.
#[derive(Debug, thiserror::Error)]
pub enum KernelCompileError {
    #[error(
        "libnvrtc (CUDA 12 runtime compiler) cannot be loaded; run scripts/install-nvrtc.sh \
         or put libnvrtc.so.12 on the library path"
    )]
    NvrtcMissing,
    #[error("NVRTC failed on {file} for {target:?}: {error:?}\n{log}")]
    Compile {
        file: String,
        target: CompileTarget,
        error: nvrtc_sys::nvrtcResult,
        log: String,
    },
}

/// Whether libnvrtc can be loaded at all (cudarc loads it lazily and would panic otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), KernelCompileError> {
    if !nvrtc_available() {
        return Err(KernelCompileError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes.
    let status = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelCompileError::Compile {
            file: String::new(),
            target: CompileTarget::Ptx(0),
            error: status,
            log: "nvrtcVersion failed".into(),
        });
    }
    Ok((major, minor))
}

/// The full source NVRTC sees for one kernel file.
pub fn full_source(file: &KernelFile) -> String {
    format!(
        "{COMMON_HEADER}\n#line 1 \"{}\"\n{}",
        file.name, file.source
    )
}

/// All kernel files in one translation unit: the module the backend loads.
pub fn combined_source() -> String {
    let mut src = String::from(COMMON_HEADER);
    for file in KERNEL_FILES {
        src.push_str(&format!("\n#line 1 \"{}\"\n{}\n", file.name, file.source));
    }
    src
}

/// Options shared by every compilation: full-precision math (`expf`, `sqrtf` as written; the
/// kernels pick `__expf` where speed matters) and the target.
fn options(target: CompileTarget) -> Vec<String> {
    vec![
        target.arch_option(),
        "--std=c++17".into(),
        "--fmad=true".into(),
    ]
}

/// Compiles `source` (named `name` in diagnostics) for `target`; returns PTX text (NUL-free) or
/// CUBIN bytes.
pub fn compile(
    name: &str,
    source: &str,
    target: CompileTarget,
) -> Result<Vec<u8>, KernelCompileError> {
    if !nvrtc_available() {
        return Err(KernelCompileError::NvrtcMissing);
    }
    let c_src = CString::new(source).expect("kernel sources contain no NUL byte");
    let c_name = CString::new(name).expect("kernel names contain no NUL byte");
    let fail = |error: nvrtc_sys::nvrtcResult, log: String| KernelCompileError::Compile {
        file: name.to_string(),
        target,
        error,
        log,
    };
    let prog = nvrtc_result::create_program(&c_src, Some(&c_name))
        .map_err(|e| fail(e.0, String::new()))?;
    let result = (|| {
        // SAFETY: `prog` is a live program created above and destroyed only below.
        unsafe {
            if let Err(e) = nvrtc_result::compile_program(prog, &options(target)) {
                let log = nvrtc_result::get_program_log(prog)
                    .map(|raw| c_chars_to_string(&raw))
                    .unwrap_or_default();
                return Err(fail(e.0, log));
            }
            match target {
                CompileTarget::Ptx(_) => {
                    let ptx = nvrtc_result::get_ptx(prog).map_err(|e| fail(e.0, String::new()))?;
                    Ok(c_chars_to_string(&ptx).into_bytes())
                }
                CompileTarget::Cubin(_) => {
                    let mut size = 0usize;
                    let status = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        return Err(fail(status, "nvrtcGetCUBINSize".into()));
                    }
                    let mut cubin = vec![0u8; size];
                    let status =
                        nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>());
                    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        return Err(fail(status, "nvrtcGetCUBIN".into()));
                    }
                    Ok(cubin)
                }
            }
        }
    })();
    // SAFETY: `prog` was created above and is not used after this.
    let _ = unsafe { nvrtc_result::destroy_program(prog) };
    result
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    if raw.is_empty() {
        return String::new();
    }
    // SAFETY: NVRTC returns NUL-terminated buffers of the size it reported.
    unsafe { CStr::from_ptr(raw.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
