// SPDX-License-Identifier: Apache-2.0
// Behavioural suite of paged_kv_cache, run for every shipped composition and for user-written policies.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "support/cache_types.hpp"

using namespace kvpager;
using kvtest::make_cache;

template <class Cache>
class CacheTest : public ::testing::Test {};
TYPED_TEST_SUITE(CacheTest, kvtest::all_caches);

namespace {
const std::vector<seq_id> probe_ids = {1, 2, 3, 4, 99};

template <class Cache>
std::vector<block_id> table_of(const Cache& c, seq_id id) {
  auto t = c.block_table(id);
  EXPECT_TRUE(t.ok());
  return t ? std::vector<block_id>(t->begin(), t->end()) : std::vector<block_id>{};
}
}  // namespace

TYPED_TEST(CacheTest, CreateRejectsBadConfig) {
  for (std::int32_t bs : {0, -16, 12, 3, 48}) {
    auto r = TypeParam::create({bs, 64, 0, 0});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.code(), errc::invalid_block_size) << bs;
  }
  EXPECT_EQ(TypeParam::create({16, 0, 0, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(TypeParam::create({16, -5, 0, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(TypeParam::create({16, 4, 4, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(TypeParam::create({16, 4, -1, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(TypeParam::create({16, 4, 0, -1}).code(), errc::invalid_argument);
  EXPECT_EQ(TypeParam::create({16, 4, 0, 0, -1}).code(), errc::invalid_pool_size);  // num_host_blocks
  for (std::int32_t bs : {1, 8, 16, 32, 256}) EXPECT_TRUE(TypeParam::create({bs, 4, 0, 0}).ok()) << bs;
}

TYPED_TEST(CacheTest, FreshCacheStats) {
  auto c = make_cache<TypeParam>(100, 16, 1);
  const cache_stats s = c.stats();
  EXPECT_EQ(s.total, 99);
  EXPECT_EQ(s.free, 99);
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.logical, 0);
  EXPECT_EQ(s.shared, 0);
  EXPECT_EQ(s.sequences, 0);
  EXPECT_EQ(s.block_size, 16);
  EXPECT_EQ(c.available_blocks(), 99);
}

TYPED_TEST(CacheTest, ReservedBlocksAreNeverHandedOut) {
  auto c = make_cache<TypeParam>(5, 16, 2);
  ASSERT_TRUE(c.add_sequence(1, 48));
  for (const block_id b : table_of(c, 1)) EXPECT_GE(b, 2);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.add_sequence(2, 1), errc::out_of_blocks);
}

TYPED_TEST(CacheTest, PrefillTakesCeilBlocksInOneBatch) {
  auto c = make_cache<TypeParam>(1000);
  const std::vector<std::pair<std::int32_t, std::size_t>> cases = {{1, 1}, {15, 1}, {16, 1}, {17, 2}, {320, 20}};
  seq_id id = 1;
  std::int64_t used = 0;
  for (auto [tokens, blocks] : cases) {
    ASSERT_TRUE(c.add_sequence(id, tokens));
    auto t = table_of(c, id);
    EXPECT_EQ(t.size(), blocks) << tokens;
    EXPECT_EQ(std::set<block_id>(t.begin(), t.end()).size(), blocks) << "duplicate block in a table";
    EXPECT_EQ(*c.num_tokens(id), tokens);
    used += static_cast<std::int64_t>(blocks);
    EXPECT_EQ(c.stats().used, used);
    ++id;
  }
  // The plan holds each prompt's tokens once.
  ASSERT_EQ(c.plan().appends().size(), cases.size());
  EXPECT_EQ(c.plan().appends()[4], (token_range{5, 0, 320}));
  EXPECT_EQ(c.slot_mapping_size(), 1 + 15 + 16 + 17 + 320);
}

TYPED_TEST(CacheTest, PrefillErrorsChangeNothing) {
  auto c = make_cache<TypeParam>(10, 16, 0, 4);
  ASSERT_TRUE(c.add_sequence(1, 20));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.add_sequence(2, 0), errc::invalid_argument);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.add_sequence(2, -3), errc::invalid_argument);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.add_sequence(1, 5), errc::duplicate_sequence);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.add_sequence(2, 16 * 4 + 1), errc::invalid_argument);
  ASSERT_TRUE(c.add_sequence(2, 64));
  ASSERT_TRUE(c.add_sequence(3, 32));
  // 10 - 2 - 4 - 2 = 2 blocks left; a 3-block prompt fails and reports what it needed.
  const auto before = kvtest::take_snapshot(c, probe_ids);
  const status st = c.add_sequence(4, 40);
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 3);
  EXPECT_TRUE(kvtest::take_snapshot(c, probe_ids) == before);
  EXPECT_TRUE(c.add_sequence(4, 32));
}

TYPED_TEST(CacheTest, DecodeAllocatesExactlyWhenTokensExceedCapacity) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 16));
  EXPECT_EQ(table_of(c, 1).size(), 1U);
  ASSERT_TRUE(c.append_tokens(1));  // 17 > 1 x 16
  EXPECT_EQ(table_of(c, 1).size(), 2U);
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(c.append_tokens(1));  // 32 tokens fit in 2 blocks
  EXPECT_EQ(table_of(c, 1).size(), 2U);
  ASSERT_TRUE(c.append_tokens(1));  // 33
  EXPECT_EQ(table_of(c, 1).size(), 3U);
  ASSERT_TRUE(c.append_tokens(1, token_count{40}));  // 73 tokens: 5 blocks
  EXPECT_EQ(table_of(c, 1).size(), 5U);
  EXPECT_EQ(*c.num_tokens(1), 73);
  EXPECT_EQ(c.stats().tokens, 73);
}

TYPED_TEST(CacheTest, DecodeErrorsChangeNothing) {
  auto c = make_cache<TypeParam>(3, 16, 0, 2);
  ASSERT_TRUE(c.add_sequence(1, 16));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(1, token_count{0}), errc::invalid_argument);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(1, token_count{-1}), errc::invalid_argument);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(7), errc::unknown_sequence);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(1, token_count{17}), errc::invalid_argument);  // > 2 blocks
  ASSERT_TRUE(c.add_sequence(2, 32));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(1), errc::out_of_blocks);
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_TRUE(c.append_tokens(1));
}

