// SPDX-License-Identifier: Apache-2.0
#pragma once
// CUDA device code for fp8 E4M3 KV pools (issue 12, point 3): kv_append_fp8 (quantize with per-tensor scales) and
// decode over an fp8 pool (device_kernels.cuh's decode over uint8_t rows, dequantized in registers; the split merge
// is its merge_kernel). Included
// by kernels.cu, and compiled as plain C++ by tests/kernels/cuda_emulation_test.cpp over the CUDA emulation
// (cuda_emulation.hpp), within the same limits as device_kernels.cuh: blockIdx/threadIdx/blockDim/gridDim,
// __syncthreads, __shfl_xor_sync with a full mask, atomicExch, __expf/fmaxf/min, __shared__ arrays at the top.
// The conversions are kvpager/kernels/float8.hpp's (host and device, bit-exact with the CPU backend's).
#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float8.hpp"
#include "kernels/common/decode_math.hpp"
#include "kernels/cuda/device_kernels.cuh"

namespace kvpager::kernels::detail {

/// Grid (num_tokens): one CTA writes one token's K and V (all heads), each element stored as e4m3(x / scale)
/// (fp32 division, round to nearest even, saturation); a negative slot is skipped, one beyond the pool is flagged
/// KVPAGER_STATUS_INVALID_BLOCK and never written.
template <class T>
__global__ void append_fp8_kernel(uint8_t* __restrict__ kv, const T* __restrict__ key, const T* __restrict__ value,
                                  const int64_t* __restrict__ slots, int hkv, int D, int bs, int64_t max_slot,
                                  float k_scale, float v_scale, int32_t* error) {
  const int t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  if (slot >= max_slot) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
    return;
  }
  const int64_t blk = slot / bs, off = slot % bs;
  const int64_t head_stride = static_cast<int64_t>(bs) * D, half = static_cast<int64_t>(hkv) * head_stride;
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(hkv) * D; i += blockDim.x) {
    const int64_t h = i / D, d = i % D;
    const int64_t dst = blk * 2 * half + h * head_stride + off * D + d;
    const int64_t src = static_cast<int64_t>(t) * hkv * D + i;
    kv[dst] = kvpager::detail::float_to_e4m3(to_f(key[src]) / k_scale);
    kv[dst + half] = kvpager::detail::float_to_e4m3(to_f(value[src]) / v_scale);
  }
}

/// Decode over an fp8 pool: device_kernels.cuh's decode (decode_body) with the K/V rows read as e4m3 bytes, 16 per
/// 16-byte load, and converted in registers (K once per row for every query head of a tile). `scale` already includes
/// k_scale; v_scale multiplies the output (one split) or the partial state (several splits, merged by merge_kernel).
/// Window and soft cap as decode_kernel's. Grid (num_seqs, min(num_kv_heads, 65535), splits).
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_fp8_kernel(T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part, const T* __restrict__ q,
                      const uint8_t* __restrict__ kv, const int32_t* __restrict__ table, const int32_t* __restrict__ lens,
                      int hq, int hkv, int bs, int max_blocks, int num_blocks, float scale, float v_scale,
                      int window_left, float cap, int splits, int32_t* error) {
  decode_body<T, uint8_t, D>(out, lse, part, q, kv, table, lens, hq, hkv, bs, max_blocks, num_blocks, scale, v_scale,
                             window_left, cap, splits, error);
}

}  // namespace kvpager::kernels::detail
