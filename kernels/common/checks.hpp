#pragma once
// Argument checks shared by the CPU and CUDA entry points of the C ABI, so both reject the same inputs with the
// same status codes (documented in include/kvpager/c/kernels.h).
#include <cstdint>

#include "kvpager/c/kernels.h"

namespace kvpager_kernels {

inline bool supported_head_dim(int32_t d) { return d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 256; }
inline bool supported_block_size(int32_t b) { return b == 8 || b == 16 || b == 32; }
inline bool valid_dtype(int32_t dtype) {
  return dtype == KVPAGER_DTYPE_FP32 || dtype == KVPAGER_DTYPE_FP16 || dtype == KVPAGER_DTYPE_BF16;
}

/// Head counts, head dim, dtype, block size: the shape checks of every decode entry point, in this order.
inline int32_t check_decode_shape(int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                  int32_t dtype) {
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return KVPAGER_STATUS_BAD_HEADS;
  if (!supported_head_dim(head_dim)) return KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM;
  if (!valid_dtype(dtype)) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (!supported_block_size(block_size)) return KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE;
  return KVPAGER_STATUS_OK;
}

/// The most KV splits a decode call takes (CPU and CUDA).
constexpr int32_t max_decode_splits = 256;

/// Workspace of a split decode: an fp32 state (m, l, acc[head_dim]) per (sequence, query head, split); none
/// without splits. -1 for arguments out of range.
inline int64_t decode_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits) {
  if (num_seqs < 0 || num_q_heads < 0 || head_dim < 0 || num_splits < 1 || num_splits > max_decode_splits) return -1;
  if (num_splits == 1) return 0;
  return int64_t{num_seqs} * num_q_heads * num_splits * (int64_t{head_dim} + 2) * 4;
}

/// swap_blocks arguments: pairs is [num_pairs, 2] (src block, dst block), every id inside its pool. Host memory.
inline int32_t check_swap(const void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                          const int64_t* pairs, int32_t num_pairs) {
  if (num_pairs < 0 || block_bytes <= 0 || dst_blocks <= 0 || src_blocks <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_pairs > 0 && (dst == nullptr || src == nullptr || pairs == nullptr)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t i = 0; i < num_pairs; ++i)
    if (pairs[2 * i] < 0 || pairs[2 * i] >= src_blocks || pairs[2 * i + 1] < 0 || pairs[2 * i + 1] >= dst_blocks)
      return KVPAGER_STATUS_INVALID_BLOCK;
  return KVPAGER_STATUS_OK;
}

/// Calls copy(src_block, dst_block, count) once per run of consecutive pairs whose sources and destinations both
/// ascend by one; stops at (and returns) the first non-OK status copy returns.
template <class Copy>
int32_t for_each_run(const int64_t* pairs, int32_t num_pairs, Copy copy) {
  for (int32_t i = 0; i < num_pairs;) {
    int32_t j = i + 1;
    while (j < num_pairs && pairs[2 * j] == pairs[2 * (j - 1)] + 1 && pairs[2 * j + 1] == pairs[2 * (j - 1) + 1] + 1) ++j;
    if (const int32_t rc = copy(pairs[2 * i], pairs[2 * i + 1], int64_t{j - i}); rc != KVPAGER_STATUS_OK) return rc;
    i = j;
  }
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager_kernels
