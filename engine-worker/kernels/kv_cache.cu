// Writes each new token's key and value (from the fused qkv projection, after RoPE) into its
// slot of the paged KV cache. slot = block * block_size + offset, chosen by the host from the
// sequence's block table. Cache layout per layer: [num_blocks * block_size, kv_heads * head_dim].
// grid: tokens, block: any.
extern "C" __global__ void kv_cache_write(
    const float* __restrict__ qkv,    // [tokens, stride]
    const int* __restrict__ slots,    // [tokens]
    bf16_t* __restrict__ k_cache,
    bf16_t* __restrict__ v_cache,
    int stride,
    int k_offset,                     // first k column in qkv
    int v_offset,                     // first v column in qkv
    int kv_dim) {
    const size_t t = blockIdx.x;
    const size_t slot = (size_t)slots[t];
    const float* row = qkv + t * stride;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_cache[slot * kv_dim + i] = f32_to_bf16(row[k_offset + i]);
        v_cache[slot * kv_dim + i] = f32_to_bf16(row[v_offset + i]);
    }
}
