// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// C++ interface of the CPU paged decode attention (the C ABI in kvpager/c/kernels.h wraps it). One query token per
/// sequence; K/V read through a dense or CSR page table from a paged pool with explicit element strides, so the
/// default [blocks, 2, kv_heads, block_size, head_dim] (HND) layout and NHD [blocks, block_size, kv_heads,
/// head_dim] (K and V in two pools, or interleaved) both work. Long contexts are split into KV chunks whose partial
/// (max, sum, output) states are merged in fp32; the split is chosen by plan_decode on the host. Optional LSE
/// output (natural log of the softmax denominator, scaled scores). Implemented in libkvpager_kernels. Errors come back
/// as kvpager::status through the one mapping of the C codes (kernel_status.hpp).

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/kernels/export.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A paged KV pool: element (block, kv, head, token, dim) of K (kv = 0) or V (kv = 1) is at
/// data[block * stride_block + kv * stride_kv + head * stride_head + token * stride_token + dim] (64-bit offsets; a
/// view whose largest offset in bytes overflows int64, or with a negative stride, is KVPAGER_STATUS_INVALID_ARGUMENT).
struct paged_kv_view {
  const void* data = nullptr;
  std::int32_t dtype = KVPAGER_DTYPE_FP16;
  std::int32_t num_blocks = 0, num_kv_heads = 0, block_size = default_block_size, head_dim = 128;
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
  /// The default layout of a pool of geometry `g`.
  static constexpr paged_kv_view hnd(const void* data, const kv_geometry& g) noexcept {
    return hnd(data, static_cast<std::int32_t>(g.dtype), g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim);
  }
  /// NHD (K and V interleaved per block) of a pool of geometry `g`.
  static constexpr paged_kv_view nhd(const void* data, const kv_geometry& g) noexcept {
    return nhd(data, static_cast<std::int32_t>(g.dtype), g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim);
  }
  /// Element offset of (block, kv = 0 for K / 1 for V, head, token in block), dim 0: the one address rule of every
  /// kernel that reads or writes K/V through a view (host and device). In elements; times the dtype's bytes for bytes.
  [[nodiscard]] KVPAGER_HOST_DEVICE constexpr std::int64_t offset(std::int64_t block, std::int32_t kv, std::int32_t head,
                                                                  std::int32_t token) const noexcept {
    return block * stride_block + kv * stride_kv + head * stride_head + token * stride_token;
  }
  /// The pool's geometry (block count, block size, heads, head dim, dtype); the strides are the view's own.
  [[nodiscard]] constexpr kv_geometry geometry() const noexcept {
    return {num_blocks, block_size, num_kv_heads, head_dim, static_cast<kv_dtype>(dtype)};
  }
};

