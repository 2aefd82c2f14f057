// SPDX-License-Identifier: Apache-2.0
#pragma once
// The decoder's forward pass on the CPU, fp32 activations, for the tokens of one step (prompt chunks and decode rows
// together), as transformers computes Llama, Qwen2, Mistral and Gemma 2: embedding (Gemma: times sqrt(hidden)), then
// per layer RMSNorm, the q/k/v projections (with Qwen2's biases), RoPE at each token's absolute position, attention
// (Gemma: its scale and soft cap, in the kernels), o_proj (Gemma: RMSNorm of it) and the residual, RMSNorm, the
// SwiGLU MLP (Gemma: gelu-tanh gated, then RMSNorm) and the residual; the final RMSNorm and the LM head only for the
// rows that need logits (Gemma: the final soft cap).
// Every linear layer is one GEMM over all the step's tokens (cblas_sgemm, OpenBLAS). Attention is the caller's: the
// engine's writes K/V through kv_append into the paged pools and runs kvpager's prefill and decode kernels over the
// step's tables; the reference's keeps contiguous K/V per request (engine.hpp, reference.hpp).

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "checkpoint.hpp"

namespace kvgen {

/// Where a forward pass spends its time (seconds, summed over calls).
struct forward_times {
  double gemm_s = 0, attention_s = 0, other_s = 0;
};

/// The inputs of one layer's attention for a step's tokens, fp32, token after token: q [n, heads, head_dim] and
/// k, v [n, kv_heads, head_dim] after RoPE; out [n, heads, head_dim] is to be written.
struct attention_io {
  std::int32_t layer = 0, num_tokens = 0, window_left = -1;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float* out = nullptr;
};

/// RoPE's inverse frequencies as transformers computes them in fp32 (default, linear, llama3).
inline std::vector<float> rope_inv_freq(const model_config& c) {
  const std::int32_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (std::int32_t i = 0; i < half; ++i) {
    const auto e = static_cast<float>(static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
    // In fp32, as transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)).
    inv[static_cast<std::size_t>(i)] = 1.0F / std::pow(static_cast<float>(c.rope.theta), e);
  }
  const rope_config& r = c.rope;
  if (r.type == rope_config::kind::linear) {
    for (float& f : inv) f = static_cast<float>(f / r.factor);
  } else if (r.type == rope_config::kind::llama3) {
    const double low_wavelen = r.original_max_position_embeddings / r.low_freq_factor;
    const double high_wavelen = r.original_max_position_embeddings / r.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      double g = wavelen > low_wavelen ? f / r.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth =
            (r.original_max_position_embeddings / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        g = (1 - smooth) * g / r.factor + smooth * g;
      }
      f = static_cast<float>(g);
    }
  }
  return inv;
}

/// Y[n, out] = X[n, in] W[out, in]^T (+ bias). One row (a decode step of batch 1) is a matrix-vector product: OpenBLAS
/// threads its sgemv but runs a one-row sgemm on one thread (bench/RESULTS.md: 1.9x on 2 cores).
inline void linear(const float* x, std::int32_t n, std::int32_t in, const float* w, const float* bias, std::int32_t out,
                   float* y) {
  if (n == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0F, w, in, x, 1, 0.0F, y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0F, x, in, w, in, 0.0F, y, out);
  if (bias != nullptr)
    for (std::int32_t t = 0; t < n; ++t)
      for (std::int32_t j = 0; j < out; ++j) y[static_cast<std::size_t>(t) * out + j] += bias[j];
}

/// The model over loaded weights; buffers are kept between calls (a warm step allocates nothing).
class transformer {
 public:
  explicit transformer(const model_weights& w) : w_(w), c_(w.config), inv_freq_(rope_inv_freq(w.config)) {}

  [[nodiscard]] const model_config& config() const noexcept { return c_; }
  [[nodiscard]] const forward_times& times() const noexcept { return times_; }

