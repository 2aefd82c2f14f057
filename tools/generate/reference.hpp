// SPDX-License-Identifier: Apache-2.0
#pragma once
// --reference: the same model, one sample at a time, over contiguous K/V with plain attention and no kvpager cache,
// scheduler or kernel: the prompt in one forward pass, then one token per pass. K/V (and, for fp16/bf16 pools, the
// queries and outputs) are rounded as the engine's pool stores them, so the two differ only in summation order and
// any difference beyond fp32 rounding is the cache's or the kernels' fault. Then the engine's outputs are compared
// with it: identical tokens (a divergence accepted only where the engine's two best logits are within the
// tolerance) and logits within the tolerance.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"
#include "paged_attention.hpp"
#include "results.hpp"

namespace kvgen {

/// Causal attention of one sequence over its contiguous K/V, fp32 (double accumulation).
class contiguous_attention {
 public:
  contiguous_attention(const model_config& c, io_dtype dt, float k_scale, float v_scale)
      : c_(c), dt_(dt), k_scale_(k_scale), v_scale_(v_scale), k_(static_cast<std::size_t>(c.num_layers)),
        v_(static_cast<std::size_t>(c.num_layers)) {}

  void reset() {
    for (auto& x : k_) x.clear();
    for (auto& x : v_) x.clear();
  }

  std::string operator()(const attention_io& io) {
    const std::size_t hd = static_cast<std::size_t>(c_.head_dim), nkv = c_.num_kv_heads * hd, nq = c_.num_heads * hd;
    const std::size_t group = static_cast<std::size_t>(c_.num_heads / c_.num_kv_heads);
    std::vector<float>& K = k_[static_cast<std::size_t>(io.layer)];
    std::vector<float>& V = v_[static_cast<std::size_t>(io.layer)];
    const std::size_t past = K.size() / nkv, n = static_cast<std::size_t>(io.num_tokens);
    for (std::size_t i = 0; i < n * nkv; ++i) {
      K.push_back(dt_.round(io.k[i], k_scale_));
      V.push_back(dt_.round(io.v[i], v_scale_));
    }
    const double scale = c_.attn_scale, cap = c_.attn_softcap;
    std::vector<double> s, o(hd);
    std::vector<float> q(hd);
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t p = past + t;
      const std::size_t lo = io.window_left >= 0 && p > static_cast<std::size_t>(io.window_left)
                                 ? p - static_cast<std::size_t>(io.window_left)
                                 : 0;
      for (std::size_t h = 0; h < static_cast<std::size_t>(c_.num_heads); ++h) {
        const std::size_t kh = h / group;
        for (std::size_t d = 0; d < hd; ++d) q[d] = dt_.half() ? dt_.round(io.q[t * nq + h * hd + d], 1) : io.q[t * nq + h * hd + d];
        s.assign(p + 1 - lo, 0.0);
        double mx = -INFINITY;
        for (std::size_t j = lo; j <= p; ++j) {
          double acc = 0;
          const float* kr = K.data() + j * nkv + kh * hd;
          for (std::size_t d = 0; d < hd; ++d) acc += static_cast<double>(q[d]) * kr[d];
          s[j - lo] = cap > 0 ? cap * std::tanh(acc * scale / cap) : acc * scale;
          mx = std::max(mx, s[j - lo]);
        }
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - mx));
        std::fill(o.begin(), o.end(), 0.0);
        for (std::size_t j = lo; j <= p; ++j) {
          const float* vr = V.data() + j * nkv + kh * hd;
          for (std::size_t d = 0; d < hd; ++d) o[d] += s[j - lo] * vr[d];
        }
        for (std::size_t d = 0; d < hd; ++d) {
          const auto r = static_cast<float>(o[d] / z);
          io.out[t * nq + h * hd + d] = dt_.half() ? dt_.round(r, 1) : r;
        }
      }
    }
    return "";
  }

 private:
  const model_config& c_;
  io_dtype dt_;
  float k_scale_, v_scale_;
  std::vector<std::vector<float>> k_, v_;
};

