// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill over an fp8 E4M3 pool (issue 12, point 3): kvpager_cpu_paged_attention_prefill_fp8 and
// paged_attention_prefill_cpu with an fp8 view against an fp64 reference computed from the stored (dequantized) fp8
// values and the stored (rounded) query, for every query dtype, head dims, block sizes, MHA/GQA/MQA, q_len 0, 1 and
// == seq_len, sliding windows and soft cap, HND/NHD layouts, dense/CSR tables and LSE; q_len 1 equals the fp8 decode;
// thread counts agree bit for bit; bad scales and bad input get their status and leave `out` byte-identical. Every
// unused pool slot holds the e4m3 NaN code, so a read outside the visible KV shows up as NaN. Runs on every dispatch
// path (tests/CMakeLists.txt: kernels_fp8.<path>_path runs CpuFp8*).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float8.hpp>
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

#include "fp8_problem.hpp"
#include "paged_tables.hpp"

using namespace kvpager;
using kvpager_fp8_test::q_elem_bytes;

namespace {

/// Output tolerance (relative to 1 + |reference|): the query/output rounding of q_dtype plus fp32 accumulation.
double tolerance(std::int32_t q_dtype) {
  return q_dtype == KVPAGER_DTYPE_FP32 ? 2e-5 : q_dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

struct shape {
  std::int32_t q_dtype = KVPAGER_DTYPE_FP32, hq = 4, hkv = 4, d = 64, bs = 16;
  std::vector<std::int32_t> lens, q_lens;
  std::int32_t window = -1;
  float cap = 0.0F, k_scale = 1.0F / 160, v_scale = 1.0F / 224;
  bool nhd = false, csr = false;
  std::int32_t threads = 0;
};

/// An fp8 pool filled for `s` (random K/V quantized with the scales, shuffled block ids, the NaN code in every slot no
/// sequence uses), its page tables and a query of q_dtype.
struct fixture : kvpager_prefill_test::paged_tables {
  shape s;
  std::int64_t rows = 0;
  std::vector<std::uint8_t> kv;
  std::vector<unsigned char> q;
  paged_kv_view view{};
  fixture(const shape& sh, std::uint32_t seed) : s(sh) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    static_cast<paged_tables&>(*this) = paged_tables(s.lens, s.q_lens, s.bs, 3, rng);
    kv.assign(static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(s.hkv * s.bs * s.d),
              detail::e4m3_nan_code);
    view = s.nhd ? paged_kv_view::nhd(kv.data(), KVPAGER_DTYPE_FP8_E4M3, num_blocks, s.hkv, s.bs, s.d)
                 : paged_kv_view::hnd(kv.data(), KVPAGER_DTYPE_FP8_E4M3, num_blocks, s.hkv, s.bs, s.d);
    for (std::int32_t sq = 0; sq < static_cast<std::int32_t>(s.lens.size()); ++sq)
      for (std::int32_t t = 0; t < s.lens[static_cast<std::size_t>(sq)]; ++t)
        for (std::int32_t k = 0; k < 2; ++k)
          for (std::int32_t h = 0; h < s.hkv; ++h)
            for (std::int32_t e = 0; e < s.d; ++e)
              kv[at(sq, t, k, h, e)] = detail::float_to_e4m3(uni(rng) / (k == 0 ? s.k_scale : s.v_scale));
    rows = qo.back();
    q.resize(static_cast<std::size_t>(rows * s.hq * s.d) * q_elem_bytes(s.q_dtype));
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows * s.hq * s.d); ++i)
      kvpager_fp8_test::set(q, s.q_dtype, i, uni(rng));
  }
  [[nodiscard]] std::size_t out_bytes() const { return q.size(); }
  /// Pool index of (sequence, token, K/V, head, dim), through the view's strides.
  [[nodiscard]] std::size_t at(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t e) const {
    return static_cast<std::size_t>(block(sq, t, s.bs) * view.stride_block + k * view.stride_kv + h * view.stride_head +
                                    (t % s.bs) * view.stride_token + e);
  }
  /// The stored value, dequantized.
  [[nodiscard]] double value(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t e) const {
    return static_cast<double>(detail::e4m3_to_float(kv[at(sq, t, k, h, e)])) * (k == 0 ? s.k_scale : s.v_scale);
  }
  [[nodiscard]] float scale() const { return 1.0F / std::sqrt(static_cast<float>(s.d)); }
  [[nodiscard]] prefill_params params(void* out, float* lse) const {
    prefill_params p;
    p.out = out;
    p.query = q.data();
    p.lse = lse;
    p.kv = view;
    p.kv.data = kv.data();  // this copy's pool
    set_pages(p, s.csr, s.lens);
    p.num_q_heads = s.hq;
    p.scale = scale();
    p.window_left = s.window;
    p.logits_soft_cap = s.cap;
    p.num_threads = s.threads;
    p.q_dtype = s.q_dtype;
    p.k_scale = s.k_scale;
    p.v_scale = s.v_scale;
    return p;
  }
  /// The C ABI on the dense HND tables.
  std::int32_t run_c(void* out) const {
    return kvpager_cpu_paged_attention_prefill_fp8(out, q.data(), kv.data(), qo.data(), table.data(), s.lens.data(),
                                                   static_cast<std::int32_t>(s.lens.size()), s.hq, s.hkv, s.d, s.bs,
                                                   max_blocks, num_blocks, scale(), s.window, s.cap, s.q_dtype,
                                                   s.k_scale, s.v_scale, s.threads);
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
      for (std::int32_t e = 0; e < s.d; ++e)
        dot += kvpager_fp8_test::get(q, s.q_dtype, static_cast<std::size_t>((r * s.hq + h) * s.d + e)) *
               value(sq, static_cast<std::int32_t>(j), 0, kh, e);
      double x = dot * static_cast<double>(scale());
      if (s.cap > 0) x = s.cap * std::tanh(x / s.cap);
      sc.push_back(x);
      mx = std::max(mx, x);
    }
    double sum = 0;
    for (double& x : sc) sum += (x = std::exp(x - mx));
    o.assign(static_cast<std::size_t>(s.d), 0.0);
    for (std::int64_t j = lo; j <= p; ++j)
      for (std::int32_t e = 0; e < s.d; ++e)
        o[static_cast<std::size_t>(e)] += sc[static_cast<std::size_t>(j - lo)] / sum * value(sq, static_cast<std::int32_t>(j), 1, kh, e);
    lse = mx + std::log(sum);
  }
};

