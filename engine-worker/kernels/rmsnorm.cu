// RMSNorm (Zhang & Sennrich 2019), as Llama uses it: y = x / sqrt(mean(x^2) + eps) * w.
// f32 in, bf16 out (the next GEMM's input). grid: output rows, block: 256.
// `rows` (optional) picks the input row of each output row, so the final norm runs only on the
// positions that need logits.
extern "C" __global__ void rmsnorm_to_bf16(
    const float* __restrict__ x,    // [in_rows, hidden]
    const u32* __restrict__ rows,   // [out_rows] or null
    const float* __restrict__ w,    // [hidden]
    bf16_t* __restrict__ out,       // [out_rows, hidden]
    int hidden,
    float eps) {
    __shared__ float scratch[32];
    const size_t out_row = blockIdx.x;
    const size_t in_row = rows ? rows[out_row] : out_row;
    const float* xr = x + in_row * hidden;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) sq += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(sq, scratch) / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[out_row * hidden + i] = f32_to_bf16(xr[i] * inv * w[i]);
    }
}
