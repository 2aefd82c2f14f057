// SPDX-License-Identifier: Apache-2.0
// Library identity, status texts, the geometry check and workspace arithmetic of the C ABI
// (include/kvpager/c/kernels.h): host code with no CUDA dependency. What depends on CUDA being built in
// (kvpager_built_with_cuda, device discovery, the split plan) is in kernels/cuda/device_info.cpp or, without CUDA, in
// kernels/no_cuda/cuda_stubs.cpp; CMake picks one.
#include "kvpager/c/kernels.h"

#include "kvpager/core/config.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kernels/common/checks.hpp"

extern "C" {

int32_t kvpager_version(void) { return KVPAGER_VERSION; }

const char* kvpager_status_string(int32_t status) { return kvpager::kernel_status_string(status); }

int32_t kvpager_can_implement(int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                              int32_t dtype) {
  // Every KV dtype the kernels store, fp8 E4M3 included (run by the _fp8 functions).
  return kvpager::kernels::detail::check_pool_geometry(num_kv_heads, head_dim, block_size, dtype, num_blocks,
                                                       kvpager::kernels::detail::valid_kv_dtype(dtype));
}

int32_t kvpager_cuda_decode_workspace_size(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits,
                                           int64_t* bytes) {
  if (bytes == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const int64_t need = kvpager::kernels::detail::decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits);
  if (need < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *bytes = need;
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cuda_prefill_workspace_size(int32_t num_seqs, int64_t* bytes) {
  if (bytes == nullptr || num_seqs < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *bytes = kvpager::kernels::detail::prefill_workspace_bytes(num_seqs);
  return KVPAGER_STATUS_OK;
}

}  // extern "C"