/// Runs the C++ entry point (with LSE) or the C ABI (`c_abi`: HND, dense, no LSE) and returns the worst relative error
/// of output and LSE against the reference.
double run_and_check(const shape& sh, std::uint32_t seed, bool c_abi = false) {
  const fixture f(sh, seed);
  std::vector<unsigned char> out(f.out_bytes(), 0xAB);
  std::vector<float> lse(static_cast<std::size_t>(f.rows * sh.hq), 123.0F);
  if (c_abi) {
    EXPECT_EQ(f.run_c(out.data()), KVPAGER_STATUS_OK);
  } else {
    EXPECT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), lse.data())));
  }
  double worst = 0;
  std::vector<double> o;
  double ref_lse = 0;
  for (std::int64_t r = 0; r < f.rows; ++r)
    for (std::int32_t h = 0; h < sh.hq; ++h) {
      f.reference(r, h, o, ref_lse);
      for (std::int32_t e = 0; e < sh.d; ++e) {
        const double got = kvpager_fp8_test::get(out, sh.q_dtype, static_cast<std::size_t>((r * sh.hq + h) * sh.d + e));
        if (std::isnan(got)) return INFINITY;
        const double want = o[static_cast<std::size_t>(e)];
        worst = std::max(worst, std::abs(got - want) / (1.0 + std::abs(want)));
      }
      if (!c_abi) {
        const double got = lse[static_cast<std::size_t>(r * sh.hq + h)];
        worst = std::max(worst, std::abs(got - ref_lse) / (1.0 + std::abs(ref_lse)));
      }
    }
  return worst;
}

