// CUDA kernels of the C ABI: paged decode attention, kv_append, copy_blocks, swap_blocks. Same semantics as the CPU
// backend (kernels/cpu/attention.cpp). Compiled by nvcc whenever CMake finds it; verified only where a GPU runs the
// GPU tests (tests/kernels/cuda_test.cpp), which compare with the CPU backend on the same inputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "../common/checks.hpp"

namespace {

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

/// Query heads of a group handled together (their K/V rows are loaded once per tile): 8, or 4 for head_dim 256.
template <int D> constexpr int kHeadTile = D <= 128 ? 8 : 4;

/// The tokens [t0, t1) a split reads: whole blocks, the same formula as the CPU backend.
__device__ __forceinline__ void split_range(int len, int bs, int splits, int split, int& t0, int& t1) {
  const int per = (len + splits - 1) / splits;
  const int chunk = (per + bs - 1) / bs * bs;
  t0 = min(len, split * chunk);
  t1 = min(len, t0 + chunk);
}

/// Grid (num_seqs, num_kv_heads, splits); 4 warps. For a tile of up to kHeadTile query heads of the group, each warp
/// walks every 4th token of the split with one online softmax per head (each K/V row read once per tile, held in
/// registers), then the warps' states are merged in fp32 through shared memory. With one split the result goes to
/// `out` (and `lse`); with several, the unnormalized state (m, l, acc[D]) goes to part[seq][q head][split] for
/// merge_kernel. Out-of-range block ids are never dereferenced: the token is skipped and *error set.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part, const T* __restrict__ q,
                  const T* __restrict__ kv, const int32_t* __restrict__ table, const int32_t* __restrict__ lens, int hq,
                  int hkv, int bs, int max_blocks, int num_blocks, float scale, int splits, int32_t* error) {
  constexpr int kPer = (D + 31) / 32;
  constexpr int G = kHeadTile<D>;
  __shared__ float sm[kWarps][G], sl[kWarps][G];
  __shared__ float sacc[kWarps][G][D];
  const int seq = blockIdx.x, h = blockIdx.y, split = blockIdx.z, group = hq / hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int len = lens[seq];
  if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(max_blocks) * bs) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_SEQ_TOO_LONG);
    len = 0;
  }
  int t0 = 0, t1 = 0;
  split_range(len, bs, splits, split, t0, t1);
  const int64_t head_stride = static_cast<int64_t>(bs) * D, half_stride = static_cast<int64_t>(hkv) * head_stride;
  for (int g0 = 0; g0 < group; g0 += G) {
    const int gt = min(G, group - g0);
    float qv[G][kPer], acc[G][kPer], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0F;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        qv[g][i] = g < gt && d < D ? to_f(q[(static_cast<int64_t>(seq) * hq + h * group + g0 + g) * D + d]) * scale : 0.0F;
        acc[g][i] = 0.0F;
      }
    }
    for (int t = t0 + warp; t < t1; t += kWarps) {
      const int blk = table[static_cast<int64_t>(seq) * max_blocks + t / bs];
      if (blk < 0 || blk >= num_blocks) {  // never dereferenced
        if (error != nullptr && lane == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
        continue;
      }
      const T* krow = kv + static_cast<int64_t>(blk) * 2 * half_stride + h * head_stride + static_cast<int64_t>(t % bs) * D;
      const T* vrow = krow + half_stride;
      float kf[kPer], vf[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        kf[i] = d < D ? to_f(krow[d]) : 0.0F;
        vf[i] = d < D ? to_f(vrow[d]) : 0.0F;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= gt) break;
        float s = 0.0F;
#pragma unroll
        for (int i = 0; i < kPer; ++i) s += qv[g][i] * kf[i];
        s = warp_sum(s);
        const float m_new = fmaxf(m[g], s);
        const float alpha = m[g] == -INFINITY ? 0.0F : __expf(m[g] - m_new);
        const float p = __expf(s - m_new);
        l[g] = l[g] * alpha + p;
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[g][i] = acc[g][i] * alpha + p * vf[i];
        m[g] = m_new;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (lane == 0) {
        sm[warp][g] = m[g];
        sl[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        if (d < D) sacc[warp][g][d] = acc[g][i];
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
        out[row * D + d] = from_f<T>(L > 0.0F ? o / L : 0.0F);
        if (lse != nullptr && d == 0) lse[row] = L > 0.0F ? M + logf(L) : -INFINITY;
      } else {
        float* st = part + (row * splits + split) * (D + 2);
        if (d == 0) {
          st[0] = M;
          st[1] = L;
        }
        st[2 + d] = o;
      }
    }
    __syncthreads();
  }
}

