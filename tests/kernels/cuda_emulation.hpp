// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small emulation of the CUDA execution model on CPU threads, enough to run kernels/cuda/device_kernels.cuh as plain
// C++ on a machine without a GPU: every thread of a CTA is a std::thread; CTAs run one after another, so __shared__
// (static storage here) is the CTA's shared memory; __syncthreads is a barrier of the CTA's threads and
// __shfl_xor_sync an exchange through a barrier of the warp's 32 threads (full mask only). This checks the kernels'
// logic (indexing, splits, merges, bounds checks) against the CPU backend; it says nothing about their speed or
// about what nvcc makes of them, which only a GPU run (.ci/gpu_check.sh) shows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(x)

inline thread_local uint3 threadIdx{}, blockIdx{};
inline thread_local dim3 blockDim{}, gridDim{};

namespace kvpager_emulation {
struct warp_exchange {
  std::barrier<> bar{32};
  float value[32] = {};
};
inline thread_local std::barrier<>* cta_barrier = nullptr;
inline thread_local warp_exchange* warp = nullptr;
}  // namespace kvpager_emulation

inline void __syncthreads() { kvpager_emulation::cta_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned /*mask: full only*/, float v, int lane_mask) {
  auto* w = kvpager_emulation::warp;
  const unsigned lane = threadIdx.x % 32;
  w->value[lane] = v;
  w->bar.arrive_and_wait();
  const float r = w->value[lane ^ static_cast<unsigned>(lane_mask)];
  w->bar.arrive_and_wait();
  return r;
}
/// A barrier of the warp's 32 threads (full mask only), as the prefill kernels use between shared-memory phases.
inline void __syncwarp(unsigned /*mask: full only*/ = 0xffffffffU) { kvpager_emulation::warp->bar.arrive_and_wait(); }
inline int32_t atomicExch(int32_t* p, int32_t v) { return std::atomic_ref<int32_t>(*p).exchange(v); }
inline float __expf(float x) { return std::exp(x); }
inline int min(int a, int b) { return a < b ? a : b; }

namespace kvpager_emulation {
/// Runs kernel(args...) over grid x block (block.y = block.z = 1): the block's threads are created once and walk the
/// CTAs one after another, with a barrier between CTAs so that shared memory is free again before the next one.
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
  const unsigned n = block.x;
  std::barrier<> cta(n);
  std::vector<std::unique_ptr<warp_exchange>> warps;
  for (unsigned w = 0; w < (n + 31) / 32; ++w) warps.push_back(std::make_unique<warp_exchange>());
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      threadIdx = uint3{t, 0, 0};
      blockDim = block;
      gridDim = grid;
      cta_barrier = &cta;
      warp = warps[t / 32].get();
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = uint3{x, y, z};
            kernel(args...);
            cta.arrive_and_wait();
          }
    });
  for (auto& th : threads) th.join();
}
}  // namespace kvpager_emulation
