// SPDX-License-Identifier: Apache-2.0
// CUDA kernels against the CPU backend on the same inputs. Skipped, with a message, where no GPU is present.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/step_executor.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvpager_testing/cuda_compare.hpp"
#include "kvpager_testing/cuda_prefill_compare.hpp"
#include "kvpager_testing/prefill_cpu_compare.hpp"

using namespace kvpager_gpu_check;

#define KVTEST_NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA kernel tests skipped (they run where a GPU is present)"

TEST(CudaDecodeAttention, MatchesCpuBackend) {
  KVTEST_NEED_GPU();
  uint32_t seed = 3;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256})
      for (int32_t bs : {8, 16, 32}) {
        const std::vector<int32_t> lens = {1, bs - 1, bs + 1, 97, 513, 4097, 0};
        const auto r = run_decode_case(dtype, d, bs, 8, 2, lens, 1, seed++);
        EXPECT_TRUE(r.calls_ok) << dtype << " " << d << " " << bs;
        EXPECT_LE(r.out, gpu_tolerance(dtype)) << dtype << " " << d << " " << bs;
      }
}

TEST(CudaDecodeAttention, SplitKvAndLseMatchCpuBackend) {
  KVTEST_NEED_GPU();
  // Query-head groups 1, 4, 7 (a full tile of 8 is not needed), 12 (tiles of 8 + 4) and MQA with 32 heads.
  const std::pair<int32_t, int32_t> heads[] = {{4, 4}, {8, 2}, {7, 1}, {24, 2}, {32, 1}};
  uint32_t seed = 11;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16})
    for (int32_t splits : {2, 3, 16})
      for (const auto& [hq, hkv] : heads) {
        const auto r = run_decode_case(dtype, 128, 16, hq, hkv, {1, 15, 17, 300, 2048, 4097, 0}, splits, seed++);
        EXPECT_TRUE(r.calls_ok) << dtype << " splits " << splits << " hq " << hq << " hkv " << hkv;
        EXPECT_LE(r.out, gpu_tolerance(dtype)) << dtype << " splits " << splits << " hq " << hq << " hkv " << hkv;
        EXPECT_LE(r.lse, 1e-5) << dtype << " splits " << splits << " hq " << hq << " hkv " << hkv;
      }
  int32_t planned = 0;
  ASSERT_EQ(kvpager_cuda_plan_decode(1, 8, 32768, 0, &planned), KVPAGER_STATUS_OK);
  EXPECT_GT(planned, 1) << "one long sequence must be split to fill the GPU";
  const auto r = run_decode_case(KVPAGER_DTYPE_FP16, 128, 16, 32, 8, {32768}, planned, 99);
  EXPECT_TRUE(r.calls_ok);
  EXPECT_LE(r.out, gpu_tolerance(KVPAGER_DTYPE_FP16));
}

TEST(CudaDecodeAttention, WindowAndSoftCapMatchCpuBackend) {
  KVTEST_NEED_GPU();
  struct variant {
    int32_t window;
    float cap;
    int32_t splits;
  };
  const variant variants[] = {{0, 0.0F, 1}, {37, 0.0F, 3}, {-1, 2.0F, 1}, {1000, 30.0F, 8}, {100, 1.0F, 2}};
  uint32_t seed = 500;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (const variant& v : variants) {
      const auto r = run_decode_case(dtype, 128, 16, 32, 8, {1, 17, 300, 4097, 0}, v.splits, seed++, v.window, v.cap);
      EXPECT_TRUE(r.calls_ok) << dtype << " window " << v.window << " cap " << v.cap;
      EXPECT_LE(r.out, gpu_tolerance(dtype)) << dtype << " window " << v.window << " cap " << v.cap;
      EXPECT_LE(r.lse, 1e-5) << dtype << " window " << v.window << " cap " << v.cap;
    }
}

