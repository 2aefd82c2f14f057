// SPDX-License-Identifier: Apache-2.0
#pragma once
// The few device primitives of the prefill kernels (device_prefill.cuh) that differ between nvcc and the CPU
// emulation of the CUDA execution model (tests/kernels/cuda_emulation.hpp), each behind a small wrapper with one
// contract for both builds:
//  - tile_mma: 16x16x16 matrix fragments. nvcuda::wmma (tensor cores, fp16/bf16 in, fp32 accumulate) under nvcc; a
//    scalar version with the same per-warp contract in the emulation (operand fragments: the whole 16x16 tile;
//    accumulator fragments: element e belongs to lane e % 32, which alone computes, stores and loads it). Kernels
//    never touch a fragment's elements: they go through shared memory (store, scale, load), so they rely on nothing
//    WMMA leaves unspecified.
//  - async_copy: cp.async copies from global to shared memory (plain copies in the emulation).
//  - block_inclusive_sum: cub::BlockScan under nvcc, a shared-memory scan in the emulation.
//  - warp_sum_lane0: cub::WarpReduce under nvcc (result in lane 0), a shuffle butterfly in the emulation.
// Hand-written shuffles are kept where CUB would be slower: reductions whose result every lane needs (warp_max_all,
// and the two-lane row max of the prefill softmax: cub::WarpReduce leaves its result in one lane and a broadcast
// costs one more shuffle each time), and, for the same reason, the sub-warp butterflies of decode_kernel in
// device_kernels.cuh. bf16 fragments need sm_80 or newer (the build's default is sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_pipeline.h>
#include <mma.h>

#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_reduce.cuh>
#endif

#ifndef KVPAGER_UNROLL
#if defined(__CUDACC__)
#define KVPAGER_UNROLL _Pragma("unroll")
#else
#define KVPAGER_UNROLL
#endif
#endif

namespace kvpager::kernels::detail {

// Element conversions (the same as device_kernels.cuh's, kept apart so that each header stands alone: both define
// non-template kernels and are included by different translation units).
__device__ __forceinline__ float pf_to_f(float x) { return x; }
__device__ __forceinline__ float pf_to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float pf_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T pf_from_f(float x);
template <> __device__ __forceinline__ __half pf_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 pf_from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/// Warps of a prefill CTA (warp_sum_lane0 keeps one CUB scratch per warp).
constexpr int kPrefillWarps = 4;

namespace tile_mma {
#if defined(__CUDACC__)
namespace w = nvcuda::wmma;
template <class T> using frag_a = w::fragment<w::matrix_a, 16, 16, 16, T, w::row_major>;    ///< A (m, k) = p[m * ldm + k]
template <class T> using frag_bt = w::fragment<w::matrix_b, 16, 16, 16, T, w::col_major>;   ///< B (k, n) = p[n * ldm + k]
template <class T> using frag_b = w::fragment<w::matrix_b, 16, 16, 16, T, w::row_major>;    ///< B (k, n) = p[k * ldm + n]
using frag_acc = w::fragment<w::accumulator, 16, 16, 16, float>;
template <class F, class T> __device__ __forceinline__ void load(F& f, const T* p, unsigned ldm) { w::load_matrix_sync(f, p, ldm); }
__device__ __forceinline__ void load_acc(frag_acc& f, const float* p, unsigned ldm) { w::load_matrix_sync(f, p, ldm, w::mem_row_major); }
__device__ __forceinline__ void store(float* p, const frag_acc& f, unsigned ldm) { w::store_matrix_sync(p, f, ldm, w::mem_row_major); }
__device__ __forceinline__ void zero(frag_acc& f) { w::fill_fragment(f, 0.0F); }
template <class A, class B> __device__ __forceinline__ void mma(frag_acc& c, const A& a, const B& b) { w::mma_sync(c, a, b, c); }
__device__ __forceinline__ void sync_warp() { __syncwarp(); }
__device__ __forceinline__ bool warp_any(bool v) { return __any_sync(0xffffffffU, v) != 0; }
#else
enum class layout { a, bt, b };
template <class T, layout L> struct operand { float x[256]; };  ///< the whole tile, (row, col) = x[row * 16 + col]
template <class T> using frag_a = operand<T, layout::a>;
template <class T> using frag_bt = operand<T, layout::bt>;
template <class T> using frag_b = operand<T, layout::b>;
struct frag_acc { float x[256]; };  ///< element e is lane e % 32's
inline unsigned lane_id() { return threadIdx.x % 32; }
template <class T, layout L> void load(operand<T, L>& f, const T* p, unsigned ldm) {
  for (unsigned r = 0; r < 16; ++r)
    for (unsigned c = 0; c < 16; ++c) f.x[r * 16 + c] = pf_to_f(L == layout::bt ? p[c * ldm + r] : p[r * ldm + c]);
}
inline void load_acc(frag_acc& f, const float* p, unsigned ldm) {
  for (unsigned e = lane_id(); e < 256; e += 32) f.x[e] = p[(e / 16) * ldm + e % 16];
}
inline void store(float* p, const frag_acc& f, unsigned ldm) {
  for (unsigned e = lane_id(); e < 256; e += 32) p[(e / 16) * ldm + e % 16] = f.x[e];
}
inline void zero(frag_acc& f) {
  for (float& v : f.x) v = 0.0F;
}
template <class T, layout LA, layout LB> void mma(frag_acc& c, const operand<T, LA>& a, const operand<T, LB>& b) {
  for (unsigned e = lane_id(); e < 256; e += 32) {
    float s = c.x[e];
    for (unsigned k = 0; k < 16; ++k) s += a.x[(e / 16) * 16 + k] * b.x[k * 16 + e % 16];
    c.x[e] = s;
  }
}
inline void sync_warp() { __syncwarp(); }
inline bool warp_any(bool v) {
  float f = v ? 1.0F : 0.0F;
  for (int o = 16; o > 0; o >>= 1) f = fmaxf(f, __shfl_xor_sync(0xffffffffU, f, o));
  return f > 0.0F;
}
#endif
}  // namespace tile_mma

/// 16-byte copies from global to shared memory that overlap with computation: cp.async under nvcc (committed as a
/// group, waited for with wait_prior), plain copies in the emulation (where wait_prior has nothing to wait for).
namespace async_copy {
#if defined(__CUDACC__)
__device__ __forceinline__ void copy16(void* smem, const void* gmem) { __pipeline_memcpy_async(smem, gmem, 16); }
__device__ __forceinline__ void commit() { __pipeline_commit(); }
__device__ __forceinline__ void wait_prior(int groups) {
  if (groups == 0) __pipeline_wait_prior(0);
  else __pipeline_wait_prior(1);
}
#else
inline void copy16(void* smem, const void* gmem) { *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem); }
inline void commit() {}
inline void wait_prior(int /*groups*/) {}
#endif
}  // namespace async_copy

