// Paged attention over the KV cache, for prefill chunks and for verifying K+1 tokens of many
// sequences in one launch (vLLM's PagedAttention, Kwon et al. 2023; the merge of per-warp
// partial softmaxes follows FlashAttention's online softmax, Dao et al. 2022).
//
// One block per (query token, query head). Query token t of a sequence sits at position
// positions[t] and attends to positions 0..=positions[t] of that sequence (causal within the
// chunk: the whole chunk's keys are already in the cache). Grouped-query attention: query head
// h reads kv head h / (q_heads / kv_heads). Each warp walks every num_warps-th key; lanes split
// head_dim (dimension lane + 32 * j), so key and value rows are read coalesced. head_dim must be
// at most 32 * ATTN_MAX_PER_LANE (checked on the host).
#define ATTN_WARPS 4
#define ATTN_MAX_PER_LANE 8

extern "C" __global__ void paged_attention(
    const float* __restrict__ q,             // [tokens, q_stride]; head h at column h * head_dim
    const bf16_t* __restrict__ k_cache,      // [slots, kv_heads * head_dim]
    const bf16_t* __restrict__ v_cache,      // [slots, kv_heads * head_dim]
    const int* __restrict__ block_tables,    // [seqs, max_blocks]
    const int* __restrict__ token_seq,       // [tokens] row of block_tables
    const int* __restrict__ positions,       // [tokens]
    bf16_t* __restrict__ out,                // [tokens, q_heads * head_dim]
    int q_stride,
    int max_blocks,
    int q_heads,
    int kv_heads,
    int head_dim,
    int block_size,
    float scale) {
    __shared__ float part_max[ATTN_WARPS];
    __shared__ float part_sum[ATTN_WARPS];
    __shared__ float part_acc[ATTN_WARPS][ATTN_MAX_PER_LANE * WARP_SIZE];

    const int t = blockIdx.x;
    const int h = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
        const int kv_dim = kv_heads * head_dim;
    const int kv_head = h / (q_heads / kv_heads);
    const int ctx = positions[t] + 1;
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;

    float qr[ATTN_MAX_PER_LANE];
    float acc[ATTN_MAX_PER_LANE];
    const float* qrow = q + (size_t)t * q_stride + (size_t)h * head_dim;
#pragma unroll
    for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
        const int d = lane + WARP_SIZE * j;
        qr[j] = d < head_dim ? qrow[d] * scale : 0.0f;
        acc[j] = 0.0f;
    }

    float run_max = NEG_INF;
    float run_sum = 0.0f;
    for (int p = warp; p < ctx; p += ATTN_WARPS) {
        const size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        const bf16_t* krow = k_cache + slot * kv_dim + (size_t)kv_head * head_dim;
        const bf16_t* vrow = v_cache + slot * kv_dim + (size_t)kv_head * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            const int d = lane + WARP_SIZE * j;
            if (d < head_dim) s += qr[j] * bf16_to_f32(krow[d]);
        }
        s = warp_sum(s);
        const float new_max = fmaxf(run_max, s);
        const float correction = __expf(run_max - new_max);
        const float weight = __expf(s - new_max);
        run_sum = run_sum * correction + weight;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            const int d = lane + WARP_SIZE * j;
            if (d < head_dim) acc[j] = acc[j] * correction + weight * bf16_to_f32(vrow[d]);
        }
        run_max = new_max;
    }

    if (lane == 0) {
        part_max[warp] = run_max;
        part_sum[warp] = run_sum;
    }
#pragma unroll
    for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
        const int d = lane + WARP_SIZE * j;
        if (d < head_dim) part_acc[warp][d] = acc[j];
    }
    __syncthreads();

    // Merge the warps' partial softmaxes; warps that saw no key have max -inf and weight 0.
    float total_max = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; ++w) total_max = fmaxf(total_max, part_max[w]);
    float total_sum = 0.0f;
    for (int w = 0; w < ATTN_WARPS; ++w) total_sum += part_sum[w] * __expf(part_max[w] - total_max);
    const float inv_sum = 1.0f / total_sum;
    bf16_t* orow = out + (size_t)t * q_heads * head_dim + (size_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) v += part_acc[w][d] * __expf(part_max[w] - total_max);
        orow[d] = f32_to_bf16(v * inv_sum);
    }
}

