// SPDX-License-Identifier: Apache-2.0
#pragma once
// How a CUDA runtime error becomes a KVPAGER_STATUS_* code, for every CUDA entry point and the executor: no device
// to run on (no driver, no device, a driver too old, a stub library) is KVPAGER_STATUS_NO_DEVICE; any other failure
// of a present device (a launch the runtime refuses, a faulting copy, an allocation) is KVPAGER_STATUS_DEVICE_ERROR.
// Host code only.
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"

namespace kvpager::kernels::detail {

inline int32_t cuda_status(cudaError_t err) noexcept {
  switch (err) {
    case cudaSuccess: return KVPAGER_STATUS_OK;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCallRequiresNewerDriver: return KVPAGER_STATUS_NO_DEVICE;
    default: return KVPAGER_STATUS_DEVICE_ERROR;
  }
}

/// The status of the launches just queued: cudaGetLastError (which also clears a non-sticky error).
inline int32_t launch_status() noexcept { return cuda_status(cudaGetLastError()); }

}  // namespace kvpager::kernels::detail
