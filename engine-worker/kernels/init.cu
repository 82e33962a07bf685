// Dummy weights generated on the device (benchmarks of large shapes such as Llama-3-8B, where
// generating and copying 16 GB from the host would dominate): a counter-based hash (the
// "lowbias32" integer mix) of (seed, index) mapped to uniform [-scale, scale), stored as bf16.
// Deterministic for a given seed. grid/block: any (grid-stride loop).
__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

extern "C" __global__ void fill_uniform_bf16(
    bf16_t* __restrict__ out,
    unsigned long long n,
    u32 seed,
    float scale) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const u32 h = mix32((u32)i ^ mix32(seed ^ (u32)(i >> 32) * 0x9e3779b9u));
        const float unit = (float)(h >> 8) * (1.0f / 16777216.0f);  // [0, 1)
        out[i] = f32_to_bf16((2.0f * unit - 1.0f) * scale);
    }
}

// Sets every element of an f32 vector to `value` (norm weights of dummy models).
extern "C" __global__ void fill_f32(float* __restrict__ out, unsigned long long n, float value) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = value;
    }
}
