// SPDX-License-Identifier: Apache-2.0
// Per-content state of the eviction policies (LFU hit counts, FIFO first-use stamps) starts afresh with every
// content: the cache tells the policy about every discard of a block's cached content (forget), whichever path
// discards it: eviction, a write into an owned cached block, appends cancelled before their bytes were written,
// or a release without retention.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "sharing/tokens.hpp"

using namespace kvpager;

namespace {

using kvtest::iota_tokens;
std::vector<token_id> with(std::vector<token_id> a, token_id t) { return kvtest::concat(std::move(a), {t}); }
template <class Cache>
Cache make(std::int32_t num_blocks, std::int32_t block_size = 4) {
  auto r = Cache::create({block_size, num_blocks, 1, 0});
  EXPECT_TRUE(r.ok()) << r.error().message();
  return std::move(*r);
}
template <class Cache>
block_id block_of(const Cache& c, seq_id id, std::size_t i) {
  return (*c.block_table(id))[i];
}

/// Any shipped policy plus a record of the blocks it was told to forget.
template <class Base>
struct forget_spy : Base {
  std::vector<block_id> forgotten;
  void forget(block_id b) noexcept {
    if constexpr (detail::forgets_content<Base>) Base::forget(b);
    forgotten.push_back(b);
  }
};

/// Caches prompt [A B] + 1 token (evictable once), hits it `hits` times (added, step, freed), and adds it again as
/// sequence 1, which keeps A and B: they carry hits + 1 hits and have been evictable.
template <class Cache>
std::vector<token_id> cache_and_hit(Cache& c, int hits) {
  const auto prompt = with(iota_tokens(8, 0), 1);
  for (int k = 0; k <= hits; ++k) {
    EXPECT_TRUE(c.add_sequence(static_cast<seq_id>(10 + k), prompt));
    c.begin_step();
    EXPECT_TRUE(c.free_sequence(static_cast<seq_id>(10 + k)));
  }
  EXPECT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  return prompt;
}

/// Drops block B's content by writing into it: a fork that ends inside B is left its only owner and appends.
template <class Cache>
block_id overwrite_second_block(Cache& c) {
  const block_id b = block_of(c, 1, 1);
  EXPECT_TRUE(c.fork(1, 2, 6));
  EXPECT_TRUE(c.free_sequence(1));
  c.begin_step();
  EXPECT_TRUE(c.append_tokens(2, std::vector<token_id>{55}));
  EXPECT_EQ(block_of(c, 2, 1), b) << "written in place";
  EXPECT_FALSE(c.sharing().is_cached(b));
  return b;
}

}  // namespace

static_assert(detail::forgets_content<lfu_eviction>);
static_assert(detail::forgets_content<fifo_eviction>);
static_assert(detail::forgets_content<priority_lru>);
static_assert(!detail::forgets_content<lru_index_eviction>);  // stateless per block: nothing to forget
static_assert(!detail::forgets_content<eviction_policy_archetype>);

namespace {
/// Block B of a cached chain carries per-content state `read(policy, B)` (== `expected` when given); after a write
/// into B drops its content, the state must be reset.
template <class Eviction, class Read>
void overwrite_resets_state(int hits, Read read, std::uint64_t expected = 0) {
  auto c = make<paged_kv_cache<free_list_allocator, Eviction, prefix_caching>>(16);
  cache_and_hit(c, hits);
  const block_id b = block_of(c, 1, 1);
  ASSERT_GT(read(c.eviction(), b), 0u);
  if (expected != 0) {
    ASSERT_EQ(read(c.eviction(), b), expected);
  }
  overwrite_second_block(c);
  EXPECT_EQ(read(c.eviction(), b), 0u) << "the block's new content inherited its old content's state";
}
}  // namespace

// Regression: a block whose content grow() dropped kept its five hits, and its next content inherited them.
TEST(EvictionState, LfuForgetsHitsWhenAWriteDropsTheContent) {
  overwrite_resets_state<lfu_eviction>(4, [](const auto& e, block_id b) -> std::uint64_t { return e.hits(b); }, 5);
}

// Regression: the same for FIFO's first-use stamp (the block would be evicted as if cached long ago).
TEST(EvictionState, FifoForgetsFirstUseWhenAWriteDropsTheContent) {
  overwrite_resets_state<fifo_eviction>(2, [](const auto& e, block_id b) { return e.first_evictable(b); });
}

// Regression: sequence 1 commits [A B] and sequence 2 hits them in the same step; both are freed before the step
// runs, so A and B are never written and their content is dropped by cancel_appends, with the hit counted.
TEST(EvictionState, LfuForgetsHitsWhenCancelledAppendsDropTheContent) {
  auto c = make<paged_kv_cache<free_list_allocator, lfu_eviction, prefix_caching>>(16);
  const auto prompt = with(iota_tokens(8, 0), 1);
  ASSERT_TRUE(c.add_sequence(1, prompt));
  ASSERT_TRUE(c.add_sequence(2, prompt));  // hits A and B in this step
  const block_id a = block_of(c, 1, 0), b = block_of(c, 1, 1);
  ASSERT_EQ(c.eviction().hits(a), 1u);
  ASSERT_TRUE(c.free_sequence(2));
  ASSERT_TRUE(c.free_sequence(1));  // A and B are its alone now: never written, dropped
  EXPECT_FALSE(c.sharing().is_cached(a));
  EXPECT_FALSE(c.sharing().is_cached(b));
  EXPECT_EQ(c.eviction().hits(a), 0u);
  EXPECT_EQ(c.eviction().hits(b), 0u);
}

