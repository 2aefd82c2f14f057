// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA kernels themselves (device code), included by kernels.cu, which launches them. Written so that
// tests/kernels/cuda_emulation_test.cpp can also compile them as plain C++ over a small emulation of the CUDA
// execution model (kvpager_cuda_emulation.hpp: threads, warps, shuffles, barriers), which checks their logic against
// the CPU backend on machines without a GPU. Keep to what that emulation provides: blockIdx/threadIdx/blockDim/
// gridDim, __syncthreads, __shfl_xor_sync with a full mask, atomicExch, __expf/logf/fmaxf/min, __shared__ arrays
// declared at the top of a kernel, and no warp-divergent shuffles or barriers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float8.hpp"
#include "kernels/common/decode_math.hpp"

#if defined(__CUDACC__)
#define KVPAGER_UNROLL _Pragma("unroll")
#else
#define KVPAGER_UNROLL
#endif

namespace kvpager::kernels::detail {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}

constexpr int kWarps = 4;

/// How a warp reads K/V rows of D elements of T (float, __half, __nv_bfloat16, or uint8_t for an fp8 E4M3 pool):
/// 16-byte loads of kVec elements; kLanes lanes per row (a power of two, lanes past the row's kChunks pieces idle),
/// kPerLane pieces per lane, kRows rows per warp-wide load.
template <class T, int D>
struct row_map {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kChunks = D / kVec;
  static constexpr int kLanes = kChunks >= 32 ? 32 : kChunks > 8 ? 16 : 8;
  static constexpr int kPerLane = (kChunks + kLanes - 1) / kLanes;
  static constexpr int kRows = 32 / kLanes;
  static constexpr int kElems = kPerLane * kVec;  // elements of a row a lane holds
  // Rows per row-group per step (loads in flight per lane); fp8 rows unpack to 16 floats a piece, so 2 rows of K
  // unpacked sit next to 4 heads' query and accumulator.
  static constexpr int kUnroll = sizeof(T) == 1 ? 2 : kPerLane == 1 ? 4 : 2;
};

/// Query heads of a group handled together (each K/V row is loaded once per tile of heads).
constexpr int kHeadTile = 4;


/// 16-byte piece of a row as floats (fp8 E4M3: 16 bytes, each its exact value, as the CPU backend converts it).
template <class T, int N>
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[N]) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    KVPAGER_UNROLL
    for (int i = 0; i < N; ++i) out[i] = kvpager::detail::e4m3_to_float(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4))));
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
    KVPAGER_UNROLL
    for (int i = 0; i < N; ++i) out[i] = to_f(e[i]);
  }
}

