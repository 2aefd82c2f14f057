// SPDX-License-Identifier: Apache-2.0
#pragma once
// Argument checks shared by the CPU and CUDA entry points of the C ABI, so both reject the same inputs with the
// same status codes (documented in include/kvpager/c/kernels.h). Host code only. The rules, for every entry point:
//  - one geometry check (check_pool_geometry) for every kernel that takes a KV pool's shape;
//  - every size in bytes (pool, query/output, key/value, workspace) is computed in 64 bits and must fit in int64:
//    a product that overflows is KVPAGER_STATUS_INVALID_ARGUMENT, never undefined behaviour;
//  - a pointer may be null only when nothing is read or written through it (its count is zero); a call with nothing
//    to do is OK, but ids it carries are still checked.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kvpager/c/kernels.h"
#include "kvpager/core/dtype.hpp"

namespace kvpager::kernels::detail {

inline bool supported_head_dim(int32_t d) { return d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 256; }
inline bool supported_block_size(int32_t b) { return b == 8 || b == 16 || b == 32; }
inline bool valid_dtype(int32_t dtype) {
  return dtype == KVPAGER_DTYPE_FP32 || dtype == KVPAGER_DTYPE_FP16 || dtype == KVPAGER_DTYPE_BF16;
}
/// A KV pool's dtype as kvpager_can_implement accepts it: a valid_dtype or fp8 E4M3 (run by the fp8 path, fp8_path).
inline bool valid_kv_dtype(int32_t dtype) { return valid_dtype(dtype) || dtype == KVPAGER_DTYPE_FP8_E4M3; }
/// Bytes of one element of a valid_kv_dtype: core's kvpager::elem_bytes (the C dtype codes are kv_dtype's values).
inline int64_t elem_bytes(int32_t dtype) { return kvpager::elem_bytes(static_cast<kvpager::kv_dtype>(dtype)); }
/// A per-tensor fp8 scale: finite and positive.
inline bool valid_fp8_scale(float s) { return std::isfinite(s) && s > 0.0F; }

/// The product of non-negative factors in int64, or -1 when a factor is negative or the product overflows int64.
inline int64_t checked_product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (const int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(r, f, &r)) return -1;
  return r;
}
/// a + b for non-negative a and b, or -1 when either is negative or the sum overflows int64.
inline int64_t checked_sum(int64_t a, int64_t b) {
  int64_t r = 0;
  return a < 0 || b < 0 || __builtin_add_overflow(a, b, &r) ? -1 : r;
}

/// The geometry of a KV pool, one check for every kernel that takes it (decode and kv_append, CPU and CUDA), in this
/// order: KV heads (positive, else BAD_HEADS), head dim, dtype, block size (the UNSUPPORTED_* codes), then
/// num_blocks (positive) and the pool's size in bytes, num_blocks x 2 x num_kv_heads x block_size x head_dim x
/// element bytes, which must fit in int64 (else INVALID_ARGUMENT).
/// `dtype_ok` says whether this call runs the pool's dtype: valid_dtype on the plain path, valid_kv_dtype for
/// kvpager_can_implement, true on the fp8 path (fp8_path).
inline int32_t check_pool_geometry(int32_t num_kv_heads, int32_t head_dim, int32_t block_size, int32_t dtype,
                                   int32_t num_blocks, bool dtype_ok) {
  if (num_kv_heads <= 0) return KVPAGER_STATUS_BAD_HEADS;
  if (!supported_head_dim(head_dim)) return KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM;
  if (!dtype_ok) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (!supported_block_size(block_size)) return KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE;
  if (num_blocks <= 0 || checked_product({num_blocks, 2, num_kv_heads, block_size, head_dim, elem_bytes(dtype)}) < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  return KVPAGER_STATUS_OK;
}

/// The most KV splits a decode call takes (CPU and CUDA).
constexpr int32_t max_decode_splits = 256;

/// kvpager_cuda_plan_decode's arguments (checked the same with and without CUDA): a non-null output, non-negative
/// counts, positive KV heads.
inline int32_t check_plan_args(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len, int32_t device,
                               const int32_t* num_splits) {
  return num_splits == nullptr || num_seqs < 0 || num_kv_heads <= 0 || max_seq_len < 0 || device < 0
             ? KVPAGER_STATUS_INVALID_ARGUMENT
             : KVPAGER_STATUS_OK;
}

/// Workspace of a split decode: an fp32 state (m, l, acc[head_dim]) per (sequence, query head, split); none
/// without splits. -1 for arguments out of range or a size that overflows int64.
inline int64_t decode_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits) {
  if (num_seqs < 0 || num_q_heads < 0 || head_dim < 0 || num_splits < 1 || num_splits > max_decode_splits) return -1;
  if (num_splits == 1) return 0;
  return checked_product({num_seqs, num_q_heads, num_splits, int64_t{head_dim} + 2, 4});
}