// The seed's GlobalBlockPool walk-through: 500 blocks, three prompts, 100 decode steps, one completion.
TYPED_TEST(CacheTest, SeedServingCycle) {
  auto c = make_cache<TypeParam>(500);
  ASSERT_TRUE(c.add_sequence(1, 200));  // 13 blocks
  ASSERT_TRUE(c.add_sequence(2, 150));  // 10 blocks
  ASSERT_TRUE(c.add_sequence(3, 300));  // 19 blocks
  EXPECT_EQ(c.stats().free, 500 - 42);
  for (int step = 0; step < 100; ++step) {
    c.begin_step();
    for (seq_id id : {1, 2, 3}) ASSERT_TRUE(c.append_tokens(id));
  }
  EXPECT_EQ(c.stats().free, 500 - (19 + 16 + 25));
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.stats().free, 500 - (16 + 25));
}

TYPED_TEST(CacheTest, ForkSharesOrCopiesAllBlocks) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 40));  // 3 blocks, last holds 8 tokens
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  const auto parent = table_of(c, 1);
  const auto child = table_of(c, 2);
  EXPECT_EQ(*c.num_tokens(2), 40);
  ASSERT_EQ(child.size(), 3U);
  const cache_stats s = c.stats();
  EXPECT_EQ(s.logical, 6);
  if constexpr (kvtest::shares_on_fork<TypeParam>) {
    EXPECT_EQ(child, parent);
    EXPECT_EQ(s.used, 3);
    EXPECT_EQ(s.shared, 3);
    for (const block_id b : parent) EXPECT_EQ(c.refcount(b), 2);
    EXPECT_TRUE(c.plan().copies().empty());
    EXPECT_NEAR(s.sharing_ratio(), 0.5, 1e-12);
  } else {
    EXPECT_EQ(s.used, 6);
    EXPECT_EQ(s.shared, 0);
    ASSERT_EQ(c.plan().copies().size(), 3U);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(c.plan().copies()[i], (block_copy{parent[i], child[i]}));
    EXPECT_EQ(s.fork_copies, 3);
  }
}

