// SPDX-License-Identifier: Apache-2.0
// CUDA entry points of the C ABI: paged decode attention (split-KV with a merge kernel), kv_append, copy_blocks,
// swap_blocks, and the fp8 E4M3 pool's kv_append_fp8 and decode_fp8 (device_fp8.cuh).
// Host-side checks and launches; the kernels are in device_kernels.cuh. A launch or copy the runtime
// refuses is KVPAGER_STATUS_DEVICE_ERROR (cuda_status.hpp). Same semantics as the CPU backend
// (kernels/cpu/decode.cpp, kernels/cpu/block_moves.cpp): tests/kernels/cuda_test.cpp compares them on a GPU, tests/kernels/cuda_emulation_test.cpp
// runs the device code on CPU threads everywhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kernels/common/checks.hpp"
#include "kernels/cuda/cuda_status.hpp"
#include "kernels/cuda/device_fp8.cuh"
#include "kernels/cuda/device_kernels.cuh"

namespace {

using namespace kvpager::kernels::detail;

struct decode_args {
  void* out;
  float* lse;
  const void* q;
  const void* kv;
  const int32_t* table;
  const int32_t* lens;
  int32_t seqs, hq, hkv, dim, bs, max_blocks, num_blocks;
  float scale;
  int32_t window_left;
  float cap;
  int32_t splits;
  float* part;
  int32_t* error;
  cudaStream_t stream;
};

/// Grid rows (y and z) are limited to 65535; the kernels walk any further KV heads, query heads or layers themselves.
unsigned grid_rows(int32_t n) { return static_cast<unsigned>(n < 65535 ? n : 65535); }

template <class T, int D>
void launch_decode_dim(const decode_args& a) {
  const dim3 grid(static_cast<unsigned>(a.seqs), grid_rows(a.hkv), static_cast<unsigned>(a.splits));
  decode_kernel<T, D><<<grid, kWarps * 32, 0, a.stream>>>(static_cast<T*>(a.out), a.lse, a.part, static_cast<const T*>(a.q),
                                                          static_cast<const T*>(a.kv), a.table, a.lens, a.hq, a.hkv, a.bs,
                                                          a.max_blocks, a.num_blocks, a.scale, a.window_left, a.cap,
                                                          a.splits, a.error);
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
    const dim3 grid(static_cast<unsigned>(a.seqs), grid_rows(a.hq));
    merge_kernel<T><<<grid, 128, 0, a.stream>>>(static_cast<T*>(a.out), a.lse, a.part, a.hq, a.dim, a.splits);
  }
  return launch_status();
}

/// decode_args of an fp8 pool: `scale` already multiplied by k_scale, the query/output dtype in T.
template <class T, int D>
void launch_decode_fp8_dim(const decode_args& a, float v_scale) {
  const dim3 grid(static_cast<unsigned>(a.seqs), grid_rows(a.hkv), static_cast<unsigned>(a.splits));
  decode_fp8_kernel<T, D><<<grid, kWarps * 32, 0, a.stream>>>(
      static_cast<T*>(a.out), a.lse, a.part, static_cast<const T*>(a.q), static_cast<const uint8_t*>(a.kv), a.table,
      a.lens, a.hq, a.hkv, a.bs, a.max_blocks, a.num_blocks, a.scale, v_scale, a.window_left, a.cap, a.splits, a.error);
}

template <class T>
int32_t launch_decode_fp8(const decode_args& a, float v_scale) {
  switch (a.dim) {
    case 64: launch_decode_fp8_dim<T, 64>(a, v_scale); break;
    case 80: launch_decode_fp8_dim<T, 80>(a, v_scale); break;
    case 96: launch_decode_fp8_dim<T, 96>(a, v_scale); break;
    case 112: launch_decode_fp8_dim<T, 112>(a, v_scale); break;
    case 128: launch_decode_fp8_dim<T, 128>(a, v_scale); break;
    default: launch_decode_fp8_dim<T, 256>(a, v_scale); break;
  }
  if (a.splits > 1) {  // the partial states already carry v_scale: the plain merge applies
    const dim3 grid(static_cast<unsigned>(a.seqs), grid_rows(a.hq));
    merge_kernel<T><<<grid, 128, 0, a.stream>>>(static_cast<T*>(a.out), a.lse, a.part, a.hq, a.dim, a.splits);
  }
  return launch_status();
}

}  // namespace