/// Whether an attention or append call over a pool of `kv_dtype` runs the fp8 path: an fp8 E4M3 pool with an
/// io_dtype (query and output of attention, key and value of an append) that is not the pool's own (-1 or fp8). -1 is
/// the pool's dtype on every path; on the plain path fp8 is not a dtype (UNSUPPORTED_DTYPE in the geometry's order).
/// The plain C functions pass their `dtype` as both.
inline bool fp8_path(int32_t kv_dtype, int32_t io_dtype) {
  return kv_dtype == KVPAGER_DTYPE_FP8_E4M3 && io_dtype != KVPAGER_DTYPE_FP8_E4M3 && io_dtype != -1;
}
/// An io_dtype that no path runs: the _fp8 C functions pass it for a q_dtype or src_dtype of -1 or fp8, which is not
/// a query or source dtype there, so that the call stays on the fp8 path and is answered in its order
/// (UNSUPPORTED_DTYPE after the geometry).
inline constexpr int32_t no_io_dtype = -2;
/// The io_dtype an _fp8 C function passes for its q_dtype or src_dtype argument.
inline int32_t fp8_entry_io_dtype(int32_t io_dtype) {
  return io_dtype == KVPAGER_DTYPE_FP8_E4M3 || io_dtype == -1 ? no_io_dtype : io_dtype;
}

