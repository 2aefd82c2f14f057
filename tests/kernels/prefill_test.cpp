// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill against an independent fp64 reference computed from the stored (rounded, or dequantized fp8)
// values, as one suite over every pool dtype (fp32, fp16, bf16, and fp8 E4M3 under each query dtype: fp8 is a value of
// the parameter, prefill_fixture.hpp): head dims 64..256, block sizes 8/16/32, MHA/GQA/MQA, q_len 0, 1 and == seq_len
// in mixed batches, sliding windows (none, 0, small, larger than the context), soft cap on and off, shuffled block ids
// with NaN in every unused slot, positions a row may not see poisoned, HND and NHD layouts, dense and CSR page tables,
// LSE; thread counts agree bit for bit. Then the plain pools' own tests: q_len = 1 equals decode, every bad argument
// gets its status and leaves `out` byte-identical, the geometry verdict is can_implement's (fp8_prefill_test.cpp has
// the fp8 pools' own).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/kernel_status.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "prefill_fixture.hpp"

using namespace kvpager;
using kvpager_prefill_test::dtypes;
using kvpager_prefill_test::fixture;
using kvpager_prefill_test::run_and_check;
using kvpager_prefill_test::shape;
using kvpager_prefill_test::tolerance;

namespace {

#if defined(KVPAGER_TEST_REDUCED)
constexpr bool kReduced = true;
#else
constexpr bool kReduced = false;
#endif

class PrefillEveryDtype : public ::testing::TestWithParam<dtypes> {
 protected:
  [[nodiscard]] shape base() const { return shape(GetParam()); }
  [[nodiscard]] std::int32_t q_dtype() const { return GetParam().q; }
  [[nodiscard]] bool fp8() const { return GetParam().kv == KVPAGER_DTYPE_FP8_E4M3; }
  /// A per-dtype seed offset, so the dtypes do not share random draws.
  [[nodiscard]] std::uint32_t salt() const {
    return static_cast<std::uint32_t>(GetParam().kv * 16 + GetParam().q) * 1000U;
  }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, PrefillEveryDtype, ::testing::ValuesIn(kvpager_prefill_test::every_dtype()),
                         [](const ::testing::TestParamInfo<dtypes>& i) { return kvpager_prefill_test::name_of(i.param); });

}  // namespace

TEST_P(PrefillEveryDtype, MatchesReferenceAcrossHeadDimsBlockSizesAndHeads) {
  // The reduced presets (sanitizers) run fewer head dims over fp8 pools, as the fp8 suite did before it joined this one.
  std::vector<std::int32_t> dims{64, 80, 96, 112, 128, 256};
  if (kReduced && fp8()) dims = {64, 128};
  const std::int32_t heads[][2] = {{4, 4}, {8, 2}, {6, 1}, {12, 4}};
  const std::int32_t blocks[] = {8, 16, 32};
  const float scales[][2] = {{1.0F / 160, 1.0F / 224}, {0.02F, 0.5F / 448}, {1.0F, 1.0F / 400}};  // fp8 pools
  std::uint32_t seed = 1 + salt();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::size_t pick = i + static_cast<std::size_t>(q_dtype());
    shape sh = base();
    sh.d = dims[i];
    sh.hq = heads[pick % 4][0];
    sh.hkv = heads[pick % 4][1];
    sh.bs = blocks[pick % 3];
    sh.k_scale = scales[pick % 3][0];
    sh.v_scale = scales[pick % 3][1];
    // a whole prompt, a chunk over a cached prefix, a single row, nothing to do, a long prompt past one KV tile
    sh.lens = {37, 70, 9, 12, 100};
    sh.q_lens = {37, 19, 1, 0, 83};
    EXPECT_LT(run_and_check(sh, seed++, (i % 2) == 0), tolerance(q_dtype()))
        << "d " << sh.d << " heads " << sh.hq << "/" << sh.hkv << " block " << sh.bs;
  }
}

TEST_P(PrefillEveryDtype, WindowsAndSoftCap) {
  std::vector<std::int32_t> windows{-1, 0, 1, 7, 50, 1000};
  if (kReduced && fp8()) windows = {-1, 0, 7};
  std::uint32_t seed = 100 + salt();
  for (const std::int32_t window : windows)
    // 1e4 and up: tanh of tiny arguments (no cancellation; FLT_MAX: s / cap subnormal, the result s itself)
    for (const float cap : {0.0F, 0.5F, 30.0F, 1.0e4F, 1.0e8F, std::numeric_limits<float>::max()}) {
      shape sh = base();
      sh.hq = 8;
      sh.hkv = 2;
      sh.bs = 8;
      sh.d = 64;
      sh.lens = {150, 33, 5};
      sh.q_lens = {90, 33, 2};
      sh.window = window;
      sh.cap = cap;
      EXPECT_LT(run_and_check(sh, seed++, window == 7), tolerance(q_dtype())) << "window " << window << " cap " << cap;
    }
}

