// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the scheduler tests: prompts of consecutive token ids, and a token for every scheduled sequence.

#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvtest {

/// `n` consecutive token ids from `first`.
inline std::vector<kvpager::token_id> prompt(std::int32_t n, kvpager::token_id first = 0) {
  std::vector<kvpager::token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

/// Gives token 1 to every sequence scheduled in `out` (a failed complete fails the test).
template <class S>
void sample_all(S& s, const kvpager::step_output& out) {
  for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
}

}  // namespace kvtest
