// SPDX-License-Identifier: Apache-2.0
// The CUDA half of the C ABI and of cuda_executor in a build without CUDA (CMake compiles this file instead of
// kernels/cuda/): every entry point exists and answers KVPAGER_STATUS_NO_DEVICE (cuda_executor: errc::unsupported),
// after the same argument checks as the CUDA build where those need no device.
#include <cstdint>
#include <memory>
#include <span>

#include "kvpager/c/kernels.h"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/kernels/cuda_executor.hpp"
#include "kernels/common/checks.hpp"

extern "C" {

int32_t kvpager_built_with_cuda(void) { return 0; }

int32_t kvpager_cuda_device_count(int32_t* count) {
  if (count == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *count = 0;
  return KVPAGER_STATUS_NO_DEVICE;
}

int32_t kvpager_cuda_plan_decode(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len, int32_t device,
                                 int32_t* num_splits) {
  if (const int32_t rc = kvpager::kernels::detail::check_plan_args(num_seqs, num_kv_heads, max_seq_len, device, num_splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  return KVPAGER_STATUS_NO_DEVICE;
}

int32_t kvpager_cuda_plan_prefill(int32_t total_q_rows, int32_t num_q_heads, int32_t num_kv_heads, int32_t device,
                                  int32_t* num_ctas) {
  if (const int32_t rc =
          kvpager::kernels::detail::check_prefill_plan_args(total_q_rows, num_q_heads, num_kv_heads, device, num_ctas);
      rc != KVPAGER_STATUS_OK)
    return rc;
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_prefill(void*, float*, const void*, const void*, const int32_t*,
                                             const int32_t*, const int32_t*, int32_t, int32_t, int32_t, int32_t,
                                             int32_t, int32_t, int32_t, float, int32_t, float, int32_t, int32_t, void*,
                                             int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_prefill_fp8(void*, float*, const void*, const void*, const int32_t*,
                                                 const int32_t*, const int32_t*, int32_t, int32_t, int32_t, int32_t,
                                                 int32_t, int32_t, int32_t, float, int32_t, float, int32_t, float,
                                                 float, int32_t, void*, int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode(void*, const void*, const void*, const int32_t*, const int32_t*, int32_t,
                                            int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, float, int32_t,
                                            int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode_split(void*, float*, const void*, const void*, const int32_t*,
                                                  const int32_t*, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
                                                  int32_t, float, int32_t, int32_t, void*, int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode_split_ex(void*, float*, const void*, const void*, const int32_t*,
                                                     const int32_t*, int32_t, int32_t, int32_t, int32_t, int32_t,
                                                     int32_t, int32_t, float, int32_t, float, int32_t, int32_t, void*,
                                                     int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_kv_append(void*, const void*, const void*, const int64_t*, int32_t, int32_t, int32_t, int32_t,
                               int32_t, int32_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_kv_append_fp8(void*, const void*, const void*, const int64_t*, int32_t, int32_t, int32_t, int32_t,
                                   int32_t, int32_t, float, float, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode_fp8(void*, const void*, const void*, const int32_t*, const int32_t*, int32_t,
                                                int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, float, int32_t,
                                                float, float, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode_fp8_split(void*, float*, const void*, const void*, const int32_t*,
                                                      const int32_t*, int32_t, int32_t, int32_t, int32_t, int32_t,
                                                      int32_t, int32_t, float, int32_t, float, float, int32_t, void*,
                                                      int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_paged_attention_decode_fp8_split_ex(void*, float*, const void*, const void*, const int32_t*,
                                                         const int32_t*, int32_t, int32_t, int32_t, int32_t, int32_t,
                                                         int32_t, int32_t, float, int32_t, float, int32_t, float, float,
                                                         int32_t, void*, int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_copy_blocks(void* const*, int32_t, const int64_t*, int32_t, int32_t, int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_swap_blocks(void*, int32_t, const void*, int32_t, int64_t, const int64_t*, int32_t, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}

}  // extern "C"

KVPAGER_NAMESPACE_BEGIN

result<std::unique_ptr<cuda_executor>> cuda_executor::create(const cuda_executor_config& /*cfg*/) {
  return status{errc::unsupported, "cuda_executor: this kvpager was built without CUDA"};
}
cuda_executor::~cuda_executor() = default;
status cuda_executor::execute(const step_plan& /*plan*/, std::span<const std::int64_t> /*slots*/, const void* /*k*/,
                              const void* /*v*/) {
  return status{errc::unsupported, "cuda_executor: this kvpager was built without CUDA"};
}

KVPAGER_NAMESPACE_END