// Issue 21, point 5 on an fp8 pool: every position outside a checked row's window holds the E4M3 NaN code (the
// format has no infinity) in K and V; the row still equals the reference of the clean values.
TEST(CpuFp8Prefill, MaskedPositionsNeverReachARow) {
  std::uint32_t seed = 7100;
  for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16})
    for (const std::int32_t window : {-1, 6}) {
      shape sh;
      sh.q_dtype = q_dtype;
      sh.hq = 4;
      sh.hkv = 2;
      sh.bs = 8;
      sh.d = 64;
      sh.lens = {90};
      sh.q_lens = {75};
      sh.window = window;
      sh.cap = window < 0 ? 0.0F : 20.0F;
      const fixture clean(sh, seed++);
      for (std::int64_t r = 0; r < clean.rows; r += 4) {
        fixture f = clean;
        const std::int64_t pos = sh.lens[0] - sh.q_lens[0] + r;
        kvpager_prefill_test::for_each_masked_position(sh.lens[0], pos, window, [&](std::int32_t j) {
          for (std::int32_t k = 0; k < 2; ++k)
            for (std::int32_t h = 0; h < sh.hkv; ++h)
              for (std::int32_t e = 0; e < sh.d; ++e) f.kv[f.at(0, j, k, h, e)] = detail::e4m3_nan_code;
        });
        std::vector<unsigned char> out(f.out_bytes(), 0xAB);
        ASSERT_TRUE(paged_attention_prefill_cpu(f.params(out.data(), nullptr)));
        std::vector<double> o;
        double lse = 0;
        for (std::int32_t h = 0; h < sh.hq; ++h) {
          clean.reference(r, h, o, lse);
          for (std::int32_t e = 0; e < sh.d; ++e) {
            const double got = kvpager_fp8_test::get(out, q_dtype, static_cast<std::size_t>((r * sh.hq + h) * sh.d + e));
            ASSERT_TRUE(std::isfinite(got)) << "row " << r << " saw a poisoned position: window " << window;
            ASSERT_LT(std::abs(got - o[static_cast<std::size_t>(e)]) / (1.0 + std::abs(o[static_cast<std::size_t>(e)])),
                      tolerance(q_dtype))
                << "row " << r << " head " << h << " window " << window;
          }
        }
      }
    }
}

TEST(CpuFp8Prefill, MatchesTheReferenceFromStoredValuesAcrossShapes) {
#if defined(KVPAGER_TEST_REDUCED)
  const std::int32_t dims[] = {64, 128};
#else
  const std::int32_t dims[] = {64, 80, 96, 128, 256};
#endif
  const std::int32_t heads[][2] = {{4, 4}, {8, 2}, {6, 1}, {12, 4}};
  const std::int32_t blocks[] = {8, 16, 32};
  const float scales[][2] = {{1.0F / 160, 1.0F / 224}, {0.02F, 0.5F / 448}, {1.0F, 1.0F / 400}};
  std::uint32_t seed = 1;
  for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (std::size_t i = 0; i < std::size(dims); ++i) {
      const std::size_t pick = i + static_cast<std::size_t>(q_dtype);
      shape sh;
      sh.q_dtype = q_dtype;
      sh.d = dims[i];
      sh.hq = heads[pick % 4][0];
      sh.hkv = heads[pick % 4][1];
      sh.bs = blocks[pick % 3];
      sh.k_scale = scales[pick % 3][0];
      sh.v_scale = scales[pick % 3][1];
      // a whole prompt, a chunk over a cached prefix, a single row, nothing to do, a long chunk past one KV tile
      sh.lens = {37, 70, 9, 12, 100};
      sh.q_lens = {37, 19, 1, 0, 83};
      EXPECT_LT(run_and_check(sh, seed++, (i % 2) == 0), tolerance(q_dtype))
          << "q_dtype " << q_dtype << " d " << sh.d << " heads " << sh.hq << "/" << sh.hkv << " block " << sh.bs;
    }
}

TEST(CpuFp8Prefill, WindowsAndSoftCap) {
#if defined(KVPAGER_TEST_REDUCED)
  const std::int32_t windows[] = {-1, 0, 7};
#else
  const std::int32_t windows[] = {-1, 0, 1, 7, 50, 1000};
#endif
  std::uint32_t seed = 100;
  for (const std::int32_t window : windows)
    for (const float cap : {0.0F, 0.5F, 30.0F}) {
      shape sh;
      sh.q_dtype = (seed % 2) == 0 ? KVPAGER_DTYPE_FP32 : KVPAGER_DTYPE_BF16;
      sh.hq = 8;
      sh.hkv = 2;
      sh.bs = 8;
      sh.lens = {150, 33, 5};
      sh.q_lens = {90, 33, 2};
      sh.window = window;
      sh.cap = cap;
      EXPECT_LT(run_and_check(sh, seed, window == 7), tolerance(sh.q_dtype))
          << "window " << window << " cap " << cap << " q_dtype " << sh.q_dtype;
      ++seed;
    }
}

