// SPDX-License-Identifier: Apache-2.0
// paged_kv_cache with a host tier (cache_config::host_tier, a tier policy as the fifth policy): configuration
// errors, the two-tier lookup (device hits, then host blocks to load, capped so the last token is computed), loads
// and stores as swaps of the step plan into the tier's host blocks (after the swap pool's), write-through and
// write-back, completion with the step, exclusive and priority floors, staleness of a kept lookup, events on the host
// medium, and failed calls that change nothing. tests/cache/model_test.cpp runs the same caches randomly with
// emulated KV content.

#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include "cache/tier_test_support.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kvpager {
namespace {

using lru_cache = tiered_cache_with<lru_tier, no_swap>;
using arc_swap_cache = tiered_cache_with<arc_tier, host_swap>;

constexpr std::int32_t bs = kvtest::tier_block_size;
using kvtest::iota_prompt;
using kvtest::tier_config;

/// Admits and frees prompts of other content until `cache` has evicted everything it cached (a small pool).
template <class Cache>
void flush_device(Cache& c, token_id base, std::int32_t rounds) {
  for (std::int32_t r = 0; r < rounds; ++r) {
    const auto other = iota_prompt(4 * bs + 1, base + 1000 * r);
    const seq_id id = 900'000 + static_cast<seq_id>(r);
    ASSERT_TRUE(c.add_sequence(id, other));
    c.begin_step();
    ASSERT_TRUE(c.free_sequence(id));
    c.begin_step();
  }
}

TEST(TierCache, ConfigurationErrors) {
  // host tier blocks without a tier policy, a tier policy without blocks, negative, contradicting options
  EXPECT_EQ(vllm_v1_cache::create(tier_config(9, 4)).error().code(), errc::invalid_argument);
  EXPECT_EQ(lru_cache::create(tier_config(9, 0)).error().code(), errc::invalid_pool_size);
  EXPECT_EQ(lru_cache::create(tier_config(9, -3)).error().code(), errc::invalid_pool_size);
  cache_config c = tier_config(9, 4);
  c.host_tier.inclusive = false;  // exclusive with write-through: every loaded block would be copied back at once
  EXPECT_EQ(lru_cache::create(c).error().code(), errc::invalid_argument);
  c.host_tier.write = tier_write::back;
  EXPECT_TRUE(lru_cache::create(c));
  c = tier_config(9, 4);
  c.host_tier.store_threshold = 0;
  EXPECT_EQ(lru_cache::create(c).error().code(), errc::invalid_argument);
  c = tier_config(9, 1 << 29);  // past what the host block ids allow
  EXPECT_EQ(lru_cache::create(c).error().code(), errc::invalid_pool_size);
  EXPECT_EQ(tier_config(9, 4, tier_write::through, 3).host_pool_blocks(), 7);
}

TEST(TierCache, WriteThroughStoresAtTheNextStepIntoTheTiersHostBlocks) {
  auto c = *arc_swap_cache::create(tier_config(12, 8, tier_write::through, 5));
  const auto p = iota_prompt(2 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  EXPECT_TRUE(c.plan().swap_outs().empty()) << "the blocks' bytes are not written yet";
  const auto table = *c.block_table(1);
  c.begin_step();
  const auto outs = c.plan().swap_outs();
  ASSERT_EQ(outs.size(), 2U);
  EXPECT_EQ(outs[0], (block_swap{table[0], 5 + 0, 0})) << "tier block 0 is host block num_host_blocks + 0";
  EXPECT_EQ(outs[1], (block_swap{table[1], 5 + 1, 0}));
  EXPECT_EQ(c.tier().stats().writing, 2);
  EXPECT_EQ(c.stats().tier_stored_blocks, 2);
  // A block still being written is not loadable: a lookup now finds it pending, not a hit.
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.tier().peek(c.sharing().block_hash(table[0])), tier_hit::pending);
  c.begin_step();
  EXPECT_EQ(c.tier().stats().stored, 2);
  EXPECT_EQ(c.tier().stats().writing, 0);
  EXPECT_TRUE(c.plan().swap_outs().empty()) << "stored once";
}

TEST(TierCache, LookupWalksTheDeviceThenTheTierAndLoadsIntoNewBlocks) {
  auto c = *lru_cache::create(tier_config(9, 16));
  const auto p = iota_prompt(3 * bs + 2, 10);  // 3 full blocks
  ASSERT_TRUE(c.add_sequence(1, p));
  c.begin_step();  // stores planned
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();  // stores complete
  flush_device(c, 5000, 3);
  ASSERT_EQ(*c.match_prefix(p), (prefix_match{0, 3 * bs, 4, 3}));

  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, p, {}, &m));
  EXPECT_EQ(m, (prefix_match{0, 3 * bs, 4, 3}));
  const auto table = *c.block_table(2);
  const auto ins = c.plan().swap_ins();
  ASSERT_EQ(ins.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ins[i].device, table[i]);
    EXPECT_EQ(ins[i].host, c.tier().host_block(c.sharing().block_hash(table[i])));
  }
  ASSERT_EQ(c.plan().appends().size(), 1U);
  EXPECT_EQ(c.plan().appends()[0], (token_range{2, 3 * bs, 2})) << "only the tokens after the loaded blocks";
  EXPECT_EQ(c.stats().prefix_hit_tokens, 0);
  EXPECT_EQ(c.stats().prefix_hit_tokens_host, 3 * bs);
  EXPECT_EQ(c.stats().tier_loaded_blocks, 3);
  EXPECT_EQ(c.tier().stats().reading, 3);
  c.begin_step();
  EXPECT_EQ(c.tier().stats().reading, 0) << "loads complete with the step";
  EXPECT_TRUE(c.plan().swap_outs().empty()) << "an inclusive tier keeps the loaded blocks: nothing stored twice";

  // Device hits first, then the tier: a prompt sharing the device's blocks and more.
  ASSERT_TRUE(c.free_sequence(2));
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(3, p, {}, &m));
  EXPECT_EQ(m, (prefix_match{3, 3 * bs, 4, 0})) << "all on the device now (cached, unreferenced: they take capacity)";
}

