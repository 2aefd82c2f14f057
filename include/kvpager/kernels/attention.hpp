#pragma once
/// \file
/// C++ interface of the CPU paged decode attention (the C ABI in kvpager/c/kernels.h wraps it). One query token per
/// sequence; K/V read through a dense or CSR page table from a paged pool with explicit element strides, so the
/// default [blocks, 2, kv_heads, block_size, head_dim] (HND) layout and NHD [blocks, block_size, kv_heads,
/// head_dim] (K and V in two pools, or interleaved) both work. Long contexts are split into KV chunks whose partial
/// (max, sum, output) states are merged in fp32; the split is chosen by plan_decode on the host. Optional LSE
/// output (natural log of the softmax denominator, scaled scores). Implemented in libkvpager_kernels.

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A paged KV pool: element (block, kv, head, token, dim) of K (kv = 0) or V (kv = 1) is at
/// data[block * stride_block + kv * stride_kv + head * stride_head + token * stride_token + dim] (64-bit offsets; a
/// view whose largest offset in bytes overflows int64, or with a negative stride, is KVPAGER_STATUS_INVALID_ARGUMENT).
struct paged_kv_view {
  const void* data = nullptr;
  std::int32_t dtype = KVPAGER_DTYPE_FP16;
  std::int32_t num_blocks = 0, num_kv_heads = 0, block_size = 16, head_dim = 128;
  std::int64_t stride_block = 0, stride_kv = 0, stride_head = 0, stride_token = 0;

  /// The default layout [num_blocks, 2, num_kv_heads, block_size, head_dim].
  static constexpr paged_kv_view hnd(const void* data, std::int32_t dtype, std::int32_t num_blocks, std::int32_t kv_heads,
                                     std::int32_t block_size, std::int32_t head_dim) noexcept {
    const std::int64_t head = std::int64_t{block_size} * head_dim;
    return {data, dtype, num_blocks, kv_heads, block_size, head_dim, 2 * head * kv_heads, head * kv_heads, head, head_dim};
  }
  /// NHD with K and V interleaved per block: [num_blocks, 2, block_size, num_kv_heads, head_dim].
  static constexpr paged_kv_view nhd(const void* data, std::int32_t dtype, std::int32_t num_blocks, std::int32_t kv_heads,
                                     std::int32_t block_size, std::int32_t head_dim) noexcept {
    const std::int64_t tok = std::int64_t{kv_heads} * head_dim;
    return {data, dtype, num_blocks, kv_heads, block_size, head_dim, 2 * tok * block_size, tok * block_size, head_dim, tok};
  }
};

/// Which blocks each sequence reads: dense (block_table != nullptr: row s at block_table + s * row_stride, length
/// seq_lens[s]) or CSR (indptr/indices/last_page_len: the blocks of s are indices[indptr[s] .. indptr[s+1]),
/// length (pages - 1) * block_size + last_page_len[s], computed in 64 bits: a CSR sequence longer than INT32_MAX
/// tokens is KVPAGER_STATUS_SEQ_TOO_LONG, a decreasing or negative indptr KVPAGER_STATUS_INVALID_ARGUMENT).
struct page_table_view {
  const std::int32_t* block_table = nullptr;
  std::int64_t row_stride = 0;
  const std::int32_t* seq_lens = nullptr;
  const std::int32_t* indptr = nullptr;
  const std::int32_t* indices = nullptr;
  const std::int32_t* last_page_len = nullptr;
};

struct decode_params {
  void* out = nullptr;          ///< [num_seqs, num_q_heads, head_dim], kv dtype, contiguous
  const void* query = nullptr;  ///< same shape and dtype
  float* lse = nullptr;         ///< optional [num_seqs, num_q_heads]
  paged_kv_view kv{};
  page_table_view pages{};
  std::int32_t num_seqs = 0, num_q_heads = 0;
  float scale = 1.0F;
  std::int32_t num_splits = 0;   ///< KV chunks per sequence (at most 256); 0 = choose with plan_decode
  std::int32_t num_threads = 0;  ///< 0 = all cores
};

/// Host-side split choice: enough (sequence, KV head, split) work items to keep `threads` busy, chunks of at least
/// 256 tokens.
[[nodiscard]] KVPAGER_C_API std::int32_t plan_decode(std::int32_t num_seqs, std::int32_t num_kv_heads,
                                                     std::int32_t max_seq_len, std::int32_t threads) noexcept;

/// Runs decode attention; returns a KVPAGER_STATUS_* code. Validates everything (page tables included) first.
[[nodiscard]] KVPAGER_C_API std::int32_t paged_attention_decode_cpu(const decode_params& p) noexcept;

KVPAGER_NAMESPACE_END
