// SPDX-License-Identifier: Apache-2.0
#pragma once
// Policies written the way a user would write them, outside the library, to prove the concepts are open:
// each models its concept and plugs into paged_kv_cache, which then passes the same behavioural suite.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace kvtest {

/// Hands out the highest free id first. Deliberately simple: a flag per block and a scan (O(n) pop).
class highest_id_allocator {
 public:
  void reset(std::int32_t n) {
    free_.assign(static_cast<std::size_t>(n), 0);
    size_ = 0;
  }
  void push(kvpager::block_id b) noexcept {
    free_[static_cast<std::size_t>(b)] = 1;
    ++size_;
  }
  kvpager::block_id pop() noexcept {
    for (std::size_t i = free_.size(); i-- > 0;)
      if (free_[i] != 0) {
        free_[i] = 0;
        --size_;
        return static_cast<kvpager::block_id>(i);
      }
    return kvpager::no_block;
  }
  void erase(kvpager::block_id b) noexcept {
    free_[static_cast<std::size_t>(b)] = 0;
    --size_;
  }
  [[nodiscard]] bool contains(kvpager::block_id b) const noexcept {
    return b >= 0 && static_cast<std::size_t>(b) < free_.size() && free_[static_cast<std::size_t>(b)] != 0;
  }
  [[nodiscard]] std::int32_t size() const noexcept { return size_; }

 private:
  std::vector<std::uint8_t> free_;
  std::int32_t size_ = 0;
};

/// An indexed eviction policy: LRU over an index_list, ignoring hints.
class user_lru_index {
 public:
  static constexpr kvpager::retention_mode retention = kvpager::retention_mode::indexed;
  void reset(const kvpager::pool_geometry& g) { list_.reset(g.num_blocks); }
  void insert(kvpager::block_id b, kvpager::retention_hint /*hint*/) noexcept { list_.push_back(b); }
  void erase(kvpager::block_id b) noexcept { list_.erase(b); }
  kvpager::block_id pop_victim() noexcept { return list_.pop_front(); }
  void on_hit(kvpager::block_id /*b*/) noexcept {}
  [[nodiscard]] bool contains(kvpager::block_id b) const noexcept { return list_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

 private:
  kvpager::index_list list_;
};

/// A sharing policy that forks by reference and records how often content was discarded.
struct user_sharing {
  static constexpr kvpager::fork_mode fork = kvpager::fork_mode::share;
  void reset(const kvpager::pool_geometry& /*g*/) {}
  [[nodiscard]] bool is_cached(kvpager::block_id /*b*/) const noexcept { return false; }
  void uncache(kvpager::block_id /*b*/) noexcept { ++uncached; }
  std::int64_t uncached = 0;
};

/// A swap policy written by a user: swaps while the host pool has room for the victim, else asks for recompute,
/// as hybrid_swap does, but keeps `reserve` host blocks free for others. A decision only (concept 0.2.0): the host
/// pool is the cache's.
struct user_swap {
  [[nodiscard]] kvpager::preempt_action action(std::int32_t n, std::int32_t host_free) const noexcept {
    return n + reserve <= host_free ? kvpager::preempt_action::swap : kvpager::preempt_action::recompute;
  }
  std::int32_t reserve = 2;
  static constexpr std::int32_t host_blocks = 64;  ///< the host pool the tests give caches using it
};

}  // namespace kvtest
