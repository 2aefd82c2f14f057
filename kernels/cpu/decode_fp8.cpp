// SPDX-License-Identifier: Apache-2.0
// CPU paged decode attention over an fp8 E4M3 KV pool (KVPAGER_DTYPE_FP8_E4M3; issue 12, point 3): the C function
// kvpager_cpu_paged_attention_decode_fp8 and the fp8 branch of kvpager::paged_attention_decode_cpu. K = e4m3 x
// k_scale, V = e4m3 x v_scale with per-tensor scales; query and output fp32/fp16/bf16 (q_dtype). The point is
// bandwidth: the kernel reads one byte per KV element and converts it in registers. This file holds the fp8 checks
// (kernels/common/checks.hpp, page_tables.hpp: everything checked before a KV byte is read or an output written); the
// decode itself is decode.cpp's for every dtype (decode_tiled.inc with an fp8 load, the K scale folded into the
// query and the V scale into the output): the same work items, split-KV plan, fp32 merge and worker pool.
#include <algorithm>
#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/cpu/decode_fp8.hpp"
#include "kernels/cpu/page_tables.hpp"

namespace {

/// Every argument, page tables included, before any KV memory is read.
std::int32_t validate_fp8(const kvpager::decode_params& p) noexcept {
  namespace kd = kvpager::kernels::detail;
  const auto& kv = p.kv;
  if (p.num_threads < 0 || p.num_splits < 0 || p.workspace_bytes < 0 ||
      reinterpret_cast<std::uintptr_t>(p.workspace) % alignof(float) != 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const std::int32_t rc =
          kd::check_decode_fp8_args(p.num_seqs, p.num_q_heads, kv.num_kv_heads, kv.head_dim, kv.block_size, p.q_dtype,
                                    kv.num_blocks, p.scale, p.k_scale, p.v_scale, std::max(p.num_splits, 1));
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const std::int32_t rc = kd::check_window_and_cap(p.window_left, p.logits_soft_cap); rc != KVPAGER_STATUS_OK)
    return rc;
  if (kd::view_extent_bytes(kv, 1) < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (p.num_seqs == 0) return KVPAGER_STATUS_OK;
  if (p.out == nullptr || p.query == nullptr || kv.data == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  return kd::check_pages(p.pages, p.num_seqs, kv.block_size, kv.num_blocks);
}

}  // namespace

namespace kvpager::kernels::detail {

std::int32_t decode_fp8_cpu(const kvpager::decode_params& p) noexcept {
  if (const std::int32_t rc = validate_fp8(p); rc != KVPAGER_STATUS_OK) return rc;
  return decode_validated(p);
}

}  // namespace kvpager::kernels::detail

extern "C" {

int32_t kvpager_cpu_paged_attention_decode_fp8_ex(void* out, const void* query, const void* kv_cache,
                                                  const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                  int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                  int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                  float scale, int32_t window_left, float logits_soft_cap,
                                                  int32_t q_dtype, float k_scale, float v_scale, int32_t num_threads) {
  if (const int32_t rc = kvpager::kernels::detail::check_dense_decode_fp8(
          out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
          max_blocks_per_seq, num_blocks, scale, q_dtype, k_scale, v_scale, 1);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const int32_t rc = kvpager::kernels::detail::check_window_and_cap(window_left, logits_soft_cap);
      rc != KVPAGER_STATUS_OK)
    return rc;
  auto p = kvpager::kernels::detail::dense_params<kvpager::decode_params>(
      out, query, kv_cache, KVPAGER_DTYPE_FP8_E4M3, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
      block_size, max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.q_dtype = q_dtype;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return kvpager::kernels::detail::decode_fp8_cpu(p);
}

int32_t kvpager_cpu_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                               const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                               int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                               int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                               float scale, int32_t q_dtype, float k_scale, float v_scale,
                                               int32_t num_threads) {
  return kvpager_cpu_paged_attention_decode_fp8_ex(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads,
                                                   num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks,
                                                   scale, -1, 0.0F, q_dtype, k_scale, v_scale, num_threads);
}

}  // extern "C"
