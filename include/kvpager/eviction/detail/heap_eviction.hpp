// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The machinery behind the heap-ordered indexed eviction policies (lfu_eviction, priority_lru, fifo_eviction):
/// an indexed_heap of the evictable blocks plus per-block counters. Each policy is `heap_eviction<Order>`, where
/// `Order::primary(hits, first_evictable, hint)` gives the key's first part; ties go to the least recently
/// released block. Memory: O(num_blocks), allocated by reset; no allocation per operation; O(log n) per operation.

#include <cstdint>
#include <vector>

#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/indexed_heap.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// Shared machinery: an indexed heap keyed by (Order::primary, release clock), with per-block counters that
/// live as long as the block's content is cached (reset by forget, which the cache calls on every discard).
template <class Order>
class heap_eviction {
 public:
  static constexpr retention_mode retention = retention_mode::indexed;
  void reset(const pool_geometry& g) {
    heap_.reset(g.num_blocks);
    hits_.assign(static_cast<std::size_t>(g.num_blocks), 0);
    first_.assign(static_cast<std::size_t>(g.num_blocks), 0);
    clock_ = 0;
  }
  void insert(block_id b, retention_hint hint) noexcept {
    const auto i = static_cast<std::size_t>(b);
    ++clock_;
    if (first_[i] == 0) first_[i] = clock_;
    heap_.push(b, indexed_heap::key{Order::primary(hits_[i], first_[i], hint), clock_});
  }
  void erase(block_id b) noexcept { heap_.erase(b); }
  block_id pop_victim() noexcept { return heap_.pop(); }  // the cache then discards its content: forget(b)
  /// `b`'s content was discarded (by eviction or any other way, see the concept): its counters restart.
  void forget(block_id b) noexcept {
    KVPAGER_ASSERT(!heap_.contains(b), "forget of a block that is still evictable");
    hits_[static_cast<std::size_t>(b)] = 0;
    first_[static_cast<std::size_t>(b)] = 0;
  }
  void on_hit(block_id b) noexcept {
    std::uint32_t& h = hits_[static_cast<std::size_t>(b)];
    if (h != UINT32_MAX) ++h;
  }
  [[nodiscard]] bool contains(block_id b) const noexcept { return heap_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return heap_.size(); }
  /// Hits counted for `b` since its content was cached.
  [[nodiscard]] std::uint32_t hits(block_id b) const noexcept { return hits_[static_cast<std::size_t>(b)]; }
  /// Release clock when `b`'s current content first became evictable (fifo_eviction's key); 0 = not yet.
  [[nodiscard]] std::uint64_t first_evictable(block_id b) const noexcept { return first_[static_cast<std::size_t>(b)]; }

 private:
  indexed_heap heap_;
  std::vector<std::uint32_t> hits_;
  std::vector<std::uint64_t> first_;  ///< clock when the current content first became evictable; 0 = never
  std::uint64_t clock_ = 0;
};
}  // namespace detail
KVPAGER_NAMESPACE_END
