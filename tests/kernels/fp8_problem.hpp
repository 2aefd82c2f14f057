// SPDX-License-Identifier: Apache-2.0
#pragma once
// A decode problem over an fp8 E4M3 KV pool for the fp8 tests (CPU: fp8_attention_test.cpp; CUDA device code on the
// emulation: cuda_emulation_test.cpp): random K/V quantized with per-tensor scales behind shuffled block ids, every
// slot no sequence uses poisoned with the e4m3 NaN code, a query of q_dtype, and the fp64 reference computed from the
// stored (dequantized) fp8 values and the stored (rounded) query.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/float8.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvpager_fp8_test {

inline std::size_t q_elem_bytes(int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 4 : 2; }

/// Element i of a buffer of `dtype` as double.
inline double get(const std::vector<unsigned char>& b, int32_t dtype, std::size_t i) {
  if (dtype == KVPAGER_DTYPE_FP32) {
    float x = 0;
    std::memcpy(&x, b.data() + 4 * i, 4);
    return x;
  }
  std::uint16_t h = 0;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(h) : kvpager::detail::bf16_to_float(h);
}
inline void set(std::vector<unsigned char>& b, int32_t dtype, std::size_t i, float x) {
  if (dtype == KVPAGER_DTYPE_FP32) {
    std::memcpy(b.data() + 4 * i, &x, 4);
  } else {
    const std::uint16_t h = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(x) : kvpager::detail::float_to_bf16(x);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
}

/// Output tolerance (relative to 1 + |reference|) against the fp64 reference: the query/output rounding of q_dtype
/// plus fp32 accumulation.
inline double tolerance(int32_t q_dtype) {
  return q_dtype == KVPAGER_DTYPE_FP32 ? 2e-5 : q_dtype == KVPAGER_DTYPE_FP16 ? 1e-3 : 1.6e-2;
}

struct fp8_problem {
  int32_t q_dtype, d, bs, hq, hkv, S, maxb = 1, nb = 3;
  float scale, k_scale, v_scale;
  std::vector<int32_t> lens, table;
  std::vector<std::uint8_t> kv;
  std::vector<unsigned char> q;
  std::vector<double> ref_out, ref_lse;

  fp8_problem(int32_t q_dtype_, int32_t d_, int32_t bs_, int32_t hq_, int32_t hkv_, std::vector<int32_t> lens_,
              uint32_t seed, float k_scale_ = 1.0F / 160, float v_scale_ = 1.0F / 224)
      : q_dtype(q_dtype_), d(d_), bs(bs_), hq(hq_), hkv(hkv_), S(static_cast<int32_t>(lens_.size())),
        scale(1.0F / std::sqrt(static_cast<float>(d_))), k_scale(k_scale_), v_scale(v_scale_), lens(std::move(lens_)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    for (int32_t len : lens) {
      maxb = std::max(maxb, (len + bs - 1) / bs);
      nb += (len + bs - 1) / bs;
    }
    kv.assign(static_cast<std::size_t>(nb) * block_elems(), kvpager::detail::e4m3_nan_code);
    std::vector<int32_t> ids(static_cast<std::size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(maxb), -1);
    std::size_t next = 0;
    for (int32_t s = 0; s < S; ++s)
      for (int32_t b = 0; b < (lens[static_cast<std::size_t>(s)] + bs - 1) / bs; ++b)
        table[static_cast<std::size_t>(s * maxb + b)] = ids[next++];
    for (int32_t s = 0; s < S; ++s)
      for (int32_t t = 0; t < lens[static_cast<std::size_t>(s)]; ++t)
        for (int32_t kvi = 0; kvi < 2; ++kvi)
          for (int32_t h = 0; h < hkv; ++h)
            for (int32_t e = 0; e < d; ++e)
              kv[index(s, t, kvi, h, e)] = kvpager::detail::float_to_e4m3(uni(rng) / (kvi == 0 ? k_scale : v_scale));
    q.resize(static_cast<std::size_t>(S * hq * d) * q_elem_bytes(q_dtype));
    for (std::size_t i = 0; i < static_cast<std::size_t>(S * hq * d); ++i) set(q, q_dtype, i, uni(rng));
    reference();
  }

  [[nodiscard]] std::size_t block_elems() const { return 2ULL * static_cast<std::size_t>(hkv * bs * d); }
  [[nodiscard]] std::size_t out_elems() const { return static_cast<std::size_t>(S * hq * d); }
  [[nodiscard]] std::size_t out_bytes() const { return out_elems() * q_elem_bytes(q_dtype); }
  /// Pool index of element e of K (kvi 0) or V (1), head h, token t of sequence s.
  [[nodiscard]] std::size_t index(int32_t s, int32_t t, int32_t kvi, int32_t h, int32_t e) const {
    const int32_t blk = table[static_cast<std::size_t>(s * maxb + t / bs)];
    return static_cast<std::size_t>(blk) * block_elems() +
           static_cast<std::size_t>(((kvi * hkv + h) * bs + t % bs) * d + e);
  }
  /// The stored value, dequantized: e4m3 x scale.
  [[nodiscard]] double value(int32_t s, int32_t t, int32_t kvi, int32_t h, int32_t e) const {
    return static_cast<double>(kvpager::detail::e4m3_to_float(kv[index(s, t, kvi, h, e)])) * (kvi == 0 ? k_scale : v_scale);
  }

  void reference() {
    ref_out.assign(out_elems(), 0.0);
    ref_lse.assign(static_cast<std::size_t>(S * hq), -INFINITY);
    const int32_t group = hq / hkv;
    for (int32_t s = 0; s < S; ++s)
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t len = lens[static_cast<std::size_t>(s)];
        if (len == 0) continue;
        std::vector<double> sc(static_cast<std::size_t>(len));
        double mx = -INFINITY;
        for (int32_t t = 0; t < len; ++t) {
          double dot = 0;
          for (int32_t e = 0; e < d; ++e)
            dot += get(q, q_dtype, static_cast<std::size_t>((s * hq + h) * d + e)) * value(s, t, 0, h / group, e);
          sc[static_cast<std::size_t>(t)] = dot * static_cast<double>(scale);
          mx = std::max(mx, sc[static_cast<std::size_t>(t)]);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        ref_lse[static_cast<std::size_t>(s * hq + h)] = mx + std::log(sum);
        for (int32_t e = 0; e < d; ++e) {
          double o = 0;
          for (int32_t t = 0; t < len; ++t) o += sc[static_cast<std::size_t>(t)] / sum * value(s, t, 1, h / group, e);
          ref_out[static_cast<std::size_t>((s * hq + h) * d + e)] = o;
        }
      }
  }

  /// Worst error of an output (and, when given, an LSE) against the reference; NaN counts as infinitely wrong.
  [[nodiscard]] double out_error(const std::vector<unsigned char>& out) const {
    double worst = 0;
    for (std::size_t i = 0; i < out_elems(); ++i) {
      const double got = get(out, q_dtype, i);
      if (std::isnan(got)) return INFINITY;
      worst = std::max(worst, std::abs(got - ref_out[i]) / (1.0 + std::abs(ref_out[i])));
    }
    return worst;
  }
  [[nodiscard]] double lse_error(const std::vector<float>& lse) const {
    double worst = 0;
    for (std::size_t i = 0; i < ref_lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        if (!(std::isinf(lse[i]) && lse[i] < 0)) return INFINITY;
        continue;
      }
      worst = std::max(worst, std::abs(static_cast<double>(lse[i]) - ref_lse[i]) / (1.0 + std::abs(ref_lse[i])));
    }
    return worst;
  }
};

}  // namespace kvpager_fp8_test
