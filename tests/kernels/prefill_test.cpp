// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill against an independent fp64 reference computed from the stored (rounded) values: every dtype,
// head dims 64..256, block sizes 8/16/32, MHA/GQA/MQA, q_len 0, 1 and == seq_len in mixed batches, sliding windows
// (none, 0, small, larger than the context), soft cap on and off, shuffled block ids with NaN in every unused slot,
// HND and NHD layouts, dense and CSR page tables, LSE; q_len = 1 equals decode; thread counts agree bit for bit;
// every bad argument gets its status and leaves `out` byte-identical.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/kernel_status.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "paged_tables.hpp"

using namespace kvpager;

namespace {

/// Elements stored as raw bits of the dtype; converts through float.
struct tensor {
  std::int32_t dtype;
  std::vector<std::uint32_t> f32;
  std::vector<std::uint16_t> f16;
  tensor(std::int32_t dt, std::size_t n) : dtype(dt) {
    if (dt == KVPAGER_DTYPE_FP32) f32.resize(n); else f16.resize(n);
  }
  void set(std::size_t i, float x) {
    if (dtype == KVPAGER_DTYPE_FP32) f32[i] = std::bit_cast<std::uint32_t>(x);
    else if (dtype == KVPAGER_DTYPE_FP16) f16[i] = detail::float_to_half(x);
    else f16[i] = detail::float_to_bf16(x);
  }
  [[nodiscard]] double get(std::size_t i) const {
    if (dtype == KVPAGER_DTYPE_FP32) return std::bit_cast<float>(f32[i]);
    if (dtype == KVPAGER_DTYPE_FP16) return detail::half_to_float(f16[i]);
    return detail::bf16_to_float(f16[i]);
  }
  [[nodiscard]] std::size_t size() const { return f32.size() + f16.size(); }
  [[nodiscard]] std::size_t bytes() const { return f32.size() * 4 + f16.size() * 2; }
  void* data() { return dtype == KVPAGER_DTYPE_FP32 ? static_cast<void*>(f32.data()) : static_cast<void*>(f16.data()); }
};

double tolerance(std::int32_t dtype) {
  return dtype == KVPAGER_DTYPE_FP32 ? 2e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

struct shape {
  std::int32_t dtype = KVPAGER_DTYPE_FP32, hq = 4, hkv = 4, d = 64, bs = 16;
  std::vector<std::int32_t> lens, q_lens;
  std::int32_t window = -1;
  float cap = 0.0F;
  bool nhd = false, csr = false;
  std::int32_t threads = 0;
};

/// A paged pool filled for `s` (shuffled block ids, NaN in every slot no sequence uses), its page tables and queries.
struct fixture : kvpager_prefill_test::paged_tables {
  shape s;
  std::int64_t rows = 0;
  tensor kv, q;
  paged_kv_view view{};
  fixture(const shape& sh, std::uint32_t seed) : s(sh), kv(sh.dtype, 0), q(sh.dtype, 0) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    static_cast<paged_tables&>(*this) = paged_tables(s.lens, s.q_lens, s.bs, 3, rng);  // 3 unused blocks full of NaN
    kv = tensor(s.dtype, static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(s.hkv * s.bs * s.d));
    for (std::size_t i = 0; i < kv.size(); ++i) kv.set(i, std::numeric_limits<float>::quiet_NaN());
    view = s.nhd ? paged_kv_view::nhd(kv.data(), s.dtype, num_blocks, s.hkv, s.bs, s.d)
                 : paged_kv_view::hnd(kv.data(), s.dtype, num_blocks, s.hkv, s.bs, s.d);
    for (std::int32_t sq = 0; sq < static_cast<std::int32_t>(s.lens.size()); ++sq)
      for (std::int32_t t = 0; t < s.lens[static_cast<std::size_t>(sq)]; ++t)
        for (std::int32_t k = 0; k < 2; ++k)
          for (std::int32_t h = 0; h < s.hkv; ++h)
            for (std::int32_t d = 0; d < s.d; ++d) kv.set(at(sq, t, k, h, d), uni(rng));
    rows = qo.back();
    q = tensor(s.dtype, static_cast<std::size_t>(rows * s.hq * s.d));
    for (std::size_t i = 0; i < q.size(); ++i) q.set(i, uni(rng));
  }
  /// Element index of (sequence, token, K/V, head, dim) in the pool, through the view's strides.
  [[nodiscard]] std::size_t at(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t d) const {
    return static_cast<std::size_t>(block(sq, t, s.bs) * view.stride_block + k * view.stride_kv + h * view.stride_head +
                                    (t % s.bs) * view.stride_token + d);
  }
  [[nodiscard]] float scale() const { return 1.0F / std::sqrt(static_cast<float>(s.d)); }
  [[nodiscard]] prefill_params params(void* out, float* lse) {
    prefill_params p;
    p.out = out;
    p.query = q.data();
    p.lse = lse;
    p.kv = view;
    set_pages(p, s.csr, s.lens);
    p.num_q_heads = s.hq;
    p.scale = scale();
    p.window_left = s.window;
    p.logits_soft_cap = s.cap;
    p.num_threads = s.threads;
    return p;
  }
  /// fp64 reference of row r (of all rows), head h: output[D] and lse.
  void reference(std::int64_t r, std::int32_t h, std::vector<double>& o, double& lse) const {
    std::int32_t sq = 0;
    while (qo[static_cast<std::size_t>(sq) + 1] <= r) ++sq;
    const std::int64_t len = s.lens[static_cast<std::size_t>(sq)];
    const std::int64_t ql = qo[static_cast<std::size_t>(sq) + 1] - qo[static_cast<std::size_t>(sq)];
    const std::int64_t p = len - ql + (r - qo[static_cast<std::size_t>(sq)]);
    const std::int64_t lo = s.window >= 0 ? std::max<std::int64_t>(0, p - s.window) : 0;
    const std::int32_t kh = h / (s.hq / s.hkv);
    std::vector<double> sc;
    double mx = -INFINITY;
    for (std::int64_t j = lo; j <= p; ++j) {
      double dot = 0;
      for (std::int32_t d = 0; d < s.d; ++d)
        dot += q.get(static_cast<std::size_t>((r * s.hq + h) * s.d + d)) * kv.get(at(sq, static_cast<std::int32_t>(j), 0, kh, d));
      double x = dot * static_cast<double>(scale());
      if (s.cap > 0) x = s.cap * std::tanh(x / s.cap);
      sc.push_back(x);
      mx = std::max(mx, x);
    }
    double sum = 0;
    for (double& x : sc) sum += (x = std::exp(x - mx));
    o.assign(static_cast<std::size_t>(s.d), 0.0);
    for (std::int64_t j = lo; j <= p; ++j)
      for (std::int32_t d = 0; d < s.d; ++d)
        o[static_cast<std::size_t>(d)] += sc[static_cast<std::size_t>(j - lo)] / sum * kv.get(at(sq, static_cast<std::int32_t>(j), 1, kh, d));
    lse = mx + std::log(sum);
  }
};

/// Runs the C++ entry point (or the C ABI for HND + dense without LSE when `c_abi`) and returns the worst relative
/// error of output and LSE against the reference.
double run_and_check(const shape& sh, std::uint32_t seed, bool c_abi = false) {
  fixture f(sh, seed);
  tensor out(sh.dtype, f.q.size());
  std::vector<float> lse(static_cast<std::size_t>(f.rows * sh.hq), 123.0F);
  if (c_abi) {
    EXPECT_EQ(kvpager_cpu_paged_attention_prefill(out.data(), f.q.data(), f.kv.data(), f.qo.data(), f.table.data(),
                                                  sh.lens.data(), static_cast<std::int32_t>(sh.lens.size()), sh.hq, sh.hkv,
                                                  sh.d, sh.bs, f.max_blocks, f.num_blocks, f.scale(), sh.window, sh.cap,
                                                  sh.dtype, sh.threads),
              KVPAGER_STATUS_OK);
  } else {
    EXPECT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), lse.data())));
  }
  double worst = 0;
  std::vector<double> o;
  double ref_lse = 0;
  for (std::int64_t r = 0; r < f.rows; ++r)
    for (std::int32_t h = 0; h < sh.hq; ++h) {
      f.reference(r, h, o, ref_lse);
      for (std::int32_t d = 0; d < sh.d; ++d) {
        const double got = out.get(static_cast<std::size_t>((r * sh.hq + h) * sh.d + d));
        if (std::isnan(got)) return INFINITY;
        worst = std::max(worst, std::abs(got - o[static_cast<std::size_t>(d)]) / (1.0 + std::abs(o[static_cast<std::size_t>(d)])));
      }
      if (!c_abi) worst = std::max(worst, std::abs(lse[static_cast<std::size_t>(r * sh.hq + h)] - ref_lse) / (1.0 + std::abs(ref_lse)));
    }
  return worst;
}

