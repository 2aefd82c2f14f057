// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the benchmarks: a failed call aborts the benchmark run (it would measure nothing); random prompts.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

namespace kvbench {

template <class T>
T must(kvpager::result<T> r) {
  if (!r) std::abort();
  return std::move(*r);
}
inline void must(kvpager::status s) {
  if (!s) std::abort();
}

/// `n` token ids drawn uniformly from a 50000-token vocabulary.
inline std::vector<kvpager::token_id> random_prompt(std::mt19937& rng, std::int32_t n) {
  std::vector<kvpager::token_id> p(static_cast<std::size_t>(n));
  for (auto& t : p) t = static_cast<kvpager::token_id>(rng() % 50000);
  return p;
}

}  // namespace kvbench
