// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one check of each CPU attention operation's params (decode_params, prefill_params), every pool dtype (fp8 a
// value of kv.dtype, fp8_path), page tables read on the host: each call is validated once, by these, before any KV
// memory is read or an output written. The C functions forward to the operations; only what a params struct cannot
// state (max_blocks_per_seq <= 0, checked first) is theirs. Internal to libkvpager_kernels.
#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/prefill.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/cpu/page_tables.hpp"

namespace kvpager::kernels::detail {

/// The checks of decode and prefill before their own (query rows, workspace), in this order: check_decode_args (the
/// query dtype, num_seqs, scale, an fp8 pool's scales, heads, geometry, the query size and `splits`' workspace),
/// check_window_and_cap, num_threads non-negative, the view's extent (INVALID_ARGUMENT), then, for num_seqs > 0, the
/// output, query and pool pointers and the page-table pointers (INVALID_ARGUMENT).
template <class Params>
std::int32_t check_attention_common(const Params& p, std::int32_t splits) noexcept {
  const kvpager::paged_kv_view& kv = p.kv;
  if (const std::int32_t rc = check_decode_args(p.num_seqs, p.num_q_heads, kv.num_kv_heads, kv.head_dim, kv.block_size,
                                                kv.dtype, p.q_dtype, kv.num_blocks, p.scale, p.k_scale, p.v_scale,
                                                splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const std::int32_t rc = check_window_and_cap(p.window_left, p.logits_soft_cap); rc != KVPAGER_STATUS_OK)
    return rc;
  if (p.num_threads < 0 || view_extent_bytes(kv, elem_bytes(kv.dtype)) < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (p.num_seqs == 0) return KVPAGER_STATUS_OK;
  if (p.out == nullptr || p.query == nullptr || kv.data == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  return check_page_pointers(p.pages, p.num_seqs);
}

/// The one check of a decode: check_attention_common (with max(num_splits, 1)), num_splits and workspace_bytes
/// non-negative and the workspace aligned for float (INVALID_ARGUMENT), then every sequence's length and block ids
/// (check_pages). The workspace's size is checked when the split is known (the decode, before writing).
inline std::int32_t check_decode(const kvpager::decode_params& p) noexcept {
  if (const std::int32_t rc = check_attention_common(p, p.num_splits > 1 ? p.num_splits : 1); rc != KVPAGER_STATUS_OK)
    return rc;
  if (p.num_splits < 0 || p.workspace_bytes < 0 || reinterpret_cast<std::uintptr_t>(p.workspace) % alignof(float) != 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  return check_pages(p.pages, p.num_seqs, p.kv.block_size, p.kv.num_blocks);
}

/// The one check of a prefill: check_attention_common, a non-null qo_indptr (num_seqs > 0), check_qo_indptr (starts at
/// 0, never decreases, the query size in the query dtype), then per sequence its length (check_page_length), q_len
/// at most that length (INVALID_ARGUMENT) and its block ids (INVALID_BLOCK).
inline std::int32_t check_prefill(const kvpager::prefill_params& p) noexcept {
  const kvpager::paged_kv_view& kv = p.kv;
  if (const std::int32_t rc = check_attention_common(p, 1); rc != KVPAGER_STATUS_OK) return rc;
  if (p.num_seqs == 0) return KVPAGER_STATUS_OK;
  if (p.qo_indptr == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  std::int64_t rows = 0;
  const std::int32_t io_dtype = fp8_path(kv.dtype, p.q_dtype) ? p.q_dtype : kv.dtype;
  if (const std::int32_t rc = check_qo_indptr(p.qo_indptr, p.num_seqs, p.num_q_heads, kv.head_dim, io_dtype, &rows);
      rc != KVPAGER_STATUS_OK)
    return rc;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {  // per sequence: its length, then its q_len, then its blocks
    std::int64_t len = 0, blocks = 0;
    if (const std::int32_t rc = check_page_length(p.pages, s, kv.block_size, len, blocks); rc != KVPAGER_STATUS_OK)
      return rc;
    if (std::int64_t{p.qo_indptr[s + 1]} - p.qo_indptr[s] > len) return KVPAGER_STATUS_INVALID_ARGUMENT;
    if (const std::int32_t rc = check_page_blocks(p.pages, s, blocks, kv.num_blocks); rc != KVPAGER_STATUS_OK)
      return rc;
  }
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager::kernels::detail