TEST(CpuPrefill, MatchesReferenceAcrossDtypesHeadDimsBlockSizesAndHeads) {
  const std::int32_t dims[] = {64, 80, 96, 112, 128, 256};
  const std::int32_t heads[][2] = {{4, 4}, {8, 2}, {6, 1}, {12, 4}};
  const std::int32_t blocks[] = {8, 16, 32};
  std::uint32_t seed = 1;
  for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (std::size_t i = 0; i < std::size(dims); ++i) {
      shape sh;
      sh.dtype = dtype;
      sh.d = dims[i];
      sh.hq = heads[(i + static_cast<std::size_t>(dtype)) % 4][0];
      sh.hkv = heads[(i + static_cast<std::size_t>(dtype)) % 4][1];
      sh.bs = blocks[(i + static_cast<std::size_t>(dtype)) % 3];
      // a whole prompt, a chunk over a cached prefix, a single row, nothing to do, a long prompt past one KV tile
      sh.lens = {37, 70, 9, 12, 100};
      sh.q_lens = {37, 19, 1, 0, 83};
      const double err = run_and_check(sh, seed++, (i % 2) == 0);
      EXPECT_LT(err, tolerance(dtype)) << "dtype " << dtype << " d " << sh.d << " heads " << sh.hq << "/" << sh.hkv
                                       << " block " << sh.bs;
    }
}

