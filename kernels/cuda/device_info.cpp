// SPDX-License-Identifier: Apache-2.0
// CUDA device discovery and the host-side split plan of the C ABI (the no-CUDA build answers these in
// kernels/no_cuda/cuda_stubs.cpp). Any runtime error while looking for a device (no driver, no device, driver too
// old) reads as "no GPU": KVPAGER_STATUS_NO_DEVICE.
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kernels/common/checks.hpp"

namespace kvpager::kernels::detail {
namespace {

int32_t sm_count(int32_t device, int32_t* count) noexcept {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    return KVPAGER_STATUS_NO_DEVICE;
  }
  *count = static_cast<int32_t>(n);
  return KVPAGER_STATUS_OK;
}

}  // namespace
}  // namespace kvpager::kernels::detail

extern "C" {

int32_t kvpager_built_with_cuda(void) { return 1; }

int32_t kvpager_cuda_device_count(int32_t* count) {
  if (count == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  *count = 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return KVPAGER_STATUS_NO_DEVICE;
  }
  *count = static_cast<int32_t>(n);
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cuda_plan_decode(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len, int32_t device,
                                 int32_t* num_splits) {
  if (const int32_t rc = kvpager::kernels::detail::check_plan_args(num_seqs, num_kv_heads, max_seq_len, device, num_splits);
      rc != KVPAGER_STATUS_OK)
    return rc;
  int32_t sms = 0;
  if (const int32_t rc = kvpager::kernels::detail::sm_count(device, &sms); rc != KVPAGER_STATUS_OK) return rc;
  *num_splits = kvpager::plan_decode(num_seqs, num_kv_heads, max_seq_len, sms);
  return KVPAGER_STATUS_OK;
}

}  // extern "C"
