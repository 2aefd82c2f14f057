// SPDX-License-Identifier: Apache-2.0
#pragma once
// A paged prefill problem with its fp64 reference answer (host only, no CUDA runtime): random K/V/query in the given
// dtype behind shuffled block ids, sequences given as (seq_len, q_len), and the comparison of a backend's output (and
// LSE) with the reference. use_fp8_kv turns it into a problem over an fp8 E4M3 pool (the same K/V quantized with
// per-tensor scales, the reference recomputed from the stored fp8 values). Shared by the CUDA emulation test, the GPU
// tests and the GPU benchmark.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/float8.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace kvpager_gpu_check {

struct prefill_problem {
  int32_t dtype, d, bs, hq, hkv, window_left;
  float cap, scale;
  int32_t S, maxb = 1, nb = 3, rows = 0;
  std::vector<int32_t> lens, indptr, table;
  std::vector<unsigned char> kv, q;
  std::vector<double> ref;  ///< [rows, hq, d]
  std::vector<double> lse;  ///< [rows, hq]: log of each row's softmax denominator (of the scaled, capped scores)
  std::vector<unsigned char> kv8;  ///< the pool in fp8 E4M3 (use_fp8_kv), else empty
  float k_scale = 1.0F, v_scale = 1.0F;

  /// seqs: (seq_len, q_len) per sequence. With reference = false the fp64 answer is not computed (benchmarks).
  prefill_problem(int32_t dtype_, int32_t d_, int32_t bs_, int32_t hq_, int32_t hkv_, int32_t window, float cap_,
                  const std::vector<std::pair<int32_t, int32_t>>& seqs, uint32_t seed, bool reference = true)
      : dtype(dtype_), d(d_), bs(bs_), hq(hq_), hkv(hkv_), window_left(window), cap(cap_),
        scale(1.0F / std::sqrt(static_cast<float>(d_))), S(static_cast<int32_t>(seqs.size())) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    indptr.push_back(0);
    for (const auto& [len, q_len] : seqs) {
      lens.push_back(len);
      indptr.push_back(indptr.back() + q_len);
      maxb = std::max(maxb, (len + bs - 1) / bs);
      nb += (len + bs - 1) / bs;
    }
    rows = indptr.back();
    auto fill = [&](std::vector<unsigned char>& bytes, size_t n) {
      bytes.resize(n * esz());
      for (size_t i = 0; i < n; ++i) {
        const float x = 2.0F * uni(rng);  // wide enough that softmax is not flat
        if (dtype == KVPAGER_DTYPE_FP32) {
          std::memcpy(bytes.data() + 4 * i, &x, 4);
        } else {
          const uint16_t h = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(x) : kvpager::detail::float_to_bf16(x);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
    };
    fill(kv, static_cast<size_t>(nb) * 2 * static_cast<size_t>(hkv) * static_cast<size_t>(bs) * static_cast<size_t>(d));
    fill(q, static_cast<size_t>(rows) * static_cast<size_t>(hq) * static_cast<size_t>(d));
    std::vector<int32_t> ids(static_cast<size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<size_t>(S) * static_cast<size_t>(maxb), 0);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b)
        table[s * static_cast<size_t>(maxb) + static_cast<size_t>(b)] = ids[next++];
    if (reference) compute_reference();
  }

