// A tiny CPU emulator of the CUDA execution model, just enough to run engine-worker/kernels/*.cu
// unmodified on a machine without a GPU: each block runs as blockDim real threads (blocks one
// after another, so `__shared__` can be a function-local static), `__syncthreads` is a barrier
// over the block, and warp shuffles exchange through a buffer between two warp barriers.
// It checks kernel logic (indexing, reductions, scans, online softmax); not timing, not memory
// coalescing, and not races the real hardware might expose differently.
#pragma once

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

namespace emu {
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float> shuffle_buffer;

inline unsigned linear_tid() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Runs `kernel` over the grid, block after block.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    blockDim = block;
    gridDim = grid;
    const unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(n);
                block_barrier = &bar;
                warp_barriers.clear();
                for (unsigned w = 0; w < (n + 31) / 32; ++w) {
                    const unsigned size = std::min(32u, n - w * 32);
                    warp_barriers.push_back(std::make_unique<std::barrier<>>(size));
                }
                shuffle_buffer.assign(n, 0.0f);
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned t = 0; t < n; ++t) {
                    threads.emplace_back([&, t] {
                        threadIdx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        blockIdx = dim3{bx, by, bz};
                        kernel();
                    });
                }
                for (auto& th : threads) th.join();
            }
}
}  // namespace emu

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const unsigned tid = emu::linear_tid();
    const unsigned warp = tid / 32;
    emu::shuffle_buffer[tid] = v;
    emu::warp_barriers[warp]->arrive_and_wait();
    const float r = emu::shuffle_buffer[warp * 32 + ((tid % 32) ^ (unsigned)lane_mask)];
    emu::warp_barriers[warp]->arrive_and_wait();
    return r;
}

inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
