//! Linear layers through cuBLAS: bf16 weights and activations in, f32 out, f32 accumulation
//! (`cublasGemmEx` with `CUBLAS_COMPUTE_32F`; tensor cores are used for bf16 inputs).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result as blas_result;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::device::unavailable;
use crate::EngineError;

/// Shape of one linear layer applied to `rows` activations.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub rows: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

pub struct Gemm {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, EngineError> {
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| unavailable(format!("cuBLAS initialisation failed: {e:?}")))?;
        Ok(Self { blas, stream })
    }

    /// `y = x · wᵀ + beta · y`: x `[rows, in_dim]` bf16, w `[out_dim, in_dim]` bf16 (PyTorch's
    /// and ggml's row-major weight layout), y `[rows, out_dim]` f32. `beta = 1` adds the product
    /// onto y (the residual connection, for free).
    ///
    /// Row-major `y[rows, out]` is column-major `yᵀ[out, rows] = w · xᵀ`: w, read column-major,
    /// is `wᵀ[in, out]`, hence `transa = T`.
    pub fn linear<X, W, Y>(
        &self,
        x: &X,
        w: &W,
        y: &mut Y,
        shape: Shape,
        beta: f32,
    ) -> Result<(), EngineError>
    where
        X: DevicePtr<u16>,
        W: DevicePtr<u16>,
        Y: DevicePtrMut<f32>,
    {
        let Shape {
            rows,
            in_dim,
            out_dim,
        } = shape;
        debug_assert!(x.len() >= rows * in_dim && w.len() >= out_dim * in_dim);
        debug_assert!(y.len() >= rows * out_dim);
        let alpha = 1.0f32;
        let (x_ptr, _x_sync) = x.device_ptr(&self.stream);
        let (w_ptr, _w_sync) = w.device_ptr(&self.stream);
        let (y_ptr, _y_sync) = y.device_ptr_mut(&self.stream);
        // SAFETY: the pointers are live device buffers at least as large as the shapes say
        // (checked above in debug builds; the callers size them from the same numbers).
        unsafe {
            blas_result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                out_dim as i32,
                rows as i32,
                in_dim as i32,
                (&alpha as *const f32).cast::<c_void>(),
                w_ptr as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                in_dim as i32,
                x_ptr as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                in_dim as i32,
                (&beta as *const f32).cast::<c_void>(),
                y_ptr as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                out_dim as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| EngineError::BackendUnavailable {
            backend: "cuda".into(),
            reason: format!("cublasGemmEx failed: {e:?}"),
        })
    }
}