  /// Computes `ids` at `positions` through every layer, calling `attn(const attention_io&) -> std::string` for each
  /// layer's attention; the logits of the rows `logit_rows` (indices into ids) go to `logits` ([rows, vocab]).
  /// Returns "" or the attention's error.
  template <class Attention>
  std::string forward(std::span<const std::int32_t> ids, std::span<const std::int32_t> positions, Attention&& attn,
                      std::span<const std::int32_t> logit_rows, std::vector<float>& logits) {
    using clock = std::chrono::steady_clock;
    const auto n = static_cast<std::int32_t>(ids.size());
    const std::int32_t H = c_.hidden_size, hd = c_.head_dim, nq = c_.num_heads * hd, nkv = c_.num_kv_heads * hd,
                       I = c_.intermediate_size;
    const auto N = static_cast<std::size_t>(n);
    auto t0 = clock::now();
    const auto lap = [&](double& acc) {
      const auto t = clock::now();
      acc += std::chrono::duration<double>(t - t0).count();
      t0 = t;
    };
    x_.resize(N * H);
    h_.resize(N * H);
    q_.resize(N * nq);
    k_.resize(N * nkv);
    v_.resize(N * nkv);
    a_.resize(N * nq);
    g_.resize(N * I);
    u_.resize(N * I);
    for (std::size_t t = 0; t < N; ++t)
      std::copy_n(w_.embed + static_cast<std::size_t>(ids[t]) * H, H, x_.data() + t * H);
    if (c_.gemma) {  // transformers: hidden * torch.tensor(hidden_size ** 0.5, dtype=hidden.dtype)
      const auto normalizer = static_cast<float>(std::sqrt(static_cast<double>(H)));
      for (float& e : x_) e *= normalizer;
    }
    rope_tables(positions);
    lap(times_.other_s);
    for (std::int32_t l = 0; l < c_.num_layers; ++l) {
      const layer_weights& L = w_.layers[static_cast<std::size_t>(l)];
      rms_norm(x_.data(), n, L.input_norm, h_.data());
      lap(times_.other_s);
      linear(h_.data(), n, H, L.wq, L.bq, nq, q_.data());
      linear(h_.data(), n, H, L.wk, L.bk, nkv, k_.data());
      linear(h_.data(), n, H, L.wv, L.bv, nkv, v_.data());
      lap(times_.gemm_s);
      rope(q_.data(), n, c_.num_heads);
      rope(k_.data(), n, c_.num_kv_heads);
      lap(times_.other_s);
      const attention_io io{l, n, c_.window_left[static_cast<std::size_t>(l)], q_.data(), k_.data(), v_.data(), a_.data()};
      if (std::string e = attn(io); !e.empty()) return e;
      lap(times_.attention_s);
      linear(a_.data(), n, nq, L.wo, L.bo, H, h_.data());
      lap(times_.gemm_s);
      if (L.attn_out_norm != nullptr) rms_norm_in_place(h_.data(), n, L.attn_out_norm);
      for (std::size_t i = 0; i < N * H; ++i) x_[i] += h_[i];
      rms_norm(x_.data(), n, L.post_norm, h_.data());
      lap(times_.other_s);
      linear(h_.data(), n, H, L.w_gate, L.b_gate, I, g_.data());
      linear(h_.data(), n, H, L.w_up, L.b_up, I, u_.data());
      lap(times_.gemm_s);
      if (c_.gelu_tanh) {  // gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        const float k0 = std::sqrt(2.0F / std::numbers::pi_v<float>);
        for (std::size_t i = 0; i < N * I; ++i) {
          const float gv = g_[i];
          g_[i] = 0.5F * gv * (1.0F + std::tanh(k0 * (gv + 0.044715F * gv * gv * gv))) * u_[i];
        }
      } else {
        for (std::size_t i = 0; i < N * I; ++i) {
          const float gv = g_[i];
          g_[i] = gv / (1.0F + std::exp(-gv)) * u_[i];
        }
      }
      lap(times_.other_s);
      linear(g_.data(), n, I, L.w_down, L.b_down, H, h_.data());
      lap(times_.gemm_s);
      if (L.mlp_out_norm != nullptr) rms_norm_in_place(h_.data(), n, L.mlp_out_norm);
      for (std::size_t i = 0; i < N * H; ++i) x_[i] += h_[i];
    }
    const auto R = static_cast<std::int32_t>(logit_rows.size());
    sel_.resize(static_cast<std::size_t>(R) * H);
    for (std::int32_t r = 0; r < R; ++r)
      std::copy_n(x_.data() + static_cast<std::size_t>(logit_rows[static_cast<std::size_t>(r)]) * H, H,
                  sel_.data() + static_cast<std::size_t>(r) * H);
    h_.resize(std::max(h_.size(), sel_.size()));
    rms_norm(sel_.data(), R, w_.norm, h_.data());
    lap(times_.other_s);
    logits.resize(static_cast<std::size_t>(R) * c_.vocab_size);
    if (R > 0) linear(h_.data(), R, H, w_.lm_head, nullptr, c_.vocab_size, logits.data());
    if (c_.final_softcap > 0) {  // transformers: logits / cap, tanh, * cap (in fp32)
      const auto cap = static_cast<float>(c_.final_softcap);
      for (float& e : logits) e = std::tanh(e / cap) * cap;
    }
    lap(times_.gemm_s);
    return "";
  }

