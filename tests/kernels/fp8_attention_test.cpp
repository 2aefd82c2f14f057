// SPDX-License-Identifier: Apache-2.0
// fp8 E4M3 KV on the CPU (issue 12, point 3): kvpager_cpu_kv_append_fp8 stores e4m3(x / scale) for every element;
// the decode over an fp8 pool's own tests (the reference checks for every query dtype, head dim, block size and GQA
// ratio, with windows, soft caps, splits, LSE, CSR tables and the NHD layout, are attention_test.cpp's DecodeEveryDtype
// suite, fp8 a value of its dtype parameter): the scales are applied to K and V; bad scales and bad input leave the
// cache and the output byte-identical; the plain functions still refuse dtype 3; the fp8 geometry is sized with one
// byte per element; every code is read exactly; each entry point answers bad input in the documented order.
#include <kvpager/c/kernels.h>
#include <kvpager/core/geometry.hpp>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/can_implement.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/float8.hpp>
#include <kvpager/kernels/kv_layout.hpp>
#include <kvpager/kernels/prefill.hpp>
#include <kvpager/monitor/metrics.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "fp8_problem.hpp"

using namespace kvpager;
using kvpager_fp8_test::fp8_problem;
using kvpager_fp8_test::tolerance;

namespace {

std::vector<unsigned char> run_c(const fp8_problem& pr, int32_t threads, int32_t* rc) {
  std::vector<unsigned char> out(pr.out_bytes(), 0xAB);
  *rc = kvpager_cpu_paged_attention_decode_fp8(out.data(), pr.q.data(), pr.kv.data(), pr.table.data(), pr.lens.data(),
                                               pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb, pr.scale, pr.q_dtype,
                                               pr.k_scale, pr.v_scale, threads);
  return out;
}

decode_params params_of(const fp8_problem& pr, void* out) {
  decode_params p;
  p.out = out;
  p.query = pr.q.data();
  p.kv = paged_kv_view::hnd(pr.kv.data(), KVPAGER_DTYPE_FP8_E4M3, pr.nb, pr.hkv, pr.bs, pr.d);
  p.pages.block_table = pr.table.data();
  p.pages.row_stride = pr.maxb;
  p.pages.seq_lens = pr.lens.data();
  p.num_seqs = pr.S;
  p.num_q_heads = pr.hq;
  p.scale = pr.scale;
  p.q_dtype = pr.q_dtype;
  p.k_scale = pr.k_scale;
  p.v_scale = pr.v_scale;
  return p;
}

}  // namespace

TEST(CpuFp8Append, StoresEveryElementRoundedToNearestEvenAndSkipsNegativeSlots) {
  const int32_t hkv = 2, d = 64, bs = 16, nb = 6, tokens = 7;
  const float ks = 0.0125F, vs = 0.03F;
  const std::vector<int64_t> slots = {5 * bs + 3, -1, 2 * bs, 0, 3 * bs + 15, -7, 4 * bs + 1};
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> uni(-8.0F, 8.0F);  // |x| / ks beyond 448: saturates
  for (const int32_t src : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    std::vector<unsigned char> k(static_cast<std::size_t>(tokens * hkv * d) * kvpager_fp8_test::q_elem_bytes(src)), v(k.size());
    for (std::size_t i = 0; i < static_cast<std::size_t>(tokens * hkv * d); ++i) {
      kvpager_fp8_test::set(k, src, i, uni(rng));
      kvpager_fp8_test::set(v, src, i, i == 5 ? std::numeric_limits<float>::quiet_NaN() : uni(rng));
    }
    std::vector<std::uint8_t> cache(static_cast<std::size_t>(nb * 2 * hkv * bs * d));
    for (auto& b : cache) b = static_cast<std::uint8_t>(rng());
    const auto before = cache;
    ASSERT_EQ(kvpager_cpu_kv_append_fp8(cache.data(), k.data(), v.data(), slots.data(), tokens, hkv, d, bs, nb, src, ks, vs),
              KVPAGER_STATUS_OK);
    std::vector<std::uint8_t> want = before;
    const kv_layout l{nb, hkv, bs, d, 1};
    for (int32_t t = 0; t < tokens; ++t) {
      const int64_t s = slots[static_cast<std::size_t>(t)];
      if (s < 0) continue;
      for (int32_t h = 0; h < hkv; ++h)
        for (int32_t e = 0; e < d; ++e) {
          const std::size_t i = static_cast<std::size_t>((t * hkv + h) * d + e);
          const auto b = static_cast<block_id>(s / bs);
          const auto pos = static_cast<int32_t>(s % bs);
          want[static_cast<std::size_t>(l.offset(b, 0, h, pos)) + static_cast<std::size_t>(e)] =
              detail::float_to_e4m3(static_cast<float>(kvpager_fp8_test::get(k, src, i)) / ks);
          want[static_cast<std::size_t>(l.offset(b, 1, h, pos)) + static_cast<std::size_t>(e)] =
              detail::float_to_e4m3(static_cast<float>(kvpager_fp8_test::get(v, src, i)) / vs);
        }
    }
    EXPECT_EQ(cache, want) << "src dtype " << src;
    EXPECT_NE(cache, before);
    // The NaN value element stayed NaN; saturated elements are +-448.
    const auto nan_at = static_cast<std::size_t>(l.offset(5, 1, 0, 3)) + 5;
    EXPECT_EQ(cache[nan_at] & 0x7F, 0x7F);
  }
}

