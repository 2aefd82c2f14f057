// SPDX-License-Identifier: Apache-2.0
// bf16 pools on every CPU prefill path (issue 27, point 3), against the fp64 reference of prefill_fixture.hpp at the
// precision each result is stored in: the LSE (fp32) within the fp32 pool's tolerance, every output element within
// the bf16 output's own rounding (the suite of prefill_test.cpp allows 1.6e-2 for any bf16 call; this is 4x tighter).
// On a CPU with AVX512_BF16 the default path computes Q.K^T with vdpbf16ps from the queries packed as (d, d + 1)
// pairs per row and each K row's pairs broadcast from the pool: a pair taken in the wrong order, a head dim whose
// pairs do not fill whole vectors (80 and 112: 40 and 56 pairs), a KV tile with an odd number of tokens (padded), a
// masked causal or window tile, the soft cap, GQA groups and MHA, all show up here as an LSE off by far more than
// fp32's rounding. CMake runs this binary once per path (KVPAGER_CPU_DISPATCH), so the same checks hold on each.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "prefill_fixture.hpp"

using kvpager_prefill_test::dtypes;
using kvpager_prefill_test::errors_of;
using kvpager_prefill_test::prefill_errors;
using kvpager_prefill_test::shape;
using kvpager_prefill_test::tolerance;

namespace {

/// One bf16 rounding of an output of magnitude below 1 (2^-8 relative), with room for the fp32 sums before it.
constexpr double kBf16Output = 4e-3;

}  // namespace

TEST(CpuPrefillBf16, EveryHeadDimTileEdgeMaskAndCapWithinTheStoredPrecision) {
  const std::int32_t dims[] = {64, 80, 96, 112, 128, 256};
  const std::int32_t heads[][2] = {{4, 4}, {8, 2}, {6, 2}, {12, 1}};  // MHA, GQA 4, GQA 3, MQA 12
  const struct {
    std::int32_t window;
    float cap;
  } masks[] = {{-1, 0.0F}, {5, 0.0F}, {-1, 30.0F}, {40, 20.0F}};
  std::uint32_t seed = 2700;
  for (std::size_t i = 0; i < std::size(dims); ++i)
    for (std::size_t k = 0; k < std::size(masks); ++k) {
      shape sh(dtypes{KVPAGER_DTYPE_BF16, KVPAGER_DTYPE_BF16});
      sh.d = dims[i];
      sh.hq = heads[(i + k) % 4][0];
      sh.hkv = heads[(i + k) % 4][1];
      sh.bs = (i + k) % 2 == 0 ? 16 : 8;
      // A whole prompt of 37 tokens (one KV tile of 37: padded to whole register tiles), and 67 rows over 131 tokens
      // (tiles of 64, 64 and 3; a window starts its tiles anywhere).
      sh.lens = {37, 131};
      sh.q_lens = {37, 67};
      sh.window = masks[k].window;
      sh.cap = masks[k].cap;
      const prefill_errors e = errors_of(sh, seed++);
      EXPECT_LT(e.lse, tolerance(KVPAGER_DTYPE_FP32))
          << "d " << sh.d << " heads " << sh.hq << "/" << sh.hkv << " window " << sh.window << " cap " << sh.cap;
      EXPECT_LT(e.out, kBf16Output)
          << "d " << sh.d << " heads " << sh.hq << "/" << sh.hkv << " window " << sh.window << " cap " << sh.cap;
    }
}

TEST(CpuPrefillBf16, LongRowsAcrossManyTilesAndSeveralItems) {
  // 200 rows of a GQA 4 group (800 rows: several work items, each over several full KV tiles and a diagonal one)
  // after a cached prefix of 57 tokens, one thread and all.
  for (const std::int32_t threads : {1, 0}) {
    shape sh(dtypes{KVPAGER_DTYPE_BF16, KVPAGER_DTYPE_BF16});
    sh.d = 80;
    sh.hq = 8;
    sh.hkv = 2;
    sh.lens = {257};
    sh.q_lens = {200};
    sh.threads = threads;
    const prefill_errors e = errors_of(sh, 2800);
    EXPECT_LT(e.lse, tolerance(KVPAGER_DTYPE_FP32)) << threads << " threads";
    EXPECT_LT(e.out, kBf16Output) << threads << " threads";
  }
}