// Issue 21, point 5: a position a row may not attend to (after it, or before its window) never reaches that row's
// output, whatever is stored there. The masked tiles used to add 0 x V over the whole tile, so an inf or NaN at a
// future position turned earlier rows into NaN. For each checked row, every position outside its window is
// poisoned (+inf, -inf or NaN in K and V; an fp8 pool has no infinity, so its NaN code), and the row must still equal
// the reference of the clean values.
TEST_P(PrefillEveryDtype, MaskedPositionsNeverReachARow) {
  std::uint32_t seed = 700 + salt();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> poisons{std::numeric_limits<float>::quiet_NaN()};
  if (!fp8()) poisons.insert(poisons.begin(), {inf, -inf});
  for (const std::int32_t window : {-1, 6})
    for (const float poison : poisons) {
      shape sh = base();
      sh.hq = 4;
      sh.hkv = 2;
      sh.bs = 8;
      sh.d = 64;
      sh.lens = {90};
      sh.q_lens = {75};  // a cached prefix of 15 tokens, then rows across two KV tiles
      sh.window = window;
      sh.cap = window < 0 ? 0.0F : 20.0F;
      const fixture clean(sh, seed++);
      for (std::int64_t r = 0; r < clean.rows; r += 4) {
        fixture f = clean;
        const std::int64_t pos = sh.lens[0] - sh.q_lens[0] + r;
        kvpager_prefill_test::for_each_masked_position(sh.lens[0], pos, window, [&](std::int32_t j) {
          for (std::int32_t k = 0; k < 2; ++k)
            for (std::int32_t h = 0; h < sh.hkv; ++h)
              for (std::int32_t e = 0; e < sh.d; ++e) f.poison(0, j, k, h, e, poison);
        });
        std::vector<unsigned char> out(f.out_bytes(), 0xAB);
        ASSERT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), nullptr)));
        std::vector<double> o;
        double lse = 0;
        for (std::int32_t h = 0; h < sh.hq; ++h) {
          clean.reference(r, h, o, lse);
          for (std::int32_t e = 0; e < sh.d; ++e) {
            const double got = f.out(out, static_cast<std::size_t>((r * sh.hq + h) * sh.d + e));
            ASSERT_TRUE(std::isfinite(got)) << "row " << r << " saw a poisoned position: window " << window
                                            << " poison " << poison;
            ASSERT_LT(std::abs(got - o[static_cast<std::size_t>(e)]) / (1.0 + std::abs(o[static_cast<std::size_t>(e)])),
                      tolerance(q_dtype()))
                << "row " << r << " head " << h << " window " << window;
          }
        }
      }
    }
}

TEST_P(PrefillEveryDtype, NhdLayoutCsrTablesLseAndMqa) {
  std::uint32_t seed = 200 + salt();
  for (const bool nhd : {false, true})
    for (const bool csr : {false, true})
      for (const float cap : {0.0F, 20.0F}) {
        shape sh = base();
        sh.hq = 16;
        sh.hkv = nhd ? 1 : 4;  // MQA: a group of 16 heads in one tile
        sh.d = 128;
        sh.bs = 32;
        sh.lens = {65, 0, 200, 31};
        sh.q_lens = {65, 0, 70, 3};
        sh.nhd = nhd;
        sh.csr = csr;
        sh.window = csr ? 40 : -1;
        sh.cap = cap;
        EXPECT_LT(run_and_check(sh, seed++), tolerance(q_dtype())) << "nhd " << nhd << " csr " << csr << " cap " << cap;
      }
}

TEST_P(PrefillEveryDtype, ThreadCountsAgreeBitForBit) {
  shape sh = base();
  sh.hq = 8;
  sh.hkv = 2;
  sh.d = 128;
  sh.lens = {300, 129, 64};
  sh.q_lens = {300, 100, 1};
  fixture f(sh, 400 + salt());
  std::vector<unsigned char> a(f.out_bytes()), b(f.out_bytes());
  for (const std::int32_t threads : {1, 2, 0}) {
    f.s.threads = threads;
    std::vector<unsigned char>& out = threads == 1 ? a : b;
    ASSERT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), nullptr)));
    if (threads != 1) {
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << threads << " threads";
    }
  }
}

