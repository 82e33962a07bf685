// Token choice on the device, so only token ids (not [rows, vocab] logits) cross to the host.

// Greedy: index of the largest logit of each row; ties go to the lowest index, NaN never wins.
// grid: rows, block: 256.
extern "C" __global__ void argmax_rows(
    const float* __restrict__ logits,  // [rows, vocab]
    u32* __restrict__ out,             // [rows]
    int vocab) {
    __shared__ float best_val[256];
    __shared__ int best_idx[256];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (v > bv) {  // strided scan visits indices in increasing order: first max kept
            bv = v;
            bi = i;
        }
    }
    best_val[threadIdx.x] = bv;
    best_idx[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float ov = best_val[threadIdx.x + stride];
            const int oi = best_idx[threadIdx.x + stride];
            if (ov > best_val[threadIdx.x] ||
                (ov == best_val[threadIdx.x] && oi < best_idx[threadIdx.x])) {
                best_val[threadIdx.x] = ov;
                best_idx[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = best_idx[0] == 0x7fffffff ? 0u : (u32)best_idx[0];
}

// Softmax statistics at a temperature: stats[r] = (max logit, sum exp((l - max) / temperature)).
// grid: rows, block: 256.
extern "C" __global__ void softmax_stats(
    const float* __restrict__ logits,       // [rows, vocab]
    const float* __restrict__ temperature,  // [rows], > 0
    float* __restrict__ stats,              // [rows, 2]
    int vocab) {
    __shared__ float scratch[32];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    const float inv_t = 1.0f / temperature[blockIdx.x];
    float m = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += __expf((row[i] - m) * inv_t);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        stats[2 * blockIdx.x] = m;
        stats[2 * blockIdx.x + 1] = s;
    }
}

// Multinomial sampling by inverse CDF: row rows[i] of logits at that row's temperature,
// drawing with uniform[i] in [0, 1), with token excluded[i] (or none when < 0) given zero mass
// (the residual distribution after a rejected one-hot draft). Each thread owns a contiguous
// chunk of the vocabulary, so the CDF is walked in token order and the result is deterministic.
// grid: samples, block: 256.
#define SAMPLE_THREADS 256
extern "C" __global__ void sample_rows(
    const float* __restrict__ logits,       // [rows, vocab]
    const u32* __restrict__ rows,           // [samples]
    const float* __restrict__ temperature,  // [rows], > 0
    const float* __restrict__ uniform,      // [samples]
    const int* __restrict__ excluded,       // [samples]
    u32* __restrict__ out,                  // [samples]
    int vocab) {
    __shared__ float scratch[32];
    __shared__ float prefix[SAMPLE_THREADS];
    __shared__ int chosen;
    const int s = blockIdx.x;
    const float* row = logits + (size_t)rows[s] * vocab;
    const float inv_t = 1.0f / temperature[rows[s]];
    const int skip = excluded[s];
    const int chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int begin = min(vocab, (int)threadIdx.x * chunk);
    const int end = min(vocab, begin + chunk);

    float m = NEG_INF;
    for (int i = begin; i < end; ++i) {
        if (i != skip) m = fmaxf(m, row[i]);
    }
    m = block_max(m, scratch);
    float local = 0.0f;
    for (int i = begin; i < end; ++i) {
        if (i != skip) local += __expf((row[i] - m) * inv_t);
    }
    prefix[threadIdx.x] = local;
    if (threadIdx.x == 0) chosen = -1;
    __syncthreads();
    // Inclusive scan (Hillis-Steele) of the chunk sums.
    for (int offset = 1; offset < SAMPLE_THREADS; offset <<= 1) {
        const float add = threadIdx.x >= offset ? prefix[threadIdx.x - offset] : 0.0f;
        __syncthreads();
        prefix[threadIdx.x] += add;
        __syncthreads();
    }
    const float total = prefix[SAMPLE_THREADS - 1];
    const float target = uniform[s] * total;
    const float before = threadIdx.x == 0 ? 0.0f : prefix[threadIdx.x - 1];
    if (local > 0.0f && target >= before && target < prefix[threadIdx.x]) {
        float acc = before;
        int pick = -1;
        for (int i = begin; i < end; ++i) {
            if (i == skip) continue;
            acc += __expf((row[i] - m) * inv_t);
            pick = i;
            if (target < acc) break;
        }
        chosen = pick;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (chosen < 0) {
            // Rounding put the target past the last mass: take the last token with any mass.
            for (int i = vocab - 1; i >= 0; --i) {
                if (i != skip && __expf((row[i] - m) * inv_t) > 0.0f) {
                    chosen = i;
                    break;
                }
            }
        }
        out[s] = chosen < 0 ? 0u : (u32)chosen;
    }
}