/// The decode (decode_kernel; decode_fp8_kernel in device_fp8.cuh, KV = uint8_t: an fp8 E4M3 pool, `scale` already
/// multiplied by k_scale, the output or partial state by v_scale, 1 for the other pools).
/// Grid (num_seqs, min(num_kv_heads, 65535), splits); 4 warps. A warp splits into kRows row-groups of kLanes lanes; each
/// row-group walks its own tokens of the split kUnroll rows at a time, issuing all of their 16-byte K and V loads
/// before using them, and keeps one online softmax per query head of the current tile (up to kHeadTile heads, each
/// K/V row read once per tile). Row-groups are merged with shuffles, warps through shared memory, all in fp32. With
/// one split the result goes to `out` (and `lse`); with several, the unnormalized state (m, l, acc[D]) goes to
/// part[seq][q head][split] for merge_kernel. With window_left >= 0 only the tokens [window_start, len) are read
/// (the splits cover those alone); with cap > 0 each score s becomes cap * tanh(s / cap). Out-of-range block ids are never dereferenced: the token is skipped and
/// *error set.
template <class T, class KV, int D>
__device__ __forceinline__ void decode_body(T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part,
                                            const T* __restrict__ q, const KV* __restrict__ kv,
                                            const int32_t* __restrict__ table, const int32_t* __restrict__ lens, int hq,
                                            int hkv, int bs, int max_blocks, int num_blocks, float scale, float v_scale,
                                            int window_left, float cap, int splits, int32_t* error) {
  using map = row_map<KV, D>;
  constexpr bool kFp8 = std::is_same_v<KV, uint8_t>;  // unpack K once per row, not once per head
  constexpr int G = kHeadTile, U = map::kUnroll, E = map::kElems;
  __shared__ float sm[kWarps][G], sl[kWarps][G];
  __shared__ float sacc[kWarps][G][D];
  const int seq = blockIdx.x, split = blockIdx.z, group = hq / hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rgroup = lane / map::kLanes, sub = lane % map::kLanes;
  int len = lens[seq];
  if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(max_blocks) * bs) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_SEQ_TOO_LONG);
    len = 0;
  }
  // KV heads beyond the grid's 65535 rows are walked by the same CTAs.
  for (int h = blockIdx.y; h < hkv; h += gridDim.y) {
    int t0 = 0, t1 = 0;
    kvpager::kernels::detail::split_range_from(kvpager::kernels::detail::window_start(len, window_left), len, bs, splits,
                                               split, t0, t1);
    const int64_t head_stride = static_cast<int64_t>(bs) * D, half_stride = static_cast<int64_t>(hkv) * head_stride;
    constexpr int kStep = kWarps * map::kRows * U;  // tokens the CTA covers per step
    for (int g0 = 0; g0 < group; g0 += G) {
      const int gt = min(G, group - g0);
      float qv[G][E], acc[G][E], m[G], l[G];
      KVPAGER_UNROLL
      for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0F;
        KVPAGER_UNROLL
        for (int j = 0; j < map::kPerLane; ++j) {
          const int c = sub + map::kLanes * j;
          KVPAGER_UNROLL
          for (int e = 0; e < map::kVec; ++e) {
            const int d = c * map::kVec + e;
            qv[g][j * map::kVec + e] =
                g < gt && c < map::kChunks ? to_f(q[(static_cast<int64_t>(seq) * hq + h * group + g0 + g) * D + d]) * scale : 0.0F;
            acc[g][j * map::kVec + e] = 0.0F;
          }
        }
      }
      // The loop bound is the same for the whole warp (shuffles need all 32 lanes); tokens past t1 are masked.
      // Token positions in 64 bits: t1 can be near INT32_MAX, and wbase steps past it.
      for (int64_t wbase = t0 + warp * map::kRows * U; wbase < t1; wbase += kStep) {
        const int64_t base = wbase + rgroup * U;
        uint4 kraw[U][map::kPerLane], vraw[U][map::kPerLane];
        bool valid[U];
        KVPAGER_UNROLL
        for (int u = 0; u < U; ++u) {
          const int64_t t = base + u;
          valid[u] = t < t1;
          const KV* krow = nullptr;
          if (valid[u]) {
            const int ti = static_cast<int>(t);  // t < t1 <= INT32_MAX here: 32-bit division on the hot path
            const int blk = table[static_cast<int64_t>(seq) * max_blocks + ti / bs];
            if (blk < 0 || blk >= num_blocks) {  // never dereferenced
              if (error != nullptr && sub == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
              valid[u] = false;
            } else {
              krow = kv + static_cast<int64_t>(blk) * 2 * half_stride + h * head_stride + static_cast<int64_t>(ti % bs) * D;
            }
          }
          KVPAGER_UNROLL
          for (int j = 0; j < map::kPerLane; ++j) {
            const int c = sub + map::kLanes * j;
            if (valid[u] && c < map::kChunks) {
              kraw[u][j] = *reinterpret_cast<const uint4*>(krow + c * map::kVec);
              vraw[u][j] = *reinterpret_cast<const uint4*>(krow + half_stride + c * map::kVec);
            } else {
              kraw[u][j] = uint4{0, 0, 0, 0};
              vraw[u][j] = uint4{0, 0, 0, 0};
            }
          }
        }
        float kf[kFp8 ? U : 1][kFp8 ? E : 1];  // fp8: the K rows unpacked once for every head of the tile
        (void)kf;
        if constexpr (kFp8) {
          KVPAGER_UNROLL
          for (int u = 0; u < U; ++u) unpack<KV>(kraw[u][0], kf[u]);
        }
        KVPAGER_UNROLL
        for (int g = 0; g < G; ++g) {
          if (g >= gt) break;
          float s[U];
          float m_new = m[g];
          KVPAGER_UNROLL
          for (int u = 0; u < U; ++u) {
            float part_dot = 0.0F;
            KVPAGER_UNROLL
            for (int j = 0; j < map::kPerLane; ++j) {
              if constexpr (kFp8) {
                KVPAGER_UNROLL
                for (int e = 0; e < map::kVec; ++e) part_dot += qv[g][j * map::kVec + e] * kf[u][j * map::kVec + e];
              } else {
                float k[map::kVec];
                unpack<KV>(kraw[u][j], k);
                KVPAGER_UNROLL
                for (int e = 0; e < map::kVec; ++e) part_dot += qv[g][j * map::kVec + e] * k[e];
              }
            }
            KVPAGER_UNROLL
            for (int o = map::kLanes / 2; o > 0; o >>= 1) part_dot += __shfl_xor_sync(0xffffffffU, part_dot, o);
            s[u] = valid[u] ? kvpager::kernels::detail::soft_cap(part_dot, cap) : -INFINITY;
            m_new = fmaxf(m_new, s[u]);
          }
          if (m_new == -INFINITY) continue;  // nothing valid yet in this row-group
          const float alpha = m[g] == -INFINITY ? 0.0F : __expf(m[g] - m_new);
          l[g] *= alpha;
          KVPAGER_UNROLL
          for (int i = 0; i < E; ++i) acc[g][i] *= alpha;
          KVPAGER_UNROLL
          for (int u = 0; u < U; ++u) {
            const float p = valid[u] ? __expf(s[u] - m_new) : 0.0F;
            l[g] += p;
            KVPAGER_UNROLL
            for (int j = 0; j < map::kPerLane; ++j) {
              float v[map::kVec];
              unpack<KV>(vraw[u][j], v);
              KVPAGER_UNROLL
              for (int e = 0; e < map::kVec; ++e) acc[g][j * map::kVec + e] += p * v[e];
            }
          }
          m[g] = m_new;
        }
      }
      // Merge the warp's row-groups (lanes kLanes apart hold the same dims of different tokens).
      KVPAGER_UNROLL
      for (int o = map::kLanes; o < 32; o <<= 1) {
        KVPAGER_UNROLL
        for (int g = 0; g < G; ++g) {
          const float m_o = __shfl_xor_sync(0xffffffffU, m[g], o), l_o = __shfl_xor_sync(0xffffffffU, l[g], o);
          const float M = fmaxf(m[g], m_o);
          const float f = l[g] > 0.0F ? __expf(m[g] - M) : 0.0F, f_o = l_o > 0.0F ? __expf(m_o - M) : 0.0F;
          KVPAGER_UNROLL
          for (int i = 0; i < E; ++i) acc[g][i] = acc[g][i] * f + __shfl_xor_sync(0xffffffffU, acc[g][i], o) * f_o;
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
          for (int j = 0; j < map::kPerLane; ++j) {
            const int c = sub + map::kLanes * j;
            KVPAGER_UNROLL
            for (int e = 0; e < map::kVec; ++e)
              if (c < map::kChunks) sacc[warp][g][c * map::kVec + e] = acc[g][j * map::kVec + e];
          }
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
          if (lse != nullptr && d == 0) lse[row] = kvpager::kernels::detail::lse_of(M, L);
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

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part, const T* __restrict__ q,
                  const T* __restrict__ kv, const int32_t* __restrict__ table, const int32_t* __restrict__ lens, int hq,
                  int hkv, int bs, int max_blocks, int num_blocks, float scale, int window_left, float cap, int splits,
                  int32_t* error) {
  decode_body<T, T, D>(out, lse, part, q, kv, table, lens, hq, hkv, bs, max_blocks, num_blocks, scale, 1.0F,
                       window_left, cap, splits, error);
}

/// Grid (num_seqs, min(num_q_heads, 65535)): merges the splits' states in fp32, out = sum_i e^(m_i - M) acc_i /
/// sum_i e^(m_i - M) l_i.
template <class T>
__global__ void merge_kernel(T* __restrict__ out, float* __restrict__ lse, const float* __restrict__ part, int hq, int D,
                             int splits) {
  for (int qh = blockIdx.y; qh < hq; qh += gridDim.y) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * hq + qh;
    const float* st = part + row * splits * (D + 2);
    float M = -INFINITY;
    for (int i = 0; i < splits; ++i)
      if (st[i * (D + 2) + 1] > 0.0F) M = fmaxf(M, st[i * (D + 2)]);
    float L = 0.0F;
    if (M != -INFINITY)
      for (int i = 0; i < splits; ++i)
        if (st[i * (D + 2) + 1] > 0.0F) L += st[i * (D + 2) + 1] * __expf(st[i * (D + 2)] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.0F;
      if (M != -INFINITY)
        for (int i = 0; i < splits; ++i)
          if (st[i * (D + 2) + 1] > 0.0F) o += st[i * (D + 2) + 2 + d] * __expf(st[i * (D + 2)] - M);
      out[row * D + d] = from_f<T>(L > 0.0F ? o / L : 0.0F);
    }
    if (lse != nullptr && threadIdx.x == 0) lse[row] = kvpager::kernels::detail::lse_of(M, L);
  }
}

template <class T>
__global__ void append_kernel(T* __restrict__ kv, const T* __restrict__ key, const T* __restrict__ value,
                              const int64_t* __restrict__ slots, int hkv, int D, int bs, int64_t max_slot,
                              int32_t* error) {
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
    kv[dst] = key[static_cast<int64_t>(t) * hkv * D + i];
    kv[dst + half] = value[static_cast<int64_t>(t) * hkv * D + i];
  }
}

/// Grid (num_pairs, min(max(num_layers, 1), 65535)): one CTA copies one block of one layer (and of every 65535th
/// layer after it), four 16-byte loads in flight per thread. Ids are checked whatever the layer count (num_layers = 0
/// launches one row that only checks); a pair onto itself copies nothing; a null layer pointer is flagged
/// KVPAGER_STATUS_INVALID_ARGUMENT and never dereferenced.
__global__ void copy_kernel(void* const* caches, int num_layers, const int64_t* __restrict__ mapping, int num_blocks,
                            int64_t block_bytes, int32_t* error) {
  const int64_t pair = blockIdx.x;
  const int64_t src = mapping[2 * pair], dst = mapping[2 * pair + 1];
  if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
    return;
  }
  if (src == dst) return;
  for (int layer = blockIdx.y; layer < num_layers; layer += gridDim.y) {
    auto* base = static_cast<unsigned char*>(caches[layer]);
    if (base == nullptr) {
      if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_INVALID_ARGUMENT);
      continue;
    }
    if (block_bytes % 16 == 0) {
      const auto* s = reinterpret_cast<const uint4*>(base + src * block_bytes);
      auto* d = reinterpret_cast<uint4*>(base + dst * block_bytes);
      const int64_t n = block_bytes / 16, stride = blockDim.x;
      for (int64_t i = threadIdx.x; i < n; i += 4 * stride) {
        uint4 r[4];
        KVPAGER_UNROLL
        for (int k = 0; k < 4; ++k)
          if (i + k * stride < n) r[k] = s[i + k * stride];
        KVPAGER_UNROLL
        for (int k = 0; k < 4; ++k)
          if (i + k * stride < n) d[i + k * stride] = r[k];
      }
    } else {
      for (int64_t i = threadIdx.x; i < block_bytes; i += blockDim.x) base[dst * block_bytes + i] = base[src * block_bytes + i];
    }
  }
}

}  // namespace kvpager::kernels::detail