TYPED_TEST(CacheTest, ForkPrefixSharesTheSystemPrompt) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 100));  // 7 blocks
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2, 64));  // the first 4 blocks
  EXPECT_EQ(*c.num_tokens(2), 64);
  ASSERT_EQ(table_of(c, 2).size(), 4U);
  ASSERT_TRUE(c.fork(1, 3, 20));  // 2 blocks, the second partly filled for the child
  EXPECT_EQ(table_of(c, 3).size(), 2U);
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(3));  // writes position 20 inside a block the parent also uses
  const auto t3 = table_of(c, 3);
  const auto t1 = table_of(c, 1);
  EXPECT_NE(t3[1], t1[1]) << "the child's write must not land in the parent's block";
  if constexpr (kvtest::shares_on_fork<TypeParam>) {
    EXPECT_EQ(t3[0], t1[0]);
    ASSERT_EQ(c.plan().copies().size(), 1U);
    EXPECT_EQ(c.plan().copies()[0], (block_copy{t1[1], t3[1]}));
  }
}

TYPED_TEST(CacheTest, CopyOnWriteOnSharedPartialBlock) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 20));  // block 0 full, block 1 holds 4 tokens
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  const auto before = table_of(c, 1);
  ASSERT_TRUE(c.append_tokens(2));
  const auto child = table_of(c, 2);
  if constexpr (kvtest::shares_on_fork<TypeParam>) {
    EXPECT_EQ(child[0], before[0]) << "full blocks stay shared";
    EXPECT_NE(child[1], before[1]);
    ASSERT_EQ(c.plan().copies().size(), 1U);
    EXPECT_EQ(c.plan().copies()[0], (block_copy{before[1], child[1]}));
    EXPECT_EQ(c.refcount(before[1]), 1);
    EXPECT_EQ(c.refcount(child[1]), 1);
    EXPECT_EQ(c.stats().cow_copies, 1);
    EXPECT_EQ(table_of(c, 1), before) << "the parent keeps its blocks";
    ASSERT_TRUE(c.append_tokens(1));  // now exclusive: written in place
    EXPECT_EQ(table_of(c, 1), before);
    EXPECT_EQ(c.plan().copies().size(), 1U);
  } else {
    EXPECT_TRUE(c.plan().copies().empty()) << "nothing is shared, nothing to copy";
  }
}

TYPED_TEST(CacheTest, AppendAfterSharedFullBlockNeedsNoCopy) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 32));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(2));
  EXPECT_TRUE(c.plan().copies().empty());
  EXPECT_EQ(table_of(c, 2).size(), 3U);
}

TYPED_TEST(CacheTest, ForkErrorsChangeNothing) {
  auto c = make_cache<TypeParam>(8);
  ASSERT_TRUE(c.add_sequence(1, 40));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 2), errc::pending_append);
  c.begin_step();
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(9, 2), errc::unknown_sequence);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 1), errc::duplicate_sequence);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 2, 41), errc::invalid_argument);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 2, -1), errc::invalid_argument);
  ASSERT_TRUE(c.add_sequence(3, 1));
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 3), errc::duplicate_sequence);
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(4, 48));  // 8 - 3 - 1 - 3 = 1 block left
  if constexpr (!kvtest::shares_on_fork<TypeParam>) {
    KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.fork(1, 2), errc::out_of_blocks);
  } else {
    ASSERT_TRUE(c.fork(1, 2));
    ASSERT_TRUE(c.fork(1, 99));
    c.begin_step();
    ASSERT_TRUE(c.append_tokens(1));  // CoW of the shared partial block takes the last free block
    KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_tokens(2), errc::out_of_blocks);  // still shared with 99
  }
}

TYPED_TEST(CacheTest, FreeDropsReferencesAndReturnsBlocks) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 64));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  const auto t = table_of(c, 1);
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_FALSE(c.contains(1));
  if constexpr (kvtest::shares_on_fork<TypeParam>) {
    for (const block_id b : t) {
      EXPECT_EQ(c.refcount(b), 1);
      EXPECT_FALSE(c.is_free(b));
    }
  } else {
    for (const block_id b : t) EXPECT_TRUE(c.is_free(b));
  }
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.stats().free, 100);
  EXPECT_EQ(c.stats().used, 0);
  EXPECT_EQ(c.stats().logical, 0);
  EXPECT_EQ(c.stats().tokens, 0);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.free_sequence(1), errc::unknown_sequence);  // double free
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.free_sequence(42), errc::unknown_sequence);
}