// The same attention with one block per (query token, kv head): the block serves all
// q_heads / kv_heads query heads that share the kv head, so each key and value row is read once
// per group instead of once per query head (grouped-query attention, Ainslie et al. 2023). This
// is the kernel the backend uses when the group has at most ATTN_MAX_GROUP heads.
#define ATTN_MAX_GROUP 8

extern "C" __global__ void paged_attention_grouped(
    const float* __restrict__ q,             // [tokens, q_stride]; head h at column h * head_dim
    const bf16_t* __restrict__ k_cache,      // [slots, kv_heads * head_dim]
    const bf16_t* __restrict__ v_cache,      // [slots, kv_heads * head_dim]
    const int* __restrict__ block_tables,    // [seqs, max_blocks]
    const int* __restrict__ token_seq,       // [tokens] row of block_tables
    const int* __restrict__ positions,       // [tokens]
    bf16_t* __restrict__ out,                // [tokens, q_heads * head_dim]
    int q_stride,
    int max_blocks,
    int q_heads,
    int kv_heads,
    int head_dim,
    int block_size,
    float scale) {
    __shared__ float part_max[ATTN_WARPS][ATTN_MAX_GROUP];
    __shared__ float part_sum[ATTN_WARPS][ATTN_MAX_GROUP];
    __shared__ float part_acc[ATTN_WARPS][ATTN_MAX_PER_LANE * WARP_SIZE];

    const int t = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int group = q_heads / kv_heads;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int kv_dim = kv_heads * head_dim;
    const int ctx = positions[t] + 1;
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;

    float qr[ATTN_MAX_GROUP][ATTN_MAX_PER_LANE];
    float acc[ATTN_MAX_GROUP][ATTN_MAX_PER_LANE];
    float run_max[ATTN_MAX_GROUP];
    float run_sum[ATTN_MAX_GROUP];
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
        const float* qrow = q + (size_t)t * q_stride + (size_t)(kv_head * group + g) * head_dim;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            const int d = lane + WARP_SIZE * j;
            qr[g][j] = (g < group && d < head_dim) ? qrow[d] * scale : 0.0f;
            acc[g][j] = 0.0f;
        }
        run_max[g] = NEG_INF;
        run_sum[g] = 0.0f;
    }

    for (int p = warp; p < ctx; p += ATTN_WARPS) {
        const size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        const bf16_t* krow = k_cache + slot * kv_dim + (size_t)kv_head * head_dim;
        const bf16_t* vrow = v_cache + slot * kv_dim + (size_t)kv_head * head_dim;
        float k[ATTN_MAX_PER_LANE];
        float v[ATTN_MAX_PER_LANE];
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            const int d = lane + WARP_SIZE * j;
            k[j] = d < head_dim ? bf16_to_f32(krow[d]) : 0.0f;
            v[j] = d < head_dim ? bf16_to_f32(vrow[d]) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
            if (g >= group) break;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) s += qr[g][j] * k[j];
            s = warp_sum(s);
            const float new_max = fmaxf(run_max[g], s);
            const float correction = __expf(run_max[g] - new_max);
            const float weight = __expf(s - new_max);
            run_sum[g] = run_sum[g] * correction + weight;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) acc[g][j] = acc[g][j] * correction + weight * v[j];
            run_max[g] = new_max;
        }
    }

    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
            if (g >= group) break;
            part_max[warp][g] = run_max[g];
            part_sum[warp][g] = run_sum[g];
        }
    }
    // Merge the warps' partial softmaxes one query head at a time through one shared buffer.
    // (Loops run to the compile-time bound so the register arrays are indexed statically.)
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; ++g) {
        if (g >= group) break;  // uniform across the block
        __syncthreads();  // the previous head's merge is done with part_acc
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            const int d = lane + WARP_SIZE * j;
            if (d < head_dim) part_acc[warp][d] = acc[g][j];
        }
        __syncthreads();
        float total_max = NEG_INF;
        for (int w = 0; w < ATTN_WARPS; ++w) total_max = fmaxf(total_max, part_max[w][g]);
        float total_sum = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) total_sum += part_sum[w][g] * __expf(part_max[w][g] - total_max);
        const float inv_sum = 1.0f / total_sum;
        bf16_t* orow = out + (size_t)t * q_heads * head_dim + (size_t)(kv_head * group + g) * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float val = 0.0f;
            for (int w = 0; w < ATTN_WARPS; ++w) val += part_acc[w][d] * __expf(part_max[w][g] - total_max);
            orow[d] = f32_to_bf16(val * inv_sum);
        }
    }
}
