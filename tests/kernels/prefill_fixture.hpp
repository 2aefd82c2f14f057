// SPDX-License-Identifier: Apache-2.0
#pragma once
// One prefill problem for every pool dtype (issue 22, point 3: fp8 is a value of the dtype, not a family of tests):
// a paged pool of kv_dtype (fp32, fp16, bf16, or fp8 E4M3 with per-tensor scales) filled behind shuffled block ids,
// every slot no sequence uses poisoned (NaN, or the e4m3 NaN code), a query of q_dtype, and the fp64 reference from
// the stored (rounded or dequantized) values. Shared by prefill_test.cpp (the suite over every dtype, and the plain
// pools' own tests) and fp8_prefill_test.cpp (the fp8 pools' own tests).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float8.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fp8_problem.hpp"
#include "paged_tables.hpp"

namespace kvpager_prefill_test {

/// A pool dtype and the query/output dtype over it (the pool's own for fp32/fp16/bf16).
struct dtypes {
  std::int32_t kv, q;
};
/// Every combination the CPU prefill runs: the plain pools, and an fp8 pool under each query dtype.
inline std::vector<dtypes> every_dtype() {
  return {{KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP32}, {KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_FP16},
          {KVPAGER_DTYPE_BF16, KVPAGER_DTYPE_BF16}, {KVPAGER_DTYPE_FP8_E4M3, KVPAGER_DTYPE_FP32},
          {KVPAGER_DTYPE_FP8_E4M3, KVPAGER_DTYPE_FP16}, {KVPAGER_DTYPE_FP8_E4M3, KVPAGER_DTYPE_BF16}};
}
inline std::string dtype_name(std::int32_t d) {
  return d == KVPAGER_DTYPE_FP32 ? "fp32" : d == KVPAGER_DTYPE_FP16 ? "fp16" : d == KVPAGER_DTYPE_BF16 ? "bf16" : "fp8";
}
inline std::string name_of(const dtypes& t) {
  return t.kv == t.q ? dtype_name(t.kv) : dtype_name(t.kv) + "_q" + dtype_name(t.q);
}
/// How GoogleTest prints a parameter (in a failure's "where GetParam() = ...").
inline void PrintTo(const dtypes& t, std::ostream* os) { *os << name_of(t); }

/// Output tolerance (relative to 1 + |reference|): the query/output rounding of q_dtype plus fp32 accumulation.
inline double tolerance(std::int32_t q_dtype) {
  return q_dtype == KVPAGER_DTYPE_FP32 ? 2e-5 : q_dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

struct shape {
  std::int32_t kv_dtype = KVPAGER_DTYPE_FP32, q_dtype = KVPAGER_DTYPE_FP32, hq = 4, hkv = 4, d = 64, bs = 16;
  std::vector<std::int32_t> lens, q_lens;
  std::int32_t window = -1;
  float cap = 0.0F, k_scale = 1.0F / 160, v_scale = 1.0F / 224;  ///< the scales: fp8 pools only
  bool nhd = false, csr = false;
  std::int32_t threads = 0;
  shape() = default;
  explicit shape(const dtypes& t) : kv_dtype(t.kv), q_dtype(t.q) {}
  [[nodiscard]] bool fp8() const { return kv_dtype == KVPAGER_DTYPE_FP8_E4M3; }
};

/// A pool filled for `s` (random K/V, quantized with the scales for fp8; shuffled block ids; NaN in every slot no
/// sequence uses), its page tables and a query of q_dtype.
struct fixture : paged_tables {
  shape s;
  std::int64_t rows = 0;
  std::vector<unsigned char> kv, q;
  kvpager::paged_kv_view view{};
  fixture(const shape& sh, std::uint32_t seed) : s(sh) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    static_cast<paged_tables&>(*this) = paged_tables(s.lens, s.q_lens, s.bs, 3, rng);  // 3 unused blocks
    const std::size_t elems = static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(s.hkv * s.bs * s.d);
    kv.assign(elems * kv_elem_bytes(), 0);
    for (std::size_t i = 0; i < elems; ++i) store(i, std::numeric_limits<float>::quiet_NaN());
    view = s.nhd ? kvpager::paged_kv_view::nhd(kv.data(), s.kv_dtype, num_blocks, s.hkv, s.bs, s.d)
                 : kvpager::paged_kv_view::hnd(kv.data(), s.kv_dtype, num_blocks, s.hkv, s.bs, s.d);
    for (std::int32_t sq = 0; sq < static_cast<std::int32_t>(s.lens.size()); ++sq)
      for (std::int32_t t = 0; t < s.lens[static_cast<std::size_t>(sq)]; ++t)
        for (std::int32_t k = 0; k < 2; ++k)
          for (std::int32_t h = 0; h < s.hkv; ++h)
            for (std::int32_t e = 0; e < s.d; ++e) {
              const float x = uni(rng);
              store(at(sq, t, k, h, e), s.fp8() ? x / (k == 0 ? s.k_scale : s.v_scale) : x);
            }
    rows = qo.back();
    q.resize(static_cast<std::size_t>(rows * s.hq * s.d) * kvpager_fp8_test::q_elem_bytes(s.q_dtype));
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows * s.hq * s.d); ++i)
      kvpager_fp8_test::set(q, s.q_dtype, i, uni(rng));
  }
  [[nodiscard]] std::size_t kv_elem_bytes() const {
    return s.fp8() ? 1 : kvpager_fp8_test::q_elem_bytes(s.kv_dtype);
  }
  /// Writes x into pool element i as the pool stores it (for fp8, e4m3(x); NaN stays the NaN code).
  void store(std::size_t i, float x) {
    if (s.fp8()) kv[i] = kvpager::detail::float_to_e4m3(x);
    else kvpager_fp8_test::set(kv, s.kv_dtype, i, x);
  }
  /// Poisons element (sq, t, k, h, e) with x (an fp8 pool has no infinity: every poison is its NaN code there).
  void poison(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t e, float x) {
    if (s.fp8()) kv[at(sq, t, k, h, e)] = kvpager::detail::e4m3_nan_code;
    else store(at(sq, t, k, h, e), x);
  }
  [[nodiscard]] std::size_t out_bytes() const { return q.size(); }
  [[nodiscard]] std::size_t out_elems() const { return static_cast<std::size_t>(rows * s.hq * s.d); }
  /// Pool element index of (sequence, token, K/V, head, dim), through the view's strides.
  [[nodiscard]] std::size_t at(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t e) const {
    return static_cast<std::size_t>(block(sq, t, s.bs) * view.stride_block + k * view.stride_kv + h * view.stride_head +
                                    (t % s.bs) * view.stride_token + e);
  }
  /// The stored value (dequantized for fp8).
  [[nodiscard]] double value(std::int32_t sq, std::int32_t t, std::int32_t k, std::int32_t h, std::int32_t e) const {
    const std::size_t i = at(sq, t, k, h, e);
    if (s.fp8()) return static_cast<double>(kvpager::detail::e4m3_to_float(kv[i])) * (k == 0 ? s.k_scale : s.v_scale);
    return kvpager_fp8_test::get(kv, s.kv_dtype, i);
  }
  [[nodiscard]] double out(const std::vector<unsigned char>& o, std::size_t i) const {
    return kvpager_fp8_test::get(o, s.q_dtype, i);
  }
  [[nodiscard]] float scale() const { return 1.0F / std::sqrt(static_cast<float>(s.d)); }
  [[nodiscard]] kvpager::prefill_params params(void* out, float* lse) const {
    kvpager::prefill_params p;
    p.out = out;
    p.query = q.data();
    p.lse = lse;
    p.kv = view;
    p.kv.data = kv.data();  // this copy's pool
    p.kv.block_size = s.bs;
    set_pages(p, s.csr, s.lens);
    p.num_q_heads = s.hq;
    p.scale = scale();
    p.window_left = s.window;
    p.logits_soft_cap = s.cap;
    p.num_threads = s.threads;
    if (s.fp8()) {
      p.q_dtype = s.q_dtype;
      p.k_scale = s.k_scale;
      p.v_scale = s.v_scale;
    }
    return p;
  }
  /// The C ABI on the dense HND tables: the plain function, or the _fp8 one over an fp8 pool.
  std::int32_t run_c(void* out) const {
    const auto n = static_cast<std::int32_t>(s.lens.size());
    if (s.fp8())
      return kvpager_cpu_paged_attention_prefill_fp8(out, q.data(), kv.data(), qo.data(), table.data(), s.lens.data(),
                                                     n, s.hq, s.hkv, s.d, s.bs, max_blocks, num_blocks, scale(),
                                                     s.window, s.cap, s.q_dtype, s.k_scale, s.v_scale, s.threads);
    return kvpager_cpu_paged_attention_prefill(out, q.data(), kv.data(), qo.data(), table.data(), s.lens.data(), n,
                                               s.hq, s.hkv, s.d, s.bs, max_blocks, num_blocks, scale(), s.window, s.cap,
                                               s.kv_dtype, s.threads);
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
        o[static_cast<std::size_t>(e)] +=
            sc[static_cast<std::size_t>(j - lo)] / sum * value(sq, static_cast<std::int32_t>(j), 1, kh, e);
    lse = mx + std::log(sum);
  }
};

