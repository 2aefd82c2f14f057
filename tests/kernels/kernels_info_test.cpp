// SPDX-License-Identifier: Apache-2.0
// The kernel library loads, identifies itself, and reports "no GPU" as a status rather than failing.
#include <kvpager/c/kernels.h>
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

TEST(KernelsLibrary, VersionMatchesHeaders) { EXPECT_EQ(kvpager_version(), KVPAGER_VERSION); }

TEST(KernelsLibrary, CudaBuildFlagMatchesConfiguration) {
  EXPECT_EQ(kvpager_built_with_cuda(), KVPAGER_TEST_HAS_CUDA ? 1 : 0);
}

TEST(KernelsLibrary, DeviceCountRejectsNull) {
  EXPECT_EQ(kvpager_cuda_device_count(nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
}

TEST(KernelsLibrary, DeviceCountIsAStatusNeverACrash) {
  int32_t n = -1;
  const int32_t st = kvpager_cuda_device_count(&n);
  if (st == KVPAGER_STATUS_OK) {
    EXPECT_GT(n, 0);
  } else {
    EXPECT_EQ(st, KVPAGER_STATUS_NO_DEVICE);
    EXPECT_EQ(n, 0);
  }
}

TEST(CpuPath, IsReportedAndHonoursTheCap) {
  const std::string path = kvpager_cpu_decode_path();
  std::printf("[   INFO   ] CPU decode path: %s\n", path.c_str());
  EXPECT_TRUE(path == "avx512bf16" || path == "avx512" || path == "avx2" || path == "portable") << path;
  const char* env = std::getenv("KVPAGER_CPU_DISPATCH");
  const std::string cap = env != nullptr ? env : "";
  if (cap == "portable") {
    EXPECT_EQ(path, "portable");
  } else if (cap == "avx2") {
    EXPECT_TRUE(path == "avx2" || path == "portable") << path;
  } else if (cap == "avx512") {
    EXPECT_NE(path, "avx512bf16");
  }
}

TEST(KernelsGpu, DeviceIsUsable) {
  int32_t n = 0;
  if (kvpager_cuda_device_count(&n) != KVPAGER_STATUS_OK)
    GTEST_SKIP() << "no CUDA device (or no CUDA build): GPU tests skipped";
  EXPECT_GE(n, 1);
}