TEST(CpuFp8Prefill, NhdLayoutCsrTablesLseAndMqa) {
  std::uint32_t seed = 200;
  for (const bool nhd : {false, true})
    for (const bool csr : {false, true}) {
      shape sh;
      sh.q_dtype = nhd ? KVPAGER_DTYPE_FP16 : KVPAGER_DTYPE_FP32;
      sh.hq = 16;
      sh.hkv = nhd ? 1 : 4;  // MQA: a group of 16 heads in one tile
      sh.d = 128;
      sh.bs = 32;
      sh.lens = {65, 0, 200, 31};
      sh.q_lens = {65, 0, 70, 3};
      sh.nhd = nhd;
      sh.csr = csr;
      sh.window = csr ? 40 : -1;
      sh.cap = nhd ? 20.0F : 0.0F;
      EXPECT_LT(run_and_check(sh, seed++), tolerance(sh.q_dtype)) << "nhd " << nhd << " csr " << csr;
    }
}

TEST(CpuFp8Prefill, ThreadCountsAgreeBitForBit) {
  shape sh;
  sh.q_dtype = KVPAGER_DTYPE_BF16;
  sh.hq = 8;
  sh.hkv = 2;
  sh.d = 128;
  sh.lens = {300, 129, 64};
  sh.q_lens = {300, 100, 1};
  fixture f(sh, 400);
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

TEST(CpuFp8Prefill, SingleRowEqualsFp8Decode) {
  for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    shape sh;
    sh.q_dtype = q_dtype;
    sh.hq = 8;
    sh.hkv = 2;
    sh.d = 128;
    sh.bs = 16;
    sh.lens = {1, 77, 300, 16};
    sh.q_lens = {1, 1, 1, 1};
    const fixture f(sh, 500 + static_cast<std::uint32_t>(q_dtype));
    std::vector<unsigned char> dec(f.out_bytes(), 0xCD), pre(f.out_bytes(), 0xAB), tiled(f.out_bytes(), 0x11);
    ASSERT_EQ(kvpager_cpu_paged_attention_decode_fp8(dec.data(), f.q.data(), f.kv.data(), f.table.data(),
                                                     sh.lens.data(), 4, sh.hq, sh.hkv, sh.d, sh.bs, f.max_blocks,
                                                     f.num_blocks, f.scale(), q_dtype, sh.k_scale, sh.v_scale, 0),
              KVPAGER_STATUS_OK);
    // One row per sequence, no window or cap: the fp8 decode kernel itself, so the same bytes.
    ASSERT_EQ(f.run_c(pre.data()), KVPAGER_STATUS_OK);
    EXPECT_EQ(std::memcmp(dec.data(), pre.data(), dec.size()), 0) << "q_dtype " << q_dtype;
    // A window wider than every sequence changes nothing but takes the tiled kernel: equal within rounding.
    fixture g = f;
    g.s.window = 1000;
    ASSERT_EQ(g.run_c(tiled.data()), KVPAGER_STATUS_OK);
    double worst = 0;
    for (std::size_t i = 0; i < dec.size() / q_elem_bytes(q_dtype); ++i) {
      const double x = kvpager_fp8_test::get(dec, q_dtype, i), y = kvpager_fp8_test::get(tiled, q_dtype, i);
      worst = std::isnan(y) ? INFINITY : std::max(worst, std::abs(x - y) / (1.0 + std::abs(x)));
    }
    EXPECT_LT(worst, tolerance(q_dtype)) << "q_dtype " << q_dtype;
  }
}

