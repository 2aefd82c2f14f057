// SPDX-License-Identifier: Apache-2.0
#pragma once
// CUDA device code for fp8 E4M3 KV pools (issue 12, point 3): kv_append_fp8 (quantize with per-tensor scales) and
// decode over an fp8 pool (dequantize in registers; the split merge is device_kernels.cuh's merge_kernel). Included
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

/// How a warp reads fp8 rows of D bytes: 16-byte loads (16 elements); kLanes lanes per row (8, or 16 for D = 256),
/// one 16-byte piece per lane (lanes past the row's D / 16 pieces idle), kRows rows per warp-wide load, kUnroll rows
/// per row-group per step.
template <int D>
struct fp8_row_map {
  static constexpr int kVec = 16;
  static constexpr int kChunks = D / kVec;
  static constexpr int kLanes = kChunks > 8 ? 16 : 8;
  static constexpr int kRows = 32 / kLanes;
  static constexpr int kUnroll = 2;  // 2 K rows unpacked (32 floats) next to 4 heads' query and accumulator
};

/// 16 e4m3 bytes as floats (exact).
__device__ __forceinline__ void unpack_e4m3(const uint4& raw, float (&out)[16]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  KVPAGER_UNROLL
  for (int i = 0; i < 16; ++i) out[i] = kvpager::detail::e4m3_to_float(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4))));
}

