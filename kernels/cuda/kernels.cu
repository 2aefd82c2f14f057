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

/// Grid (num_seqs, num_kv_heads); 4 warps. Each warp walks every 4th token of the sequence with an online softmax
/// per query head of the group (so the KV head's rows are read once per group member from L1/L2), then the warps'
/// partial states are merged in fp32 through shared memory.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ kv,
                  const int32_t* __restrict__ table, const int32_t* __restrict__ lens, int hq, int hkv, int bs,
                  int max_blocks, int num_blocks, float scale, int32_t* error) {
  constexpr int kPer = (D + 31) / 32;
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][D];
  const int seq = blockIdx.x, h = blockIdx.y, group = hq / hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int len = lens[seq];
  if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(max_blocks) * bs) {
    if (error != nullptr && lane == 0) atomicExch(error, KVPAGER_STATUS_SEQ_TOO_LONG);
    len = 0;
  }
  const int64_t head_stride = static_cast<int64_t>(bs) * D, half_stride = static_cast<int64_t>(hkv) * head_stride;
  for (int g = 0; g < group; ++g) {
    const int qh = h * group + g;
    float qv[kPer], acc[kPer];
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      qv[i] = d < D ? to_f(q[(static_cast<int64_t>(seq) * hq + qh) * D + d]) * scale : 0.0F;
      acc[i] = 0.0F;
    }
    float m = -INFINITY, l = 0.0F;
    for (int t = warp; t < len; t += kWarps) {
      const int blk = table[static_cast<int64_t>(seq) * max_blocks + t / bs];
      if (blk < 0 || blk >= num_blocks) {  // never dereferenced
        if (error != nullptr && lane == 0) atomicExch(error, KVPAGER_STATUS_INVALID_BLOCK);
        continue;
      }
      const T* krow = kv + static_cast<int64_t>(blk) * 2 * half_stride + h * head_stride + static_cast<int64_t>(t % bs) * D;
      const T* vrow = krow + half_stride;
      float s = 0.0F;
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        if (d < D) s += qv[i] * to_f(krow[d]);
      }
      s = warp_sum(s);
      const float m_new = fmaxf(m, s);
      const float alpha = m == -INFINITY ? 0.0F : __expf(m - m_new);
      const float p = __expf(s - m_new);
      l = l * alpha + p;
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + 32 * i;
        acc[i] = acc[i] * alpha + (d < D ? p * to_f(vrow[d]) : 0.0F);
      }
      m = m_new;
    }
    if (lane == 0) {
      sm[warp] = m;
      sl[warp] = l;
    }
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      if (d < D) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.0F) M = fmaxf(M, sm[w]);
    float L = 0.0F;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.0F) L += sl[w] * __expf(sm[w] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.0F;
      for (int w = 0; w < kWarps; ++w)
        if (sl[w] > 0.0F) o += sacc[w][d] * __expf(sm[w] - M);
      out[(static_cast<int64_t>(seq) * hq + qh) * D + d] = from_f<T>(L > 0.0F ? o / L : 0.0F);
    }
    __syncthreads();
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

template <class T>
int32_t launch_decode(void* out, const void* q, const void* kv, const int32_t* table, const int32_t* lens, int32_t S,
                      int32_t hq, int32_t hkv, int32_t D, int32_t bs, int32_t maxb, int32_t nb, float scale,
                      int32_t* error, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(S), static_cast<unsigned>(hkv));
  auto* o = static_cast<T*>(out);
  const auto* qq = static_cast<const T*>(q);
  const auto* k = static_cast<const T*>(kv);
#define KVPAGER_LAUNCH(DIM) decode_kernel<T, DIM><<<grid, kWarps * 32, 0, stream>>>(o, qq, k, table, lens, hq, hkv, bs, maxb, nb, scale, error)
  switch (D) {
    case 64: KVPAGER_LAUNCH(64); break;
    case 80: KVPAGER_LAUNCH(80); break;
    case 96: KVPAGER_LAUNCH(96); break;
    case 112: KVPAGER_LAUNCH(112); break;
    case 128: KVPAGER_LAUNCH(128); break;
    default: KVPAGER_LAUNCH(256); break;
  }
#undef KVPAGER_LAUNCH
  return cudaGetLastError() == cudaSuccess ? KVPAGER_STATUS_OK : KVPAGER_STATUS_NO_DEVICE;
}


}  // namespace

extern "C" {

int32_t kvpager_cuda_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                            const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                            int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                            int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                            float scale, int32_t dtype, int32_t* error_flag, void* stream) {
  if (num_seqs < 0 || max_blocks_per_seq <= 0 || num_blocks <= 0 || !isfinite(scale)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs > 0 && (out == nullptr || query == nullptr || kv_cache == nullptr || block_table == nullptr || seq_lens == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = kvpager_kernels::check_decode_shape(num_q_heads, num_kv_heads, head_dim, block_size, dtype);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KVPAGER_DTYPE_FP32:
      return launch_decode<float>(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                                  block_size, max_blocks_per_seq, num_blocks, scale, error_flag, s);
    case KVPAGER_DTYPE_FP16:
      return launch_decode<__half>(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                                   block_size, max_blocks_per_seq, num_blocks, scale, error_flag, s);
    default:
      return launch_decode<__nv_bfloat16>(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads,
                                          head_dim, block_size, max_blocks_per_seq, num_blocks, scale, error_flag, s);
  }
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
