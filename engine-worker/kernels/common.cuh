// Shared helpers, prepended to every kernel file before NVRTC compiles it (see
// src/backend/cuda/kernels.rs). Self-contained on purpose: no CUDA headers, so the PyPI NVRTC
// wheel alone is enough. bf16 is stored as its raw 16 bits; math is always f32.

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define WARP_SIZE 32
#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
    return __uint_as_float(((u32)h) << 16);
}

// Round to nearest even, NaN kept quiet (same rule as `half::bf16::from_f32`).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int num_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < num_warps; ++w) total += scratch[w];
    return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int num_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float best = NEG_INF;
    for (int w = 0; w < num_warps; ++w) best = fmaxf(best, scratch[w]);
    return best;
}