TEST(CpuFp8Append, BadScalesAndBadInputLeaveTheCacheByteIdentical) {
  const int32_t hkv = 1, d = 64, bs = 8, nb = 2;
  std::vector<float> k(static_cast<std::size_t>(2 * d), 1.0F), v(k);
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(nb * 2 * hkv * bs * d), 0x5A);
  const auto before = cache;
  const std::vector<int64_t> slots = {3, 9}, bad_slots = {3, int64_t{nb} * bs};
  auto call = [&](float ks, float vs, int32_t src = KVPAGER_DTYPE_FP32, const std::vector<int64_t>& sl = {3, 9},
                  int32_t dim = 64, int32_t block = 8, int32_t heads = 1) {
    return kvpager_cpu_kv_append_fp8(cache.data(), k.data(), v.data(), sl.data(), 2, heads, dim, block, nb, src, ks, vs);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const float bad : {0.0F, -0.0F, -1.0F, nan, inf, -inf}) {
    EXPECT_EQ(call(bad, 1.0F), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(call(1.0F, bad), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
  }
  EXPECT_EQ(call(1.0F, 1.0F, 3), KVPAGER_STATUS_UNSUPPORTED_DTYPE) << "fp8 source";
  EXPECT_EQ(call(1.0F, 1.0F, -1), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP32, bad_slots), KVPAGER_STATUS_INVALID_BLOCK) << "second slot outside";
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP32, slots, 72), KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM);
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP32, slots, d, 12), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE);
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP32, slots, d, bs, 0), KVPAGER_STATUS_BAD_HEADS);
  EXPECT_EQ(kvpager_cpu_kv_append_fp8(cache.data(), nullptr, v.data(), slots.data(), 2, hkv, d, bs, nb, 0, 1.0F, 1.0F),
            KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cpu_kv_append_fp8(nullptr, nullptr, nullptr, nullptr, 0, hkv, d, bs, nb, 0, 1.0F, 1.0F),
            KVPAGER_STATUS_OK) << "nothing to do";
  EXPECT_EQ(cache, before);
}