extern "C" {

int32_t kvpager_cuda_paged_attention_decode_fp8_split_ex(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left, float logits_soft_cap,
    int32_t q_dtype, float k_scale, float v_scale, int32_t num_splits, void* workspace, int64_t workspace_bytes,
    int32_t* error_flag, void* stream) {
  if (num_splits < 1 || workspace_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_dense_decode(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads,
                                            num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks, scale,
                                            KVPAGER_DTYPE_FP8_E4M3, fp8_entry_io_dtype(q_dtype), k_scale, v_scale,
                                            num_splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const int32_t rc = check_window_and_cap(window_left, logits_soft_cap); rc != KVPAGER_STATUS_OK) return rc;
  const int64_t need = decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  const decode_args a{out, lse, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                      block_size, max_blocks_per_seq, num_blocks, scale * k_scale, window_left, logits_soft_cap,
                      num_splits, static_cast<float*>(workspace), error_flag, static_cast<cudaStream_t>(stream)};
  switch (q_dtype) {
    case KVPAGER_DTYPE_FP32: return launch_decode_fp8<float>(a, v_scale);
    case KVPAGER_DTYPE_FP16: return launch_decode_fp8<__half>(a, v_scale);
    default: return launch_decode_fp8<__nv_bfloat16>(a, v_scale);
  }
}

int32_t kvpager_cuda_paged_attention_decode_fp8_split(void* out, float* lse, const void* query, const void* kv_cache,
                                                      const int32_t* block_table, const int32_t* seq_lens,
                                                      int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                                      int32_t head_dim, int32_t block_size, int32_t max_blocks_per_seq,
                                                      int32_t num_blocks, float scale, int32_t q_dtype, float k_scale,
                                                      float v_scale, int32_t num_splits, void* workspace,
                                                      int64_t workspace_bytes, int32_t* error_flag, void* stream) {
  return kvpager_cuda_paged_attention_decode_fp8_split_ex(out, lse, query, kv_cache, block_table, seq_lens, num_seqs,
                                                          num_q_heads, num_kv_heads, head_dim, block_size,
                                                          max_blocks_per_seq, num_blocks, scale, -1, 0.0F, q_dtype,
                                                          k_scale, v_scale, num_splits, workspace, workspace_bytes,
                                                          error_flag, stream);
}

int32_t kvpager_cuda_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                                const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                float scale, int32_t q_dtype, float k_scale, float v_scale,
                                                int32_t* error_flag, void* stream) {
  return kvpager_cuda_paged_attention_decode_fp8_split(out, nullptr, query, kv_cache, block_table, seq_lens, num_seqs,
                                                       num_q_heads, num_kv_heads, head_dim, block_size,
                                                       max_blocks_per_seq, num_blocks, scale, q_dtype, k_scale, v_scale,
                                                       1, nullptr, 0, error_flag, stream);
}

int32_t kvpager_cuda_kv_append_fp8(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                                   int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                   int32_t num_blocks, int32_t src_dtype, float k_scale, float v_scale,
                                   int32_t* error_flag, void* stream) {
  if (const int32_t rc = check_append(kv_cache, key, value, slot_mapping, num_tokens, num_kv_heads, head_dim,
                                      block_size, num_blocks, KVPAGER_DTYPE_FP8_E4M3, fp8_entry_io_dtype(src_dtype),
                                      k_scale, v_scale);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_tokens == 0) return KVPAGER_STATUS_OK;
  const int64_t max_slot = static_cast<int64_t>(num_blocks) * block_size;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(num_tokens));
  auto* cache = static_cast<uint8_t*>(kv_cache);
  switch (src_dtype) {
    case KVPAGER_DTYPE_FP32:
      append_fp8_kernel<float><<<grid, 256, 0, s>>>(cache, static_cast<const float*>(key), static_cast<const float*>(value),
                                                    slot_mapping, num_kv_heads, head_dim, block_size, max_slot, k_scale,
                                                    v_scale, error_flag);
      break;
    case KVPAGER_DTYPE_FP16:
      append_fp8_kernel<__half><<<grid, 256, 0, s>>>(cache, static_cast<const __half*>(key),
                                                     static_cast<const __half*>(value), slot_mapping, num_kv_heads,
                                                     head_dim, block_size, max_slot, k_scale, v_scale, error_flag);
      break;
    default:
      append_fp8_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(cache, static_cast<const __nv_bfloat16*>(key),
                                                            static_cast<const __nv_bfloat16*>(value), slot_mapping,
                                                            num_kv_heads, head_dim, block_size, max_slot, k_scale,
                                                            v_scale, error_flag);
  }
  return launch_status();
}

