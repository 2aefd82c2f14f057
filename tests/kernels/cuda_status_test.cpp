// SPDX-License-Identifier: Apache-2.0
// How a CUDA runtime error becomes a status (kernels/cuda/cuda_status.hpp, used by every CUDA entry point and by
// cuda_executor): a launch or runtime failure on a present device is KVPAGER_STATUS_DEVICE_ERROR, hence
// errc::device_error, and only "there is no device to run on" is KVPAGER_STATUS_NO_DEVICE. Needs only the CUDA headers.
#include <kvpager/kernels/kernel_status.hpp>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_status.hpp"

TEST(CudaStatus, LaunchAndRuntimeErrorsAreDeviceErrors) {
  using kvpager::kernels::detail::cuda_status;
  for (const cudaError_t e : {cudaErrorLaunchFailure, cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources,
                              cudaErrorMemoryAllocation, cudaErrorIllegalAddress, cudaErrorInvalidValue,
                              cudaErrorInvalidDeviceFunction, cudaErrorNoKernelImageForDevice, cudaErrorLaunchTimeout,
                              cudaErrorECCUncorrectable, cudaErrorUnknown}) {
    EXPECT_EQ(cuda_status(e), KVPAGER_STATUS_DEVICE_ERROR) << static_cast<int>(e);
    EXPECT_EQ(kvpager::kernel_status(cuda_status(e)).code(), kvpager::errc::device_error) << static_cast<int>(e);
  }
}

TEST(CudaStatus, NoDeviceOnlyWhenThereIsNoDevice) {
  using kvpager::kernels::detail::cuda_status;
  EXPECT_EQ(cuda_status(cudaSuccess), KVPAGER_STATUS_OK);
  for (const cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorStubLibrary,
                              cudaErrorDevicesUnavailable, cudaErrorCallRequiresNewerDriver})
    EXPECT_EQ(cuda_status(e), KVPAGER_STATUS_NO_DEVICE) << static_cast<int>(e);
}