// Decode over an fp8 E4M3 pool (the plain decode's device code over uint8_t rows) against the CPU fp8 backend on the
// same inputs, with and without a window and a soft cap, one split and several.
TEST(CudaDecodeAttention, Fp8PoolWithWindowAndSoftCapMatchesCpuBackend) {
  KVTEST_NEED_GPU();
  struct variant {
    int32_t window;
    float cap;
    int32_t splits;
  };
  const variant variants[] = {{-1, 0.0F, 1}, {-1, 0.0F, 4}, {0, 0.0F, 1}, {37, 0.0F, 3}, {-1, 2.0F, 1}, {100, 1.0F, 2}};
  uint32_t seed = 900;
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 128, 256})
      for (const variant& v : variants) {
        const auto r = run_fp8_decode_case(q_dtype, d, 16, 8, 2, {1, 17, 300, 2049, 0}, v.splits, seed++, v.window, v.cap);
        const auto what = ::testing::Message() << "q dtype " << q_dtype << " d " << d << " window " << v.window
                                               << " cap " << v.cap << " splits " << v.splits;
        EXPECT_TRUE(r.calls_ok) << what;
        EXPECT_LE(r.out, gpu_tolerance(q_dtype)) << what;
      }
}

// Host-side checks of the split entry point and the workspace query: no device needed.
TEST(CudaDecodeArguments, WorkspaceQueryAndHostChecks) {
  int64_t bytes = -1;
  ASSERT_EQ(kvpager_cuda_decode_workspace_size(4, 32, 128, 1, &bytes), KVPAGER_STATUS_OK);
  EXPECT_EQ(bytes, 0);
  ASSERT_EQ(kvpager_cuda_decode_workspace_size(4, 32, 128, 5, &bytes), KVPAGER_STATUS_OK);
  EXPECT_EQ(bytes, 4LL * 32 * 5 * 130 * 4);
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(4, 32, 128, 0, &bytes), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(4, 32, 128, 257, &bytes), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(4, 32, 128, 2, nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
  int32_t splits = -1;
  const int32_t plan = kvpager_cuda_plan_decode(2, 8, 4096, 0, &splits);
  if (have_gpu()) {
    EXPECT_EQ(plan, KVPAGER_STATUS_OK);
    EXPECT_GE(splits, 1);
  } else {
    EXPECT_EQ(plan, KVPAGER_STATUS_NO_DEVICE);
  }
  EXPECT_EQ(kvpager_cuda_plan_decode(2, 0, 4096, 0, &splits), KVPAGER_STATUS_INVALID_ARGUMENT);
  // Argument checks happen on the host before anything is launched, so they answer the same without a GPU (a build
  // without CUDA answers NO_DEVICE for everything).
  const int32_t expect_bad = kvpager_built_with_cuda() != 0 ? KVPAGER_STATUS_INVALID_ARGUMENT : KVPAGER_STATUS_NO_DEVICE;
  char dummy[16] = {};
  const int32_t table[1] = {0}, lens[1] = {1};
  auto call = [&](int32_t splits_arg, void* ws, int64_t ws_bytes) {
    return kvpager_cuda_paged_attention_decode_split(dummy, nullptr, dummy, dummy, table, lens, 2, 8, 2, 128, 16, 4, 8,
                                                     0.1F, KVPAGER_DTYPE_FP16, splits_arg, ws, ws_bytes, nullptr, nullptr);
  };
  EXPECT_EQ(call(0, nullptr, 0), expect_bad);                         // no splits
  EXPECT_EQ(call(4, nullptr, 0), expect_bad);                         // workspace missing
  EXPECT_EQ(call(4, dummy, 2LL * 8 * 4 * 130 * 4 - 1), expect_bad);   // one byte short
  EXPECT_EQ(kvpager_cuda_paged_attention_decode_split(dummy, nullptr, dummy, dummy, table, lens, 2, 8, 3, 128, 16, 4, 8, 0.1F,
                                                      KVPAGER_DTYPE_FP16, 1, nullptr, 0, nullptr, nullptr),
            kvpager_built_with_cuda() != 0 ? KVPAGER_STATUS_BAD_HEADS : KVPAGER_STATUS_NO_DEVICE);
  // The window and soft cap of the _ex entry point: checked on the host, as the CPU function checks them.
  auto call_ex = [&](int32_t window, float cap) {
    return kvpager_cuda_paged_attention_decode_split_ex(dummy, nullptr, dummy, dummy, table, lens, 2, 8, 2, 128, 16, 4, 8,
                                                        0.1F, window, cap, KVPAGER_DTYPE_FP16, 1, nullptr, 0, nullptr,
                                                        nullptr);
  };
  EXPECT_EQ(call_ex(-2, 0.0F), expect_bad);
  EXPECT_EQ(call_ex(-1, -1.0F), expect_bad);
  EXPECT_EQ(call_ex(-1, std::numeric_limits<float>::quiet_NaN()), expect_bad);
  EXPECT_EQ(call_ex(-1, std::numeric_limits<float>::infinity()), expect_bad);
  // The same for the fp8 pool's _ex entry point.
  auto call_fp8_ex = [&](int32_t window, float cap) {
    return kvpager_cuda_paged_attention_decode_fp8_split_ex(dummy, nullptr, dummy, dummy, table, lens, 2, 8, 2, 128, 16,
                                                            4, 8, 0.1F, window, cap, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 1,
                                                            nullptr, 0, nullptr, nullptr);
  };
  EXPECT_EQ(call_fp8_ex(-2, 0.0F), expect_bad);
  EXPECT_EQ(call_fp8_ex(-1, -1.0F), expect_bad);
  EXPECT_EQ(call_fp8_ex(-1, std::numeric_limits<float>::quiet_NaN()), expect_bad);
}

// Paged prefill on the GPU against the fp64 reference and against the CPU backend on the same inputs
// (kvpager_cpu_paged_attention_prefill, within gpu_tolerance); tests/kernels/cuda_prefill_emulation_test.cpp runs the
// same device code without a GPU.
// (seq_len, q_len): one token, a prompt just over a block, extensions over cached prefixes (several tiles, a q_len
// not a multiple of the tile), no new token, a decode-like single token after 520.
TEST(CudaPrefillAttention, MatchesReferenceForEveryDtypeHeadDimBlockSizeWindowAndCap) {
  KVTEST_NEED_GPU();
  uint32_t seed = 5;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256})
      for (int32_t bs : {8, 16, 32}) {
        const uint32_t k = seed++;
        const int32_t window = k % 2 == 0 ? -1 : 45;
        const float cap = (k / 2) % 2 == 0 ? 0.0F : 2.0F;
        const prefill_problem pr(dtype, d, bs, 8, 2, window, cap, {{1, 1}, {bs + 1, bs + 1}, {300, 130}, {97, 0}, {520, 1}, {200, 200}}, k);
        const auto r = run_prefill_case(pr);
        const auto what = ::testing::Message() << "dtype " << dtype << " d " << d << " bs " << bs << " window " << window
                                               << " cap " << cap;
        EXPECT_TRUE(r.calls_ok) << what;
        EXPECT_EQ(r.device_error, 0) << what;
        EXPECT_LE(r.out, gpu_tolerance(dtype)) << what;
        EXPECT_LE(r.lse, 1e-3) << what;
        EXPECT_LE(compare_with_cpu(pr, r.output), gpu_tolerance(dtype)) << what << " (against the CPU backend)";
      }
}