TEST(CpuPrefill, WindowsAndSoftCap) {
  std::uint32_t seed = 100;
  for (const std::int32_t window : {-1, 0, 1, 7, 50, 1000})
    // 1e4 and up: tanh of tiny arguments (no cancellation; FLT_MAX: s / cap subnormal, the result s itself)
    for (const float cap : {0.0F, 0.5F, 30.0F, 1.0e4F, 1.0e8F, std::numeric_limits<float>::max()})
      for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16}) {
        shape sh;
        sh.dtype = dtype;
        sh.hq = 8;
        sh.hkv = 2;
        sh.bs = 8;
        sh.d = 64;
        sh.lens = {150, 33, 5};
        sh.q_lens = {90, 33, 2};
        sh.window = window;
        sh.cap = cap;
        const double err = run_and_check(sh, seed++, window == 7);
        EXPECT_LT(err, tolerance(dtype)) << "window " << window << " cap " << cap << " dtype " << dtype;
      }
}

// Issue 21, point 5: a position a row may not attend to (after it, or before its window) never reaches that row's
// output, whatever is stored there. The masked tiles used to add 0 x V over the whole tile, so an inf or NaN at a
// future position turned earlier rows into NaN. For each checked row, every position outside its window is
// poisoned (+inf, -inf or NaN in K and V), and the row must still equal the reference of the clean values.
TEST(CpuPrefill, MaskedPositionsNeverReachARow) {
  std::uint32_t seed = 700;
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (const std::int32_t window : {-1, 6})
      for (const float poison : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
        shape sh;
        sh.dtype = dtype;
        sh.hq = 4;
        sh.hkv = 2;
        sh.bs = 8;
        sh.d = 64;
        sh.lens = {90};
        sh.q_lens = {75};  // a cached prefix of 15 tokens, then rows across two KV tiles
        sh.window = window;
        sh.cap = window < 0 ? 0.0F : 20.0F;
        fixture f(sh, seed++);
        const fixture clean = f;
        for (std::int64_t r = 0; r < f.rows; r += 4) {
          f.kv = clean.kv;
          const std::int64_t pos = sh.lens[0] - sh.q_lens[0] + r;
          kvpager_prefill_test::for_each_masked_position(sh.lens[0], pos, window, [&](std::int32_t j) {
            for (std::int32_t k = 0; k < 2; ++k)
              for (std::int32_t h = 0; h < sh.hkv; ++h)
                for (std::int32_t d = 0; d < sh.d; ++d) f.kv.set(f.at(0, j, k, h, d), poison);
          });
          f.view.data = f.kv.data();
          tensor out(dtype, f.q.size());
          ASSERT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), nullptr)));
          std::vector<double> o;
          double lse = 0;
          for (std::int32_t h = 0; h < sh.hq; ++h) {
            clean.reference(r, h, o, lse);
            for (std::int32_t d = 0; d < sh.d; ++d) {
              const double got = out.get(static_cast<std::size_t>((r * sh.hq + h) * sh.d + d));
              ASSERT_TRUE(std::isfinite(got)) << "row " << r << " saw a poisoned position: dtype " << dtype
                                              << " window " << window << " poison " << poison;
              ASSERT_LT(std::abs(got - o[static_cast<std::size_t>(d)]) / (1.0 + std::abs(o[static_cast<std::size_t>(d)])),
                        tolerance(dtype))
                  << "row " << r << " head " << h << " dtype " << dtype << " window " << window;
            }
          }
        }
      }
}

