// SPDX-License-Identifier: Apache-2.0
// Swapping sequences to a host pool, and preemption by swap or recompute.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "support/cache_types.hpp"

using namespace kvpager;

namespace {
using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;
using hybrid_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, hybrid_swap>;
using recompute_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;

template <class Cache>
Cache make(std::int32_t num_blocks, std::int32_t host_blocks, std::int32_t block_size = 16) {
  auto r = Cache::create({block_size, num_blocks, 0, 0, host_blocks});
  EXPECT_TRUE(r.ok());
  return std::move(*r);
}
std::vector<block_id> vec(std::span<const block_id> s) { return {s.begin(), s.end()}; }
const std::vector<seq_id> probe = {1, 2, 3, 4};
}  // namespace

static_assert(swap_policy<host_swap> && swap_policy<recompute> && swap_policy<hybrid_swap>);

// The seed's SwapManager demo, with the out-of-blocks case its code would crash on.
TEST(Swap, SeedDemo) {
  auto c = make<swap_cache>(100, 200);
  ASSERT_TRUE(c.add_sequence(1, 80 * 16));
  ASSERT_TRUE(c.add_sequence(2, 15 * 16));
  c.begin_step();
  ASSERT_TRUE(c.swap_out(1));
  EXPECT_EQ(c.plan().swap_outs().size(), 80U);
  EXPECT_EQ(c.stats().free, 85);
  EXPECT_EQ(c.stats().host_free, 120);
  EXPECT_TRUE(c.is_swapped(1));
  c.begin_step();
  const auto before = kvtest::take_snapshot(c, probe);
  const status st = c.add_sequence(3, 90 * 16);
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 90);
  EXPECT_TRUE(kvtest::take_snapshot(c, probe) == before);
  ASSERT_TRUE(c.add_sequence(3, 85 * 16));
  EXPECT_EQ(c.swap_in(1).code(), errc::out_of_blocks);
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(3));
  ASSERT_TRUE(c.swap_in(1));
  EXPECT_EQ(c.plan().swap_ins().size(), 80U);
  EXPECT_EQ(vec(*c.block_table(1)).size(), 80U);
  c.begin_step();
  EXPECT_EQ(c.stats().host_free, 200);
}

TEST(Swap, PlanPairsMatchTheTables) {
  auto c = make<swap_cache>(16, 16);
  ASSERT_TRUE(c.add_sequence(1, 40));
  c.begin_step();
  const auto device = vec(*c.block_table(1));
  ASSERT_TRUE(c.swap_out(1));
  const auto host = vec(*c.host_block_table(1));
  ASSERT_EQ(c.plan().swap_outs().size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(c.plan().swap_outs()[i], (block_swap{device[i], host[i]}));
  EXPECT_EQ(c.block_table(1).code(), errc::sequence_swapped);
  EXPECT_EQ(*c.num_tokens(1), 40);
  c.begin_step();
  ASSERT_TRUE(c.swap_in(1));
  const auto back = vec(*c.block_table(1));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(c.plan().swap_ins()[i], (block_swap{back[i], host[i]}));
  EXPECT_EQ(c.stats().swapped_out_blocks, 3);
  EXPECT_EQ(c.stats().swapped_in_blocks, 3);
}

TEST(Swap, SharedBlocksAreSwappedOnceAndSharedAgain) {
  auto c = make<swap_cache>(32, 32);
  ASSERT_TRUE(c.add_sequence(1, 40));  // 3 blocks
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));          // shares all 3
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(2));    // CoW of the partial block: 4 distinct blocks now
  c.begin_step();
  const std::vector<seq_id> group = {1, 2};
  ASSERT_TRUE(c.swap_out(group));
  EXPECT_EQ(c.plan().swap_outs().size(), 4U) << "the two shared blocks are copied once";
  const auto h1 = vec(*c.host_block_table(1)), h2 = vec(*c.host_block_table(2));
  EXPECT_EQ(h1[0], h2[0]);
  EXPECT_EQ(h1[1], h2[1]);
  EXPECT_NE(h1[2], h2[2]);
  EXPECT_EQ(c.stats().used, 0);
  c.begin_step();
  ASSERT_TRUE(c.swap_in(group));
  EXPECT_EQ(c.plan().swap_ins().size(), 4U);
  const auto d1 = vec(*c.block_table(1)), d2 = vec(*c.block_table(2));
  EXPECT_EQ(d1[0], d2[0]);
  EXPECT_EQ(d1[1], d2[1]);
  EXPECT_EQ(c.refcount(d1[0]), 2) << "sharing is preserved";
  EXPECT_EQ(c.stats().used, 4);
}

TEST(Swap, SwappingOneSharerKeepsTheOthersBlocksOnDevice) {
  auto c = make<swap_cache>(32, 32);
  ASSERT_TRUE(c.add_sequence(1, 32));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  const auto t = vec(*c.block_table(2));
  ASSERT_TRUE(c.swap_out(1));
  EXPECT_EQ(vec(*c.block_table(2)), t);
  for (const block_id b : t) EXPECT_EQ(c.refcount(b), 1);
  EXPECT_EQ(c.plan().swap_outs().size(), 2U);
}