// Prefill over an fp8 E4M3 pool against the fp64 reference from the stored fp8 values (the emulation test runs the
// same device code without a GPU): every query dtype and head dim, block sizes, window and cap, with the LSE.
TEST(CudaPrefillAttention, Fp8PoolMatchesReferenceFromStoredValues) {
  KVTEST_NEED_GPU();
  uint32_t seed = 300;
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256}) {
      const uint32_t k = seed++;
      const int32_t bs = k % 3 == 0 ? 8 : k % 3 == 1 ? 16 : 32;
      const int32_t window = k % 2 == 0 ? -1 : 45;
      const float cap = (k / 2) % 2 == 0 ? 0.0F : 2.0F;
      prefill_problem pr(q_dtype, d, bs, 8, 2, window, cap, {{1, 1}, {bs + 1, bs + 1}, {300, 130}, {97, 0}, {520, 1}}, k,
                         false);
      pr.use_fp8_kv(0.01F, 0.05F);
      const auto r = run_prefill_case(pr);
      const auto what = ::testing::Message() << "q_dtype " << q_dtype << " d " << d << " bs " << bs << " window "
                                             << window << " cap " << cap;
      EXPECT_TRUE(r.calls_ok) << what;
      EXPECT_EQ(r.device_error, 0) << what;
      EXPECT_LE(r.out, gpu_tolerance(q_dtype)) << what;
      EXPECT_LE(r.lse, 1e-3) << what;
    }
}

