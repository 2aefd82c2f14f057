// SPDX-License-Identifier: Apache-2.0
#pragma once
// A decode attention problem with its CPU-backend answer (host only, no CUDA runtime): random K/V/query in the
// given dtype behind shuffled block ids, the CPU result with the same split count, and the comparison of another
// backend's output with it. Shared by the GPU comparisons (cuda_compare.hpp) and the CUDA emulation test.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvpager_gpu_check {

/// Tolerances of GPU against CPU outputs (both fp32-accumulated; fp16 a little above one rounding).
inline double gpu_tolerance(int32_t dtype) {
  return dtype == KVPAGER_DTYPE_FP32 ? 1e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

struct gpu_vs_cpu {
  bool calls_ok = true;  ///< every call returned OK and the device error flag stayed 0
  double out = 0, lse = 0;
};

struct decode_problem {
  int32_t dtype, d, bs, hq, hkv, splits, S, maxb = 1, nb = 3;
  float scale;
  int32_t window_left = -1;    ///< decode_params::window_left
  float logits_soft_cap = 0;   ///< decode_params::logits_soft_cap
  std::vector<int32_t> lens, table;
  std::vector<unsigned char> kv, q, cpu_out;
  std::vector<float> cpu_lse;
  bool cpu_ok = false;

  decode_problem(int32_t dtype_, int32_t d_, int32_t bs_, int32_t hq_, int32_t hkv_, std::vector<int32_t> lens_,
                 int32_t splits_, uint32_t seed, int32_t window_left_ = -1, float logits_soft_cap_ = 0.0F)
      : dtype(dtype_), d(d_), bs(bs_), hq(hq_), hkv(hkv_), splits(splits_), S(static_cast<int32_t>(lens_.size())),
        scale(1.0F / std::sqrt(static_cast<float>(d_))), window_left(window_left_), logits_soft_cap(logits_soft_cap_),
        lens(std::move(lens_)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    for (int32_t len : lens) {
      maxb = std::max(maxb, (len + bs - 1) / bs);
      nb += (len + bs - 1) / bs;
    }
    auto fill = [&](std::vector<unsigned char>& bytes, size_t n) {
      bytes.resize(n * esz());
      for (size_t i = 0; i < n; ++i) {
        const float x = uni(rng);
        if (dtype == KVPAGER_DTYPE_FP32) {
          std::memcpy(bytes.data() + 4 * i, &x, 4);
        } else {
          const uint16_t h = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(x) : kvpager::detail::float_to_bf16(x);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
    };
    fill(kv, static_cast<size_t>(nb) * 2 * static_cast<size_t>(hkv * bs * d));
    fill(q, static_cast<size_t>(S) * static_cast<size_t>(hq * d));
    std::vector<int32_t> ids(static_cast<size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<size_t>(S) * static_cast<size_t>(maxb), 0);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[s * static_cast<size_t>(maxb) + static_cast<size_t>(b)] = ids[next++];
    cpu_out.resize(q.size());
    cpu_lse.resize(static_cast<size_t>(S) * static_cast<size_t>(hq));
    cpu_ok = kvpager::paged_attention_decode_cpu(params(cpu_out.data(), cpu_lse.data())).ok();
  }
  /// The CPU decode of this problem writing `out` (and `lse` unless null), with the problem's split count.
  [[nodiscard]] kvpager::decode_params params(void* out, float* lse) const {
    kvpager::decode_params p;
    p.out = out;
    p.query = q.data();
    p.lse = lse;
    p.kv = kvpager::paged_kv_view::hnd(kv.data(), dtype, nb, hkv, bs, d);
    p.pages.block_table = table.data();
    p.pages.row_stride = maxb;
    p.pages.seq_lens = lens.data();
    p.num_seqs = S;
    p.num_q_heads = hq;
    p.scale = scale;
    p.window_left = window_left;
    p.logits_soft_cap = logits_soft_cap;
    p.num_splits = splits;
    return p;
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
  /// Worst relative differences of `out` (same layout and dtype as the query) and of `lse` unless it is empty.
  [[nodiscard]] gpu_vs_cpu compare(const std::vector<unsigned char>& out, const std::vector<float>& lse) const {
    gpu_vs_cpu worst;
    worst.calls_ok = cpu_ok;
    for (size_t i = 0; i < cpu_out.size() / esz(); ++i) {
      const double a = value(cpu_out, i), b = value(out, i);
      worst.out = std::max(worst.out, std::isnan(b) ? 1e9 : std::abs(a - b) / (1.0 + std::abs(a)));
    }
    for (size_t i = 0; !lse.empty() && i < cpu_lse.size(); ++i) {
      if (std::isinf(cpu_lse[i])) {
        if (!std::isinf(lse[i])) worst.lse = 1e9;
        continue;
      }
      worst.lse = std::max(worst.lse, std::abs(double{cpu_lse[i]} - lse[i]) / (1.0 + std::abs(cpu_lse[i])));
    }
    return worst;
  }
};

}  // namespace kvpager_gpu_check
