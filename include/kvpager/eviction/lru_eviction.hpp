// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lru_eviction: exactly vLLM v1's eviction order. Cached blocks whose last reference is dropped go back to the
/// allocator's free queue (to the tail) with their content; allocation takes the head and evicts a block's content
/// lazily, only when the block is reused; a hit unlinks the block from the middle. A request's blocks are released
/// tail first, so a chain's tail is evicted before its head. The queue is the allocator's, so this policy needs the
/// FIFO free_list_allocator (checked at compile time). Never-cached (partial) blocks share the same queue, as in vLLM;
/// use lru_index_eviction to keep them out of the cache order.
/// Complexity: O(1) everything (it is the allocator's list); no state of its own.

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct lru_eviction {
  static constexpr retention_mode retention = retention_mode::in_free_list;
  /// The allocator order this policy relies on; paged_kv_cache static_asserts it.
  static constexpr free_order required_free_order = free_order::fifo;
  void reset(const pool_geometry& /*g*/) noexcept {}
};

KVPAGER_NAMESPACE_END
