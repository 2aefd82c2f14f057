// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated KV content of the randomized tests: a token's K/V is a function of its whole prefix, as real
// attention KV is, so reusing a block for different content is caught when a sequence is read back.

#include <cstdint>

namespace kvtest {

/// One step of a rolling 64-bit hash.
inline std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ULL;
  return h ^ (h >> 31);
}

}  // namespace kvtest