 private:
  void rms_norm(const float* x, std::int32_t n, const float* weight, float* y) const {
    const std::int32_t H = c_.hidden_size;
    for (std::int32_t t = 0; t < n; ++t) {
      const float* r = x + static_cast<std::size_t>(t) * H;
      double ss = 0;
      for (std::int32_t i = 0; i < H; ++i) ss += static_cast<double>(r[i]) * r[i];
      const auto var = static_cast<float>(ss / H);
      const float inv = 1.0F / std::sqrt(var + static_cast<float>(c_.rms_norm_eps));
      float* o = y + static_cast<std::size_t>(t) * H;
      for (std::int32_t i = 0; i < H; ++i) o[i] = weight[i] * (r[i] * inv);
    }
  }

  /// rms_norm of n rows of x into themselves (a row is read whole before it is written).
  void rms_norm_in_place(float* x, std::int32_t n, const float* weight) {
    tmp_.resize(static_cast<std::size_t>(c_.hidden_size));
    for (std::int32_t t = 0; t < n; ++t) {
      float* r = x + static_cast<std::size_t>(t) * c_.hidden_size;
      rms_norm(r, 1, weight, tmp_.data());
      std::copy(tmp_.begin(), tmp_.end(), r);
    }
  }

  /// cos and sin of every (token, frequency) of the step, fp32 as transformers' rotary embedding gives them.
  void rope_tables(std::span<const std::int32_t> positions) {
    const std::size_t half = inv_freq_.size();
    cos_.resize(positions.size() * half);
    sin_.resize(cos_.size());
    for (std::size_t t = 0; t < positions.size(); ++t)
      for (std::size_t i = 0; i < half; ++i) {
        const float f = static_cast<float>(positions[t]) * inv_freq_[i];
        cos_[t * half + i] = static_cast<float>(std::cos(static_cast<double>(f)));
        sin_[t * half + i] = static_cast<float>(std::sin(static_cast<double>(f)));
      }
  }

  /// Rotates each head's halves (transformers' rotate_half convention).
  void rope(float* x, std::int32_t n, std::int32_t heads) const {
    const std::size_t half = inv_freq_.size(), hd = 2 * half;
    for (std::size_t t = 0; t < static_cast<std::size_t>(n); ++t)
      for (std::size_t h = 0; h < static_cast<std::size_t>(heads); ++h) {
        float* r = x + (t * static_cast<std::size_t>(heads) + h) * hd;
        const float* cs = cos_.data() + t * half;
        const float* sn = sin_.data() + t * half;
        for (std::size_t i = 0; i < half; ++i) {
          const float a = r[i], b = r[i + half];
          r[i] = a * cs[i] - b * sn[i];
          r[i + half] = b * cs[i] + a * sn[i];
        }
      }
  }

  const model_weights& w_;
  const model_config& c_;
  std::vector<float> inv_freq_;
  forward_times times_;
  std::vector<float> x_, h_, q_, k_, v_, a_, g_, u_, sel_, cos_, sin_, tmp_;
};

}  // namespace kvgen
