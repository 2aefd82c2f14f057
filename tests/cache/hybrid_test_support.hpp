// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the hybrid_kv_cache tests (hybrid_kv_cache_test.cpp, hybrid_units_test.cpp): the compositions, a
// config, prompts, a table read and the snapshot a failed call must leave as it was.

#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kvpager_test {

using namespace kvpager;

using hybrid = hybrid_kv_cache<any_group_kind>;
using hybrid_no_caching = hybrid_kv_cache<any_group_kind, free_list_allocator, no_eviction, refcount_sharing>;
using hybrid_swapping = hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, host_swap>;

inline cache_config config(std::int32_t num_blocks, std::int32_t block_size = 4, std::int32_t host_blocks = 0) {
  cache_config c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.reserved_blocks = 1;
  c.num_host_blocks = host_blocks;
  return c;
}

inline std::vector<token_id> tokens(std::int32_t n, token_id base = 0) {
  std::vector<token_id> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = base + i;
  return t;
}

template <class C>
std::vector<block_id> table_of(const C& c, std::int32_t t, seq_id id) {
  const auto r = c.is_swapped(id) ? c.host_block_table(t, id) : c.block_table(t, id);
  EXPECT_TRUE(r) << r.error().message();
  return r ? std::vector<block_id>(r->begin(), r->end()) : std::vector<block_id>{};
}

/// Everything observable about a cache (every table of every sequence, host tables while swapped, the groups' and
/// the pool's counts), to check that a failed call changed nothing.
template <class C>
struct snapshot {
  std::vector<std::vector<block_id>> tables;
  std::vector<group_stats> groups;
  cache_stats stats;
  std::int64_t available = 0;
  friend bool operator==(const snapshot&, const snapshot&) = default;
  snapshot(const C& c, std::span<const seq_id> ids) : stats(c.stats()), available(c.available_blocks()) {
    for (std::int32_t g = 0; g < c.num_groups(); ++g) groups.push_back(c.stats(g));
    for (std::int32_t t = 0; t < c.num_tables(); ++t)
      for (const seq_id id : ids) {
        tables.push_back(table_of(c, t, id));
        tables.back().push_back(c.is_swapped(id) ? 1 : 0);
      }
  }
};

}  // namespace kvpager_test