  [[nodiscard]] size_t esz() const { return dtype == KVPAGER_DTYPE_FP32 ? 4 : 2; }
  [[nodiscard]] double value(const std::vector<unsigned char>& bytes, size_t i) const {
    if (dtype == KVPAGER_DTYPE_FP32) {
      float x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      return x;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(h) : kvpager::detail::bf16_to_float(h);
  }
  /// Element index of K (v = 0) or V (v = 1) of KV head h, token j of sequence s, dim 0.
  [[nodiscard]] size_t kv_index(int32_t s, int32_t h, int32_t j, int v) const {
    const auto blk = static_cast<size_t>(table[static_cast<size_t>(s) * static_cast<size_t>(maxb) + static_cast<size_t>(j / bs)]);
    return (((blk * 2 + static_cast<size_t>(v)) * static_cast<size_t>(hkv) + static_cast<size_t>(h)) * static_cast<size_t>(bs) +
            static_cast<size_t>(j % bs)) *
           static_cast<size_t>(d);
  }

  /// Quantizes the pool to fp8 E4M3 with per-tensor scales (K element x stored as e4m3(x / k_scale), V with v_scale,
  /// as kv_append_fp8 stores them) into kv8, and recomputes the reference over the dequantized values.
  void use_fp8_kv(float k_scale_, float v_scale_) {
    k_scale = k_scale_;
    v_scale = v_scale_;
    const size_t n = kv.size() / esz(), half = static_cast<size_t>(hkv) * static_cast<size_t>(bs) * static_cast<size_t>(d);
    kv8.resize(n);
    for (size_t i = 0; i < n; ++i)
      kv8[i] = kvpager::detail::float_to_e4m3(static_cast<float>(value(kv, i)) / ((i / half) % 2 == 0 ? k_scale : v_scale));
    compute_reference();
  }
  /// KV element i (K or V: v) as the backend sees it: the stored value, or the fp8 byte times its scale.
  [[nodiscard]] double kv_value(size_t i, int v) const {
    if (kv8.empty()) return value(kv, i);
    return static_cast<double>(kvpager::detail::e4m3_to_float(kv8[i])) * (v == 0 ? k_scale : v_scale);
  }

  /// Attention of every query row in fp64 over the stored (already rounded) values.
  void compute_reference() {
    ref.assign(static_cast<size_t>(rows) * static_cast<size_t>(hq) * static_cast<size_t>(d), 0.0);
    lse.assign(static_cast<size_t>(rows) * static_cast<size_t>(hq), 0.0);
    const int32_t group = hq / hkv;
    std::vector<double> w;
    for (int32_t s = 0; s < S; ++s) {
      const int32_t q_len = indptr[static_cast<size_t>(s) + 1] - indptr[static_cast<size_t>(s)];
      for (int32_t i = 0; i < q_len; ++i) {
        const int64_t p = int64_t{lens[static_cast<size_t>(s)]} - q_len + i;
        const int64_t lo = window_left >= 0 ? std::max<int64_t>(0, p - window_left) : 0;
        for (int32_t h = 0; h < hq; ++h) {
          const size_t qi = (static_cast<size_t>(indptr[static_cast<size_t>(s)] + i) * static_cast<size_t>(hq) + static_cast<size_t>(h)) *
                            static_cast<size_t>(d);
          w.assign(static_cast<size_t>(p - lo + 1), 0.0);
          double mx = -INFINITY;
          for (int64_t j = lo; j <= p; ++j) {
            const size_t ki = kv_index(s, h / group, static_cast<int32_t>(j), 0);
            double dot = 0;
            for (int32_t e = 0; e < d; ++e) dot += value(q, qi + static_cast<size_t>(e)) * kv_value(ki + static_cast<size_t>(e), 0);
            double sc = dot * static_cast<double>(scale);
            if (cap > 0.0F) sc = cap * std::tanh(sc / cap);
            w[static_cast<size_t>(j - lo)] = sc;
            mx = std::max(mx, sc);
          }
          double sum = 0;
          for (double& x : w) sum += (x = std::exp(x - mx));
          lse[qi / static_cast<size_t>(d)] = mx + std::log(sum);
          for (int64_t j = lo; j <= p; ++j) {
            const size_t vi = kv_index(s, h / group, static_cast<int32_t>(j), 1);
            for (int32_t e = 0; e < d; ++e)
              ref[qi + static_cast<size_t>(e)] += w[static_cast<size_t>(j - lo)] / sum * kv_value(vi + static_cast<size_t>(e), 1);
          }
        }
      }
    }
  }

  /// Worst relative difference |ref - out| / (1 + |ref|) over every output element (NaN counts as 1e9).
  [[nodiscard]] double compare(const std::vector<unsigned char>& out) const {
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double b = value(out, i);
      worst = std::max(worst, std::isnan(b) ? 1e9 : std::abs(ref[i] - b) / (1.0 + std::abs(ref[i])));
    }
    return worst;
  }
  /// Worst |lse_ref - lse| over every (row, head) (NaN counts as 1e9).
  [[nodiscard]] double compare_lse(const std::vector<float>& got) const {
    double worst = got.size() == lse.size() ? 0.0 : 1e9;
    for (size_t i = 0; i < lse.size() && i < got.size(); ++i) {
      const double b = got[i];
      worst = std::max(worst, std::isnan(b) ? 1e9 : std::abs(lse[i] - b));
    }
    return worst;
  }
  /// Multiply-adds of QK^T and PV actually needed (the causal / windowed pairs), as 4 x pairs x hq x d FLOPs.
  [[nodiscard]] double flops() const {
    double pairs = 0;
    for (int32_t s = 0; s < S; ++s) {
      const int32_t q_len = indptr[static_cast<size_t>(s) + 1] - indptr[static_cast<size_t>(s)];
      for (int32_t i = 0; i < q_len; ++i) {
        const int64_t p = int64_t{lens[static_cast<size_t>(s)]} - q_len + i;
        pairs += static_cast<double>(p - (window_left >= 0 ? std::max<int64_t>(0, p - window_left) : 0) + 1);
      }
    }
    return 4.0 * pairs * hq * d;
  }
};

}  // namespace kvpager_gpu_check