TYPED_TEST(CacheTest, SequenceIdsAreReusableAfterFree) {
  auto c = make_cache<TypeParam>(100);
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(c.add_sequence(7, 33));
    ASSERT_TRUE(c.add_sequence(~seq_id{0}, 1));
    ASSERT_TRUE(c.free_sequence(7));
    ASSERT_TRUE(c.free_sequence(~seq_id{0}));
  }
  EXPECT_EQ(c.stats().free, 100);
}

TYPED_TEST(CacheTest, BlocksUsedByPlannedCopiesAreNotReusedInTheSameStep) {
  auto c = make_cache<TypeParam>(100);
  ASSERT_TRUE(c.add_sequence(1, 20));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(2));  // share: CoW of the partial block
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.free_sequence(2));
  // Every block a planned copy reads or writes is parked until the plan has run.
  std::set<block_id> busy;
  for (const block_copy& cp : c.plan().copies()) {
    busy.insert(cp.src);
    busy.insert(cp.dst);
  }
  for (const block_id b : busy) EXPECT_FALSE(c.is_free(b)) << b;
  EXPECT_EQ(c.stats().pending_free, static_cast<std::int32_t>(busy.size()));
  EXPECT_EQ(c.stats().free + c.stats().pending_free, 100);
  c.begin_step();
  for (const block_id b : busy) EXPECT_TRUE(c.is_free(b)) << b;
  EXPECT_EQ(c.stats().free, 100);
  EXPECT_EQ(c.stats().pending_free, 0);
}

// The seed's BlockAllocator demo, with the figure it got wrong: 13 physical blocks back 18 table entries.
TYPED_TEST(CacheTest, SeedBlockAllocatorDemoCounts) {
  auto c = make_cache<TypeParam>(1000);
  ASSERT_TRUE(c.add_sequence(1, 10 * 16));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2, 5 * 16));
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(2, token_count{3 * 16}));
  const auto t1 = table_of(c, 1);
  const auto t2 = table_of(c, 2);
  ASSERT_EQ(t1.size(), 10U);
  ASSERT_EQ(t2.size(), 8U);
  const cache_stats s = c.stats();
  EXPECT_EQ(s.logical, 18);
  if constexpr (kvtest::shares_on_fork<TypeParam>) {
    EXPECT_TRUE(std::equal(t1.begin(), t1.begin() + 5, t2.begin()));
    EXPECT_EQ(s.used, 13);
    EXPECT_EQ(s.shared, 5);
    EXPECT_EQ(s.free, 1000 - 13);
  } else {
    EXPECT_EQ(s.used, 18);
  }
}

// A token id cannot be passed where a count is meant: append_tokens(id, next_token) does not compile (it appended
// next_token tokens before 0.2.0); the count is a token_count, and append_token takes one token id.
template <class Cache, class Arg>
concept appends_with = requires(Cache& c, Arg a) { c.append_tokens(seq_id{1}, a); };
static_assert(!appends_with<paged_kv_cache<>, token_id>);
static_assert(!appends_with<paged_kv_cache<>, std::int32_t>);
static_assert(!appends_with<paged_kv_cache<>, int>);
static_assert(!std::is_convertible_v<std::int32_t, token_count>);
static_assert(appends_with<paged_kv_cache<>, token_count>);
static_assert(appends_with<paged_kv_cache<>, std::span<const token_id>>);

TYPED_TEST(CacheTest, AppendTokenAppendsOneTokenWhateverItsId) {
  auto c = make_cache<TypeParam>(64);
  ASSERT_TRUE(c.add_sequence(1, 16));
  c.begin_step();
  const token_id next_token = 40;
  ASSERT_TRUE(c.append_token(1, next_token));
  EXPECT_EQ(*c.num_tokens(1), 17);
  ASSERT_EQ(c.plan().appends().size(), 1U);
  EXPECT_EQ(c.plan().appends()[0], (token_range{1, 16, 1}));
  ASSERT_TRUE(c.append_tokens(1, token_count{3}));
  EXPECT_EQ(*c.num_tokens(1), 20);
  KVTEST_EXPECT_FAILS_UNCHANGED(c, probe_ids, c.append_token(9, next_token), errc::unknown_sequence);
}

