// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// splitmix64's finalizer: a 64-bit mix in which nearby inputs give unrelated outputs (root seeds of hash chains,
/// per-group hash keys).

#include <cstdint>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

KVPAGER_NAMESPACE_END
