// SPDX-License-Identifier: Apache-2.0
#pragma once
// Page-table reading and checking for the CPU kernels (decode.cpp, prefill.cpp, and params_checks.hpp) over a
// kvpager::page_table_view (dense block table or CSR indptr/indices/last_page_len): one definition of a sequence's
// length and blocks, and of the checks every kernel runs before reading KV (lengths, block ids), and of the bytes a
// paged_kv_view spans.
#include <cstdint>
#include <limits>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kernels/common/checks.hpp"

namespace kvpager::kernels::detail {

/// Block `b` of sequence `seq`.
inline std::int32_t page_block_at(const kvpager::page_table_view& pt, std::int32_t seq, std::int64_t b) noexcept {
  return pt.block_table != nullptr ? pt.block_table[std::int64_t{seq} * pt.row_stride + b]
                                   : pt.indices[std::int64_t{pt.indptr[seq]} + b];
}
/// Tokens of CSR sequence `seq`, (pages - 1) x block_size + last_page_len, in 64 bits (0 without pages).
inline std::int64_t page_csr_length(const kvpager::page_table_view& pt, std::int32_t seq, std::int32_t bs) noexcept {
  const std::int64_t pages = std::int64_t{pt.indptr[seq + 1]} - pt.indptr[seq];
  return pages == 0 ? 0 : (pages - 1) * bs + pt.last_page_len[seq];
}
/// Tokens of sequence `seq` (after check_pages: at most INT32_MAX).
inline std::int32_t page_length(const kvpager::page_table_view& pt, std::int32_t seq, std::int32_t bs) noexcept {
  return pt.block_table != nullptr ? pt.seq_lens[seq] : static_cast<std::int32_t>(page_csr_length(pt, seq, bs));
}

/// The table pointers of `num_seqs` (> 0) sequences: dense, seq_lens and a positive row_stride with num_seqs x
/// row_stride within int64; CSR, indptr, indices and last_page_len. INVALID_ARGUMENT else.
inline std::int32_t check_page_pointers(const kvpager::page_table_view& pt, std::int32_t num_seqs) noexcept {
  const bool bad = pt.block_table != nullptr
                       ? pt.seq_lens == nullptr || pt.row_stride <= 0 || checked_product({num_seqs, pt.row_stride}) < 0
                       : pt.indptr == nullptr || pt.indices == nullptr || pt.last_page_len == nullptr;
  return bad ? KVPAGER_STATUS_INVALID_ARGUMENT : KVPAGER_STATUS_OK;
}

/// Sequence `s`'s length and block count (dense: check_seq_len; CSR: a non-negative, non-decreasing indptr else
/// INVALID_ARGUMENT, last_page_len in [1, bs] and a length within INT32_MAX else SEQ_TOO_LONG), into len and blocks.
inline std::int32_t check_page_length(const kvpager::page_table_view& pt, std::int32_t s, std::int32_t bs,
                                      std::int64_t& len, std::int64_t& blocks) noexcept {
  if (pt.block_table != nullptr) {
    len = pt.seq_lens[s];
    if (const std::int32_t rc = check_seq_len(pt.seq_lens[s], bs, pt.row_stride); rc != KVPAGER_STATUS_OK) return rc;
    blocks = blocks_for(pt.seq_lens[s], bs);
    return KVPAGER_STATUS_OK;
  }
  if (pt.indptr[s] < 0 || pt.indptr[s + 1] < pt.indptr[s]) return KVPAGER_STATUS_INVALID_ARGUMENT;
  blocks = std::int64_t{pt.indptr[s + 1]} - pt.indptr[s];
  len = page_csr_length(pt, s, bs);
  if (blocks > 0 && (pt.last_page_len[s] < 1 || pt.last_page_len[s] > bs || len > std::numeric_limits<std::int32_t>::max()))
    return KVPAGER_STATUS_SEQ_TOO_LONG;
  return KVPAGER_STATUS_OK;
}

/// Every block id of sequence `s`'s first `blocks` blocks within [0, num_blocks), else INVALID_BLOCK.
inline std::int32_t check_page_blocks(const kvpager::page_table_view& pt, std::int32_t s, std::int64_t blocks,
                                      std::int32_t num_blocks) noexcept {
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int32_t id = page_block_at(pt, s, b);
    if (id < 0 || id >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  }
  return KVPAGER_STATUS_OK;
}

/// The page tables of `num_seqs` sequences over a pool of `num_blocks` blocks of `bs` tokens: check_page_pointers,
/// then per sequence check_page_length and check_page_blocks.
inline std::int32_t check_pages(const kvpager::page_table_view& pt, std::int32_t num_seqs, std::int32_t bs,
                                std::int32_t num_blocks) noexcept {
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  if (const std::int32_t rc = check_page_pointers(pt, num_seqs); rc != KVPAGER_STATUS_OK) return rc;
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    std::int64_t len = 0, blocks = 0;
    if (const std::int32_t rc = check_page_length(pt, s, bs, len, blocks); rc != KVPAGER_STATUS_OK) return rc;
    if (const std::int32_t rc = check_page_blocks(pt, s, blocks, num_blocks); rc != KVPAGER_STATUS_OK) return rc;
  }
  return KVPAGER_STATUS_OK;
}

/// The fields every C entry point fills alike in a decode_params or a prefill_params (Params): a dense block table over
/// a pool in the default layout, the scale, window, cap and threads. The caller adds its own (qo_indptr; an fp8 pool's
/// q_dtype and scales).
template <class Params>
Params dense_params(void* out, const void* query, const void* kv_cache, std::int32_t kv_dtype,
                    const std::int32_t* block_table, const std::int32_t* seq_lens, std::int32_t num_seqs,
                    std::int32_t num_q_heads, std::int32_t num_kv_heads, std::int32_t head_dim, std::int32_t block_size,
                    std::int32_t max_blocks_per_seq, std::int32_t num_blocks, float scale, std::int32_t window_left,
                    float logits_soft_cap, std::int32_t num_threads) noexcept {
  Params p;
  p.out = out;
  p.query = query;
  p.kv = kvpager::paged_kv_view::hnd(kv_cache, kv_dtype, num_blocks, num_kv_heads, block_size, head_dim);
  p.pages.block_table = block_table;
  p.pages.row_stride = max_blocks_per_seq;
  p.pages.seq_lens = seq_lens;
  p.num_seqs = num_seqs;
  p.num_q_heads = num_q_heads;
  p.scale = scale;
  p.window_left = window_left;
  p.logits_soft_cap = logits_soft_cap;
  p.num_threads = num_threads;
  return p;
}

/// Bytes a paged_kv_view spans: its largest element offset plus one, times `elem_size`; -1 when a stride is negative
/// or the extent overflows int64.
inline std::int64_t view_extent_bytes(const kvpager::paged_kv_view& kv, std::int64_t elem_size) noexcept {
  std::int64_t last = kv.head_dim;
  last = checked_sum(last, checked_product({std::int64_t{kv.num_blocks} - 1, kv.stride_block}));
  last = checked_sum(last, checked_product({kv.stride_kv}));
  last = checked_sum(last, checked_product({std::int64_t{kv.num_kv_heads} - 1, kv.stride_head}));
  last = checked_sum(last, checked_product({std::int64_t{kv.block_size} - 1, kv.stride_token}));
  return checked_product({last, elem_size});
}

}  // namespace kvpager::kernels::detail