TEST(CpuFp8Decode, PlainFunctionsStillRefuseDtype3AndQueryDtypeMustMatchOtherPools) {
  std::vector<std::uint8_t> buf(4096);
  const int64_t slot = 0;
  const int32_t table = 0, len = 1;
  EXPECT_EQ(kvpager_cpu_kv_append(buf.data(), buf.data(), buf.data(), &slot, 1, 1, 64, 16, 1, KVPAGER_DTYPE_FP8_E4M3),
            KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(kvpager_cpu_paged_attention_decode(buf.data(), buf.data(), buf.data(), &table, &len, 1, 1, 1, 64, 16, 1, 1,
                                               0.1F, KVPAGER_DTYPE_FP8_E4M3, 1),
            KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  // An fp16 pool with an fp32 query: refused (the q_dtype field is for fp8 pools); -1 and kv.dtype are accepted.
  std::vector<std::uint16_t> pool(2 * 16 * 64), q(64), out(64, 0x1234);
  decode_params p;
  p.out = out.data();
  p.query = q.data();
  p.kv = paged_kv_view::hnd(pool.data(), KVPAGER_DTYPE_FP16, 1, 1, 16, 64);
  p.pages.block_table = &table;
  p.pages.row_stride = 1;
  p.pages.seq_lens = &len;
  p.num_seqs = 1;
  p.num_q_heads = 1;
  p.q_dtype = KVPAGER_DTYPE_FP32;
  EXPECT_EQ(paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::uint16_t x) { return x == 0x1234; }));
  p.q_dtype = KVPAGER_DTYPE_FP16;
  EXPECT_TRUE(paged_attention_decode_cpu(p).ok());
  p.q_dtype = -1;
  EXPECT_TRUE(paged_attention_decode_cpu(p).ok());
  // An fp8 pool needs a real query dtype.
  std::vector<std::uint8_t> pool8(2 * 16 * 64);
  p.kv = paged_kv_view::hnd(pool8.data(), KVPAGER_DTYPE_FP8_E4M3, 1, 1, 16, 64);
  EXPECT_EQ(paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_UNSUPPORTED_DTYPE) << "q_dtype -1 over fp8";
  p.q_dtype = KVPAGER_DTYPE_FP16;
  EXPECT_TRUE(paged_attention_decode_cpu(p).ok());
}



TEST(CpuFp8Decode, ScalesAreAppliedToKAndV) {
  // Doubling v_scale doubles the output; a K scale change equals the same change of the softmax scale.
  fp8_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 4, 2, {50, 17}, 9);
  int32_t rc = -1;
  const auto base = run_c(pr, 1, &rc);
  ASSERT_EQ(rc, KVPAGER_STATUS_OK);
  pr.v_scale *= 2;
  const auto twice = run_c(pr, 1, &rc);
  for (std::size_t i = 0; i < pr.out_elems(); ++i)
    EXPECT_NEAR(kvpager_fp8_test::get(twice, pr.q_dtype, i), 2 * kvpager_fp8_test::get(base, pr.q_dtype, i), 1e-5);
  pr.v_scale /= 2;
  pr.k_scale *= 3;
  pr.reference();  // the reference reads the scales too
  const auto k3 = run_c(pr, 1, &rc);
  EXPECT_LE(pr.out_error(k3), tolerance(KVPAGER_DTYPE_FP32));
  EXPECT_GT(fp8_problem(pr).out_error(base), 1e-3) << "a different K scale changes the result";
}