TEST(Swap, ErrorsChangeNothing) {
  auto c = make<swap_cache>(16, 4);
  ASSERT_TRUE(c.add_sequence(1, 80));  // 5 blocks: more than the host pool
  ASSERT_TRUE(c.add_sequence(2, 16));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(2), errc::pending_append);
  c.begin_step();
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(1), errc::host_pool_full);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(9), errc::unknown_sequence);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_in(2), errc::sequence_swapped);
  const std::vector<seq_id> twice = {2, 2};
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(twice), errc::invalid_argument);
  ASSERT_TRUE(c.swap_out(2));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(2), errc::sequence_swapped);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.append_tokens(2), errc::sequence_swapped);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.fork(2, 3), errc::sequence_swapped);
  std::vector<std::int32_t> table(8), lens(1);
  const std::vector<seq_id> two = {2};
  EXPECT_EQ(c.export_block_table(two, table, 8, lens).code(), errc::sequence_swapped);
  // Fill the device pool, then swap-in has no room.
  ASSERT_TRUE(c.add_sequence(3, 11 * 16));
  c.begin_step();
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_in(2), errc::out_of_blocks);
  // A swapped sequence can be freed: its host blocks come back at the next step.
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.stats().host_free, 3);
  c.begin_step();
  EXPECT_EQ(c.stats().host_free, 4);
}

TEST(Swap, NoHostPoolCannotSwap) {
  auto c = kvtest::make_cache<kvtest::default_cache>(8);
  ASSERT_TRUE(c.add_sequence(1, 16));
  c.begin_step();
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe, c.swap_out(1), errc::unsupported);
  EXPECT_EQ(c.preempt(1).code(), errc::unsupported);
  auto h = make<hybrid_cache>(8, 0);  // a swapping policy without host blocks: no host pool either
  ASSERT_TRUE(h.add_sequence(1, 16));
  h.begin_step();
  KVTEST_EXPECT_FAILS_UNCHANGED(h, probe, h.swap_out(1), errc::unsupported);
  EXPECT_EQ(*h.preempt(1), preempt_action::recompute);
}

// Since 0.2.0 the host pool is the cache's (cache_config::num_host_blocks), whatever the policy: no_swap does not
// preempt, but the engine can swap explicitly.
TEST(Swap, TheHostPoolIsTheCachesNotThePolicys) {
  auto c = *kvtest::default_cache::create({16, 8, 0, 0, 4});
  ASSERT_TRUE(c.add_sequence(1, 32));
  c.begin_step();
  EXPECT_EQ(c.preempt(1).code(), errc::unsupported);
  ASSERT_TRUE(c.swap_out(1));
  EXPECT_EQ(c.stats().host_free, 2);
  c.begin_step();
  ASSERT_TRUE(c.swap_in(1));
  EXPECT_EQ(c.stats().swapped_in_blocks, 2);
}

// The host pool is a block_pool<lifo_allocator>: its refcounts are the swapped tables' references (a block shared
// within the group is one host block with one reference per table), and it hands out the most recently freed
// block first.
TEST(Swap, HostPoolIsABlockPool) {
  auto c = make<swap_cache>(16, 8);
  ASSERT_TRUE(c.add_sequence(1, 40));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  const std::vector<seq_id> both = {1, 2};
  ASSERT_TRUE(c.swap_out(both));
  const block_pool<lifo_allocator>* pool = c.host_pool();
  ASSERT_NE(pool, nullptr);
  const auto h = vec(*c.host_block_table(1));
  EXPECT_EQ(vec(*c.host_block_table(2)), h);
  for (const block_id hb : h) EXPECT_EQ(pool->refcount(hb), 2);
  EXPECT_EQ(pool->num_free(), c.stats().host_free);
  EXPECT_EQ(pool->stats().references, 6);
  ASSERT_TRUE(c.free_sequence(2));
  for (const block_id hb : h) EXPECT_EQ(pool->refcount(hb), 1);
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(pool->num_free(), 5) << "freed host blocks return at the next step";
  c.begin_step();
  EXPECT_EQ(pool->num_free(), 8);
  ASSERT_TRUE(c.add_sequence(3, 16));
  c.begin_step();
  ASSERT_TRUE(c.swap_out(3));
  EXPECT_EQ(vec(*c.host_block_table(3)).front(), h.back()) << "the most recently freed host block comes first";
  EXPECT_EQ(kvtest::default_cache::create({16, 8, 0, 0}).value().host_pool(), nullptr);
}

TEST(Swap, HostBlocksFreedInAStepAreNotReusedInIt) {
  auto c = make<swap_cache>(16, 2);
  ASSERT_TRUE(c.add_sequence(1, 32));
  ASSERT_TRUE(c.add_sequence(2, 32));
  c.begin_step();
  ASSERT_TRUE(c.swap_out(1));
  c.begin_step();
  ASSERT_TRUE(c.swap_in(1));  // its host blocks are read by this step's swap-ins
  EXPECT_EQ(c.swap_out(2).code(), errc::host_pool_full) << "they must not be overwritten in the same step";
  c.begin_step();
  EXPECT_TRUE(c.swap_out(2));
}

TEST(Preempt, PolicyDecides) {
  auto s = make<swap_cache>(16, 8);
  ASSERT_TRUE(s.add_sequence(1, 48));
  s.begin_step();
  auto a = s.preempt(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, preempt_action::swap);
  EXPECT_TRUE(s.is_swapped(1));
  EXPECT_EQ(s.stats().preempted_swap, 1);

  auto r = make<recompute_cache>(16, 0);
  ASSERT_TRUE(r.add_sequence(1, 48));
  a = r.preempt(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, preempt_action::recompute);
  EXPECT_FALSE(r.contains(1));
  EXPECT_EQ(r.stats().free, 16);
  EXPECT_EQ(r.stats().preempted_recompute, 1);

  auto h = make<hybrid_cache>(16, 3);
  ASSERT_TRUE(h.add_sequence(1, 48));  // 3 blocks: fits the host pool
  ASSERT_TRUE(h.add_sequence(2, 64));  // 4 blocks
  h.begin_step();
  EXPECT_EQ(*h.preempt(1), preempt_action::swap);
  EXPECT_EQ(*h.preempt(2), preempt_action::recompute) << "the host pool is full: recompute";
  EXPECT_FALSE(h.contains(2));
}
