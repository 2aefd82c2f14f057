#pragma once
/// \file
/// free_list_allocator: a FIFO free queue (vLLM's FreeKVCacheBlockQueue). Freed blocks go to the tail, allocation
/// takes the head, a hit on a cached free block unlinks it from the middle. Initially ordered by block id.
/// Combined with lazy eviction (lru_eviction) the queue is the LRU order of cached blocks.
/// Complexity: every operation O(1), no allocation after reset.

#include <cstdint>

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/index_list.hpp"

KVPAGER_NAMESPACE_BEGIN

class free_list_allocator {
 public:
  static constexpr free_order order = free_order::fifo;

  void reset(std::int32_t n) { list_.reset(n); }
  void push(block_id b) noexcept { list_.push_back(b); }
  block_id pop() noexcept { return list_.pop_front(); }
  void erase(block_id b) noexcept { list_.erase(b); }
  [[nodiscard]] bool contains(block_id b) const noexcept { return list_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

  /// Read-only view of the queue, head first (for inspection and tests).
  [[nodiscard]] const index_list& queue() const noexcept { return list_; }

 private:
  index_list list_;
};

KVPAGER_NAMESPACE_END
