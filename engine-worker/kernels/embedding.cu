// Embedding gather: the residual stream starts as the f32 copy of each token's bf16 row.
// grid: tokens, block: any; out [tokens, hidden] f32. Token ids are checked on the host.
extern "C" __global__ void embedding_gather(
    const bf16_t* __restrict__ table,  // [vocab, hidden]
    const u32* __restrict__ ids,       // [tokens]
    float* __restrict__ out,           // [tokens, hidden]
    int hidden) {
    const size_t t = blockIdx.x;
    const bf16_t* row = table + (size_t)ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[t * hidden + i] = bf16_to_f32(row[i]);
    }
}