TEST(CpuPrefill, NhdLayoutCsrTablesLseAndMqa) {
  std::uint32_t seed = 200;
  for (const bool nhd : {false, true})
    for (const bool csr : {false, true})
      for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16}) {
        shape sh;
        sh.dtype = dtype;
        sh.hq = 16;
        sh.hkv = nhd ? 1 : 4;  // MQA: a group of 16 heads in one tile
        sh.d = 128;
        sh.bs = 32;
        sh.lens = {65, 0, 200, 31};
        sh.q_lens = {65, 0, 70, 3};
        sh.nhd = nhd;
        sh.csr = csr;
        sh.window = csr ? 40 : -1;
        EXPECT_LT(run_and_check(sh, seed++), tolerance(dtype)) << "nhd " << nhd << " csr " << csr << " dtype " << dtype;
      }
}

TEST(CpuPrefill, LargeGroupSpansSeveralRegisterTiles) {
  shape sh;
  sh.hq = 64;
  sh.hkv = 1;  // 64 rows per position: more than one tile of rows
  sh.d = 64;
  sh.bs = 16;
  sh.lens = {40};
  sh.q_lens = {5};
  EXPECT_LT(run_and_check(sh, 300), tolerance(sh.dtype));
}

TEST(CpuPrefill, ThreadCountsAgreeBitForBit) {
  shape sh;
  sh.dtype = KVPAGER_DTYPE_BF16;
  sh.hq = 8;
  sh.hkv = 2;
  sh.d = 128;
  sh.lens = {300, 129, 64};
  sh.q_lens = {300, 100, 1};
  fixture f(sh, 400);
  tensor a(sh.dtype, f.q.size()), b(sh.dtype, f.q.size());
  for (const std::int32_t threads : {1, 2, 0}) {
    f.s.threads = threads;
    tensor& out = threads == 1 ? a : b;
    ASSERT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), nullptr)));
    if (threads != 1) {
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0) << threads << " threads";
    }
  }
}

TEST(CpuPrefill, SingleRowEqualsDecode) {
  for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    shape sh;
    sh.dtype = dtype;
    sh.hq = 8;
    sh.hkv = 2;
    sh.d = 128;
    sh.bs = 16;
    sh.lens = {1, 77, 300, 16};
    sh.q_lens = {1, 1, 1, 1};
    fixture f(sh, 500 + static_cast<std::uint32_t>(dtype));
    tensor pre(dtype, f.q.size()), tiled(dtype, f.q.size()), dec(dtype, f.q.size());
    auto prefill = [&](tensor& out, std::int32_t window) {
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
    for (std::size_t i = 0; i < pre.size(); ++i) {
      ASSERT_NEAR(pre.get(i), dec.get(i), ulp * (1.0 + std::abs(dec.get(i)))) << "element " << i << " dtype " << dtype;
      ASSERT_NEAR(tiled.get(i), dec.get(i), ulp * (1.0 + std::abs(dec.get(i)))) << "element " << i << " dtype " << dtype;
    }
  }
}

TEST(CpuPrefill, SingleRowBatchesKeepLseCsrAndNhd) {
  // All q_len = 1 (the decode shortcut) through the C++ entry point: LSE, CSR tables and NHD strides carried over.
  for (const std::int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16}) {
    shape sh;
    sh.dtype = dtype;
    sh.hq = 8;
    sh.hkv = 1;
    sh.d = 96;
    sh.bs = 8;
    sh.lens = {1, 50, 700};
    sh.q_lens = {1, 1, 1};
    sh.nhd = true;
    sh.csr = true;
    EXPECT_LT(run_and_check(sh, 800 + static_cast<std::uint32_t>(dtype)), tolerance(dtype)) << "dtype " << dtype;
  }
}

TEST(CpuPrefill, EmptyBatchAndAllZeroQueryLengths) {
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, 64, 16, 1,
                                                1, 0.125F, -1, 0.0F, 0, 0),
            KVPAGER_STATUS_OK);
  shape sh;
  sh.lens = {20, 0};
  sh.q_lens = {0, 0};
  fixture f(sh, 600);
  float untouched = 5.0F;
  const float query = 1.0F;  // no rows: nothing is read through it, but a batch's pointers are never null
  prefill_params p = f.params(&untouched, nullptr);
  p.query = &query;
  EXPECT_TRUE(paged_attention_prefill_cpu(p));
  EXPECT_EQ(untouched, 5.0F);
}

TEST(CpuPrefill, EveryBadInputGetsItsStatusAndLeavesOutUntouched) {
  shape sh;
  sh.hq = 4;
  sh.hkv = 2;
  sh.lens = {40, 20};
  sh.q_lens = {8, 4};
  fixture f(sh, 700);
  std::vector<float> out(f.q.size(), 7.0F);
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

}  // namespace
