// Runs every kernel of engine-worker/kernels on the CPU emulator (emu.h) against plain
// references. Built and run by tests/cuda_kernels_emulated.rs; exit status 0 when all pass.
#include "emu.h"

#include <algorithm>
#include <cstdio>
#include <random>

// The kernels, in one translation unit as the backend compiles them.
#include "common.cuh"
#include "embedding.cu"
#include "rmsnorm.cu"
#include "rope.cu"
#include "kv_cache.cu"
#include "attention.cu"
#include "activation.cu"
#include "sampling.cu"
#include "acceptance.cu"
#include "init.cu"

static int failures = 0;
#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            ++failures;                                    \
            std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            std::fprintf(stderr, __VA_ARGS__);             \
            std::fprintf(stderr, "\n");                    \
        }                                                  \
    } while (0)

static std::mt19937 rng(12345);
static float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
static float bf(bf16_t h) { return bf16_to_f32(h); }
static bool close(double a, double b, double rel, double abs_tol) {
    return std::fabs(a - b) <= abs_tol + rel * std::fabs(b);
}

static void test_bf16_rounding() {
    CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80, "tie rounds to even (down)");
    CHECK(f32_to_bf16(1.01171875f) == 0x3f82, "tie rounds to even (up)");
    CHECK(f32_to_bf16(1.0048828125f) == 0x3f81, "above the tie rounds up");
    CHECK(f32_to_bf16(-2.5f) == 0xc020, "-2.5");
    CHECK(f32_to_bf16(INFINITY) == 0x7f80, "inf");
    CHECK((f32_to_bf16(NAN) & 0x7fff) > 0x7f80, "NaN stays NaN");
    CHECK(f32_to_bf16(3.4e38f) == 0x7f80, "overflow to inf");
    for (int i = 0; i < 1000; ++i) {
        const float x = uniform(-100.0f, 100.0f);
        CHECK(close(bf(f32_to_bf16(x)), x, 1.0 / 256, 0.0), "round trip %f", x);
    }
}

static void test_embedding_rmsnorm_bias_silu() {
    const int vocab = 10, hidden = 70, tokens = 3;
    std::vector<bf16_t> table(vocab * hidden);
    for (auto& t : table) t = f32_to_bf16(uniform(-1, 1));
    std::vector<u32> ids = {7, 0, 7};
    std::vector<float> x(tokens * hidden);
    emu::launch({(unsigned)tokens}, {32}, [&] { embedding_gather(table.data(), ids.data(), x.data(), hidden); });
    for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < hidden; ++i)
            CHECK(x[t * hidden + i] == bf(table[ids[t] * hidden + i]), "embedding %d %d", t, i);

    std::vector<float> w(hidden);
    for (auto& v : w) v = uniform(0.5, 1.5);
    std::vector<u32> rows = {2, 0};
    std::vector<bf16_t> out(2 * hidden);
    emu::launch({2}, {64}, [&] { rmsnorm_to_bf16(x.data(), rows.data(), w.data(), out.data(), hidden, 1e-5f); });
    for (int r = 0; r < 2; ++r) {
        const float* xr = &x[rows[r] * hidden];
        double ms = 0;
        for (int i = 0; i < hidden; ++i) ms += (double)xr[i] * xr[i];
        const double inv = 1.0 / std::sqrt(ms / hidden + 1e-5);
        for (int i = 0; i < hidden; ++i)
            CHECK(close(bf(out[r * hidden + i]), xr[i] * inv * w[i], 1.0 / 128, 1e-6), "rmsnorm %d %d", r, i);
    }
    std::vector<bf16_t> out_all(tokens * hidden);
    emu::launch({(unsigned)tokens}, {256}, [&] { rmsnorm_to_bf16(x.data(), nullptr, w.data(), out_all.data(), hidden, 1e-5f); });
    for (int i = 0; i < hidden; ++i) CHECK(out_all[2 * hidden + i] == out[i], "rmsnorm without gather, %d", i);

    std::vector<float> bias(hidden), xb = x;
    for (auto& b : bias) b = uniform(-1, 1);
    emu::launch({(unsigned)tokens}, {32}, [&] { add_bias(xb.data(), bias.data(), hidden); });
    for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < hidden; ++i) CHECK(xb[t * hidden + i] == x[t * hidden + i] + bias[i], "bias");

    const int inter = 45;
    std::vector<float> gu(tokens * 2 * inter);
    for (auto& v : gu) v = uniform(-4, 4);
    std::vector<bf16_t> act(tokens * inter);
    emu::launch({(unsigned)tokens}, {32}, [&] { silu_mul(gu.data(), act.data(), inter); });
    for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < inter; ++i) {
            const double g = gu[t * 2 * inter + i], u = gu[t * 2 * inter + inter + i];
            CHECK(close(bf(act[t * inter + i]), g / (1 + std::exp(-g)) * u, 1.0 / 128, 1e-6), "silu_mul");
        }
}