/// The scalar arguments of every decode and prefill entry point (CPU and CUDA, every pool dtype), checked before any
/// pointer is read. The plain path (fp8_path false): a query dtype other than -1 or the pool's first
/// (UNSUPPORTED_DTYPE), then num_seqs (non-negative) and scale (finite), else INVALID_ARGUMENT; query heads (a positive
/// multiple of the KV heads, else BAD_HEADS); the pool geometry (check_pool_geometry: an fp8 pool is UNSUPPORTED_DTYPE
/// here); then the query and output size, num_seqs x num_q_heads x head_dim x element bytes, and the split workspace
/// (num_splits from 1 to 256) within int64. The fp8 path: num_seqs, scale, and k_scale and v_scale finite and positive
/// (INVALID_ARGUMENT); query heads (BAD_HEADS); the fp8 pool's geometry; q_dtype fp32/fp16/bf16 (else
/// UNSUPPORTED_DTYPE); the sizes, counted in q_dtype (INVALID_ARGUMENT).
inline int32_t check_decode_args(int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                 int32_t block_size, int32_t kv_dtype, int32_t q_dtype, int32_t num_blocks, float scale,
                                 float k_scale, float v_scale, int32_t num_splits) {
  const bool fp8 = fp8_path(kv_dtype, q_dtype);
  if (!fp8 && q_dtype != -1 && q_dtype != kv_dtype) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (num_seqs < 0 || !std::isfinite(scale) || (fp8 && (!valid_fp8_scale(k_scale) || !valid_fp8_scale(v_scale))))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return KVPAGER_STATUS_BAD_HEADS;
  if (const int32_t rc = check_pool_geometry(num_kv_heads, head_dim, block_size, kv_dtype, num_blocks,
                                             fp8 || valid_dtype(kv_dtype));
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (fp8 && !valid_dtype(q_dtype)) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  const int32_t io_dtype = fp8 ? q_dtype : kv_dtype;
  if (checked_product({num_seqs, num_q_heads, head_dim, elem_bytes(io_dtype)}) < 0 ||
      decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits) < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  return KVPAGER_STATUS_OK;
}

/// The attention variants of a decode (and prefill) call: window_left is -1 (no window) or a non-negative count of
/// positions before the query's own; logits_soft_cap is 0 (none) or a positive finite cap. Anything else (a window
/// below -1, a negative, NaN or infinite cap) is INVALID_ARGUMENT.
inline int32_t check_window_and_cap(int32_t window_left, float logits_soft_cap) {
  return window_left < -1 || !std::isfinite(logits_soft_cap) || logits_soft_cap < 0.0F ? KVPAGER_STATUS_INVALID_ARGUMENT
                                                                                        : KVPAGER_STATUS_OK;
}

/// Every argument of the dense C ABI decode entry points (the CUDA ones; the CPU's forward to the C++ operation) that
/// can be checked without reading a page table: max_blocks_per_seq positive (else INVALID_ARGUMENT), then
/// check_decode_args, then the pointers, which may be null only when num_seqs is 0. The CUDA kernels check every
/// sequence length and block id on the device.
inline int32_t check_dense_decode(const void* out, const void* query, const void* kv_cache, const int32_t* block_table,
                                  const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                  int32_t head_dim, int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                  float scale, int32_t kv_dtype, int32_t q_dtype, float k_scale, float v_scale,
                                  int32_t num_splits) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_decode_args(num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, kv_dtype, q_dtype,
                                           num_blocks, scale, k_scale, v_scale, num_splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs > 0 &&
      (out == nullptr || query == nullptr || kv_cache == nullptr || block_table == nullptr || seq_lens == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  return KVPAGER_STATUS_OK;
}

/// Blocks a sequence of `len` tokens occupies, in 64 bits (no overflow near INT32_MAX).
inline int64_t blocks_for(int32_t len, int32_t block_size) { return (int64_t{len} + block_size - 1) / block_size; }

/// A dense page table row: SEQ_TOO_LONG for a negative length or one needing more than max_blocks_per_seq blocks.
inline int32_t check_seq_len(int32_t len, int32_t block_size, int64_t max_blocks_per_seq) {
  return len < 0 || blocks_for(len, block_size) > max_blocks_per_seq ? KVPAGER_STATUS_SEQ_TOO_LONG : KVPAGER_STATUS_OK;
}

/// Every argument of the dense C ABI prefill entry points (CUDA; the CPU's forward to the C++ operation) that can be
/// checked without reading a page table, in this order: max_blocks_per_seq positive, check_decode_args (the query
/// dtype, num_seqs, scale, an fp8 pool's scales, heads, geometry, q_dtype, the query size), check_window_and_cap, then
/// the pointers, which may be null only when num_seqs is 0 (qo_indptr too). The rows come after this (the CUDA prepare
/// kernel checks them on the device).
inline int32_t check_dense_prefill(const void* out, const void* query, const void* kv_cache, const int32_t* qo_indptr,
                                   const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                   int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                   int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left,
                                   float logits_soft_cap, int32_t kv_dtype, int32_t q_dtype, float k_scale,
                                   float v_scale) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_decode_args(num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, kv_dtype, q_dtype,
                                           num_blocks, scale, k_scale, v_scale, 1);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const int32_t rc = check_window_and_cap(window_left, logits_soft_cap); rc != KVPAGER_STATUS_OK) return rc;
  if (num_seqs > 0)
    for (const void* ptr : {out, query, kv_cache, static_cast<const void*>(qo_indptr),
                            static_cast<const void*>(block_table), static_cast<const void*>(seq_lens)})
      if (ptr == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  return KVPAGER_STATUS_OK;
}

/// A prefill's query row offsets (host memory): qo_indptr[0] = 0 and never decreasing (else INVALID_ARGUMENT), and
/// the query and output size, rows x num_q_heads x head_dim x element bytes, within int64. The row count goes to
/// *rows. A null qo_indptr is accepted only with num_seqs = 0 (rows = 0).
inline int32_t check_qo_indptr(const int32_t* qo_indptr, int32_t num_seqs, int32_t num_q_heads, int32_t head_dim,
                               int32_t dtype, int64_t* rows) {
  *rows = 0;
  if (qo_indptr == nullptr) return num_seqs == 0 ? KVPAGER_STATUS_OK : KVPAGER_STATUS_INVALID_ARGUMENT;
  if (qo_indptr[0] != 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t s = 0; s < num_seqs; ++s)
    if (qo_indptr[s + 1] < qo_indptr[s]) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *rows = qo_indptr[num_seqs];
  return checked_product({*rows, num_q_heads, head_dim, elem_bytes(dtype)}) < 0 ? KVPAGER_STATUS_INVALID_ARGUMENT
                                                                                 : KVPAGER_STATUS_OK;
}

/// Every row check of a prefill on the host (the CPU entry point; the CUDA prepare kernel makes the same checks on the
/// device), in this order: check_qo_indptr (qo_indptr[0] = 0, never decreasing, the query size), then per sequence
/// its length (check_seq_len: SEQ_TOO_LONG) and q_len = qo_indptr[s + 1] - qo_indptr[s] <= seq_lens[s] (else
/// INVALID_ARGUMENT). The row count goes to *rows. Block ids come after this.
inline int32_t check_prefill_rows(const int32_t* qo_indptr, const int32_t* seq_lens, int32_t num_seqs,
                                  int32_t num_q_heads, int32_t head_dim, int32_t block_size,
                                  int32_t max_blocks_per_seq, int32_t dtype, int64_t* rows) {
  if (const int32_t rc = check_qo_indptr(qo_indptr, num_seqs, num_q_heads, head_dim, dtype, rows); rc != KVPAGER_STATUS_OK)
    return rc;
  for (int32_t s = 0; s < num_seqs; ++s) {
    if (const int32_t rc = check_seq_len(seq_lens[s], block_size, max_blocks_per_seq); rc != KVPAGER_STATUS_OK) return rc;
    if (int64_t{qo_indptr[s + 1]} - qo_indptr[s] > seq_lens[s]) return KVPAGER_STATUS_INVALID_ARGUMENT;
  }
  return KVPAGER_STATUS_OK;
}

/// Device workspace of a CUDA prefill: the tile offsets, int64 [num_seqs + 1]; -1 for a negative count.
inline int64_t prefill_workspace_bytes(int32_t num_seqs) {
  return num_seqs < 0 ? -1 : (int64_t{num_seqs} + 1) * 8;
}

/// kvpager_cuda_plan_prefill's arguments (checked the same with and without CUDA): a non-null output, non-negative
/// total_q_rows and device, query heads a positive multiple of positive KV heads.
inline int32_t check_prefill_plan_args(int32_t total_q_rows, int32_t num_q_heads, int32_t num_kv_heads, int32_t device,
                                       const int32_t* num_ctas) {
  if (num_ctas == nullptr || total_q_rows < 0 || device < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return KVPAGER_STATUS_BAD_HEADS;
  return KVPAGER_STATUS_OK;
}

/// CTAs of a CUDA prefill grid: one per tile of 64 (query token, query head) rows, total_q_rows x num_q_heads / 64
/// rounded up (sequence ends add a few more, walked by the same CTAs), at least 1 and at most 64 per SM.
inline int32_t plan_prefill_ctas(int32_t total_q_rows, int32_t num_q_heads, int32_t sms) {
  const int64_t tiles = (int64_t{total_q_rows} * num_q_heads + 63) / 64, cap = int64_t{sms} * 64;
  return static_cast<int32_t>(tiles < 1 ? 1 : tiles > cap ? cap : tiles);
}

/// kv_append arguments (CPU and CUDA, every pool dtype), src_dtype the key/value dtype (-1: the pool's). The plain path
/// (fp8_path false): num_tokens non-negative, the pool geometry (check_pool_geometry), the key and value size num_tokens
/// x num_kv_heads x head_dim x element bytes within int64, every pointer non-null unless num_tokens is 0
/// (INVALID_ARGUMENT), then a src_dtype other than -1 or the pool's (UNSUPPORTED_DTYPE). The fp8 path: num_tokens
/// non-negative and both scales finite and positive (INVALID_ARGUMENT); the fp8 pool's geometry; src_dtype
/// fp32/fp16/bf16 (else UNSUPPORTED_DTYPE); the key and value size in src_dtype within int64 and the pointers
/// (INVALID_ARGUMENT). Slots are checked by the kernels (the CPU before writing anything).
inline int32_t check_append(const void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                            int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                            int32_t num_blocks, int32_t kv_dtype, int32_t src_dtype, float k_scale, float v_scale) {
  const bool fp8 = fp8_path(kv_dtype, src_dtype);
  if (num_tokens < 0 || (fp8 && (!valid_fp8_scale(k_scale) || !valid_fp8_scale(v_scale))))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_pool_geometry(num_kv_heads, head_dim, block_size, kv_dtype, num_blocks,
                                             fp8 || valid_dtype(kv_dtype));
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (fp8 && !valid_dtype(src_dtype)) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (checked_product({num_tokens, num_kv_heads, head_dim, elem_bytes(fp8 ? src_dtype : kv_dtype)}) < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_tokens > 0 && (kv_cache == nullptr || key == nullptr || value == nullptr || slot_mapping == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (!fp8 && src_dtype != -1 && src_dtype != kv_dtype) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  return KVPAGER_STATUS_OK;
}

/// A pool of `blocks` blocks of `block_bytes` bytes: both positive and the size within int64.
inline bool valid_pool(int64_t blocks, int64_t block_bytes) {
  return blocks > 0 && block_bytes > 0 && checked_product({blocks, block_bytes}) >= 0;
}

/// Where a kernel's pointer arguments live: the CPU reads them on the host, so every id is checked before anything
/// is copied; the CUDA kernels read them in device memory and check ids there.
enum class memory { host, device };

/// copy_blocks arguments, one rule for CPU and CUDA: counts non-negative, the pool valid
/// (valid_pool), block_mapping non-null unless num_pairs is 0 and kv_caches non-null unless there is nothing to copy
/// (num_layers or num_pairs 0). With host memory, also every layer pointer (when there are pairs) and every id, in
/// [0, num_blocks) whatever the layer count; with device memory the kernel checks those.
inline int32_t check_copy(const void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                          int32_t num_pairs, int32_t num_blocks, int64_t block_bytes, memory where) {
  if (num_layers < 0 || num_pairs < 0 || !valid_pool(num_blocks, block_bytes))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_pairs > 0 && (block_mapping == nullptr || (num_layers > 0 && kv_caches == nullptr)))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (where == memory::device) return KVPAGER_STATUS_OK;
  for (int32_t l = 0; l < num_layers && num_pairs > 0; ++l)
    if (kv_caches[l] == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int64_t p = 0; p < 2 * int64_t{num_pairs}; ++p)
    if (block_mapping[p] < 0 || block_mapping[p] >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  return KVPAGER_STATUS_OK;
}

/// swap_blocks arguments: pairs is [num_pairs, 2] (src block, dst block), every id inside its pool, both pools valid
/// (valid_pool); dst, src and pairs may be null only when num_pairs is 0. Host memory.
inline int32_t check_swap(const void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                          const int64_t* pairs, int32_t num_pairs) {
  if (num_pairs < 0 || !valid_pool(dst_blocks, block_bytes) || !valid_pool(src_blocks, block_bytes))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_pairs > 0 && (dst == nullptr || src == nullptr || pairs == nullptr)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int64_t i = 0; i < num_pairs; ++i)
    if (pairs[2 * i] < 0 || pairs[2 * i] >= src_blocks || pairs[2 * i + 1] < 0 || pairs[2 * i + 1] >= dst_blocks)
      return KVPAGER_STATUS_INVALID_BLOCK;
  return KVPAGER_STATUS_OK;
}

/// Calls copy(src_block, dst_block, count) once per run of consecutive pairs whose sources and destinations both
/// ascend by one; stops at (and returns) the first non-OK status copy returns.
template <class Copy>
int32_t for_each_run(const int64_t* pairs, int32_t num_pairs, Copy copy) {
  for (int64_t i = 0; i < num_pairs;) {
    int64_t j = i + 1;
    while (j < num_pairs && pairs[2 * j] == pairs[2 * (j - 1)] + 1 && pairs[2 * j + 1] == pairs[2 * (j - 1) + 1] + 1) ++j;
    if (const int32_t rc = copy(pairs[2 * i], pairs[2 * i + 1], j - i); rc != KVPAGER_STATUS_OK) return rc;
    i = j;
  }
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager::kernels::detail
