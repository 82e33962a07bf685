// Greedy token choice on the device, so only token ids (not [rows, vocab] logits) cross to the
// host. Sampled batches are decided on the host (engine-worker/src/spec/verifier.rs).

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
