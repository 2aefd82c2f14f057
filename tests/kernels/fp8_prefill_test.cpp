// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill over an fp8 E4M3 pool (issue 12, point 3), the fp8 pools' own tests: q_len 1 equals the fp8 decode
// byte for byte; the fp8 decode with a window and a soft cap equals the single-row prefill; bad scales and bad input get
// their status and leave `out` byte-identical. The reference checks over every dtype, fp8 under each query dtype
// included, are prefill_test.cpp's PrefillEveryDtype suite (one fixture, prefill_fixture.hpp). Runs on every dispatch
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
#include <vector>

#include "prefill_fixture.hpp"

using namespace kvpager;
using kvpager_fp8_test::q_elem_bytes;
using kvpager_prefill_test::dtypes;
using kvpager_prefill_test::fixture;
using kvpager_prefill_test::shape;
using kvpager_prefill_test::tolerance;

namespace {

TEST(CpuFp8Prefill, SingleRowEqualsFp8Decode) {
  for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    shape sh(dtypes{KVPAGER_DTYPE_FP8_E4M3, q_dtype});
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
      shape sh(dtypes{KVPAGER_DTYPE_FP8_E4M3, q_dtype});
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

TEST(CpuFp8Prefill, BadScalesAndBadInputLeaveTheOutputByteIdentical) {
  shape sh(dtypes{KVPAGER_DTYPE_FP8_E4M3, KVPAGER_DTYPE_FP16});
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
