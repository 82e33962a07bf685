//! Opening a GPU: `--device cuda:N` parsing and the checks that turn a missing driver, library
//! or device into [`EngineError::BackendUnavailable`] instead of cudarc's lazy-loading panics.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::kernels;
use crate::EngineError;

/// Parses a device name: `cuda` (ordinal 0) or `cuda:N`. `None` for anything else (such as
/// `cpu`), so callers can fall through to other backends.
pub fn parse_cuda_device(name: &str) -> Option<usize> {
    let name = name.trim();
    if name.eq_ignore_ascii_case("cuda") {
        return Some(0);
    }
    let (prefix, ordinal) = name.split_once(':')?;
    if !prefix.eq_ignore_ascii_case("cuda") {
        return None;
    }
    ordinal.parse().ok()
}

pub(crate) fn unavailable(reason: impl Into<String>) -> EngineError {
    EngineError::BackendUnavailable {
        backend: "cuda".into(),
        reason: reason.into(),
    }
}

/// What is missing for the CUDA backend on this machine, if anything: the driver (libcuda),
/// cuBLAS, NVRTC. Checked before any cudarc call, since cudarc panics on a missing library.
pub fn missing_libraries() -> Vec<&'static str> {
    let mut missing = Vec::new();
    // SAFETY: each check only tries to dlopen the library by its candidate names.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            missing.push("libcuda.so (NVIDIA driver)");
        }
        if !cudarc::cublas::sys::is_culib_present() {
            missing.push("libcublas.so.12 (cuBLAS)");
        }
    }
    if !kernels::nvrtc_available() {
        missing.push("libnvrtc.so.12 (NVRTC; scripts/install-nvrtc.sh installs it)");
    }
    missing
}

/// Number of CUDA devices, or why there are none usable.
pub fn device_count() -> Result<usize, EngineError> {
    let missing = missing_libraries();
    if !missing.is_empty() {
        return Err(unavailable(format!("missing {}", missing.join(", "))));
    }
    let count = CudaContext::device_count()
        .map_err(|e| unavailable(format!("CUDA driver initialisation failed: {e:?}")))?;
    Ok(count.max(0) as usize)
}

/// A context and its one work stream on device `ordinal`.
pub struct OpenDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// `(major, minor)` compute capability.
    pub compute_capability: (i32, i32),
}

pub fn open(ordinal: usize) -> Result<OpenDevice, EngineError> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(unavailable(format!(
            "device cuda:{ordinal} requested but {count} CUDA device(s) found"
        )));
    }
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| unavailable(format!("cannot create a context on cuda:{ordinal}: {e:?}")))?;
    // One stream, in order: cudarc's per-buffer event tracking only costs time here.
    // SAFETY: no other stream of this context touches the backend's buffers.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| unavailable(format!("cannot create a stream on cuda:{ordinal}: {e:?}")))?;
    let name = ctx.name().unwrap_or_else(|_| format!("cuda:{ordinal}"));
    let compute_capability = ctx
        .compute_capability()
        .map_err(|e| unavailable(format!("cannot query cuda:{ordinal}: {e:?}")))?;
    Ok(OpenDevice {
        ctx,
        stream,
        name,
        compute_capability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!(parse_cuda_device("cuda"), Some(0));
        assert_eq!(parse_cuda_device("cuda:0"), Some(0));
        assert_eq!(parse_cuda_device("CUDA:3"), Some(3));
        assert_eq!(parse_cuda_device("cpu"), None);
        assert_eq!(parse_cuda_device("cuda:x"), None);
        assert_eq!(parse_cuda_device("cuda:-1"), None);
        assert_eq!(parse_cuda_device("gpu:0"), None);
    }
}
