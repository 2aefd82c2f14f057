// SPDX-License-Identifier: Apache-2.0
// The order in which each eviction policy gives up cached blocks, seen through the cache: which prefix stops
// being hit first as new sequences take blocks.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "sharing/tokens.hpp"

using namespace kvpager;

namespace {

using kvtest::concat;
using kvtest::iota_tokens;
template <class Cache>
Cache make(std::int32_t num_blocks, std::int32_t block_size, std::int32_t reserved) {
  auto r = Cache::create({block_size, num_blocks, reserved, 0});
  EXPECT_TRUE(r.ok()) << r.error().message();
  return std::move(*r);
}

/// Caches four one-block prompts (ids 1..4 with contents 10*i..), frees them in order 1..4 with the given
/// priorities, hits some of them `hits[i]` times, then allocates blocks one at a time until every cached block is
/// evicted; returns the order in which the four contents disappeared.
template <class Eviction>
std::vector<int> eviction_order(std::vector<std::int32_t> priorities, std::vector<int> hits,
                                std::vector<int> release_order = {0, 1, 2, 3}) {
  using cache_t = paged_kv_cache<free_list_allocator, Eviction, prefix_caching>;
  auto c = make<cache_t>(9, 4, 1);  // 8 usable blocks
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(concat(iota_tokens(4, 10 * (i + 1)), {1}));  // 1 full + 1 partial
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(c.add_sequence(static_cast<seq_id>(i + 1), prompts[static_cast<std::size_t>(i)], {.priority = priorities[static_cast<std::size_t>(i)]}));
  c.begin_step();
  for (int i : release_order) EXPECT_TRUE(c.free_sequence(static_cast<seq_id>(i + 1)));
  seq_id next = 100;
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < hits[static_cast<std::size_t>(i)]; ++k) {
      EXPECT_TRUE(c.add_sequence(next, prompts[static_cast<std::size_t>(i)], {.priority = priorities[static_cast<std::size_t>(i)]}));
      c.begin_step();
      EXPECT_TRUE(c.free_sequence(next++));
    }
  std::vector<int> order;
  std::vector<bool> gone(4, false);
  std::vector<seq_id> held;
  while (static_cast<int>(order.size()) < 4) {
    EXPECT_TRUE(c.add_sequence(next, iota_tokens(1, 5000 + static_cast<token_id>(next))));
    held.push_back(next++);
    for (int i = 0; i < 4; ++i)
      if (!gone[static_cast<std::size_t>(i)] && c.match_prefix(prompts[static_cast<std::size_t>(i)])->blocks == 0) {
        gone[static_cast<std::size_t>(i)] = true;
        order.push_back(i);
      }
    if (held.size() > 16) break;
  }
  return order;
}
}  // namespace

TEST(EvictionOrder, LruIndexEvictsLeastRecentlyReleased) {
  EXPECT_EQ(eviction_order<lru_index_eviction>({0, 0, 0, 0}, {0, 0, 0, 0}, {2, 0, 3, 1}),
            (std::vector<int>{2, 0, 3, 1}));
  // A hit refreshes: content 0 was hit (and released) last.
  EXPECT_EQ(eviction_order<lru_index_eviction>({0, 0, 0, 0}, {1, 0, 0, 0}), (std::vector<int>{1, 2, 3, 0}));
}

TEST(EvictionOrder, LruEvictionIsTheFreeQueue) {
  EXPECT_EQ(eviction_order<lru_eviction>({0, 0, 0, 0}, {0, 0, 0, 0}, {2, 0, 3, 1}), (std::vector<int>{2, 0, 3, 1}));
  EXPECT_EQ(eviction_order<lru_eviction>({0, 0, 0, 0}, {1, 0, 0, 0}), (std::vector<int>{1, 2, 3, 0}));
}

TEST(EvictionOrder, LfuKeepsFrequentlyHitBlocks) {
  EXPECT_EQ(eviction_order<lfu_eviction>({0, 0, 0, 0}, {3, 0, 1, 2}), (std::vector<int>{1, 2, 3, 0}));
  // Equal counts fall back to LRU.
  EXPECT_EQ(eviction_order<lfu_eviction>({0, 0, 0, 0}, {0, 0, 0, 0}, {3, 2, 1, 0}), (std::vector<int>{3, 2, 1, 0}));
}

TEST(EvictionOrder, PriorityLruEvictsLowPriorityFirst) {
  EXPECT_EQ(eviction_order<priority_lru>({5, -1, 9, 5}, {0, 0, 0, 0}), (std::vector<int>{1, 0, 3, 2}));
}

TEST(EvictionOrder, FifoIgnoresHits) {
  EXPECT_EQ(eviction_order<fifo_eviction>({0, 0, 0, 0}, {2, 0, 0, 0}), (std::vector<int>{0, 1, 2, 3}));
}

TEST(EvictionOrder, IndexedPoliciesUseCleanBlocksFirst) {
  // With an indexed policy, partial (never hit-able) blocks and untouched blocks are reused before any cached
  // block: 8 usable blocks, 4 cached + 4 clean (partials freed), so 4 allocations evict nothing.
  using cache_t = paged_kv_cache<free_list_allocator, lru_index_eviction, prefix_caching>;
  auto c = make<cache_t>(9, 4, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.add_sequence(static_cast<seq_id>(i + 1), concat(iota_tokens(4, 10 * (i + 1)), {1})));
  c.begin_step();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.free_sequence(static_cast<seq_id>(i + 1)));
  EXPECT_EQ(c.stats().evictable, 4);
  EXPECT_EQ(c.stats().free, 4);
  ASSERT_TRUE(c.add_sequence(50, iota_tokens(16, 900)));
  EXPECT_EQ(c.stats().evictions, 0);
  ASSERT_TRUE(c.add_sequence(51, iota_tokens(1, 7)));
  EXPECT_EQ(c.stats().evictions, 1);
}