static_assert(static_cast<std::int32_t>(kv_dtype::f32) == KVPAGER_DTYPE_FP32 &&
                  static_cast<std::int32_t>(kv_dtype::f16) == KVPAGER_DTYPE_FP16 &&
                  static_cast<std::int32_t>(kv_dtype::bf16) == KVPAGER_DTYPE_BF16 &&
                  static_cast<std::int32_t>(kv_dtype::fp8_e4m3) == KVPAGER_DTYPE_FP8_E4M3,
              "kv_dtype's values are the C ABI's dtype codes");

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
  void* out = nullptr;          ///< [num_seqs, num_q_heads, head_dim], contiguous, of the query dtype (q_dtype)
  const void* query = nullptr;  ///< same shape and dtype
  float* lse = nullptr;         ///< optional [num_seqs, num_q_heads]
  paged_kv_view kv{};
  page_table_view pages{};
  std::int32_t num_seqs = 0, num_q_heads = 0;
  float scale = 1.0F;
  std::int32_t num_splits = 0;   ///< KV chunks per sequence (at most 256); 0 = choose with plan_decode
  std::int32_t num_threads = 0;  ///< 0 = all cores
  /// fp32 merge workspace of a split decode, decode_workspace_size(p) bytes (suitably aligned for float). With it the
  /// call allocates nothing (the thread-local row buffers grow once per thread and are then reused). nullptr: a call
  /// that splits allocates its own per call (KVPAGER_STATUS_OUT_OF_MEMORY when that fails).
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;  ///< size of `workspace`; smaller than the split needs: invalid_argument
  /// Sliding window: -1 = none; w >= 0: the query, at position p = seq_len - 1, attends only to KV positions
  /// j >= p - w (blocks wholly before the window are not read). Below -1: invalid_argument.
  std::int32_t window_left = -1;
  /// Logit soft cap: 0 = none; cap > 0: each scaled score s becomes cap * tanh(s / cap) before the softmax (the LSE
  /// output is then of the capped scores). Negative, NaN or infinite: invalid_argument.
  float logits_soft_cap = 0.0F;
  /// dtype of query and out: -1 (the default) = kv.dtype, the only choice for an fp32/fp16/bf16 pool (-1 or kv.dtype;
  /// another value is KVPAGER_STATUS_UNSUPPORTED_DTYPE, before any other check). fp8 is a dtype value, not a family:
  /// an fp8 pool (kv.dtype = KVPAGER_DTYPE_FP8_E4M3) runs with fp32, fp16 or bf16 here (another value:
  /// UNSUPPORTED_DTYPE after the geometry, as kvpager_cpu_paged_attention_decode_fp8 answers it); with -1 or fp8 it is
  /// answered as the plain decode answers dtype 3 (UNSUPPORTED_DTYPE in the geometry's order).
  std::int32_t q_dtype = -1;
  /// fp8 pools only (ignored otherwise): K = e4m3 x k_scale, V = e4m3 x v_scale (per tensor; finite and > 0, else
  /// invalid_argument), as kvpager_cpu_kv_append_fp8 stored them. Window and soft cap work over an fp8 pool too
  /// (the CPU backend; the C ABI's fp8 decode has neither argument).
  float k_scale = 1.0F, v_scale = 1.0F;
};

/// The most KV splits plan_decode chooses (so the most a decode with num_splits = 0 uses).
inline constexpr std::int32_t max_planned_splits = 64;

/// Host-side split choice: enough (sequence, KV head, split) work items to keep `threads` busy, chunks of at least
/// 256 tokens, at most max_planned_splits. max_seq_len: the most tokens a sequence of the batch reads (with a window,
/// at most window_left + 1). The CPU decode, whose work items cover all the KV heads of a sequence when it can (they
/// then read whole blocks), plans with num_kv_heads = 1 and splits the heads into ranges only when that leaves
/// threads idle; the CUDA decode plans one CTA per KV head.
[[nodiscard]] KVPAGER_KERNELS_EXPORT std::int32_t plan_decode(std::int32_t num_seqs, std::int32_t num_kv_heads,
                                                              std::int32_t max_seq_len, std::int32_t threads) noexcept;

/// Bytes of workspace paged_attention_decode_cpu needs for `p`: num_seqs x num_q_heads x splits x (head_dim + 2) x 4
/// for p.num_splits > 1, 0 for p.num_splits = 1, and for p.num_splits = 0 (chosen per call) the size for
/// max_planned_splits, which covers any choice. Reads only the scalar fields of `p` (not the page tables), so a
/// workspace sized once for the largest batch serves every step. -1 for fields out of range or a size beyond int64.
[[nodiscard]] KVPAGER_KERNELS_EXPORT std::int64_t decode_workspace_size(const decode_params& p) noexcept;

/// Runs decode attention. One check (kernels/cpu/params_checks.hpp) validates everything before reading KV or writing
/// out, in this order: the C decode functions' order for the fields they share (the query dtype, num_seqs, scale, an
/// fp8 pool's scales, heads, the geometry, the query size and split workspace within int64, window and cap), then
/// num_threads, the view's extent, the pointers and page-table pointers, num_splits, workspace_bytes and the
/// workspace's alignment, then every sequence's length and block ids; on error nothing is written. The C functions
/// fill a decode_params and call this (one validation per call). Returns kernel_status(code) of the C ABI's code for the same input (for example
/// errc::invalid_block with detail() KVPAGER_STATUS_INVALID_BLOCK).
[[nodiscard]] KVPAGER_KERNELS_EXPORT status paged_attention_decode_cpu(const decode_params& p) noexcept;

KVPAGER_NAMESPACE_END