TEST(TierCache, TheLastTokenIsAlwaysComputed) {
  auto c = *lru_cache::create(tier_config(9, 16));
  const auto p = iota_prompt(3 * bs, 10);  // exactly 3 full blocks: at most 2 served
  ASSERT_TRUE(c.add_sequence(1, p));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  flush_device(c, 5000, 3);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, p, {}, &m));
  EXPECT_EQ(m.host_blocks, 2);
  EXPECT_EQ(c.plan().appends()[0], (token_range{2, 2 * bs, bs}));
}

TEST(TierCache, WriteBackStoresWhatTheDeviceEvictsInTheStepItEvicts) {
  auto c = *lru_cache::create(tier_config(5, 16, tier_write::back));  // 4 usable blocks
  const auto p = iota_prompt(2 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  const auto t1 = *c.block_table(1);
  const std::vector<block_id> table(t1.begin(), t1.end());
  c.begin_step();
  EXPECT_TRUE(c.plan().swap_outs().empty()) << "write-back stores nothing on commit";
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  // A prompt of 4 blocks takes every block: the two cached ones are evicted and stored before they are rewritten.
  ASSERT_TRUE(c.add_sequence(2, iota_prompt(4 * bs, 500)));
  const auto outs = c.plan().swap_outs();
  ASSERT_EQ(outs.size(), 2U);
  std::vector<block_id> stored{outs[0].device, outs[1].device};
  std::sort(stored.begin(), stored.end());
  std::vector<block_id> cached{table[0], table[1]};
  std::sort(cached.begin(), cached.end());
  EXPECT_EQ(stored, cached);
  EXPECT_EQ(c.stats().evictions, 2);
  ASSERT_TRUE(c.free_sequence(2));
  c.begin_step();
  ASSERT_EQ(c.match_prefix(p)->host_blocks, 2);
}

TEST(TierCache, ExclusiveTierLetsALoadedBlockGoAndStoresItAgainOnEviction) {
  cache_config cfg = tier_config(5, 16, tier_write::back);
  cfg.host_tier.inclusive = false;
  auto c = *lru_cache::create(cfg);
  const auto p = iota_prompt(2 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(2, iota_prompt(4 * bs, 500)));  // evicts and stores p's 2 blocks
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(2));
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(3, p));
  EXPECT_EQ(c.plan().swap_ins().size(), 2U);
  c.begin_step();
  // p's 3 blocks evicted 3 of the other prompt's 4 (stored); p's 2 loaded blocks moved up and left the tier.
  EXPECT_EQ(c.tier().stats().held, 3);
  EXPECT_EQ(c.tier().stats().moved_up, 2);
  ASSERT_TRUE(c.free_sequence(3));
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(4, iota_prompt(4 * bs, 900)));
  EXPECT_EQ(c.plan().swap_outs().size(), 3U) << "p's 2 cached blocks go down again, and the other prompt's last";
}