int32_t kvpager_cuda_paged_attention_decode_split_ex(void* out, float* lse, const void* query, const void* kv_cache,
                                                     const int32_t* block_table, const int32_t* seq_lens,
                                                     int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                                     int32_t head_dim, int32_t block_size, int32_t max_blocks_per_seq,
                                                     int32_t num_blocks, float scale, int32_t window_left,
                                                     float logits_soft_cap, int32_t dtype, int32_t num_splits,
                                                     void* workspace, int64_t workspace_bytes, int32_t* error_flag,
                                                     void* stream) {
  if (num_splits < 1 || workspace_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = kvpager::kernels::detail::check_dense_decode(out, query, kv_cache, block_table, seq_lens, num_seqs,
                                                             num_q_heads, num_kv_heads, head_dim, block_size,
                                                             max_blocks_per_seq, num_blocks, scale, dtype, dtype, 1.0F, 1.0F,
                                                             num_splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const int32_t rc = check_window_and_cap(window_left, logits_soft_cap); rc != KVPAGER_STATUS_OK) return rc;
  const int64_t need = kvpager::kernels::detail::decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  const decode_args a{out, lse, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                      block_size, max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_splits,
                      static_cast<float*>(workspace), error_flag, static_cast<cudaStream_t>(stream)};
  switch (dtype) {
    case KVPAGER_DTYPE_FP32: return launch_decode<float>(a);
    case KVPAGER_DTYPE_FP16: return launch_decode<__half>(a);
    default: return launch_decode<__nv_bfloat16>(a);
  }
}

int32_t kvpager_cuda_paged_attention_decode_split(void* out, float* lse, const void* query, const void* kv_cache,
                                                  const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                  int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                  int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                  float scale, int32_t dtype, int32_t num_splits, void* workspace,
                                                  int64_t workspace_bytes, int32_t* error_flag, void* stream) {
  return kvpager_cuda_paged_attention_decode_split_ex(out, lse, query, kv_cache, block_table, seq_lens, num_seqs,
                                                      num_q_heads, num_kv_heads, head_dim, block_size,
                                                      max_blocks_per_seq, num_blocks, scale, -1, 0.0F, dtype,
                                                      num_splits, workspace, workspace_bytes, error_flag, stream);
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
  if (const int32_t rc = kvpager::kernels::detail::check_append(kv_cache, key, value, slot_mapping, num_tokens, num_kv_heads,
                                                       head_dim, block_size, num_blocks, dtype, dtype, 1.0F, 1.0F);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_tokens == 0) return KVPAGER_STATUS_OK;
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
  return launch_status();
}

int32_t kvpager_cuda_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                 int32_t num_pairs, int32_t num_blocks, int64_t block_bytes, int32_t* error_flag,
                                 void* stream) {
  if (const int32_t rc = kvpager::kernels::detail::check_copy(kv_caches, num_layers, block_mapping, num_pairs, num_blocks,
                                                     block_bytes, kvpager::kernels::detail::memory::device);
      rc != KVPAGER_STATUS_OK)
    return rc;
  // The ids live in device memory: with no layers the kernel still checks them, unless nobody would hear of it.
  if (num_pairs == 0 || (num_layers == 0 && error_flag == nullptr)) return KVPAGER_STATUS_OK;
  const dim3 grid(static_cast<unsigned>(num_pairs), grid_rows(num_layers > 0 ? num_layers : 1));
  copy_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(kv_caches, num_layers, block_mapping, num_blocks,
                                                                   block_bytes, error_flag);
  return launch_status();
}

int32_t kvpager_cuda_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                                 const int64_t* pairs, int32_t num_pairs, void* stream) {
  if (const int32_t rc = kvpager::kernels::detail::check_swap(dst, dst_blocks, src, src_blocks, block_bytes, pairs, num_pairs);
      rc != KVPAGER_STATUS_OK)
    return rc;
  auto s = static_cast<cudaStream_t>(stream);
  return kvpager::kernels::detail::for_each_run(pairs, num_pairs, [&](int64_t from, int64_t to, int64_t n) {
    auto* d = static_cast<unsigned char*>(dst) + to * block_bytes;
    const auto* from_ptr = static_cast<const unsigned char*>(src) + from * block_bytes;
    if (d == from_ptr) return int32_t{KVPAGER_STATUS_OK};  // a run onto itself copies nothing
    return cuda_status(cudaMemcpyAsync(d, from_ptr, static_cast<size_t>(n * block_bytes), cudaMemcpyDefault, s));
  });
}

}  // extern "C"
