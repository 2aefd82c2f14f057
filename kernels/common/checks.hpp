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

}  // namespace kvpager_kernels