// Eviction itself (a victim reused for new content) still starts the block afresh.
TEST(EvictionState, LfuForgetsHitsWhenTheBlockIsEvicted) {
  auto c = make<paged_kv_cache<free_list_allocator, lfu_eviction, prefix_caching>>(16);
  cache_and_hit(c, 3);
  const block_id a = block_of(c, 1, 0), b = block_of(c, 1, 1);
  ASSERT_EQ(c.eviction().hits(a), 4u);
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.add_sequence(3, iota_tokens(4 * static_cast<std::int32_t>(c.available_blocks()), 500)));
  EXPECT_EQ(c.stats().evictions, 2) << "every block is taken: A and B are evicted";
  EXPECT_EQ(c.eviction().hits(a), 0u);
  EXPECT_EQ(c.eviction().hits(b), 0u);
}

// Regression: a release without retention discards the content; a policy with per-content state must hear of it.
TEST(EvictionState, NoRetentionReleaseTellsThePolicy) {
  using cache_t = paged_kv_cache<free_list_allocator, forget_spy<no_eviction>, prefix_caching>;
  auto c = make<cache_t>(16);
  ASSERT_TRUE(c.add_sequence(1, with(iota_tokens(8, 0), 1)));
  const block_id a = block_of(c, 1, 0), b = block_of(c, 1, 1);
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.eviction().forgotten, (std::vector<block_id>{b, a})) << "tail first, each once";
}

namespace {
/// A random mix of prefix-cached admissions, appends, forks, frees and steps; after every call, the blocks the
/// eviction policy was told to forget are exactly those whose cached content the call discarded, each once.
template <class Eviction>
void every_content_drop_is_reported(std::uint32_t seed) {
  using cache_t = paged_kv_cache<free_list_allocator, forget_spy<Eviction>, prefix_caching>;
  auto c = make<cache_t>(24);
  std::mt19937 rng(seed);
  std::vector<seq_id> live;
  seq_id next = 1;
  const auto nb = c.pool().num_blocks();
  std::int64_t drops = 0;
  for (int op = 0; op < 20000; ++op) {
    std::vector<bool> cached_before(static_cast<std::size_t>(nb));
    for (block_id b = 0; b < nb; ++b) cached_before[static_cast<std::size_t>(b)] = c.sharing().is_cached(b);
    const std::size_t logged = c.eviction().forgotten.size();
    const auto r = rng() % 100;
    if (r < 10) {
      c.begin_step();
    } else if (r < 40 || live.empty()) {
      std::vector<token_id> prompt;  // a few families cut at random lengths: many hits
      const auto family = static_cast<token_id>(rng() % 3);
      const auto n = static_cast<std::int32_t>(1 + rng() % 14);
      for (std::int32_t i = 0; i < n; ++i) prompt.push_back(i < 8 ? 100 * family + i : static_cast<token_id>(rng() % 2));
      if (c.add_sequence(next, prompt)) live.push_back(next);
      ++next;
    } else if (r < 65) {
      const seq_id id = live[rng() % live.size()];
      (void)c.append_tokens(id, std::vector<token_id>(1 + rng() % 5, static_cast<token_id>(rng() % 2)));
    } else if (r < 80) {
      const seq_id id = live[rng() % live.size()];
      const auto len = *c.num_tokens(id);
      if (c.fork(id, next, static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(len + 1)))) live.push_back(next);
      ++next;
    } else {
      const auto i = rng() % live.size();
      ASSERT_TRUE(c.free_sequence(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
    const auto& log = c.eviction().forgotten;
    std::vector<bool> told(static_cast<std::size_t>(nb), false);
    for (std::size_t i = logged; i < log.size(); ++i) {
      const auto b = static_cast<std::size_t>(log[i]);
      ASSERT_TRUE(cached_before[b]) << "op " << op << ": told to forget block " << b << " that had no content";
      ASSERT_FALSE(told[b]) << "op " << op << ": block " << b << " forgotten twice in one call";
      told[b] = true;
    }
    for (block_id b = 0; b < nb; ++b) {
      const auto u = static_cast<std::size_t>(b);
      if (cached_before[u] && !c.sharing().is_cached(b)) {
        ASSERT_TRUE(told[u]) << "op " << op << ": block " << b << "'s content was dropped silently";
      }
    }
    drops += static_cast<std::int64_t>(log.size() - logged);
  }
  EXPECT_GT(drops, 100) << "the mix should discard content often";
}
}  // namespace

TEST(EvictionState, EveryContentDropIsReportedLruIndex) { every_content_drop_is_reported<lru_index_eviction>(1); }
TEST(EvictionState, EveryContentDropIsReportedLfu) { every_content_drop_is_reported<lfu_eviction>(2); }
TEST(EvictionState, EveryContentDropIsReportedPriority) { every_content_drop_is_reported<priority_lru>(3); }
TEST(EvictionState, EveryContentDropIsReportedFifo) { every_content_drop_is_reported<fifo_eviction>(4); }
TEST(EvictionState, EveryContentDropIsReportedNoRetention) { every_content_drop_is_reported<no_eviction>(5); }