static void test_rope() {
    const int head_dim = 16, q_heads = 4, kv_heads = 2, tokens = 3;
    const int stride = (q_heads + 2 * kv_heads) * head_dim;
    std::vector<int> pos = {0, 5, 1000};
    for (int neox = 0; neox <= 1; ++neox) {
        std::vector<float> qkv(tokens * stride);
        for (auto& v : qkv) v = uniform(-1, 1);
        const std::vector<float> before = qkv;
        emu::launch({(unsigned)tokens, (unsigned)(q_heads + kv_heads)}, {(unsigned)head_dim / 2},
                    [&] { rope_inplace(qkv.data(), pos.data(), stride, head_dim, 10000.0f, neox); });
        for (int t = 0; t < tokens; ++t)
            for (int h = 0; h < q_heads + 2 * kv_heads; ++h)
                for (int i = 0; i < head_dim / 2; ++i) {
                    const int a = neox ? i : 2 * i, b = neox ? i + head_dim / 2 : 2 * i + 1;
                    const float* x0 = &before[t * stride + h * head_dim];
                    const float* x1 = &qkv[t * stride + h * head_dim];
                    if (h >= q_heads + kv_heads) {  // v heads are left alone
                        CHECK(x1[a] == x0[a] && x1[b] == x0[b], "v untouched");
                        continue;
                    }
                    const double ang = pos[t] * std::pow(10000.0, -2.0 * i / head_dim);
                    CHECK(close(x1[a], x0[a] * std::cos(ang) - x0[b] * std::sin(ang), 1e-3, 1e-3), "rope a neox=%d", neox);
                    CHECK(close(x1[b], x0[a] * std::sin(ang) + x0[b] * std::cos(ang), 1e-3, 1e-3), "rope b neox=%d", neox);
                }
    }
}