TEST_P(PrefillEveryDtype, SingleRowBatchesKeepLseCsrAndNhd) {
  // All q_len = 1 (the decode shortcut) through the C++ entry point: LSE, CSR tables and NHD strides carried over.
  shape sh = base();
  sh.hq = 8;
  sh.hkv = 1;
  sh.d = 96;
  sh.bs = 8;
  sh.lens = {1, 50, 700};
  sh.q_lens = {1, 1, 1};
  sh.nhd = true;
  sh.csr = true;
  EXPECT_LT(run_and_check(sh, 800 + salt()), tolerance(q_dtype()));
}

TEST_P(PrefillEveryDtype, EmptyBatchAndAllZeroQueryLengths) {
  shape sh = base();
  sh.lens = {20, 0, 5};
  sh.q_lens = {0, 0, 0};
  const fixture f(sh, 600 + salt());
  // No sequences: every pointer may be null (C and C++).
  fixture none = f;
  none.s.lens.clear();
  none.qo = {0};
  prefill_params p0 = none.params(nullptr, nullptr);
  p0.query = nullptr;
  p0.kv.data = nullptr;
  p0.qo_indptr = nullptr;
  p0.pages = {};
  p0.num_seqs = 0;
  EXPECT_TRUE(paged_attention_prefill_cpu(p0));
  const std::int32_t c0 =
      fp8() ? kvpager_cpu_paged_attention_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, 64,
                                                      16, 1, 1, 0.1F, -1, 0.0F, q_dtype(), 1.0F, 1.0F, 0)
            : kvpager_cpu_paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, 64, 16,
                                                  1, 1, 0.125F, -1, 0.0F, GetParam().kv, 0);
  EXPECT_EQ(c0, KVPAGER_STATUS_OK);
  // Sequences without rows: neither query nor out is touched (but a batch's pointers are never null).
  unsigned char sentinel[4] = {0x5A, 0x5A, 0x5A, 0x5A};
  fixture g = f;
  g.q.assign(4, 0x5A);
  prefill_params p = g.params(sentinel, nullptr);
  p.query = sentinel;
  EXPECT_TRUE(paged_attention_prefill_cpu(p));
  EXPECT_EQ(g.run_c(sentinel), KVPAGER_STATUS_OK);
  for (const unsigned char c : sentinel) EXPECT_EQ(c, 0x5A);
}

TEST(CpuPrefill, LargeGroupSpansSeveralRegisterTiles) {
  shape sh;
  sh.hq = 64;
  sh.hkv = 1;  // 64 rows per position: more than one tile of rows
  sh.d = 64;
  sh.bs = 16;
  sh.lens = {40};
  sh.q_lens = {5};
  EXPECT_LT(run_and_check(sh, 300), tolerance(sh.q_dtype));
}

TEST(CpuPrefill, SingleRowEqualsDecode) {
  for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    shape sh(dtypes{dtype, dtype});
    sh.hq = 8;
    sh.hkv = 2;
    sh.d = 128;
    sh.bs = 16;
    sh.lens = {1, 77, 300, 16};
    sh.q_lens = {1, 1, 1, 1};
    fixture f(sh, 500 + static_cast<std::uint32_t>(dtype));
    std::vector<unsigned char> pre(f.out_bytes()), tiled(f.out_bytes()), dec(f.out_bytes());
    auto prefill = [&](std::vector<unsigned char>& out, std::int32_t window) {
      return kvpager_cpu_paged_attention_prefill(out.data(), f.q.data(), f.kv.data(), f.qo.data(), f.table.data(),
                                                 sh.lens.data(), 4, sh.hq, sh.hkv, sh.d, sh.bs, f.max_blocks,
                                                 f.num_blocks, f.scale(), window, 0.0F, dtype, 0);
    };
    ASSERT_EQ(prefill(pre, -1), KVPAGER_STATUS_OK);
    // A window wider than every context changes nothing but takes the tiled kernel (no decode shortcut).
    ASSERT_EQ(prefill(tiled, 100000), KVPAGER_STATUS_OK);
    ASSERT_EQ(kvpager_cpu_paged_attention_decode(dec.data(), f.q.data(), f.kv.data(), f.table.data(), sh.lens.data(), 4,
                                                 sh.hq, sh.hkv, sh.d, sh.bs, f.max_blocks, f.num_blocks, f.scale(), dtype, 0),
              KVPAGER_STATUS_OK);
    // One row per sequence without window or cap runs the decode kernel itself (bit for bit while both choose the
    // same split); the tiled kernel sums the same terms in another order: equal within the output's rounding.
    const double ulp = dtype == KVPAGER_DTYPE_FP32 ? 1e-6 : dtype == KVPAGER_DTYPE_FP16 ? 1e-3 : 8e-3;
    for (std::size_t i = 0; i < f.out_elems(); ++i) {
      const double want = f.out(dec, i);
      ASSERT_NEAR(f.out(pre, i), want, ulp * (1.0 + std::abs(want))) << "element " << i << " dtype " << dtype;
      ASSERT_NEAR(f.out(tiled, i), want, ulp * (1.0 + std::abs(want))) << "element " << i << " dtype " << dtype;
    }
  }
}