// create takes its policy objects by name; those left out are default-constructed.
TEST(CachePolicies, ArePassedToCreateByName) {
  using cache_t = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, kvtest::user_swap>;
  auto r = cache_t::create({16, 8, 0, 0}, {.swap = {.reserve = 7}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->swap().reserve, 7);
  auto d = cache_t::create({16, 8, 0, 0});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->swap().reserve, kvtest::user_swap{}.reserve);
  static_assert(std::is_same_v<cache_t::policies, cache_policies<free_list_allocator, no_eviction, refcount_sharing,
                                                                  kvtest::user_swap>>);
}

// One geometry from cache to kernel: the cache's block and pool sizes come from the kernels' kv_geometry.
TEST(CacheConfig, BlockAndPoolSizesComeFromTheKernelGeometry) {
  const kv_geometry g{.num_blocks = 96, .block_size = 32, .num_kv_heads = 8, .head_dim = 128, .dtype = kv_dtype::bf16};
  const cache_config cfg = cache_config_for(g, {.reserved_blocks = 1, .max_blocks_per_seq = 8});
  EXPECT_EQ(cfg.block_size, 32);
  EXPECT_EQ(cfg.num_blocks, 96);
  EXPECT_EQ(cfg.reserved_blocks, 1);
  EXPECT_EQ(cfg.max_blocks_per_seq, 8);
  auto cache = paged_kv_cache<free_list_allocator>::create(cfg);
  ASSERT_TRUE(cache);
  EXPECT_EQ(cache->block_size(), g.block_size);
  EXPECT_EQ(cache->stats().total, g.num_blocks - 1);
}

// Issue 22, point 1: the cache owns the geometry. cache_config states the pool's whole geometry (positional
// initialization unchanged), the cache answers geometry(), cache_config_for round-trips it, and create can check it
// with the compiled kernels' verdict (or any check) before building anything.
namespace {
kvpager::status refuse_head_dim_100(const kvpager::kv_geometry& g) noexcept {
  return g.head_dim == 100 ? kvpager::status{kvpager::errc::unsupported, "head dim 100"} : kvpager::ok_status();
}
}  // namespace

TEST(CacheGeometry, TheCacheOwnsItsGeometryAndCreateChecksItWhenAsked) {
  using namespace kvpager;
  using cache = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, no_swap>;
  const cache_config positional{16, 101, 1, 0};
  EXPECT_EQ(positional.block_size, 16);
  EXPECT_EQ(positional.num_blocks, 101);
  EXPECT_EQ(cache_config{}.block_size, default_block_size);
  EXPECT_EQ(kv_geometry{}.block_size, default_block_size);
  const kv_geometry g{64, 32, 8, 128, kv_dtype::bf16};
  const cache_config cfg = cache_config_for(g, {.reserved_blocks = 1, .max_blocks_per_seq = 8});
  EXPECT_EQ(cfg.geometry(), g);
  EXPECT_EQ(cfg.reserved_blocks, 1);
  auto c = cache::create(cfg);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->geometry(), g);
  EXPECT_EQ(block_bytes(c->geometry()), 2 * 32 * 8 * 128 * 2);
  EXPECT_EQ(block_bytes(c->geometry(), 32), kv_bytes_per_block(g, 32)) << "one statement of a block's bytes";
  EXPECT_EQ(kv_block_bytes(g, 32), block_bytes(g, 32));
  EXPECT_EQ(kv_layout::of(g).block_bytes(), block_bytes(g));
  // The check runs after validate() and its error is returned as it is; a passing check changes nothing.
  ASSERT_TRUE(cache::create(cfg, refuse_head_dim_100));
  cache_config bad = cfg;
  bad.head_dim = 100;
  const auto refused = cache::create(bad, refuse_head_dim_100);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), errc::unsupported);
  EXPECT_TRUE(cache::create(bad)) << "the cache alone does not care about the head dim";
  bad.head_dim = 0;
  EXPECT_EQ(cache::create(bad).code(), errc::invalid_argument) << "but a geometry must be one";
  bad = cfg;
  bad.block_size = 48;
  EXPECT_EQ(cache::create(bad, refuse_head_dim_100).code(), errc::invalid_block_size) << "validate() first";
  EXPECT_TRUE(cache::create(cfg, {})) << "{} is still the default policies";
  EXPECT_FALSE(checked_block_bytes({1, 1 << 20, 1 << 20, 1 << 21, kv_dtype::f16}));
}
