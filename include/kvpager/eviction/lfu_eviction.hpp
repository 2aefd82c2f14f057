// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lfu_eviction: an indexed eviction policy (retention_mode::indexed) that evicts the cached, unreferenced block
/// with the fewest hits since its content was cached, ties broken by least recently released. O(log n).

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/eviction/detail/heap_eviction.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
struct lfu_order {
  static std::uint64_t primary(std::uint32_t hits, std::uint64_t /*first*/, retention_hint /*h*/) noexcept {
    return hits;
  }
};
}  // namespace detail

/// Least frequently used (hits since cached), ties broken by least recently released. Frequency-aware:
/// resists scans of one-off prompts that would push hot system-prompt blocks out of an LRU (vLLM #40268).
using lfu_eviction = detail::heap_eviction<detail::lfu_order>;

KVPAGER_NAMESPACE_END