/// Inclusive prefix sum over the CTA's kThreads threads (every thread calls it) and the CTA's total.
template <int kThreads>
__device__ __forceinline__ void block_inclusive_sum(int64_t v, int64_t& inclusive, int64_t& total) {
#if defined(__CUDACC__)
  using scan = cub::BlockScan<long long, kThreads>;
  __shared__ typename scan::TempStorage tmp;
  __shared__ long long s_total;
  long long inc = 0, agg = 0;
  scan(tmp).InclusiveSum(static_cast<long long>(v), inc, agg);
  if (threadIdx.x == kThreads - 1) s_total = agg;
  __syncthreads();  // s_total visible, and tmp free for the next call
  inclusive = inc;
  total = s_total;
  __syncthreads();
#else
  __shared__ int64_t buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned o = 1; o < kThreads; o <<= 1) {
    const int64_t add = threadIdx.x >= o ? buf[threadIdx.x - o] : 0;
    __syncthreads();
    buf[threadIdx.x] += add;
    __syncthreads();
  }
  inclusive = buf[threadIdx.x];
  total = buf[kThreads - 1];
  __syncthreads();
#endif
}

/// Sum of v over the warp, valid in lane 0 (cub::WarpReduce: the same shuffles as a hand-written tree).
__device__ __forceinline__ float warp_sum_lane0(float v) {
#if defined(__CUDACC__)
  using reduce = cub::WarpReduce<float>;
  __shared__ typename reduce::TempStorage tmp[kPrefillWarps];
  return reduce(tmp[threadIdx.x / 32]).Sum(v);
#else
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
#endif
}

/// Max of v over the warp in every lane. Kept hand-written on purpose: a butterfly leaves the result in all 32 lanes
/// in 5 shuffles, where cub::WarpReduce leaves it in lane 0 and a broadcast would cost a 6th on every KV chunk.
__device__ __forceinline__ float warp_max_all(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  return v;
}

}  // namespace kvpager::kernels::detail