TEST(CpuFp8Decode, BadInputLeavesTheOutputByteIdentical) {
  const fp8_problem pr(KVPAGER_DTYPE_FP16, 64, 16, 4, 2, {40, 20}, 5);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<unsigned char> out(pr.out_bytes(), 0xAB);
  const auto before = out;
  auto call = [&](float ks, float vs, int32_t q_dtype = KVPAGER_DTYPE_FP16, const int32_t* table = nullptr,
                  const int32_t* lens = nullptr, float scale = 0.1F, int32_t hq = 4) {
    return kvpager_cpu_paged_attention_decode_fp8(out.data(), pr.q.data(), pr.kv.data(), table ? table : pr.table.data(),
                                                  lens ? lens : pr.lens.data(), pr.S, hq, pr.hkv, pr.d, pr.bs, pr.maxb,
                                                  pr.nb, scale, q_dtype, ks, vs, 0);
  };
  for (const float bad : {0.0F, -2.0F, nan, inf}) {
    EXPECT_EQ(call(bad, 1.0F), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(call(1.0F, bad), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
  }
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP16, nullptr, nullptr, nan), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP8_E4M3), KVPAGER_STATUS_UNSUPPORTED_DTYPE) << "fp8 query";
  EXPECT_EQ(call(1.0F, 1.0F, 7), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP16, nullptr, nullptr, 0.1F, 3), KVPAGER_STATUS_BAD_HEADS);
  auto table = pr.table;
  table[1] = pr.nb;
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP16, table.data()), KVPAGER_STATUS_INVALID_BLOCK);
  table[1] = -1;
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP16, table.data()), KVPAGER_STATUS_INVALID_BLOCK);
  const std::vector<int32_t> long_lens = {pr.maxb * pr.bs + 1, 20};
  EXPECT_EQ(call(1.0F, 1.0F, KVPAGER_DTYPE_FP16, nullptr, long_lens.data()), KVPAGER_STATUS_SEQ_TOO_LONG);
  EXPECT_EQ(out, before) << "out written on error";
  // The C++ interface: a bad scale, and a workspace too small for the splits asked.
  decode_params p = params_of(pr, out.data());
  p.k_scale = 0.0F;
  EXPECT_EQ(paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  p = params_of(pr, out.data());
  p.num_splits = 4;
  std::vector<float> small(8);
  p.workspace = small.data();
  p.workspace_bytes = 32;
  EXPECT_EQ(paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(out, before);
}

TEST(CpuFp8Decode, BadWindowOrCapOfTheExFunctionLeavesTheOutputByteIdentical) {
  const fp8_problem pr(KVPAGER_DTYPE_BF16, 64, 16, 4, 2, {40, 20}, 6);
  std::vector<unsigned char> out(pr.out_bytes(), 0xAB);
  const auto before = out;
  auto call = [&](int32_t window_left, float cap) {
    return kvpager_cpu_paged_attention_decode_fp8_ex(out.data(), pr.q.data(), pr.kv.data(), pr.table.data(),
                                                     pr.lens.data(), pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb,
                                                     pr.scale, window_left, cap, pr.q_dtype, pr.k_scale, pr.v_scale, 0);
  };
  EXPECT_EQ(call(-2, 0.0F), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(-1, -1.0F), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(-1, std::numeric_limits<float>::quiet_NaN()), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(-1, std::numeric_limits<float>::infinity()), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(out, before) << "out written on error";
  // No sequences: every pointer may be NULL, as for the plain function; a bad window is still refused.
  EXPECT_EQ(kvpager_cpu_paged_attention_decode_fp8_ex(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 64, 16, 1, 4,
                                                      0.1F, 5, 1.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_OK);
  EXPECT_EQ(kvpager_cpu_paged_attention_decode_fp8_ex(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 64, 16, 1, 4,
                                                      0.1F, -3, 0.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 0),
            KVPAGER_STATUS_INVALID_ARGUMENT);
}

TEST(CpuFp8Decode, AppendThenDecodeRoundTrip) {
  // The path an engine takes: kv_append_fp8 with the slot mapping, then decode_fp8 over the same scales; the result
  // matches the reference computed from what append stored.
  const int32_t hq = 8, hkv = 2, d = 128, bs = 16, len = 45, nb = 4;
  const float ks = 0.01F, vs = 0.005F;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
  std::vector<std::uint16_t> k(static_cast<std::size_t>(len * hkv * d)), v(k.size()), q(static_cast<std::size_t>(hq * d));
  for (auto& x : k) x = detail::float_to_bf16(uni(rng));
  for (auto& x : v) x = detail::float_to_bf16(uni(rng));
  for (auto& x : q) x = detail::float_to_bf16(uni(rng));
  const std::vector<int32_t> table = {2, 0, 3};
  std::vector<int64_t> slots(static_cast<std::size_t>(len));
  for (int32_t t = 0; t < len; ++t) slots[static_cast<std::size_t>(t)] = int64_t{table[static_cast<std::size_t>(t / bs)]} * bs + t % bs;
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(nb * 2 * hkv * bs * d), kvpager::detail::e4m3_nan_code);
  ASSERT_EQ(kvpager_cpu_kv_append_fp8(cache.data(), k.data(), v.data(), slots.data(), len, hkv, d, bs, nb,
                                      KVPAGER_DTYPE_BF16, ks, vs),
            KVPAGER_STATUS_OK);
  std::vector<std::uint16_t> out(q.size());
  const int32_t lens = len;
  ASSERT_EQ(kvpager_cpu_paged_attention_decode_fp8(out.data(), q.data(), cache.data(), table.data(), &lens, 1, hq, hkv, d,
                                                   bs, 3, nb, 0.088F, KVPAGER_DTYPE_BF16, ks, vs, 0),
            KVPAGER_STATUS_OK);
  const kv_layout l{nb, hkv, bs, d, 1};
  auto at = [&](int32_t kvi, int32_t h, int32_t t, int32_t e) {
    const auto b = static_cast<block_id>(table[static_cast<std::size_t>(t / bs)]);
    return static_cast<double>(detail::e4m3_to_float(cache[static_cast<std::size_t>(l.offset(b, kvi, h, t % bs) + e)])) *
           (kvi == 0 ? ks : vs);
  };
  double worst = 0, worst_unquantized = 0;
  for (int32_t h = 0; h < hq; ++h) {
    std::vector<double> sc(static_cast<std::size_t>(len)), raw(static_cast<std::size_t>(len));
    for (int32_t t = 0; t < len; ++t) {
      double dot = 0, dot_raw = 0;
      for (int32_t e = 0; e < d; ++e) {
        const double qe = detail::bf16_to_float(q[static_cast<std::size_t>(h * d + e)]);
        dot += qe * at(0, h / 4, t, e);
        dot_raw += qe * detail::bf16_to_float(k[static_cast<std::size_t>((t * hkv + h / 4) * d + e)]);
      }
      sc[static_cast<std::size_t>(t)] = 0.088 * dot;
      raw[static_cast<std::size_t>(t)] = 0.088 * dot_raw;
    }
    auto softmax = [](std::vector<double>& s) {
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (double& x : s) x /= sum;
    };
    softmax(sc);
    softmax(raw);
    for (int32_t e = 0; e < d; ++e) {
      double ref = 0, ref_raw = 0;
      for (int32_t t = 0; t < len; ++t) {
        ref += sc[static_cast<std::size_t>(t)] * at(1, h / 4, t, e);
        ref_raw += raw[static_cast<std::size_t>(t)] * detail::bf16_to_float(v[static_cast<std::size_t>((t * hkv + h / 4) * d + e)]);
      }
      const double got = detail::bf16_to_float(out[static_cast<std::size_t>(h * d + e)]);
      worst = std::max(worst, std::abs(got - ref) / (1 + std::abs(ref)));
      worst_unquantized = std::max(worst_unquantized, std::abs(got - ref_raw));
    }
  }
  EXPECT_LE(worst, tolerance(KVPAGER_DTYPE_BF16));
  // Against the unquantized K/V the error is the fp8 quantization's: small, but not bf16-small.
  EXPECT_LE(worst_unquantized, 0.05);
}

TEST(CpuFp8Geometry, OneBytePerElementEverywhere) {
  const kv_geometry g{64, 16, 8, 128, kv_dtype::fp8_e4m3};
  EXPECT_EQ(elem_bytes(g.dtype), 1);
  EXPECT_TRUE(can_implement(g).ok());
  EXPECT_EQ(kvpager_can_implement(64, 16, 8, 128, KVPAGER_DTYPE_FP8_E4M3), KVPAGER_STATUS_OK);
  EXPECT_EQ(kvpager_can_implement(64, 16, 8, 128, 4), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  const kv_layout l = kv_layout::of(g);
  EXPECT_EQ(l.elem_bytes, 1);
  EXPECT_EQ(l.row_bytes(), 128);
  EXPECT_EQ(l.block_bytes(), 2 * 8 * 16 * 128);
  EXPECT_EQ(l.pool_bytes(), std::int64_t{64} * 2 * 8 * 16 * 128);
  kv_geometry f16 = g;
  f16.dtype = kv_dtype::f16;
  EXPECT_EQ(kv_layout::of(f16).pool_bytes(), 2 * l.pool_bytes());
  EXPECT_EQ(kv_bytes_per_block(g, 32), std::int64_t{2} * 16 * 8 * 128 * 32);
}

TEST(CpuFp8Decode, EveryCodeIsReadExactlyAndNaNPropagates) {
  // The used slots cycle through all 254 finite codes (subnormals, zeros of both signs, +-448), so each path's
  // e4m3 -> fp32 conversion is checked on every code against the reference's (exact) values.
  for (const std::int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16}) {
    fp8_problem pr(q_dtype, 128, 16, 8, 2, {77, 64}, 21, 1.0F / 448, 1.0F / 448);
    std::size_t next = 0;
    for (std::int32_t s = 0; s < pr.S; ++s)
      for (std::int32_t t = 0; t < pr.lens[static_cast<std::size_t>(s)]; ++t)
        for (std::int32_t kvi = 0; kvi < 2; ++kvi)
          for (std::int32_t h = 0; h < pr.hkv; ++h)
            for (std::int32_t e = 0; e < pr.d; ++e) {
              auto code = static_cast<std::uint8_t>(next++ * 37 % 256);
              if ((code & 0x7F) == 0x7F) code = static_cast<std::uint8_t>(code ^ 0x01);  // no NaN here
              pr.kv[pr.index(s, t, kvi, h, e)] = code;
            }
    pr.reference();
    int32_t rc = -1;
    const auto out = run_c(pr, 0, &rc);
    ASSERT_EQ(rc, KVPAGER_STATUS_OK);
    EXPECT_LE(pr.out_error(out), tolerance(q_dtype)) << q_dtype;
    // A NaN code in one V element of a used token: that dimension of the heads reading it is NaN, nothing else.
    pr.kv[pr.index(0, 3, 1, 1, 5)] = kvpager::detail::e4m3_nan_code;
    const auto nan_out = run_c(pr, 0, &rc);
    ASSERT_EQ(rc, KVPAGER_STATUS_OK);
    for (std::int32_t qh = 0; qh < pr.hq; ++qh)
      for (std::int32_t e = 0; e < pr.d; ++e) {
        const double x = kvpager_fp8_test::get(nan_out, q_dtype, static_cast<std::size_t>(qh * pr.d + e));
        EXPECT_EQ(std::isnan(x), qh / 4 == 1 && e == 5) << "head " << qh << " dim " << e;
      }
  }
}

namespace {

/// The documented order of the _fp8 C decode and prefill functions' scalar checks (include/kvpager/c/kernels.h),
/// written out independently of kernels/common/checks.hpp: max_blocks_per_seq, num_seqs and the scales, heads, the fp8
/// pool's geometry (as kvpager_can_implement with dtype 3), q_dtype, then the pointers (null only without sequences).
std::int32_t documented_fp8_answer(std::int32_t maxb, std::int32_t num_seqs, float k_scale, std::int32_t hq,
                                   std::int32_t hkv, std::int32_t dim, std::int32_t bs, std::int32_t blocks,
                                   std::int32_t q_dtype) {
  const auto scale_ok = [](float s) { return std::isfinite(s) && s > 0.0F; };
  if (maxb <= 0 || num_seqs < 0 || !scale_ok(k_scale)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (hkv <= 0 || hq <= 0 || hq % hkv != 0) return KVPAGER_STATUS_BAD_HEADS;
  if (const std::int32_t g = kvpager_can_implement(blocks, bs, hkv, dim, KVPAGER_DTYPE_FP8_E4M3); g != KVPAGER_STATUS_OK)
    return g;
  if (q_dtype < KVPAGER_DTYPE_FP32 || q_dtype > KVPAGER_DTYPE_BF16) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  return num_seqs > 0 ? KVPAGER_STATUS_INVALID_ARGUMENT : KVPAGER_STATUS_OK;  // null pointers
}

}  // namespace

TEST(CpuFp8Decode, EveryEntryPointAnswersEachBadInputInTheDocumentedOrder) {
  // One check per operation, fp8 a dtype value: the _fp8 C functions (forwarders) and the C++ operations over an fp8
  // pool answer every combination of bad fields in the order kernels.h documents, the C++ ones with a query dtype
  // (fp32/fp16/bf16) exactly as the C ones, and the plain C functions answer dtype 3 as can_implement answers a dtype
  // no kernel takes, whatever else is wrong.
  std::int32_t checked = 0;
  for (const std::int32_t maxb : {0, 4})
    for (const std::int32_t num_seqs : {-1, 0, 2})
      for (const float ks : {1.0F, 0.0F, std::numeric_limits<float>::quiet_NaN()})
        for (const std::int32_t hkv : {0, 2})
          for (const std::int32_t bs : {12, 16})
            for (const std::int32_t dim : {100, 64})
              for (const std::int32_t q_dtype : {-1, 0, 1, 2, 3, 9}) {
                const std::int32_t hq = 4, blocks = 8;
                const std::int32_t want = documented_fp8_answer(maxb, num_seqs, ks, hq, hkv, dim, bs, blocks, q_dtype);
                const auto where = ::testing::Message() << maxb << " " << num_seqs << " " << ks << " " << hkv << " "
                                                        << bs << " " << dim << " " << q_dtype;
                EXPECT_EQ(kvpager_cpu_paged_attention_decode_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, num_seqs,
                                                                 hq, hkv, dim, bs, maxb, blocks, 0.1F, q_dtype, ks,
                                                                 1.0F, 1),
                          want)
                    << where;
                EXPECT_EQ(kvpager_cpu_paged_attention_decode_fp8_ex(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                                    num_seqs, hq, hkv, dim, bs, maxb, blocks, 0.1F, -1,
                                                                    0.0F, q_dtype, ks, 1.0F, 1),
                          want)
                    << where;
                EXPECT_EQ(kvpager_cpu_paged_attention_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                                  num_seqs, hq, hkv, dim, bs, maxb, blocks, 0.1F, -1,
                                                                  0.0F, q_dtype, ks, 1.0F, 1),
                          want)
                    << where;
                // The plain functions over dtype 3: can_implement's answer for dtype -1 once the fields before the
                // geometry (max_blocks_per_seq, num_seqs, heads) pass, whatever q_dtype or the scales say.
                const std::int32_t plain =
                    maxb <= 0 || num_seqs < 0 ? KVPAGER_STATUS_INVALID_ARGUMENT
                    : hkv <= 0                ? KVPAGER_STATUS_BAD_HEADS
                                              : kvpager_can_implement(blocks, bs, hkv, dim, -1);
                EXPECT_EQ(kvpager_cpu_paged_attention_decode(nullptr, nullptr, nullptr, nullptr, nullptr, num_seqs, hq,
                                                             hkv, dim, bs, maxb, blocks, 0.1F, KVPAGER_DTYPE_FP8_E4M3, 1),
                          plain)
                    << where;
                EXPECT_EQ(kvpager_cpu_paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                              num_seqs, hq, hkv, dim, bs, maxb, blocks, 0.1F, -1, 0.0F,
                                                              KVPAGER_DTYPE_FP8_E4M3, 1),
                          plain)
                    << where;
                if (maxb > 0 && q_dtype >= KVPAGER_DTYPE_FP32 && q_dtype <= KVPAGER_DTYPE_BF16) {
                  decode_params d;
                  d.kv = paged_kv_view::hnd(nullptr, KVPAGER_DTYPE_FP8_E4M3, blocks, hkv, bs, dim);
                  d.pages.row_stride = maxb;
                  d.num_seqs = num_seqs;
                  d.num_q_heads = hq;
                  d.scale = 0.1F;
                  d.q_dtype = q_dtype;
                  d.k_scale = ks;
                  const status sd = paged_attention_decode_cpu(d);
                  EXPECT_EQ(sd.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(sd.detail()), want) << where;
                  prefill_params p;
                  p.kv = d.kv;
                  p.pages = d.pages;
                  p.num_seqs = num_seqs;
                  p.num_q_heads = hq;
                  p.scale = 0.1F;
                  p.q_dtype = q_dtype;
                  p.k_scale = ks;
                  const status sp = paged_attention_prefill_cpu(p);
                  EXPECT_EQ(sp.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(sp.detail()), want) << where;
                }
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 3 * 3 * 2 * 2 * 2 * 6);
}