TEST(CpuPrefill, EveryBadInputGetsItsStatusAndLeavesOutUntouched) {
  shape sh;
  sh.hq = 4;
  sh.hkv = 2;
  sh.lens = {40, 20};
  sh.q_lens = {8, 4};
  fixture f(sh, 700);
  std::vector<float> out(f.out_elems(), 7.0F);
  const std::vector<float> before = out;
  // The C ABI; kv_cache is a pointer nothing may be read through (every error is found from the arguments alone).
  struct args {
    const void* kv = reinterpret_cast<const void*>(0x1);
    std::vector<std::int32_t> qo, table, lens;
    std::int32_t n = 2, hq = 4, hkv = 2, d = 64, bs = 16, maxb = 3, nb = 10;
    float scale = 0.125F;
    std::int32_t window = -1;
    float cap = 0.0F;
    std::int32_t dtype = 0;
  };
  args good;
  good.qo = {0, 8, 12};
  good.table = {0, 1, 2, 3, 4, -1};
  good.lens = {40, 20};
  auto call = [&](const args& a) {
    return kvpager_cpu_paged_attention_prefill(out.data(), f.q.data(), a.kv, a.qo.data(), a.table.data(), a.lens.data(),
                                               a.n, a.hq, a.hkv, a.d, a.bs, a.maxb, a.nb, a.scale, a.window, a.cap,
                                               a.dtype, 1);
  };
  auto with = [&](auto change) {
    args a = good;
    change(a);
    return a;
  };
  const struct {
    args a;
    std::int32_t rc;
    const char* what;
  } cases[] = {
      {with([](args& a) { a.kv = nullptr; }), KVPAGER_STATUS_INVALID_ARGUMENT, "null kv"},
      {with([](args& a) { a.n = -1; }), KVPAGER_STATUS_INVALID_ARGUMENT, "negative num_seqs"},
      {with([](args& a) { a.maxb = 0; }), KVPAGER_STATUS_INVALID_ARGUMENT, "max_blocks_per_seq 0"},
      {with([](args& a) { a.scale = std::numeric_limits<float>::quiet_NaN(); }), KVPAGER_STATUS_INVALID_ARGUMENT, "NaN scale"},
      {with([](args& a) { a.window = -2; }), KVPAGER_STATUS_INVALID_ARGUMENT, "window -2"},
      {with([](args& a) { a.cap = -1.0F; }), KVPAGER_STATUS_INVALID_ARGUMENT, "negative soft cap"},
      {with([](args& a) { a.cap = std::numeric_limits<float>::infinity(); }), KVPAGER_STATUS_INVALID_ARGUMENT, "inf soft cap"},
      {with([](args& a) { a.qo = {1, 8, 12}; }), KVPAGER_STATUS_INVALID_ARGUMENT, "qo_indptr not starting at 0"},
      {with([](args& a) { a.qo = {0, 8, 7}; }), KVPAGER_STATUS_INVALID_ARGUMENT, "decreasing qo_indptr"},
      {with([](args& a) { a.qo = {0, 8, 29}; }), KVPAGER_STATUS_INVALID_ARGUMENT, "q_len 21 above seq_len 20"},
      {with([](args& a) { a.hq = 3; }), KVPAGER_STATUS_BAD_HEADS, "3 query heads over 2 KV heads"},
      {with([](args& a) { a.hkv = 0; }), KVPAGER_STATUS_BAD_HEADS, "no KV heads"},
      {with([](args& a) { a.d = 72; }), KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM, "head dim 72"},
      {with([](args& a) { a.dtype = 3; }), KVPAGER_STATUS_UNSUPPORTED_DTYPE, "dtype 3"},
      {with([](args& a) { a.bs = 12; }), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE, "block size 12"},
      {with([](args& a) { a.lens = {49, 20}; }), KVPAGER_STATUS_SEQ_TOO_LONG, "49 tokens > 3 blocks x 16"},
      {with([](args& a) { a.lens = {40, -1}; }), KVPAGER_STATUS_SEQ_TOO_LONG, "negative length"},
      {with([](args& a) { a.nb = 4; }), KVPAGER_STATUS_INVALID_BLOCK, "block 4 of a 4-block pool"},
      {with([](args& a) { a.table[4] = -3; }), KVPAGER_STATUS_INVALID_BLOCK, "negative block id"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(call(c.a), c.rc) << c.what;
    EXPECT_EQ(std::memcmp(out.data(), before.data(), out.size() * sizeof(float)), 0) << "out written: " << c.what;
  }
  // The C++ entry point: its own fields, and the same statuses through the one mapping.
  std::vector<float> lse(12 * 4, 3.0F);  // [rows, heads]
  prefill_params p = f.params(out.data(), lse.data());
  auto cpp = [&](auto change) {
    prefill_params q = p;
    change(q);
    return paged_attention_prefill_cpu(q);
  };
  EXPECT_EQ(cpp([](prefill_params& q) { q.num_threads = -1; }).code(), errc::invalid_argument);
  EXPECT_EQ(cpp([](prefill_params& q) { q.qo_indptr = nullptr; }).code(), errc::invalid_argument);
  EXPECT_EQ(cpp([](prefill_params& q) { q.kv.stride_token = -1; }).code(), errc::invalid_argument);
  std::vector<std::int32_t> bad_qo = {0, 41, 45};
  EXPECT_EQ(cpp([&](prefill_params& q) { q.qo_indptr = bad_qo.data(); }).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(cpp([](prefill_params& q) { q.kv.num_blocks = 1; }).code(), errc::invalid_block);
  std::vector<std::int32_t> indptr = {0, 3, 2}, indices = {0, 1, 2, 3}, last = {8, 4};
  EXPECT_EQ(cpp([&](prefill_params& q) {
              q.pages = {};
              q.pages.indptr = indptr.data();
              q.pages.indices = indices.data();
              q.pages.last_page_len = last.data();
            }).code(),
            errc::invalid_argument)
      << "decreasing CSR indptr";
  EXPECT_EQ(std::memcmp(out.data(), before.data(), out.size() * sizeof(float)), 0);
  EXPECT_EQ(lse, std::vector<float>(12 * 4, 3.0F));
  EXPECT_TRUE(paged_attention_prefill_cpu(p)) << "the unchanged call is good";
  EXPECT_NE(std::memcmp(out.data(), before.data(), out.size() * sizeof(float)), 0);
}

TEST(CpuPrefill, GeometryVerdictIsCanImplements) {
  // Called with nothing to do, prefill's answer is its verdict on the pool geometry: the same as kvpager_can_implement
  // (and so as decode and kv_append) for every combination of valid and invalid fields (fp8 pools aside, below).
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  std::int32_t checked = 0;
  for (const std::int32_t blocks : {-1, 0, 1, 1000, kMax})
    for (const std::int32_t bs : {-16, 0, 4, 8, 12, 16, 32, 64})
      for (const std::int32_t heads : {-2, 0, 1, 8, 1 << 20})
        for (const std::int32_t dim : {0, 32, 64, 80, 96, 100, 112, 128, 256, 512})
          for (const std::int32_t dtype : {-1, 0, 1, 2, 3}) {
            // Prefill over fp8 E4M3 pools is not implemented: like the plain decode, prefill answers for dtype 3 what
            // can_implement answers for a dtype no kernel takes.
            const std::int32_t want =
                kvpager_can_implement(blocks, bs, heads, dim, dtype == KVPAGER_DTYPE_FP8_E4M3 ? -1 : dtype);
            const std::int32_t hq = heads > 0 && heads <= kMax / 2 ? 2 * heads : 1;
            EXPECT_EQ(kvpager_cpu_paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq,
                                                          heads, dim, bs, 1, blocks, 0.1F, -1, 0.0F, dtype, 1),
                      want)
                << blocks << " " << bs << " " << heads << " " << dim << " " << dtype;
            prefill_params p;
            p.kv = paged_kv_view::hnd(nullptr, dtype, blocks, heads, bs, dim);
            p.num_q_heads = hq;
            const status st = paged_attention_prefill_cpu(p);
            EXPECT_EQ(st.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(st.detail()), want);
            ++checked;
          }
  EXPECT_EQ(checked, 5 * 8 * 5 * 10 * 5);
}