/// Decode over an fp8 pool. Grid (num_seqs, min(num_kv_heads, 65535), splits); kWarps warps. As decode_kernel: a warp
/// splits into kRows row-groups of kLanes lanes, each walking its own tokens kUnroll rows at a time (all 16-byte K
/// and V loads of a step issued before use), one online softmax per query head of a tile of kHeadTile heads, merged
/// across row-groups with shuffles and across warps through shared memory, in fp32. `scale` already includes
/// k_scale; the V scale multiplies the accumulated output (with one split) or the partial state (several splits,
/// merged by merge_kernel). Out-of-range block ids are never dereferenced (flagged INVALID_BLOCK, token skipped); a
/// length beyond the table row is flagged SEQ_TOO_LONG and read as empty.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_fp8_kernel(T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part, const T* __restrict__ q,
                      const uint8_t* __restrict__ kv, const int32_t* __restrict__ table, const int32_t* __restrict__ lens,
                      int hq, int hkv, int bs, int max_blocks, int num_blocks, float scale, float v_scale, int splits,
                      int32_t* error) {
  using map = fp8_row_map<D>;
  constexpr int G = kHeadTile, U = map::kUnroll, E = map::kVec;
  __shared__ float sm[kWarps][G], sl[kWarps][G];
  __shared__ float sacc[kWarps][G][D];
  const int seq = blockIdx.x, split = blockIdx.z, group = hq / hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rgroup = lane / map::kLanes, sub = lane % map::kLanes;
  const bool active = sub < map::kChunks;  // this lane holds a piece of the row
  int len = lens[seq];
  if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(max_blocks) * bs) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_SEQ_TOO_LONG);
    len = 0;
  }
  for (int h = blockIdx.y; h < hkv; h += gridDim.y) {
    int t0 = 0, t1 = 0;
    split_range(len, bs, splits, split, t0, t1);
    const int64_t head_stride = static_cast<int64_t>(bs) * D, half_stride = static_cast<int64_t>(hkv) * head_stride;
    constexpr int kStep = kWarps * map::kRows * U;
    for (int g0 = 0; g0 < group; g0 += G) {
      const int gt = min(G, group - g0);
      float qv[G][E], acc[G][E], m[G], l[G];
      KVPAGER_UNROLL
      for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0F;
        KVPAGER_UNROLL
        for (int e = 0; e < E; ++e) {
          const int d = sub * E + e;
          qv[g][e] = g < gt && active ? to_f(q[(static_cast<int64_t>(seq) * hq + h * group + g0 + g) * D + d]) * scale : 0.0F;
          acc[g][e] = 0.0F;
        }
      }
      for (int64_t wbase = t0 + warp * map::kRows * U; wbase < t1; wbase += kStep) {
        const int64_t base = wbase + rgroup * U;
        uint4 kraw[U], vraw[U];
        bool valid[U];
        KVPAGER_UNROLL
        for (int u = 0; u < U; ++u) {
          const int64_t t = base + u;
          valid[u] = t < t1;
          const uint8_t* krow = nullptr;
          if (valid[u]) {
            const int ti = static_cast<int>(t);
            const int blk = table[static_cast<int64_t>(seq) * max_blocks + ti / bs];
            if (blk < 0 || blk >= num_blocks) {
              if (error != nullptr && sub == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
              valid[u] = false;
            } else {
              krow = kv + static_cast<int64_t>(blk) * 2 * half_stride + h * head_stride + static_cast<int64_t>(ti % bs) * D;
            }
          }
          if (valid[u] && active) {
            kraw[u] = *reinterpret_cast<const uint4*>(krow + sub * E);
            vraw[u] = *reinterpret_cast<const uint4*>(krow + half_stride + sub * E);
          } else {
            kraw[u] = uint4{0, 0, 0, 0};
            vraw[u] = uint4{0, 0, 0, 0};
          }
        }
        float kf[U][E];
        KVPAGER_UNROLL
        for (int u = 0; u < U; ++u) unpack_e4m3(kraw[u], kf[u]);
        KVPAGER_UNROLL
        for (int g = 0; g < G; ++g) {
          if (g >= gt) break;
          float s[U];
          float m_new = m[g];
          KVPAGER_UNROLL
          for (int u = 0; u < U; ++u) {
            float dot = 0.0F;
            KVPAGER_UNROLL
            for (int e = 0; e < E; ++e) dot += qv[g][e] * kf[u][e];
            KVPAGER_UNROLL
            for (int o = map::kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffU, dot, o);
            s[u] = valid[u] ? dot : -INFINITY;
            m_new = fmaxf(m_new, s[u]);
          }
          if (m_new == -INFINITY) continue;
          const float alpha = m[g] == -INFINITY ? 0.0F : __expf(m[g] - m_new);
          l[g] *= alpha;
          KVPAGER_UNROLL
          for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
          KVPAGER_UNROLL
          for (int u = 0; u < U; ++u) {
            const float p = valid[u] ? __expf(s[u] - m_new) : 0.0F;
            l[g] += p;
            float v[E];
            unpack_e4m3(vraw[u], v);
            KVPAGER_UNROLL
            for (int e = 0; e < E; ++e) acc[g][e] += p * v[e];
          }
          m[g] = m_new;
        }
      }
      KVPAGER_UNROLL
      for (int o = map::kLanes; o < 32; o <<= 1) {
        KVPAGER_UNROLL
        for (int g = 0; g < G; ++g) {
          const float m_o = __shfl_xor_sync(0xffffffffU, m[g], o), l_o = __shfl_xor_sync(0xffffffffU, l[g], o);
          const float M = fmaxf(m[g], m_o);
          const float f = l[g] > 0.0F ? __expf(m[g] - M) : 0.0F, f_o = l_o > 0.0F ? __expf(m_o - M) : 0.0F;
          KVPAGER_UNROLL
          for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * f + __shfl_xor_sync(0xffffffffU, acc[g][e], o) * f_o;
          l[g] = l[g] * f + l_o * f_o;
          m[g] = M;
        }
      }
      if (rgroup == 0) {
        KVPAGER_UNROLL
        for (int g = 0; g < G; ++g) {
          if (sub == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
          }
          KVPAGER_UNROLL
          for (int e = 0; e < E; ++e)
            if (active) sacc[warp][g][sub * E + e] = acc[g][e];
        }
      }
      __syncthreads();
      for (int j = threadIdx.x; j < gt * D; j += blockDim.x) {
        const int g = j / D, d = j % D;
        float M = -INFINITY;
        for (int w = 0; w < kWarps; ++w)
          if (sl[w][g] > 0.0F) M = fmaxf(M, sm[w][g]);
        float L = 0.0F, o = 0.0F;
        if (M != -INFINITY) {
          for (int w = 0; w < kWarps; ++w) {
            if (sl[w][g] <= 0.0F) continue;
            const float f = __expf(sm[w][g] - M);
            L += sl[w][g] * f;
            o += sacc[w][g][d] * f;
          }
        }
        const int64_t row = static_cast<int64_t>(seq) * hq + h * group + g0 + g;
        if (splits == 1) {
          out[row * D + d] = from_f<T>(L > 0.0F ? o * v_scale / L : 0.0F);
          if (lse != nullptr && d == 0) lse[row] = lse_of(M, L);
        } else {
          float* st = part + (row * splits + split) * (D + 2);
          if (d == 0) {
            st[0] = M;
            st[1] = L;
          }
          st[2 + d] = o * v_scale;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace kvpager::kernels::detail
