// Library identity and CUDA availability for the C ABI (include/kvpager/c/kernels.h).
#include "kvpager/c/kernels.h"

#include "kvpager/kernels/cuda_executor.hpp"

#include "kvpager/core/config.hpp"

#include "kvpager/kernels/attention.hpp"

#include "../common/checks.hpp"

#if defined(KVPAGER_KERNELS_WITH_CUDA)
namespace kvpager::cuda_detail {
int32_t device_count(int32_t* count) noexcept;                // kernels/cuda/device_info.cu
int32_t sm_count(int32_t device, int32_t* count) noexcept;     // kernels/cuda/device_info.cu
}
#endif

extern "C" {

int32_t kvpager_version(void) { return KVPAGER_VERSION; }

int32_t kvpager_built_with_cuda(void) {
#if defined(KVPAGER_KERNELS_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

int32_t kvpager_cuda_device_count(int32_t* count) {
  if (count == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *count = 0;
#if defined(KVPAGER_KERNELS_WITH_CUDA)
  return kvpager::cuda_detail::device_count(count);
#else
  return KVPAGER_STATUS_NO_DEVICE;
#endif
}

int32_t kvpager_cuda_decode_workspace_size(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits,
                                           int64_t* bytes) {
  if (bytes == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const int64_t need = kvpager_kernels::decode_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits);
  if (need < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *bytes = need;
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cuda_plan_decode(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len, int32_t device,
                                 int32_t* num_splits) {
  if (num_splits == nullptr || num_seqs < 0 || num_kv_heads <= 0 || max_seq_len < 0 || device < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
#if defined(KVPAGER_KERNELS_WITH_CUDA)
  int32_t sms = 0;
  if (const int32_t rc = kvpager::cuda_detail::sm_count(device, &sms); rc != KVPAGER_STATUS_OK) return rc;
  *num_splits = kvpager::plan_decode(num_seqs, num_kv_heads, max_seq_len, sms);
  return KVPAGER_STATUS_OK;
#else
  return KVPAGER_STATUS_NO_DEVICE;
#endif
}

#if !defined(KVPAGER_KERNELS_WITH_CUDA)
// Built without CUDA: the CUDA entry points exist and say so.
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
int32_t kvpager_cuda_kv_append(void*, const void*, const void*, const int64_t*, int32_t, int32_t, int32_t, int32_t,
                               int32_t, int32_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_copy_blocks(void* const*, int32_t, const int64_t*, int32_t, int32_t, int64_t, int32_t*, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
int32_t kvpager_cuda_swap_blocks(void*, int32_t, const void*, int32_t, int64_t, const int64_t*, int32_t, void*) {
  return KVPAGER_STATUS_NO_DEVICE;
}
#endif

}  // extern "C"

#if !defined(KVPAGER_KERNELS_WITH_CUDA)
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
#endif
