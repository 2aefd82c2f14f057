// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// fifo_eviction: an indexed eviction policy (retention_mode::indexed) that evicts the block whose current content
/// first became evictable earliest, whatever its hits since. O(log n).

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/eviction/detail/heap_eviction.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
struct fifo_order {
  static std::uint64_t primary(std::uint32_t /*hits*/, std::uint64_t first, retention_hint /*h*/) noexcept {
    return first;
  }
};
}  // namespace detail

/// First in, first out: the block whose content became evictable earliest goes first, even if it was hit since.
using fifo_eviction = detail::heap_eviction<detail::fifo_order>;

KVPAGER_NAMESPACE_END