// Writes K/V through kv_cache_write, then checks paged_attention against a plain softmax.
static void test_cache_and_attention(int q_heads, int kv_heads, int head_dim) {
    const int block_size = 4;
    const std::vector<int> lens = {1, 3, 4, 5, 13};
    int max_blocks = 0, num_blocks = 2;
    for (int l : lens) {
        max_blocks = std::max(max_blocks, (l + block_size - 1) / block_size);
        num_blocks += (l + block_size - 1) / block_size;
    }
    std::vector<int> free_blocks(num_blocks);
    for (int i = 0; i < num_blocks; ++i) free_blocks[i] = i;
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<int> tables(lens.size() * max_blocks, 0);
    for (size_t s = 0; s < lens.size(); ++s)
        for (int b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) {
            tables[s * max_blocks + b] = free_blocks.back();
            free_blocks.pop_back();
        }
    // One token per cached position of every sequence: the whole prompt as one chunk.
    std::vector<int> token_seq, positions, slots;
    for (size_t s = 0; s < lens.size(); ++s)
        for (int p = 0; p < lens[s]; ++p) {
            token_seq.push_back((int)s);
            positions.push_back(p);
            slots.push_back(tables[s * max_blocks + p / block_size] * block_size + p % block_size);
        }
    const int tokens = (int)positions.size();
    const int q_dim = q_heads * head_dim, kv_dim = kv_heads * head_dim, stride = q_dim + 2 * kv_dim;
    std::vector<float> qkv(tokens * stride);
    for (auto& v : qkv) v = uniform(-1.5, 1.5);
    std::vector<bf16_t> kc(num_blocks * block_size * kv_dim, 0xffff), vc(kc.size(), 0xffff);  // NaN fill
    emu::launch({(unsigned)tokens}, {64}, [&] {
        kv_cache_write(qkv.data(), slots.data(), kc.data(), vc.data(), stride, q_dim, q_dim + kv_dim, kv_dim);
    });
    for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < kv_dim; ++i) {
            CHECK(kc[slots[t] * kv_dim + i] == f32_to_bf16(qkv[t * stride + q_dim + i]), "k slot");
            CHECK(vc[slots[t] * kv_dim + i] == f32_to_bf16(qkv[t * stride + q_dim + kv_dim + i]), "v slot");
        }
    const float scale = 1.0f / std::sqrt((float)head_dim);
    for (int grouped = 0; grouped <= 1; ++grouped) {
    std::vector<bf16_t> out(tokens * q_dim, 0xffff);
    if (grouped) {
        emu::launch({(unsigned)tokens, (unsigned)kv_heads}, {128}, [&] {
            paged_attention_grouped(qkv.data(), kc.data(), vc.data(), tables.data(), token_seq.data(),
                                    positions.data(), out.data(), stride, max_blocks, q_heads, kv_heads, head_dim,
                                    block_size, scale);
        });
    } else {
        emu::launch({(unsigned)tokens, (unsigned)q_heads}, {128}, [&] {
            paged_attention(qkv.data(), kc.data(), vc.data(), tables.data(), token_seq.data(), positions.data(),
                            out.data(), stride, max_blocks, q_heads, kv_heads, head_dim, block_size, scale);
        });
    }
    for (int t = 0; t < tokens; ++t) {
        const int s = token_seq[t];
        for (int h = 0; h < q_heads; ++h) {
            const int kvh = h / (q_heads / kv_heads);
            std::vector<double> sc;
            for (int p = 0; p <= positions[t]; ++p) {
                // The cached key of position p of sequence s.
                const int slot = tables[s * max_blocks + p / block_size] * block_size + p % block_size;
                double dot = 0;
                for (int d = 0; d < head_dim; ++d)
                    dot += (double)qkv[t * stride + h * head_dim + d] * bf(kc[slot * kv_dim + kvh * head_dim + d]);
                sc.push_back(dot * scale);
            }
            const double mx = *std::max_element(sc.begin(), sc.end());
            double sum = 0;
            for (double v : sc) sum += std::exp(v - mx);
            for (int d = 0; d < head_dim; ++d) {
                double want = 0;
                for (int p = 0; p <= positions[t]; ++p) {
                    const int slot = tables[s * max_blocks + p / block_size] * block_size + p % block_size;
                    want += std::exp(sc[p] - mx) / sum * bf(vc[slot * kv_dim + kvh * head_dim + d]);
                }
                const float got = bf(out[t * q_dim + h * head_dim + d]);
                CHECK(close(got, want, 1.0 / 100, 1e-3),
                      "attention (grouped=%d) %d:%d dim %d token %d head %d d %d: %f vs %f", grouped, q_heads,
                      kv_heads, head_dim, t, h, d, got, want);
            }
        }
    }
    }
}

