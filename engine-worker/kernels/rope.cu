// Rotary position embedding (Su et al. 2021, RoFormer), in place on the q and k heads of the
// fused qkv projection. Pair layout: `neox == 0` rotates adjacent pairs (x[2i], x[2i+1]), the
// layout of llama.cpp's GGUF llama weights; `neox == 1` rotates (x[i], x[i + d/2]), the layout
// of Hugging Face checkpoints (`rotate_half`). Frequency i: theta^(-2i/d).
// grid: (tokens, q_heads + kv_heads), block: head_dim / 2.
extern "C" __global__ void rope_inplace(
    float* __restrict__ qkv,          // [tokens, stride]; q heads then k heads from column 0
    const int* __restrict__ positions,  // [tokens]
    int stride,
    int head_dim,
    float theta,
    int neox) {
    const int t = blockIdx.x;
    const int head = blockIdx.y;
    const int i = threadIdx.x;  // pair index
    const int half_dim = head_dim / 2;
    if (i >= half_dim) return;
    float* x = qkv + (size_t)t * stride + (size_t)head * head_dim;
    const float inv_freq = powf(theta, -2.0f * (float)i / (float)head_dim);
    const float angle = (float)positions[t] * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half_dim : 2 * i + 1;
    const float x0 = x[a];
    const float x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
