// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// priority_lru: an indexed eviction policy (retention_mode::indexed) that evicts the block of lowest retention
/// priority first (sequence_options::priority of the request that released it), then least recently released.
/// O(log n).

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/eviction/detail/heap_eviction.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
struct priority_order {
  static std::uint64_t primary(std::uint32_t /*hits*/, std::uint64_t /*first*/, retention_hint h) noexcept {
    // Map int32 priority to an unsigned key preserving order; lower priority is evicted first.
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(h.priority) - INT32_MIN);
  }
};
}  // namespace detail

/// Per-request retention priority (sequence_options::priority; larger = kept longer), then LRU, as TensorRT-LLM's
/// priority-based KV cache retention.
using priority_lru = detail::heap_eviction<detail::priority_order>;

KVPAGER_NAMESPACE_END