static void test_argmax_and_greedy_accept() {
    const int vocab = 1000, rows = 4;
    std::vector<float> logits(rows * vocab);
    for (auto& v : logits) v = uniform(-5, 5);
    logits[0 * vocab + 999] = 9;           // last index
    logits[1 * vocab + 17] = 9;            // tie: lowest index wins
    logits[1 * vocab + 600] = 9;
    logits[2 * vocab + 3] = NAN;           // NaN never wins
    logits[2 * vocab + 500] = 8;
    std::vector<u32> am(rows);
    emu::launch({(unsigned)rows}, {256}, [&] { argmax_rows(logits.data(), am.data(), vocab); });
    CHECK(am[0] == 999 && am[1] == 17 && am[2] == 500, "argmax %u %u %u", am[0], am[1], am[2]);
    u32 expect3 = 0;
    for (int i = 1; i < vocab; ++i)
        if (logits[3 * vocab + i] > logits[3 * vocab + expect3]) expect3 = i;
    CHECK(am[3] == expect3, "argmax random row");

    // Greedy acceptance: seq 0 verifies 3 drafts over rows 0..4 with argmax [5,6,7,8]; seq 1
    // drafts nothing (row 4); seq 2 verifies 2 drafts over rows 5..8.
    std::vector<u32> argmax = {5, 6, 7, 8, 42, 1, 2, 3};
    const int seqs = 3, max_drafts = 3;
    std::vector<u32> drafts = {5, 6, 9, /*seq1*/ 0, 0, 0, /*seq2*/ 1, 2, 0};
    std::vector<int> num = {3, 0, 2}, off = {0, 4, 5};
    std::vector<u32> tok(seqs * (max_drafts + 1), 77);
    std::vector<int> acc(seqs, -1);
    emu::launch({1}, {128}, [&] {
        greedy_accept(argmax.data(), drafts.data(), num.data(), off.data(), tok.data(), acc.data(), seqs, max_drafts);
    });
    CHECK(acc[0] == 2 && tok[0] == 5 && tok[1] == 6 && tok[2] == 7, "seq 0: accept 2 then correct");
    CHECK(acc[1] == 0 && tok[4] == 42, "seq 1: plain decode");
    CHECK(acc[2] == 2 && tok[8] == 1 && tok[9] == 2 && tok[10] == 3, "seq 2: all accepted plus bonus");
}

static void test_fill() {
    const unsigned long long n = 5000;
    std::vector<bf16_t> w(n);
    emu::launch({4}, {256}, [&] { fill_uniform_bf16(w.data(), n, 3u, 0.5f); });
    double mean = 0, maxabs = 0;
    for (auto h : w) {
        mean += bf(h) / n;
        maxabs = std::max(maxabs, (double)std::fabs(bf(h)));
    }
    CHECK(maxabs <= 0.5 && maxabs > 0.45 && std::fabs(mean) < 0.02, "fill range/mean %f %f", maxabs, mean);
    std::vector<bf16_t> w2(n);
    emu::launch({4}, {256}, [&] { fill_uniform_bf16(w2.data(), n, 3u, 0.5f); });
    CHECK(w == w2, "fill is deterministic");
    std::vector<float> ones(n);
    emu::launch({2}, {256}, [&] { fill_f32(ones.data(), n, 1.0f); });
    CHECK(std::all_of(ones.begin(), ones.end(), [](float v) { return v == 1.0f; }), "fill_f32");
}

int main() {
    test_bf16_rounding();
    test_embedding_rmsnorm_bias_silu();
    test_rope();
    test_cache_and_attention(8, 2, 64);
    test_cache_and_attention(4, 4, 128);
    test_cache_and_attention(6, 3, 16);
    test_cache_and_attention(2, 1, 256);
    test_cache_and_attention(8, 1, 32);  // a full group of ATTN_MAX_GROUP
    test_argmax_and_greedy_accept();
    test_fill();
    if (failures) {
        std::fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    std::printf("all kernel checks passed on the CPU emulator\n");
    return 0;
}