/// The worst relative errors against the reference: of the output (infinity for a NaN) and of the LSE (0 without).
struct prefill_errors {
  double out = 0, lse = 0;
};

/// Runs the C++ entry point (with LSE) or the C ABI (`c_abi`: HND, dense, no LSE) and measures its errors.
inline prefill_errors errors_of(const shape& sh, std::uint32_t seed, bool c_abi = false) {
  const fixture f(sh, seed);
  std::vector<unsigned char> out(f.out_bytes(), 0xAB);
  std::vector<float> lse(static_cast<std::size_t>(f.rows * sh.hq), 123.0F);
  if (c_abi) {
    EXPECT_EQ(f.run_c(out.data()), KVPAGER_STATUS_OK);
  } else {
    EXPECT_TRUE(kvpager::paged_attention_prefill_cpu(f.params(out.data(), lse.data())));
  }
  prefill_errors e;
  std::vector<double> o;
  double ref_lse = 0;
  for (std::int64_t r = 0; r < f.rows; ++r)
    for (std::int32_t h = 0; h < sh.hq; ++h) {
      f.reference(r, h, o, ref_lse);
      for (std::int32_t d = 0; d < sh.d; ++d) {
        const double got = f.out(out, static_cast<std::size_t>((r * sh.hq + h) * sh.d + d));
        const double want = o[static_cast<std::size_t>(d)];
        e.out = std::max(e.out, std::isnan(got) ? INFINITY : std::abs(got - want) / (1.0 + std::abs(want)));
      }
      if (!c_abi) {
        const double got = lse[static_cast<std::size_t>(r * sh.hq + h)];
        e.lse = std::max(e.lse, std::isnan(got) ? INFINITY : std::abs(got - ref_lse) / (1.0 + std::abs(ref_lse)));
      }
    }
  return e;
}

/// The worst relative error of output and LSE together (errors_of).
inline double run_and_check(const shape& sh, std::uint32_t seed, bool c_abi = false) {
  const prefill_errors e = errors_of(sh, seed, c_abi);
  return std::max(e.out, e.lse);
}

}  // namespace kvpager_prefill_test