TEST(TierCache, PriorityFloorAndStaleLookups) {
  cache_config cfg = tier_config(9, 16);
  cfg.host_tier.min_priority = 1;
  auto c = *lru_cache::create(cfg);
  ASSERT_TRUE(c.add_sequence(1, iota_prompt(2 * bs + 1, 10), {.priority = 0}));
  ASSERT_TRUE(c.add_sequence(2, iota_prompt(2 * bs + 1, 300), {.priority = 1}));
  c.begin_step();
  EXPECT_EQ(c.plan().swap_outs().size(), 2U) << "only the blocks of the request at the floor";
  EXPECT_EQ(c.tier().stats().below_priority, 2);

  // A kept lookup goes stale when the tier changes (a store completes), and says so without changing anything.
  const auto p = iota_prompt(2 * bs + 1, 300);
  ASSERT_TRUE(c.free_sequence(2));
  flush_device(c, 5000, 0);
  prefix_hit kept;
  ASSERT_TRUE(c.match_prefix(p, {}, kept));
  c.begin_step();  // the stores complete: the tier's answer changes
  const cache_stats before = c.stats();
  EXPECT_EQ(c.add_sequence(7, p, {}, kept).code(), errc::stale_prefix_hit);
  EXPECT_EQ(c.stats(), before);
  ASSERT_TRUE(c.match_prefix(p, {}, kept));
  EXPECT_TRUE(c.add_sequence(7, p, {}, kept));
}

TEST(TierCache, FailedCallsChangeNothingInEitherTier) {
  auto c = *lru_cache::create(tier_config(6, 16));
  const auto p = iota_prompt(3 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  flush_device(c, 5000, 2);
  ASSERT_TRUE(c.add_sequence(2, iota_prompt(3 * bs, 7000)));  // 3 of the 5 blocks in use
  const cache_stats before = c.stats();
  const host_tier_stats tier_before = c.tier().stats();
  EXPECT_EQ(c.add_sequence(3, p).code(), errc::out_of_blocks);  // needs 4 blocks, 3 of them loads
  EXPECT_EQ(c.stats(), before);
  EXPECT_EQ(c.tier().stats(), tier_before) << "not even a lookup counted";
  EXPECT_TRUE(c.plan().swap_ins().empty());
}

TEST(TierCache, ResetForgetsBothTiersOnlyWhenNothingIsInFlight) {
  auto c = *lru_cache::create(tier_config(9, 16));
  kv_event_buffer events;
  ASSERT_TRUE(c.set_kv_event_buffer(&events));
  ASSERT_TRUE(c.add_sequence(1, iota_prompt(2 * bs + 1, 10)));
  c.begin_step();  // stores planned
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.reset_prefix_cache().code(), errc::invalid_block) << "stores in flight";
  c.begin_step();
  std::int32_t host_stored = 0;
  for (const kv_event& e : events.events)
    if (e.type == kv_event_type::block_stored && e.medium == kv_medium::host)
      host_stored += static_cast<std::int32_t>(e.num_hashes);
  EXPECT_EQ(host_stored, 2) << "the tier reports its blocks on the host medium when their stores complete";
  ASSERT_TRUE(c.reset_prefix_cache());
  EXPECT_EQ(c.tier().stats().held, 0);
  EXPECT_EQ(c.match_prefix(iota_prompt(2 * bs + 1, 10))->tokens, 0);
}

}  // namespace
}  // namespace kvpager