/// Grid (num_seqs, num_q_heads): merges the splits' states in fp32, out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i.
template <class T>
__global__ void merge_kernel(T* __restrict__ out, float* __restrict__ lse, const float* __restrict__ part, int D,
                             int splits) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
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
  if (lse != nullptr && threadIdx.x == 0) lse[row] = L > 0.0F ? M + logf(L) : -INFINITY;
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
  for (int i = threadIdx.x; i < hkv * D; i += blockDim.x) {
    const int h = i / D, d = i % D;
    const int64_t dst = blk * 2 * half + h * head_stride + off * D + d;
    kv[dst] = key[static_cast<int64_t>(t) * hkv * D + i];
    kv[dst + half] = value[static_cast<int64_t>(t) * hkv * D + i];
  }
}

__global__ void copy_kernel(void* const* caches, const int64_t* __restrict__ mapping, int num_blocks, int64_t block_bytes,
                            int32_t* error) {
  const int layer = blockIdx.x, pair = blockIdx.y;
  const int64_t src = mapping[2 * pair], dst = mapping[2 * pair + 1];
  if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) {
    if (error != nullptr && threadIdx.x == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
    return;
  }
  auto* base = static_cast<unsigned char*>(caches[layer]);
  if (block_bytes % 16 == 0) {
    const auto* s = reinterpret_cast<const uint4*>(base + src * block_bytes);
    auto* d = reinterpret_cast<uint4*>(base + dst * block_bytes);
    for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < block_bytes; i += blockDim.x) base[dst * block_bytes + i] = base[src * block_bytes + i];
  }
}

struct decode_args {
  void* out;
  float* lse;
  const void* q;
  const void* kv;
  const int32_t* table;
  const int32_t* lens;
  int32_t seqs, hq, hkv, dim, bs, max_blocks, num_blocks;
  float scale;
  int32_t splits;
  float* part;
  int32_t* error;
  cudaStream_t stream;
};

template <class T, int D>
void launch_decode_dim(const decode_args& a) {
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.hkv), static_cast<unsigned>(a.splits));
  decode_kernel<T, D><<<grid, kWarps * 32, 0, a.stream>>>(static_cast<T*>(a.out), a.lse, a.part, static_cast<const T*>(a.q),
                                                          static_cast<const T*>(a.kv), a.table, a.lens, a.hq, a.hkv, a.bs,
                                                          a.max_blocks, a.num_blocks, a.scale, a.splits, a.error);
}

template <class T>
int32_t launch_decode(const decode_args& a) {
  switch (a.dim) {
    case 64: launch_decode_dim<T, 64>(a); break;
    case 80: launch_decode_dim<T, 80>(a); break;
    case 96: launch_decode_dim<T, 96>(a); break;
    case 112: launch_decode_dim<T, 112>(a); break;
    case 128: launch_decode_dim<T, 128>(a); break;
    default: launch_decode_dim<T, 256>(a); break;
  }
  if (a.splits > 1) {
    const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.hq));
    merge_kernel<T><<<grid, 128, 0, a.stream>>>(static_cast<T*>(a.out), a.lse, a.part, a.dim, a.splits);
  }
  return cudaGetLastError() == cudaSuccess ? KVPAGER_STATUS_OK : KVPAGER_STATUS_NO_DEVICE;
}

}  // namespace

