// CUDA device discovery. Any runtime error (no driver, no device, driver too old) reads as "no GPU".
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"

namespace kvpager::cuda_detail {

int32_t device_count(int32_t* count) noexcept {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    *count = 0;
    return KVPAGER_STATUS_NO_DEVICE;
  }
  *count = static_cast<int32_t>(n);
  return KVPAGER_STATUS_OK;
}

int32_t sm_count(int32_t device, int32_t* count) noexcept {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    return KVPAGER_STATUS_NO_DEVICE;
  }
  *count = static_cast<int32_t>(n);
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager::cuda_detail
