// SPDX-License-Identifier: Apache-2.0
// One error vocabulary at the kernel boundary: every KVPAGER_STATUS_* code has a text (kvpager_status_string, never
// null), the mapping to kvpager::status (kernel_status) is total, and the C++ kernel wrappers return the mapped
// status of the code the C call returns for the same bad input.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/cuda_executor.hpp>
#include <kvpager/kernels/kernel_status.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

using namespace kvpager;

namespace {

constexpr std::int32_t kLastCode = KVPAGER_STATUS_DEVICE_ERROR;
const std::vector<std::int32_t> kUnknownCodes = {-1, kLastCode + 1, 100, std::numeric_limits<std::int32_t>::max(),
                                                 std::numeric_limits<std::int32_t>::min()};

}  // namespace

TEST(KernelStatus, DeviceErrorIsTheNextFreeCode) {
  EXPECT_EQ(KVPAGER_STATUS_DEVICE_ERROR, KVPAGER_STATUS_OUT_OF_MEMORY + 1);
  EXPECT_STREQ(to_string(errc::device_error), "device_error");
}

TEST(KernelStatus, EveryCodeHasItsOwnString) {
  std::set<std::string> seen;
  for (std::int32_t c = KVPAGER_STATUS_OK; c <= kLastCode; ++c) {
    const char* s = kvpager_status_string(c);
    ASSERT_NE(s, nullptr) << c;
    EXPECT_EQ(std::string(s).rfind("KVPAGER_STATUS_", 0), 0U) << c << ": " << s;
    EXPECT_TRUE(seen.insert(s).second) << "two codes share the text " << s;
  }
  EXPECT_NE(std::string(kvpager_status_string(KVPAGER_STATUS_DEVICE_ERROR)).find("DEVICE_ERROR"), std::string::npos);
}

TEST(KernelStatus, UnknownCodesGetOneFixedString) {
  for (const std::int32_t c : kUnknownCodes) {
    const char* s = kvpager_status_string(c);
    ASSERT_NE(s, nullptr) << c;
    EXPECT_STREQ(s, "unknown kvpager status code") << c;
  }
}

TEST(KernelStatus, MappingIsTotalAndKeepsTheCode) {
  std::vector<std::int32_t> codes = kUnknownCodes;
  for (std::int32_t c = KVPAGER_STATUS_OK; c <= kLastCode; ++c) codes.push_back(c);
  for (const std::int32_t c : codes) {
    const status s = kernel_status(c);
    EXPECT_EQ(s.ok(), c == KVPAGER_STATUS_OK) << c;
    if (c == KVPAGER_STATUS_OK) continue;
    EXPECT_EQ(s.code(), kernel_errc(c)) << c;
    EXPECT_NE(s.code(), errc::ok) << c;
    EXPECT_EQ(s.detail(), c);
    EXPECT_STREQ(s.message(), kvpager_status_string(c)) << c;
  }
}

TEST(KernelStatus, EachCodeMapsToItsErrc) {
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_OK), errc::ok);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_INVALID_ARGUMENT), errc::invalid_argument);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_NO_DEVICE), errc::unsupported);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_INVALID_BLOCK), errc::invalid_block);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_SEQ_TOO_LONG), errc::invalid_argument);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_BAD_HEADS), errc::invalid_argument);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM), errc::unsupported);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_UNSUPPORTED_DTYPE), errc::unsupported);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE), errc::unsupported);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_OUT_OF_MEMORY), errc::out_of_memory);
  EXPECT_EQ(kernel_errc(KVPAGER_STATUS_DEVICE_ERROR), errc::device_error) << "a device fault is never 'unsupported'";
  for (const std::int32_t c : kUnknownCodes) EXPECT_EQ(kernel_errc(c), errc::invalid_argument) << c;
}

// The C++ decode returns kernel_status of exactly the code the C function returns for the same input, and writes
// nothing on error.
TEST(KernelStatus, CxxDecodeReturnsTheMappedStatusForBadInput) {
  constexpr std::int32_t hq = 4, hkv = 2, d = 64, bs = 16, nb = 4, maxb = 2;
  std::vector<float> kv(static_cast<std::size_t>(nb) * 2 * hkv * bs * d, 0.5F), q(2 * hq * d, 1.0F);
  std::vector<std::int32_t> table = {0, 1, 2, 3}, lens = {20, 17};
  struct bad_case {
    const char* what;
    std::int32_t hq, hkv, d, bs, dtype, table0, len0;
  };
  const bad_case cases[] = {
      {"q heads not a multiple", 3, hkv, d, bs, KVPAGER_DTYPE_FP32, 0, 20},
      {"zero kv heads", hq, 0, d, bs, KVPAGER_DTYPE_FP32, 0, 20},
      {"head dim 48", hq, hkv, 48, bs, KVPAGER_DTYPE_FP32, 0, 20},
      {"dtype 7", hq, hkv, d, bs, 7, 0, 20},
      {"block size 64", hq, hkv, d, 64, KVPAGER_DTYPE_FP32, 0, 20},
      {"block id past the pool", hq, hkv, d, bs, KVPAGER_DTYPE_FP32, nb, 20},
      {"sequence longer than its row", hq, hkv, d, bs, KVPAGER_DTYPE_FP32, 0, maxb * bs + 1},
      {"negative length", hq, hkv, d, bs, KVPAGER_DTYPE_FP32, 0, -1},
  };
  for (const bad_case& c : cases) {
    table[0] = c.table0;
    lens[0] = c.len0;
    std::vector<float> out(q.size(), -7.0F);
    const std::int32_t rc = kvpager_cpu_paged_attention_decode(out.data(), q.data(), kv.data(), table.data(), lens.data(),
                                                               2, c.hq, c.hkv, c.d, c.bs, maxb, nb, 0.1F, c.dtype, 1);
    ASSERT_NE(rc, KVPAGER_STATUS_OK) << c.what;
    decode_params p;
    p.out = out.data();
    p.query = q.data();
    p.kv = paged_kv_view::hnd(kv.data(), c.dtype, nb, c.hkv, c.bs, c.d);
    p.pages.block_table = table.data();
    p.pages.row_stride = maxb;
    p.pages.seq_lens = lens.data();
    p.num_seqs = 2;
    p.num_q_heads = c.hq;
    p.scale = 0.1F;
    p.num_threads = 1;
    const status s = paged_attention_decode_cpu(p);
    EXPECT_EQ(s.code(), kernel_errc(rc)) << c.what;
    EXPECT_EQ(s.detail(), rc) << c.what;
    EXPECT_STREQ(s.message(), kvpager_status_string(rc)) << c.what;
    for (const float x : out) ASSERT_EQ(x, -7.0F) << c.what << ": a rejected call wrote its output";
  }
}

// No device (or no CUDA build): the executor says "unsupported" through the same mapping (NO_DEVICE), not a device
// error; with a device this is covered by cuda_test.
TEST(KernelStatus, CudaExecutorWithoutADeviceIsUnsupported) {
  std::int32_t n = 0;
  if (kvpager_cuda_device_count(&n) == KVPAGER_STATUS_OK) GTEST_SKIP() << "a CUDA device is present";
  cuda_executor_config cfg;
  cfg.geometry = {16, 16, 2, 64, kv_dtype::f16};
  const auto e = cuda_executor::create(cfg);
  EXPECT_EQ(e.code(), errc::unsupported);
  EXPECT_NE(e.code(), errc::device_error);
}