TEST(CudaPrefillAttention, GqaShapesAndGridSizes) {
  KVTEST_NEED_GPU();
  const std::pair<int32_t, int32_t> heads[] = {{32, 8}, {7, 1}, {4, 4}, {24, 2}};
  uint32_t seed = 70;
  for (int32_t dtype : {KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (const auto& [hq, hkv] : heads)
      for (int32_t ctas : {0, 1, 3, 1000}) {  // planned, one CTA walking every tile, a few, more than tiles
        const prefill_problem pr(dtype, 128, 16, hq, hkv, -1, 0.0F, {{700, 300}, {64, 64}, {33, 5}}, seed++);
        const auto r = run_prefill_case(pr, ctas);
        EXPECT_TRUE(r.calls_ok && r.device_error == 0) << hq << "/" << hkv << " ctas " << ctas;
        EXPECT_LE(r.out, gpu_tolerance(dtype)) << hq << "/" << hkv << " ctas " << ctas;
        EXPECT_LE(compare_with_cpu(pr, r.output), gpu_tolerance(dtype)) << hq << "/" << hkv << " ctas " << ctas << " (CPU)";
      }
}

TEST(CudaPrefillAttention, LongPromptOverAPrefix) {
  KVTEST_NEED_GPU();
  for (int32_t window : {-1, 1000}) {
    const prefill_problem pr(KVPAGER_DTYPE_BF16, 128, 16, 8, 2, window, 0.0F, {{3000, 1100}}, 81);
    const auto r = run_prefill_case(pr);
    EXPECT_TRUE(r.calls_ok && r.device_error == 0) << window;
    EXPECT_LE(r.out, gpu_tolerance(KVPAGER_DTYPE_BF16)) << window;
    EXPECT_LE(compare_with_cpu(pr, r.output), gpu_tolerance(KVPAGER_DTYPE_BF16)) << window << " (against the CPU backend)";
  }
}

// Host-side: the workspace query and the plan need no GPU; the argument checks answer before any launch (a build
// without CUDA answers NO_DEVICE for the call itself).
TEST(CudaPrefillArguments, WorkspacePlanAndHostChecks) {
  int64_t bytes = -1;
  ASSERT_EQ(kvpager_cuda_prefill_workspace_size(5, &bytes), KVPAGER_STATUS_OK);
  EXPECT_EQ(bytes, 6 * 8);
  EXPECT_EQ(kvpager_cuda_prefill_workspace_size(-1, &bytes), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_prefill_workspace_size(1, nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
  int32_t ctas = -1;
  const int32_t plan = kvpager_cuda_plan_prefill(4096, 32, 8, 0, &ctas);
  if (have_gpu()) {
    EXPECT_EQ(plan, KVPAGER_STATUS_OK);
    EXPECT_GE(ctas, 1);
  } else {
    EXPECT_EQ(plan, KVPAGER_STATUS_NO_DEVICE);
  }
  EXPECT_EQ(kvpager_cuda_plan_prefill(-1, 32, 8, 0, &ctas), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_plan_prefill(10, 32, 8, 0, nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_plan_prefill(10, 30, 8, 0, &ctas), KVPAGER_STATUS_BAD_HEADS);
  const bool cuda = kvpager_built_with_cuda() != 0;
  char dummy[64] = {};
  const int32_t indptr[2] = {0, 1}, table[1] = {0}, lens[1] = {1};
  auto call = [&](int32_t hq, int32_t d, float scale, int32_t window, float cap, int32_t ctas_arg, void* ws, int64_t ws_bytes) {
    return kvpager_cuda_paged_attention_prefill(dummy, nullptr, dummy, dummy, indptr, table, lens, 1, hq, 2, d, 16, 4, 8, scale, window,
                                                cap, KVPAGER_DTYPE_FP16, ctas_arg, ws, ws_bytes, nullptr, nullptr);
  };
  const int32_t bad = cuda ? KVPAGER_STATUS_INVALID_ARGUMENT : KVPAGER_STATUS_NO_DEVICE;
  EXPECT_EQ(call(8, 128, 0.1F, -1, 0.0F, 0, dummy, 16), bad);                      // no CTA
  EXPECT_EQ(call(8, 128, 0.1F, -1, 0.0F, 1, nullptr, 0), bad);                     // workspace missing
  EXPECT_EQ(call(8, 128, 0.1F, -1, 0.0F, 1, dummy, 15), bad);                      // one byte short
  EXPECT_EQ(call(8, 128, 0.1F, -2, 0.0F, 1, dummy, 16), bad);                      // window below -1
  EXPECT_EQ(call(8, 128, 0.1F, -1, std::numeric_limits<float>::quiet_NaN(), 1, dummy, 16), bad);  // cap NaN
  EXPECT_EQ(call(8, 128, std::numeric_limits<float>::infinity(), -1, 0.0F, 1, dummy, 16), bad);   // scale
  EXPECT_EQ(call(7, 128, 0.1F, -1, 0.0F, 1, dummy, 16), cuda ? KVPAGER_STATUS_BAD_HEADS : KVPAGER_STATUS_NO_DEVICE);
  EXPECT_EQ(call(8, 72, 0.1F, -1, 0.0F, 1, dummy, 16), cuda ? KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM : KVPAGER_STATUS_NO_DEVICE);
  // The fp8 prefill: its scales and q_dtype are checked on the host too (NO_DEVICE without CUDA).
  auto call8 = [&](int32_t q_dtype, float k_scale, float v_scale) {
    return kvpager_cuda_paged_attention_prefill_fp8(dummy, nullptr, dummy, dummy, indptr, table, lens, 1, 8, 2, 128, 16,
                                                    4, 8, 0.1F, -1, 0.0F, q_dtype, k_scale, v_scale, 1, dummy, 16,
                                                    nullptr, nullptr);
  };
  EXPECT_EQ(call8(KVPAGER_DTYPE_FP16, 0.0F, 1.0F), bad);
  EXPECT_EQ(call8(KVPAGER_DTYPE_FP16, 1.0F, std::numeric_limits<float>::infinity()), bad);
  EXPECT_EQ(call8(KVPAGER_DTYPE_FP8_E4M3, 1.0F, 1.0F), cuda ? KVPAGER_STATUS_UNSUPPORTED_DTYPE : KVPAGER_STATUS_NO_DEVICE);
}

TEST(CudaPrefillAttention, BadBlockIdAndBadRowsAreFlagged) {
  KVTEST_NEED_GPU();
  prefill_problem pr(KVPAGER_DTYPE_FP16, 64, 16, 4, 2, -1, 0.0F, {{40, 20}, {20, 20}}, 9);
  pr.table[1] = pr.nb;  // outside the pool
  EXPECT_EQ(run_prefill_case(pr).device_error, KVPAGER_STATUS_INVALID_BLOCK);
  pr.table[1] = 0;
  pr.lens[0] = 19;  // q_len 20 above it
  EXPECT_EQ(run_prefill_case(pr).device_error, KVPAGER_STATUS_INVALID_ARGUMENT);
  pr.lens[0] = 40;
  pr.indptr[1] = 30;
  pr.indptr[2] = 25;  // decreasing
  EXPECT_EQ(run_prefill_case(pr).device_error, KVPAGER_STATUS_INVALID_ARGUMENT);
}

// Issue 9, item 3 and the geometry rule: the CUDA entry points' host checks are the CPU ones (kernels/common/checks.hpp).
// Every case below is answered on the host before anything is launched or dereferenced, so it needs no GPU, and the
// CPU function answers it with the same code. Empty calls are OK without a device.
TEST(CudaArguments, HostChecksAnswerLikeTheCpu) {
  const int32_t i32 = std::numeric_limits<int32_t>::max();
  char buf[4096] = {};
  void* layers[1] = {buf};
  const int64_t pair[2] = {0, 1};
  const int32_t table[1] = {0}, lens[1] = {1};
  auto same = [](int32_t cpu, int32_t cuda, int32_t expect, const char* what) {
    EXPECT_EQ(cpu, expect) << "cpu: " << what;
    EXPECT_EQ(cuda, expect) << "cuda: " << what;
  };
  // copy_blocks: nothing to copy, null pointers only with a zero count, pool size within int64.
  same(kvpager_cpu_copy_blocks(nullptr, 3, pair, 0, 4, 64), kvpager_cuda_copy_blocks(nullptr, 3, pair, 0, 4, 64, nullptr, nullptr),
       KVPAGER_STATUS_OK, "no pairs, kv_caches NULL");
  same(kvpager_cpu_copy_blocks(layers, 0, nullptr, 1, 4, 64), kvpager_cuda_copy_blocks(layers, 0, nullptr, 1, 4, 64, nullptr, nullptr),
       KVPAGER_STATUS_INVALID_ARGUMENT, "no layers, a pair, mapping NULL");
  same(kvpager_cpu_copy_blocks(nullptr, 1, pair, 1, 4, 64), kvpager_cuda_copy_blocks(nullptr, 1, pair, 1, 4, 64, nullptr, nullptr),
       KVPAGER_STATUS_INVALID_ARGUMENT, "a layer, a pair, kv_caches NULL");
  same(kvpager_cpu_copy_blocks(layers, 1, pair, 1, i32, int64_t{1} << 33),
       kvpager_cuda_copy_blocks(layers, 1, pair, 1, i32, int64_t{1} << 33, nullptr, nullptr), KVPAGER_STATUS_INVALID_ARGUMENT,
       "pool bytes beyond int64");
  same(kvpager_cpu_copy_blocks(layers, -1, pair, 1, 4, 64), kvpager_cuda_copy_blocks(layers, -1, pair, 1, 4, 64, nullptr, nullptr),
       KVPAGER_STATUS_INVALID_ARGUMENT, "num_layers -1");
  // kv_append: the decode geometry check, then sizes.
  const int64_t slot[1] = {0};
  auto append = [&](int32_t hkv, int32_t d, int32_t bs, int32_t nb, int32_t dtype, int32_t tokens, int32_t expect, const char* what) {
    same(kvpager_cpu_kv_append(buf, buf, buf, slot, tokens, hkv, d, bs, nb, dtype),
         kvpager_cuda_kv_append(buf, buf, buf, slot, tokens, hkv, d, bs, nb, dtype, nullptr, nullptr), expect, what);
  };
  append(0, 64, 16, 4, KVPAGER_DTYPE_FP16, 1, KVPAGER_STATUS_BAD_HEADS, "KV heads 0");
  append(1, 72, 16, 4, KVPAGER_DTYPE_FP16, 1, KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM, "head dim 72");
  append(1, 64, 12, 4, KVPAGER_DTYPE_FP16, 1, KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE, "block size 12");
  append(1, 64, 16, 4, 3, 1, KVPAGER_STATUS_UNSUPPORTED_DTYPE, "dtype 3");
  append(i32, 64, 16, i32, KVPAGER_DTYPE_FP16, 1, KVPAGER_STATUS_INVALID_ARGUMENT, "pool bytes beyond int64");
  append(1 << 30, 64, 16, 1, KVPAGER_DTYPE_FP16, i32, KVPAGER_STATUS_INVALID_ARGUMENT, "key bytes beyond int64");
  append(1, 64, 16, 4, KVPAGER_DTYPE_FP16, 0, KVPAGER_STATUS_OK, "no tokens");
  // decode: the same scalar checks, in the same order.
  auto decode = [&](int32_t seqs, int32_t hq, int32_t hkv, int32_t maxb, int32_t nb, float scale, int32_t expect, const char* what) {
    same(kvpager_cpu_paged_attention_decode(buf, buf, buf, table, lens, seqs, hq, hkv, 64, 16, maxb, nb, scale, KVPAGER_DTYPE_FP32, 1),
         kvpager_cuda_paged_attention_decode(buf, buf, buf, table, lens, seqs, hq, hkv, 64, 16, maxb, nb, scale, KVPAGER_DTYPE_FP32,
                                             nullptr, nullptr),
         expect, what);
  };
  decode(1, i32, 2, 4, 4, 0.1F, KVPAGER_STATUS_BAD_HEADS, "INT32_MAX query heads on 2 KV heads");
  decode(1, i32, i32, 4, i32, 0.1F, KVPAGER_STATUS_INVALID_ARGUMENT, "pool bytes beyond int64");
  decode(i32, i32, i32, 4, 1, 0.1F, KVPAGER_STATUS_INVALID_ARGUMENT, "query bytes beyond int64");
  decode(1, 2, 1, 0, 4, 0.1F, KVPAGER_STATUS_INVALID_ARGUMENT, "max_blocks_per_seq 0");
  decode(1, 2, 1, 4, 4, std::numeric_limits<float>::infinity(), KVPAGER_STATUS_INVALID_ARGUMENT, "scale inf");
  decode(0, 2, 1, 4, 4, 0.1F, KVPAGER_STATUS_OK, "no sequences");
  int64_t bytes = 0;
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(i32, i32, 256, 256, &bytes), KVPAGER_STATUS_INVALID_ARGUMENT);
}

TEST(CudaBlocks, AppendCopySwapMatchCpu) {
  KVTEST_NEED_GPU();
  for (const auto& [what, ok] : blocks_vs_cpu()) EXPECT_TRUE(ok) << what;
}

#include <kvpager/kvpager.hpp>
#include <kvpager/kernels/cuda_executor.hpp>

TEST(CudaExecutor, RefusesWithoutADeviceOrRunsAPlan) {
  if (!have_gpu()) {
    kvpager::cuda_executor_config cfg;
    EXPECT_EQ(kvpager::cuda_executor::create(cfg).code(), kvpager::errc::unsupported);
    GTEST_SKIP() << "no CUDA device: the executor's plan run is tested where a GPU is present";
  }
  const kvpager::kv_geometry geometry{16, 16, 2, 64, kvpager::kv_dtype::f16};
  const auto layout = kvpager::kv_layout::of(geometry);
  void* dev = nullptr;
  void* host = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, static_cast<size_t>(layout.pool_bytes())), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&host, static_cast<size_t>(layout.block_bytes() * 8)), cudaSuccess);
  cudaMemset(dev, 0, static_cast<size_t>(layout.pool_bytes()));
  kvpager::cuda_executor_config cfg;
  cfg.geometry = geometry;
  cfg.device_pool = dev;
  cfg.host_pool = host;
  cfg.num_host_blocks = 8;
  auto ex = kvpager::cuda_executor::create(cfg);
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  // Same plan on the CPU executor and the CUDA one: the device pool must end up identical.
  auto cache = *kvpager::paged_kv_cache<>::create({16, 16, 0, 0});
  ASSERT_TRUE(cache.add_sequence(1, 20));
  std::vector<int64_t> slots(static_cast<size_t>(cache.slot_mapping_size()));
  ASSERT_TRUE(cache.export_slot_mapping(slots));
  std::vector<uint16_t> k(slots.size() * 2 * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(i * 3);
    v[i] = static_cast<uint16_t>(i * 5 + 1);
  }
  auto cpu = kvpager::host_kv_pools::create(geometry, 8);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message();
  ASSERT_TRUE(cpu->execute(cache.plan(), slots, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))));
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  ASSERT_TRUE((*ex)->execute(cache.plan(), slots, dk, dv));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::byte> got(static_cast<size_t>(layout.pool_bytes()));
  cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), cpu->device_bytes().begin()));
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dev);
  cudaFreeHost(host);
}
