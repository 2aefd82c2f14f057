// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lru_tier: a host tier policy (concepts/tier_policy.hpp) that evicts the least recently used ready block, exactly
/// as vLLM's offloading LRU (`vllm/v1/kv_offload/cpu/policies/lru.py`, 0.22.0): one order over every held key, a new
/// key at the most recent end, a touched key moved there (the tier touches a request's keys last to first, so its
/// first block ends most recent and a chain's tail goes first), victims taken from the least recent end skipping
/// those not evictable, all n or none. O(1) per insert, remove and touch; evict O(n + skipped). Allocates in reset
/// only.

#include <cstdint>
#include <vector>

#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"

KVPAGER_NAMESPACE_BEGIN

/// lru_tier. A class template with one defaulted parameter, used as lru_tier: its member functions (and the
/// standard templates they use) are analysed only in a translation unit that uses them, not in every one that
/// includes <kvpager/cache.hpp> (a consumer build cost measured in bench/RESULTS.md).
template <class = void>
class basic_lru_tier {
 public:
  static constexpr const char* name = "lru";

  void reset(std::int32_t capacity) {
    index_ = id_map{};
    index_.reserve(capacity);
    keys_.assign(static_cast<std::size_t>(capacity), 0);
    order_.reset(capacity);
  }
  [[nodiscard]] std::int32_t find(std::uint64_t key) const noexcept { return index_.find(key); }
  [[nodiscard]] std::uint64_t key_of(std::int32_t slot) const noexcept { return keys_[static_cast<std::size_t>(slot)]; }
  [[nodiscard]] std::int32_t size() const noexcept { return order_.size(); }

  void insert(std::uint64_t key, std::int32_t slot) noexcept {
    index_.insert(key, slot);  // reserved for every slot: never allocates
    keys_[static_cast<std::size_t>(slot)] = key;
    order_.push_back(slot);
  }
  void remove(std::uint64_t key) noexcept {
    const std::int32_t s = index_.find(key);
    if (s < 0) return;
    order_.erase(s);
    index_.erase(key);
  }
  void touch(std::uint64_t key, bool /*ready*/) noexcept {
    const std::int32_t s = index_.find(key);
    if (s < 0) return;
    order_.erase(s);
    order_.push_back(s);
  }
  bool evict(std::int32_t n, const tier_evictable& ok, std::vector<std::int32_t>& out) noexcept {
    out.clear();
    if (n <= 0) return true;
    for (std::int32_t s = order_.empty() ? -1 : order_.front(); s >= 0; s = order_.next(s)) {
      if (!ok(s)) continue;
      out.push_back(s);
      if (static_cast<std::int32_t>(out.size()) == n) break;
    }
    if (static_cast<std::int32_t>(out.size()) < n) {
      out.clear();
      return false;
    }
    for (const std::int32_t s : out) {
      order_.erase(s);
      index_.erase(keys_[static_cast<std::size_t>(s)]);
    }
    return true;
  }
  void clear() noexcept {
    while (!order_.empty()) index_.erase(keys_[static_cast<std::size_t>(order_.pop_front())]);
  }

 private:
  id_map index_;                     ///< key -> slot
  std::vector<std::uint64_t> keys_;  ///< slot -> key
  index_list order_;                 ///< held slots, least recently used first
};

using lru_tier = basic_lru_tier<>;

static_assert(tier_policy<lru_tier>);

KVPAGER_NAMESPACE_END