/// Generates sample `sample` of `r` with the reference. Its positions keep `keep` top logits each.
inline std::string reference_sample(transformer& m, contiguous_attention& attn, const gen_request& r, std::uint32_t sample,
                                    const std::vector<std::int32_t>& eos, std::int32_t max_model_len, std::int32_t keep,
                                    sample_result& out, std::vector<float>& full_logits_of_last) {
  out = sample_result{};
  if (r.max_tokens == 0) {
    out.finish_reason = "length";
    return "";
  }
  attn.reset();
  std::vector<std::int32_t> ids(r.prompt.begin(), r.prompt.end()), pos(ids.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(i);
  std::vector<std::pair<float, std::int32_t>> scratch;
  std::vector<float> logits;
  std::int32_t next_pos = static_cast<std::int32_t>(ids.size());
  for (;;) {
    const std::int32_t row = static_cast<std::int32_t>(ids.size()) - 1;
    if (std::string e = m.forward(ids, pos, attn, std::span<const std::int32_t>(&row, 1), logits); !e.empty()) return e;
    position_record rec;
    const std::int32_t tok = sample_token(logits.data(), m.config().vocab_size, r.sampling, sample,
                                          static_cast<std::int32_t>(out.tokens.size()), keep, rec, scratch);
    out.tokens.push_back(tok);
    out.positions.push_back(std::move(rec));
    full_logits_of_last = logits;
    if (const char* why = stop_reason(r, eos, tok, out.tokens.size(), max_model_len); *why != 0) {
      out.finish_reason = why;
      return "";
    }
    ids.assign(1, tok);
    pos.assign(1, next_pos++);
  }
}

/// The comparison of the engine's outputs with the reference's.
struct reference_check {
  std::int64_t samples = 0, identical = 0;
  std::int64_t near_tie = 0;   ///< samples whose tokens diverge at a position where the two best logits are within tol
  std::int64_t mismatched = 0;
  std::int64_t positions = 0;  ///< positions compared
  double max_logit_diff = 0;   ///< largest |engine - reference| over the compared top logits
  double tolerance = 0;
  std::string first_problem;
};

/// Compares one sample's positions (top logits by id) and tokens.
inline void compare_sample(const sample_result& eng, const sample_result& ref, const std::string& what,
                           reference_check& chk) {
  ++chk.samples;
  const std::size_t n = std::min(eng.positions.size(), ref.positions.size());
  bool diverged = false, bad = false;
  for (std::size_t i = 0; i < n && !diverged; ++i) {
    const position_record& a = eng.positions[i];
    const position_record& b = ref.positions[i];
    ++chk.positions;
    // The same ids' logits: every id in the engine's top list that the reference's list holds too.
    for (std::size_t x = 0; x < a.top_ids.size(); ++x)
      for (std::size_t y = 0; y < b.top_ids.size(); ++y)
        if (a.top_ids[x] == b.top_ids[y])
          chk.max_logit_diff = std::max(chk.max_logit_diff, static_cast<double>(std::abs(a.top_logits[x] - b.top_logits[y])));
    chk.max_logit_diff = std::max(chk.max_logit_diff, std::abs(a.lse - b.lse));
    if (a.token != b.token) {
      diverged = true;
      const bool tie = a.top_logits.size() >= 2 && a.top_logits[0] - a.top_logits[1] <= chk.tolerance;
      if (tie) {
        ++chk.near_tie;
      } else {
        bad = true;
        if (chk.first_problem.empty())
          chk.first_problem = what + ": token " + std::to_string(i) + " is " + std::to_string(a.token) +
                              ", the reference's " + std::to_string(b.token);
      }
    }
  }
  if (!diverged && (eng.tokens != ref.tokens || eng.finish_reason != ref.finish_reason)) {
    bad = true;
    if (chk.first_problem.empty())
      chk.first_problem = what + ": " + std::to_string(eng.tokens.size()) + " tokens (" + eng.finish_reason +
                          "), the reference " + std::to_string(ref.tokens.size()) + " (" + ref.finish_reason + ")";
  }
  if (bad) ++chk.mismatched;
  if (!bad && !diverged) ++chk.identical;
}

}  // namespace kvgen
