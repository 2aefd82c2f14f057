// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lru_index_eviction: an indexed eviction policy (retention_mode::indexed). Cached, unreferenced blocks are kept in
/// an LRU list of their own, apart from the allocator's clean free blocks; allocation uses clean blocks first and
/// evicts the least recently released cached block only when none are left (vLLM V0's evictor; keeps partial,
/// never-hit-able blocks out of the cache order, as vLLM PR #42656 asks). Every operation O(1); memory
/// O(num_blocks), allocated by reset.

#include <cstdint>

#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/index_list.hpp"

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

KVPAGER_NAMESPACE_END
