// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sampling from one position's logits: greedy (temperature 0: the largest logit, the lowest id among equals, as
// torch.argmax), or temperature / top-k / top-p with a seed. The random number of a draw depends only on the request's
// seed, the sample's index and the generated position (a counter-based stream), so a given seed gives the same tokens
// whatever the batching, chunking, preemption or forking did. Also what a check against another implementation reads:
// the top-K logits of the position, sorted descending, and their log-sum-exp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvgen {

struct sampling_params {
  double temperature = 0.0;  ///< 0: greedy
  std::int32_t top_k = 0;    ///< 0 or -1: off
  double top_p = 1.0;        ///< in (0, 1]
  std::uint64_t seed = 0;
};

/// What is kept of one generated position.
struct position_record {
  std::int32_t token = 0;
  double lse = 0;                   ///< log-sum-exp of the position's raw logits
  float token_logit = 0;            ///< the sampled token's raw logit
  std::vector<std::int32_t> top_ids;  ///< the top-K ids by logit (descending, lowest id among equals)
  std::vector<float> top_logits;
};

inline std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// A uniform number in [0, 1) for (seed, sample, position).
inline double draw_uniform(std::uint64_t seed, std::uint32_t sample, std::int32_t position) noexcept {
  const std::uint64_t h = mix64(mix64(mix64(seed) ^ sample) ^ static_cast<std::uint64_t>(static_cast<std::uint32_t>(position)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

/// Samples one token from `logits` [vocab] and fills `rec` (top `keep` logits). `scratch` is reused.
inline std::int32_t sample_token(const float* logits, std::int32_t vocab, const sampling_params& p, std::uint32_t sample,
                                 std::int32_t position, std::int32_t keep, position_record& rec,
                                 std::vector<std::pair<float, std::int32_t>>& scratch) {
  float mx = -INFINITY;
  std::int32_t arg = 0;
  for (std::int32_t i = 0; i < vocab; ++i)
    if (logits[i] > mx) mx = logits[i], arg = i;
  double sum = 0;
  for (std::int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  rec.lse = mx + std::log(sum);
  const auto order = [](const std::pair<float, std::int32_t>& a, const std::pair<float, std::int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const bool greedy = p.temperature <= 0.0;
  const std::int32_t k_top = std::clamp(keep, 0, vocab);
  scratch.resize(static_cast<std::size_t>(vocab));
  for (std::int32_t i = 0; i < vocab; ++i) scratch[static_cast<std::size_t>(i)] = {logits[i], i};
  std::int32_t token = arg;
  if (!greedy) {
    const std::int32_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
    std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), order);
    // Softmax of the k kept logits at the temperature, then the smallest prefix reaching top_p.
    std::vector<double> prob(static_cast<std::size_t>(k));
    double z = 0;
    for (std::int32_t i = 0; i < k; ++i) {
      prob[static_cast<std::size_t>(i)] =
          std::exp((static_cast<double>(scratch[static_cast<std::size_t>(i)].first) - mx) / p.temperature);
      z += prob[static_cast<std::size_t>(i)];
    }
    std::int32_t kept = k;
    if (p.top_p < 1.0) {
      double cum = 0;
      for (std::int32_t i = 0; i < k; ++i) {
        cum += prob[static_cast<std::size_t>(i)] / z;
        if (cum >= p.top_p) {
          kept = i + 1;
          break;
        }
      }
    }
    double mass = 0;
    for (std::int32_t i = 0; i < kept; ++i) mass += prob[static_cast<std::size_t>(i)];
    const double u = draw_uniform(p.seed, sample, position) * mass;
    double acc = 0;
    token = scratch[static_cast<std::size_t>(kept - 1)].second;
    for (std::int32_t i = 0; i < kept; ++i) {
      acc += prob[static_cast<std::size_t>(i)];
      if (u < acc) {
        token = scratch[static_cast<std::size_t>(i)].second;
        break;
      }
    }
    for (std::int32_t i = 0; i < vocab; ++i) scratch[static_cast<std::size_t>(i)] = {logits[i], i};
  }
  std::partial_sort(scratch.begin(), scratch.begin() + k_top, scratch.end(), order);
  rec.token = token;
  rec.token_logit = logits[token];
  rec.top_ids.resize(static_cast<std::size_t>(k_top));
  rec.top_logits.resize(static_cast<std::size_t>(k_top));
  for (std::int32_t i = 0; i < k_top; ++i) {
    rec.top_ids[static_cast<std::size_t>(i)] = scratch[static_cast<std::size_t>(i)].second;
    rec.top_logits[static_cast<std::size_t>(i)] = scratch[static_cast<std::size_t>(i)].first;
  }
  return token;
}

}  // namespace kvgen
