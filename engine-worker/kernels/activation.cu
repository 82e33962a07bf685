// SwiGLU feed-forward activation (Shazeer 2020): silu(gate) * up, from the fused gate|up GEMM.
// grid: tokens, block: any. out is bf16: the down projection's input.
extern "C" __global__ void silu_mul(
    const float* __restrict__ gate_up,  // [tokens, 2 * inter]: gate columns, then up columns
    bf16_t* __restrict__ out,           // [tokens, inter]
    int inter) {
    const size_t t = blockIdx.x;
    const float* row = gate_up + t * 2 * (size_t)inter;
    for (int i = threadIdx.x; i < inter; i += blockDim.x) {
        const float g = row[i];
        out[t * inter + i] = f32_to_bf16(g / (1.0f + __expf(-g)) * row[inter + i]);
    }
}

// Adds a bias row to every row of an f32 matrix (q/k/v biases of Qwen2-style models).
// grid: rows, block: any.
extern "C" __global__ void add_bias(
    float* __restrict__ x,            // [rows, cols]
    const float* __restrict__ bias,  // [cols]
    int cols) {
    const size_t r = blockIdx.x;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        x[r * cols + i] += bias[i];
    }
}
