#pragma once
/// \file
/// The indexed eviction policies: cached, unreferenced blocks are kept in an index of their own, apart from the
/// allocator's clean free blocks; allocation uses clean blocks first and evicts only when none are left (vLLM V0's
/// evictor; keeps partial, never-hit-able blocks out of the cache order as vLLM PR #42656 asks). Each policy is an
/// ordering of that index:
///
/// | policy               | evicts first                                                           | complexity |
/// |----------------------|------------------------------------------------------------------------|------------|
/// | `lru_index_eviction` | least recently released                                                | O(1)       |
/// | `lfu_eviction`       | fewest hits since the block was cached, then least recently released   | O(log n)   |
/// | `priority_lru`       | lowest retention priority (per request), then least recently released  | O(log n)   |
/// | `fifo_eviction`      | cached earliest (first became evictable), whatever its hits since      | O(log n)   |
///
/// n = evictable blocks. Memory: O(num_blocks), allocated by reset; no allocation per operation.

#include <cstdint>
#include <vector>

#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/index_list.hpp"
#include "kvpager/core/indexed_heap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// LRU over the evictable index only. O(1).
class lru_index_eviction {
 public:
  static constexpr retention_mode retention = retention_mode::indexed;
  void reset(const pool_geometry& g) { list_.reset(g.num_blocks); }
  void insert(block_id b, retention_hint /*hint*/) noexcept { list_.push_back(b); }
  void erase(block_id b) noexcept { list_.erase(b); }
  block_id pop_victim() noexcept { return list_.pop_front(); }
  void on_hit(block_id /*b*/) noexcept {}
  [[nodiscard]] bool contains(block_id b) const noexcept { return list_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

 private:
  index_list list_;
};

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

struct lfu_order {
  static std::uint64_t primary(std::uint32_t hits, std::uint64_t /*first*/, retention_hint /*h*/) noexcept {
    return hits;
  }
};
struct priority_order {
  static std::uint64_t primary(std::uint32_t /*hits*/, std::uint64_t /*first*/, retention_hint h) noexcept {
    // Map int32 priority to an unsigned key preserving order; lower priority is evicted first.
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(h.priority) - INT32_MIN);
  }
};
struct fifo_order {
  static std::uint64_t primary(std::uint32_t /*hits*/, std::uint64_t first, retention_hint /*h*/) noexcept {
    return first;
  }
};
}  // namespace detail

/// Least frequently used (hits since cached), ties broken by least recently released. Frequency-aware:
/// resists scans of one-off prompts that would push hot system-prompt blocks out of an LRU (vLLM #40268).
using lfu_eviction = detail::heap_eviction<detail::lfu_order>;
/// Per-request retention priority (sequence_options::priority; larger = kept longer), then LRU, as TensorRT-LLM's
/// priority-based KV cache retention.
using priority_lru = detail::heap_eviction<detail::priority_order>;
/// First in, first out: the block whose content became evictable earliest goes first, even if it was hit since.
using fifo_eviction = detail::heap_eviction<detail::fifo_order>;

KVPAGER_NAMESPACE_END