extern "C" {

int32_t kvpager_cuda_paged_attention_decode_split(void* out, float* lse, const void* query, const void* kv_cache,
                                                  const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                  int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                  int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                  float scale, int32_t dtype, int32_t num_splits, void* workspace,
                                                  int64_t workspace_bytes, int32_t* error_flag, void* stream) {
  if (num_seqs < 0 || max_blocks_per_seq <= 0 || num_blocks <= 0 || !isfinite(scale) || num_splits < 1 ||
      num_splits > kvpager_kernels::max_decode_splits || workspace_bytes < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs > 0 && (out == nullptr || query == nullptr || kv_cache == nullptr || block_table == nullptr || seq_lens == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = kvpager_kernels::check_decode_shape(num_q_heads, num_kv_heads, head_dim, block_size, dtype);
      rc != KVPAGER_STATUS_OK)
    return rc;
  const int64_t need = kvpager_kernels::decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  const decode_args a{out, lse, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                      block_size, max_blocks_per_seq, num_blocks, scale, num_splits, static_cast<float*>(workspace),
                      error_flag, static_cast<cudaStream_t>(stream)};
  switch (dtype) {
    case KVPAGER_DTYPE_FP32: return launch_decode<float>(a);
    case KVPAGER_DTYPE_FP16: return launch_decode<__half>(a);
    default: return launch_decode<__nv_bfloat16>(a);
  }
}

int32_t kvpager_cuda_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                            const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                            int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                            int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                            float scale, int32_t dtype, int32_t* error_flag, void* stream) {
  return kvpager_cuda_paged_attention_decode_split(out, nullptr, query, kv_cache, block_table, seq_lens, num_seqs,
                                                   num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq,
                                                   num_blocks, scale, dtype, 1, nullptr, 0, error_flag, stream);
}

int32_t kvpager_cuda_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                               int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                               int32_t num_blocks, int32_t dtype, int32_t* error_flag, void* stream) {
  if (num_tokens < 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || num_blocks <= 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (!kvpager_kernels::valid_dtype(dtype)) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (num_tokens == 0) return KVPAGER_STATUS_OK;
  if (kv_cache == nullptr || key == nullptr || value == nullptr || slot_mapping == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const int64_t max_slot = static_cast<int64_t>(num_blocks) * block_size;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(num_tokens));
  switch (dtype) {
    case KVPAGER_DTYPE_FP32:
      append_kernel<float><<<grid, 256, 0, s>>>(static_cast<float*>(kv_cache), static_cast<const float*>(key),
                                                static_cast<const float*>(value), slot_mapping, num_kv_heads, head_dim,
                                                block_size, max_slot, error_flag);
      break;
    case KVPAGER_DTYPE_FP16:
      append_kernel<__half><<<grid, 256, 0, s>>>(static_cast<__half*>(kv_cache), static_cast<const __half*>(key),
                                                 static_cast<const __half*>(value), slot_mapping, num_kv_heads, head_dim,
                                                 block_size, max_slot, error_flag);
      break;
    default:
      append_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(kv_cache),
                                                        static_cast<const __nv_bfloat16*>(key),
                                                        static_cast<const __nv_bfloat16*>(value), slot_mapping,
                                                        num_kv_heads, head_dim, block_size, max_slot, error_flag);
  }
  return cudaGetLastError() == cudaSuccess ? KVPAGER_STATUS_OK : KVPAGER_STATUS_NO_DEVICE;
}

int32_t kvpager_cuda_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                 int32_t num_pairs, int32_t num_blocks, int64_t block_bytes, int32_t* error_flag,
                                 void* stream) {
  if (num_layers < 0 || num_pairs < 0 || num_blocks <= 0 || block_bytes <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_layers == 0 || num_pairs == 0) return KVPAGER_STATUS_OK;
  if (kv_caches == nullptr || block_mapping == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const dim3 grid(static_cast<unsigned>(num_layers), static_cast<unsigned>(num_pairs));
  copy_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(kv_caches, block_mapping, num_blocks, block_bytes,
                                                                   error_flag);
  return cudaGetLastError() == cudaSuccess ? KVPAGER_STATUS_OK : KVPAGER_STATUS_NO_DEVICE;
}

int32_t kvpager_cuda_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                                 const int64_t* pairs, int32_t num_pairs, void* stream) {
  if (const int32_t rc = kvpager_kernels::check_swap(dst, dst_blocks, src, src_blocks, block_bytes, pairs, num_pairs);
      rc != KVPAGER_STATUS_OK)
    return rc;
  auto s = static_cast<cudaStream_t>(stream);
  return kvpager_kernels::for_each_run(pairs, num_pairs, [&](int64_t from, int64_t to, int64_t n) {
    return cudaMemcpyAsync(static_cast<unsigned char*>(dst) + to * block_bytes,
                           static_cast<const unsigned char*>(src) + from * block_bytes,
                           static_cast<size_t>(n * block_bytes), cudaMemcpyDefault, s) == cudaSuccess
               ? KVPAGER_STATUS_OK
               : KVPAGER_STATUS_NO_DEVICE;
  });
}

}  // extern "C"