// The fp8 decode (C++: decode_params over an fp8 view) takes a window and a soft cap: it equals the tiled prefill of
// one row per sequence with the same window and cap (checked against the reference above), splits and LSE included.
TEST(CpuFp8Prefill, DecodeWithWindowAndCapEqualsSingleRowPrefill) {
  struct variant {
    std::int32_t window;
    float cap;
    std::int32_t splits;
  };
  const variant variants[] = {{0, 0.0F, 1}, {37, 0.0F, 3}, {-1, 2.0F, 1}, {1000, 30.0F, 0}, {100, 1.0F, 2}};
  std::uint32_t seed = 800;
  for (const variant& v : variants)
    for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16}) {
      shape sh;
      sh.q_dtype = q_dtype;
      sh.hq = 8;
      sh.hkv = 2;
      sh.d = 128;
      sh.lens = {1, 17, 300, 130};
      sh.q_lens = {1, 1, 1, 1};
      sh.window = v.window;
      sh.cap = v.cap;
      const fixture f(sh, seed++);
      std::vector<unsigned char> pre(f.out_bytes(), 0xAB), dec(f.out_bytes(), 0xCD);
      std::vector<float> pre_lse(static_cast<std::size_t>(4 * sh.hq)), dec_lse(pre_lse.size());
      ASSERT_TRUE(paged_attention_prefill_cpu(f.params(pre.data(), pre_lse.data())));
      decode_params d;
      d.out = dec.data();
      d.query = f.q.data();
      d.lse = dec_lse.data();
      d.kv = f.view;
      d.pages.block_table = f.table.data();
      d.pages.row_stride = f.max_blocks;
      d.pages.seq_lens = sh.lens.data();
      d.num_seqs = 4;
      d.num_q_heads = sh.hq;
      d.scale = f.scale();
      d.num_splits = v.splits;
      d.window_left = v.window;
      d.logits_soft_cap = v.cap;
      d.q_dtype = q_dtype;
      d.k_scale = sh.k_scale;
      d.v_scale = sh.v_scale;
      const auto what = ::testing::Message() << "window " << v.window << " cap " << v.cap << " splits " << v.splits
                                             << " q_dtype " << q_dtype;
      ASSERT_TRUE(paged_attention_decode_cpu(d)) << what;
      double worst = 0;
      for (std::size_t i = 0; i < dec.size() / q_elem_bytes(q_dtype); ++i) {
        const double x = kvpager_fp8_test::get(pre, q_dtype, i), y = kvpager_fp8_test::get(dec, q_dtype, i);
        worst = std::isnan(y) ? INFINITY : std::max(worst, std::abs(x - y) / (1.0 + std::abs(x)));
      }
      EXPECT_LT(worst, tolerance(q_dtype)) << what;
      for (std::size_t i = 0; i < pre_lse.size(); ++i)
        EXPECT_NEAR(dec_lse[i], pre_lse[i], 1e-4 * (1.0 + std::abs(pre_lse[i]))) << what << " lse " << i;
      // A bad window or cap is refused before anything is written.
      const auto before = dec;
      d.window_left = -2;
      EXPECT_EQ(static_cast<std::int32_t>(paged_attention_decode_cpu(d).detail()), KVPAGER_STATUS_INVALID_ARGUMENT);
      d.window_left = v.window;
      d.logits_soft_cap = -1.0F;
      EXPECT_EQ(static_cast<std::int32_t>(paged_attention_decode_cpu(d).detail()), KVPAGER_STATUS_INVALID_ARGUMENT);
      EXPECT_EQ(dec, before) << what;
    }
}

TEST(CpuFp8Prefill, EmptyBatchAndAllZeroQueryLengths) {
  shape sh;
  sh.lens = {20, 5};
  sh.q_lens = {0, 0};
  const fixture f(sh, 600);
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, 64,
                                                    16, 1, 1, 0.1F, -1, 0.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_OK);
  unsigned char sentinel = 0x5A;  // no rows: neither query nor out is touched
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill_fp8(&sentinel, &sentinel, f.kv.data(), f.qo.data(), f.table.data(),
                                                    f.s.lens.data(), 2, 4, 4, 64, 16, f.max_blocks, f.num_blocks, 0.1F,
                                                    -1, 0.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_OK);
  EXPECT_EQ(sentinel, 0x5A);
}

