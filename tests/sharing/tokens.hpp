// SPDX-License-Identifier: Apache-2.0
#pragma once
// Token-id helpers shared by the prefix-caching, eviction-state and cache-creation tests.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace kvtest {

/// n consecutive token ids starting at `first`.
inline std::vector<kvpager::token_id> iota_tokens(std::int32_t n, kvpager::token_id first) {
  std::vector<kvpager::token_id> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}
/// a followed by b.
inline std::vector<kvpager::token_id> concat(std::vector<kvpager::token_id> a,
                                             const std::vector<kvpager::token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace kvtest