TEST(CpuFp8Prefill, BadScalesAndBadInputLeaveTheOutputByteIdentical) {
  shape sh;
  sh.q_dtype = KVPAGER_DTYPE_FP16;
  sh.hq = 4;
  sh.hkv = 2;
  sh.lens = {40, 17};
  sh.q_lens = {8, 17};
  const fixture base(sh, 700);
  struct bad {
    const char* what;
    std::int32_t want;
    void (*edit)(fixture&);
  };
  const bad cases[] = {
      {"k_scale 0", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.k_scale = 0.0F; }},
      {"k_scale negative", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.k_scale = -0.5F; }},
      {"k_scale NaN", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.k_scale = std::nanf(""); }},
      {"v_scale 0", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.v_scale = 0.0F; }},
      {"v_scale inf", KVPAGER_STATUS_INVALID_ARGUMENT,
       [](fixture& f) { f.s.v_scale = std::numeric_limits<float>::infinity(); }},
      {"q_dtype fp8", KVPAGER_STATUS_UNSUPPORTED_DTYPE, [](fixture& f) { f.s.q_dtype = KVPAGER_DTYPE_FP8_E4M3; }},
      {"q_dtype 7", KVPAGER_STATUS_UNSUPPORTED_DTYPE, [](fixture& f) { f.s.q_dtype = 7; }},
      {"window -2", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.window = -2; }},
      {"cap negative", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.cap = -1.0F; }},
      {"cap NaN", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.cap = std::nanf(""); }},
      {"qo_indptr[0] != 0", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.qo[0] = 1; }},
      {"decreasing qo_indptr", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.qo[1] = 30; }},
      {"q_len above seq_len", KVPAGER_STATUS_INVALID_ARGUMENT, [](fixture& f) { f.s.lens[1] = 16; }},
      {"seq too long", KVPAGER_STATUS_SEQ_TOO_LONG, [](fixture& f) { f.s.lens[0] = f.max_blocks * f.s.bs + 1; }},
      {"block id out of range", KVPAGER_STATUS_INVALID_BLOCK, [](fixture& f) { f.table[1] = f.num_blocks; }},
      {"negative block id", KVPAGER_STATUS_INVALID_BLOCK,
       [](fixture& f) { f.table[static_cast<std::size_t>(f.max_blocks)] = -1; }},
      {"bad heads", KVPAGER_STATUS_BAD_HEADS, [](fixture& f) { f.s.hq = 3; }},
      {"block size 12", KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE, [](fixture& f) { f.s.bs = 12; }},
  };
  for (const bad& c : cases)
    for (const bool cxx : {false, true}) {
      fixture f = base;
      c.edit(f);
      f.view.block_size = f.s.bs;
      std::vector<unsigned char> out(base.out_bytes(), 0xAB);
      const auto before = out;
      const std::vector<std::uint8_t> kv_before = f.kv;
      std::int32_t rc = 0;
      if (cxx) {
        const status st = paged_attention_prefill_cpu(f.params(out.data(), nullptr));
        rc = st.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(st.detail());
      } else {
        rc = f.run_c(out.data());
      }
      EXPECT_EQ(rc, c.want) << c.what << (cxx ? " (C++)" : " (C)");
      EXPECT_EQ(std::memcmp(out.data(), before.data(), out.size()), 0) << c.what << (cxx ? " (C++)" : " (C)");
      EXPECT_EQ(f.kv, kv_before) << c.what;
    }
  // Null pointers (C ABI) and, in C++, an fp8 pool without a query dtype or a plain pool with a different one.
  std::vector<unsigned char> out(base.out_bytes(), 0xAB);
  const auto before = out;
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill_fp8(out.data(), base.q.data(), nullptr, base.qo.data(),
                                                    base.table.data(), base.s.lens.data(), 2, 4, 2, 64, 16,
                                                    base.max_blocks, base.num_blocks, 0.1F, -1, 0.0F,
                                                    KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill_fp8(out.data(), base.q.data(), base.kv.data(), base.qo.data(),
                                                    base.table.data(), base.s.lens.data(), 2, 4, 2, 64, 16, 0,
                                                    base.num_blocks, 0.1F, -1, 0.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_INVALID_ARGUMENT)
      << "max_blocks_per_seq 0";
  prefill_params p = base.params(out.data(), nullptr);
  p.q_dtype = -1;
  EXPECT_EQ(static_cast<std::int32_t>(paged_attention_prefill_cpu(p).detail()), KVPAGER_STATUS_UNSUPPORTED_DTYPE)
      << "fp8 pool, q_dtype -1";
  p.q_dtype = KVPAGER_DTYPE_FP16;
  p.kv.dtype = KVPAGER_DTYPE_BF16;
  EXPECT_EQ(static_cast<std::int32_t>(paged_attention_prefill_cpu(p).detail()), KVPAGER_STATUS_UNSUPPORTED_DTYPE)
      << "bf16 pool, fp16 query";
  // The plain prefill still refuses an fp8 pool.
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill(out.data(), base.q.data(), base.kv.data(), base.qo.data(),
                                                base.table.data(), base.s.lens.data(), 2, 4, 2, 64, 16, base.max_blocks,
                                                base.num_blocks, 0.1F, -1, 0.0F, KVPAGER_DTYPE_FP8_E4M3, 0),
            KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(std::memcmp(out.data(), before.data(), out.size()), 0);
  // And the unchanged call is good (so every refusal above was for its one bad field).
  EXPECT_EQ(base.run_c(out.data()), KVPAGER_STATUS_OK);
  EXPECT_NE(std::memcmp(out.data(), before.data(), out.size()), 0);
}

}  // namespace
