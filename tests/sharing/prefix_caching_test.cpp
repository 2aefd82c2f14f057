// Prefix caching: chained block hashes, longest-prefix hits capped at num_tokens - 1, blocks that stay hit-able
// after their last reference until evicted, vLLM's LRU order, collision safety and salts, and every eviction
// policy's order.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "support/cache_snapshot.hpp"

using namespace kvpager;

namespace {

std::vector<token_id> iota_tokens(std::int32_t n, token_id first) {
  std::vector<token_id> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}
std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
template <class Cache>
Cache make(std::int32_t num_blocks, std::int32_t block_size = 4, std::int32_t reserved = 1,
           typename Cache::sharing_policy_type sharing = {}) {
  auto r = Cache::create({block_size, num_blocks, reserved, 0}, {}, {}, std::move(sharing));
  EXPECT_TRUE(r.ok()) << r.error().message();
  return std::move(*r);
}
template <class Cache>
std::vector<block_id> table(const Cache& c, seq_id id) {
  const auto t = *c.block_table(id);
  return {t.begin(), t.end()};
}
/// A hasher that maps everything to one value: every lookup is a hash collision.
struct colliding_hasher {
  std::uint64_t operator()(std::uint64_t /*seed*/, std::span<const token_id> /*tokens*/) const noexcept { return 42; }
};

using vllm = vllm_v1_cache;
}  // namespace

static_assert(content_cache<prefix_caching>);
static_assert(content_cache<basic_prefix_caching<colliding_hasher>>);
static_assert(content_cache<content_cache_archetype>);
static_assert(!content_cache<refcount_sharing>);

TEST(PrefixCaching, HashesAreChainedAndDeterministic) {
  auto c = make<vllm>(32);
  const auto a = iota_tokens(8, 100);  // two full blocks of 4
  ASSERT_TRUE(c.add_sequence(1, concat(a, {7})));
  ASSERT_TRUE(c.add_sequence(2, concat(iota_tokens(4, 104), {7})));  // block 1's tokens, at position 0
  const auto t1 = table(c, 1), t2 = table(c, 2);
  const auto& s = c.sharing();
  EXPECT_NE(s.block_hash(t1[0]), s.block_hash(t1[1]));
  EXPECT_NE(s.block_hash(t1[1]), s.block_hash(t2[0])) << "same tokens after a different parent must hash differently";
  auto c2 = make<vllm>(32);
  ASSERT_TRUE(c2.add_sequence(9, concat(a, {7})));
  const auto u = table(c2, 9);
  EXPECT_EQ(c2.sharing().block_hash(u[0]), s.block_hash(t1[0]));
  EXPECT_EQ(c2.sharing().block_hash(u[1]), s.block_hash(t1[1]));
  EXPECT_EQ(c.stats().cached, 3);  // blocks 0,1 of seq 1 and block 0 of seq 2
}

TEST(PrefixCaching, LongestPrefixHitAndReportedTokens) {
  auto c = make<vllm>(32);
  const auto prompt = iota_tokens(10, 0);  // 2 full blocks + 2 tokens
  ASSERT_TRUE(c.add_sequence(1, prompt));
  prefix_match m;
  const auto other = concat(iota_tokens(8, 0), iota_tokens(5, 500));  // same first 2 blocks
  ASSERT_TRUE(c.add_sequence(2, other, {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.tokens, 8);
  const auto t1 = table(c, 1), t2 = table(c, 2);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);
  EXPECT_EQ(c.refcount(t1[0]), 2);
  // Only the tokens after the hit need their KV written.
  EXPECT_EQ(c.plan().appends().back(), (token_range{2, 8, 5}));
  EXPECT_EQ(c.stats().prefix_query_tokens, 23);
  EXPECT_EQ(c.stats().prefix_hit_tokens, 8);
}

TEST(PrefixCaching, HitIsCappedSoTheLastTokenIsComputed) {
  auto c = make<vllm>(32);
  const auto prompt = iota_tokens(8, 0);  // exactly 2 full blocks
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();  // the prompt's KV is written
  ASSERT_TRUE(c.free_sequence(1));
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 1) << "(8 - 1) / 4 = 1 block at most";
  EXPECT_EQ(m.tokens, 4);
  // Block 1 is recomputed into a new block with the same content: a duplicate under the same hash.
  EXPECT_EQ(c.stats().cached, 3);
  const auto single = iota_tokens(1, 0);
  ASSERT_TRUE(c.add_sequence(3, single, {}, &m));
  EXPECT_EQ(m.blocks, 0) << "a one-token prompt never hits";
}

TEST(PrefixCaching, FreedBlocksStayHitableUntilEvicted) {
  auto c = make<vllm>(5);  // 4 usable blocks
  const auto prompt = concat(iota_tokens(8, 0), {99});  // 3 blocks
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.stats().free, 4) << "cached blocks count as free (vLLM's usage)";
  EXPECT_EQ(c.stats().cached, 2);
  auto m = c.match_prefix(prompt);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks, 2);
  EXPECT_EQ(m->blocks_to_allocate, 3) << "2 hits leave the free queue + 1 new block";
  // Allocating 4 unrelated blocks reuses every block: both cached ones are evicted.
  ASSERT_TRUE(c.add_sequence(2, iota_tokens(16, 1000)));
  EXPECT_EQ(c.stats().evictions, 2);
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 0);
}

TEST(PrefixCaching, LruOrderIsVllmFreeQueue) {
  auto c = make<vllm>(9);  // blocks 1..8 usable, initially queued in id order
  ASSERT_TRUE(c.add_sequence(1, concat(iota_tokens(8, 0), {1})));  // blocks 1,2,3 (3 partial)
  ASSERT_TRUE(c.add_sequence(2, concat(iota_tokens(8, 50), {1})));  // blocks 4,5,6
  EXPECT_EQ(table(c, 1), (std::vector<block_id>{1, 2, 3}));
  EXPECT_EQ(table(c, 2), (std::vector<block_id>{4, 5, 6}));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(2));
  ASSERT_TRUE(c.free_sequence(1));
  // Free queue: 7, 8, then request 2 tail first (6, 5, 4), then request 1 tail first (3, 2, 1).
  std::vector<block_id> order;
  const auto& q = c.pool().allocator().queue();
  for (std::int32_t b = q.front(); b >= 0; b = q.next(b)) order.push_back(b);
  EXPECT_EQ(order, (std::vector<block_id>{7, 8, 6, 5, 4, 3, 2, 1}));
  // A hit on block 2... needs its parent block 1 first: request 1's first block (1) and second (2) are hit,
  // which unlinks them from the middle of the queue; the new blocks come from the head (7, 8).
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(3, concat(iota_tokens(8, 0), {5, 6, 7, 8, 9}), {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 3), (std::vector<block_id>{1, 2, 7, 8}));
  EXPECT_EQ(c.stats().evictions, 0);
  // The next allocation takes 6 (request 2's partial block, never cached), then 5: cached, evicted lazily now.
  ASSERT_TRUE(c.add_sequence(4, iota_tokens(5, 900)));
  EXPECT_EQ(table(c, 4), (std::vector<block_id>{6, 5}));
  EXPECT_EQ(c.stats().evictions, 1);
  EXPECT_EQ(c.match_prefix(concat(iota_tokens(8, 50), {1}))->blocks, 1) << "block 4 is still cached";
}

TEST(PrefixCaching, DecodeCommitsBlocksAsTheyFill) {
  auto c = make<vllm>(32);
  ASSERT_TRUE(c.add_sequence(1, iota_tokens(3, 0)));
  EXPECT_EQ(c.stats().cached, 0);
  const std::vector<token_id> more = {3, 4, 5, 6, 7};
  for (const token_id t : more) ASSERT_TRUE(c.append_tokens(1, std::span<const token_id>(&t, 1)));
  EXPECT_EQ(c.stats().cached, 2);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, iota_tokens(9, 0), {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 2)[1], table(c, 1)[1]);
}

TEST(PrefixCaching, CountAppendsStopCaching) {
  auto c = make<vllm>(32);
  ASSERT_TRUE(c.add_sequence(1, iota_tokens(3, 0)));
  ASSERT_TRUE(c.append_tokens(1, 5));  // ids unknown
  EXPECT_EQ(c.stats().cached, 0);
}

TEST(PrefixCaching, ForkedChildKeepsCaching) {
  auto c = make<vllm>(32);
  ASSERT_TRUE(c.add_sequence(1, iota_tokens(6, 0)));  // 1 full block + 2 tokens
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  c.begin_step();
  const std::vector<token_id> tail = {6, 7};
  ASSERT_TRUE(c.append_tokens(2, tail));  // fills block 1 (after copy-on-write)
  EXPECT_EQ(c.plan().copies().size(), 1U);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(3, iota_tokens(9, 0), {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 3)[1], table(c, 2)[1]);
}

TEST(PrefixCaching, ExtraKeysSeparateTenants) {
  auto c = make<vllm>(32);
  const auto prompt = iota_tokens(9, 0);
  ASSERT_TRUE(c.add_sequence(1, prompt, {.extra_key = 7}));
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, prompt, {.extra_key = 8}, &m));
  EXPECT_EQ(m.blocks, 0) << "a different salt must never hit";
  ASSERT_TRUE(c.add_sequence(3, prompt, {.extra_key = 7}, &m));
  EXPECT_EQ(m.blocks, 2);
  ASSERT_TRUE(c.add_sequence(4, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 0);
}

TEST(PrefixCaching, CollidingHashesNeverShareDifferentContent) {
  using colliding = paged_kv_cache<free_list_allocator, lru_eviction, basic_prefix_caching<colliding_hasher>>;
  auto c = make<colliding>(64);
  const auto a = iota_tokens(4, 0), b = iota_tokens(4, 100), x = iota_tokens(4, 200);
  ASSERT_TRUE(c.add_sequence(1, concat(concat(a, x), {1})));  // [A, X, .]
  ASSERT_TRUE(c.add_sequence(2, concat(concat(b, x), {1})));  // [B, X, .]: X after B is different content
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(3, concat(concat(b, x), {2}), {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 3)[0], table(c, 2)[0]);
  EXPECT_EQ(table(c, 3)[1], table(c, 2)[1]) << "X after B must be request 2's block, not request 1's";
  ASSERT_TRUE(c.add_sequence(4, concat(iota_tokens(4, 300), {1}), {}, &m));
  EXPECT_EQ(m.blocks, 0) << "a colliding hash with other tokens is a miss";
  ASSERT_TRUE(c.add_sequence(5, concat(a, {9}), {.extra_key = 1}, &m));
  EXPECT_EQ(m.blocks, 0) << "a colliding hash under another salt is a miss";

  // The opt-out trusts the hash: the same colliding requests now share wrongly, which is why it is opt-in.
  auto unsafe = make<colliding>(64, 4, 1, basic_prefix_caching<colliding_hasher>(prefix_caching_config{false}));
  ASSERT_TRUE(unsafe.add_sequence(1, concat(a, {1})));
  ASSERT_TRUE(unsafe.add_sequence(2, concat(b, {1}), {}, &m));
  EXPECT_EQ(m.blocks, 1);
}

TEST(PrefixCaching, MatchPrefixChangesNothing) {
  auto c = make<vllm>(16);
  const auto prompt = concat(iota_tokens(8, 0), {1});
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  const std::vector<seq_id> ids = {1, 2};
  const auto before = kvtest::take_snapshot(c, ids);
  auto m = c.match_prefix(prompt);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(kvtest::take_snapshot(c, ids) == before);
  prefix_match got;
  ASSERT_TRUE(c.add_sequence(2, prompt, {}, &got));
  EXPECT_EQ(got, *m);
  EXPECT_EQ(c.match_prefix({}).code(), errc::invalid_argument);
}

TEST(PrefixCaching, AdmissionFailureChangesNothing) {
  auto c = make<vllm>(5);  // 4 usable
  const auto prompt = concat(iota_tokens(8, 0), {1});
  ASSERT_TRUE(c.add_sequence(1, prompt));      // 3 blocks
  ASSERT_TRUE(c.add_sequence(2, iota_tokens(1, 77)));  // the 4th
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  const std::vector<seq_id> ids = {1, 2, 3};
  const auto before = kvtest::take_snapshot(c, ids);
  // 2 hits (free, so they count) + 3 new blocks = 5 > 4 available.
  const status st = c.add_sequence(3, concat(iota_tokens(8, 0), iota_tokens(9, 40)));
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 5);
  EXPECT_TRUE(kvtest::take_snapshot(c, ids) == before);
  EXPECT_EQ(c.stats().prefix_query_tokens, 10) << "a failed admission is not counted";
}

TEST(PrefixCaching, NoEvictionKeepsNothingOnceUnreferenced) {
  using live_only = paged_kv_cache<free_list_allocator, no_eviction, prefix_caching>;
  auto c = make<live_only>(16);
  const auto prompt = concat(iota_tokens(8, 0), {1});
  ASSERT_TRUE(c.add_sequence(1, prompt));
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 2) << "live sequences still share";
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.stats().cached, 0);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 0);
}

// ------------------------------------------------------------------------------------------ eviction orders

namespace {
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

// A parent block evicted while its child stays cached: once the parent is computed again, the old child is hit
// again (vLLM's chained hash does exactly this).
TEST(PrefixCaching, RecomputedParentRejoinsCachedChildren) {
  using cache_t = paged_kv_cache<free_list_allocator, priority_lru, prefix_caching>;
  auto c = make<cache_t>(8, 4, 1);  // 7 usable
  const auto prompt = concat(iota_tokens(12, 0), {1});  // blocks 0..2 full, block 3 partial
  ASSERT_TRUE(c.add_sequence(1, prompt, {.priority = 10}));
  ASSERT_TRUE(c.add_sequence(2, concat(iota_tokens(4, 0), {5}), {.priority = 0}));  // hits block 0
  const auto t1 = table(c, 1);
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));  // blocks 1, 2 cached at priority 10 (block 0 still used by 2)
  ASSERT_TRUE(c.free_sequence(2));  // block 0 cached at priority 0
  // Use up the clean blocks, then one more: the victim is block 0 (lowest priority).
  ASSERT_TRUE(c.add_sequence(3, iota_tokens(4 * (c.stats().free) + 1, 1000)));
  ASSERT_EQ(c.stats().evictions, 1);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 0) << "the chain starts with the evicted block";
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(3));
  // Recompute the parent: a new block for level 0, duplicates for levels 1 and 2.
  ASSERT_TRUE(c.add_sequence(4, prompt, {.priority = 10}));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(4));
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(5, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(table(c, 5)[1], t1[1]) << "the earliest block cached under level 1's hash is the original child";
  EXPECT_EQ(table(c, 5)[2], t1[2]);
}

// A fork that ends inside a cached full block, left as its only owner, writes into it: the block's cached content
// must be dropped first, or a later prompt would hit a block holding other tokens' KV.
TEST(PrefixCaching, WritingIntoAnOwnedCachedBlockDropsItsCacheEntry) {
  auto c = make<vllm>(32);
  const auto prompt = concat(iota_tokens(8, 0), {1});  // blocks [0..3], [4..7] cached
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2, 6));  // the child ends inside block [4..7]
  ASSERT_TRUE(c.free_sequence(1));
  const block_id shared = table(c, 2)[1];
  EXPECT_EQ(c.refcount(shared), 1);
  c.begin_step();
  const std::vector<token_id> other = {55};
  ASSERT_TRUE(c.append_tokens(2, other));  // position 6 of the block changes
  EXPECT_EQ(table(c, 2)[1], shared) << "exclusive: written in place";
  EXPECT_EQ(c.stats().evictions, 1);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 1) << "block [4..7] is no longer cached";
}

// A sequence freed in the step it was added: its blocks were committed to the cache before their KV is written.
// Blocks only it used are dropped from the cache (their KV is never computed); a block another sequence already
// hit keeps its slots, so the engine still writes the content that sequence relies on.
TEST(PrefixCaching, FreeingBeforeTheStepRunsKeepsOnlyWhatOthersUse) {
  auto c = make<vllm>(32);
  const auto prompt = concat(iota_tokens(8, 0), {1});
  ASSERT_TRUE(c.add_sequence(1, prompt));  // commits [0..3] and [4..7]; writes pending
  ASSERT_TRUE(c.add_sequence(2, concat(iota_tokens(4, 0), {9})));  // hits [0..3] in the same step
  const auto t1 = table(c, 1);
  ASSERT_TRUE(c.free_sequence(1));
  std::vector<std::int64_t> slots(static_cast<std::size_t>(c.slot_mapping_size()));
  ASSERT_TRUE(c.export_slot_mapping(slots));
  for (std::size_t p = 0; p < 4; ++p) EXPECT_EQ(slots[p], std::int64_t{t1[0]} * 4 + static_cast<std::int64_t>(p)) << p;
  for (std::size_t p = 4; p < 9; ++p) EXPECT_EQ(slots[p], -1) << p;
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 1) << "[4..7] was never computed: not cached";
  EXPECT_TRUE(c.sharing().is_cached(t1[0]));
  EXPECT_FALSE(c.sharing().is_cached(t1[1]));
}

// Continuing the case above: once the sharer is freed too, the block whose writes were kept must not be handed
// out again before the step runs (two sequences would write it); afterwards it is free and still cached.
TEST(PrefixCaching, KeptWritesParkTheBlockUntilTheStepRuns) {
  auto c = make<vllm>(6);  // 5 usable blocks
  const auto prompt = concat(iota_tokens(8, 0), {1});
  ASSERT_TRUE(c.add_sequence(1, prompt));                          // blocks a [0..3], b [4..7], c [8]
  ASSERT_TRUE(c.add_sequence(2, concat(iota_tokens(4, 0), {9})));  // hits a, plus one block
  const block_id a = table(c, 1)[0];
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_FALSE(c.is_free(a)) << "a's content is still to be written by this step's plan";
  EXPECT_EQ(c.stats().pending_free, 1);
  ASSERT_TRUE(c.add_sequence(3, iota_tokens(16, 500)));  // takes every other block
  for (const block_id b : table(c, 3)) EXPECT_NE(b, a);
  c.begin_step();
  EXPECT_TRUE(c.is_free(a));
  EXPECT_TRUE(c.sharing().is_cached(a));
  EXPECT_EQ(c.match_prefix(concat(iota_tokens(4, 0), {7}))->blocks, 1);
}

// ------------------------------------------------------------------------------------------ content entries

namespace {
/// Round r: a prompt of `blocks` full blocks (+1 token) at priority `head_priority` and the same prompt extended by
/// one block at `tail_priority`, which hits the prompt's blocks; the extension is freed first, so the prompt's
/// blocks are released last, with the prompt's priority. With the head cheaper to keep than the tail, the eviction
/// drops a chain's head before its tail and leaves orphan chains: cached tails whose ancestors are gone.
template <class Cache>
void orphan_chain_rounds(Cache& c, int rounds, std::int32_t blocks, std::int32_t head_priority,
                         std::int32_t tail_priority) {
  const std::int32_t bs = c.block_size();
  for (int r = 0; r < rounds; ++r) {
    const auto head = iota_tokens(blocks * bs, 100000 * (r + 1));
    const auto ext = concat(concat(head, iota_tokens(bs, 7)), {1});
    ASSERT_TRUE(c.add_sequence(1, concat(head, {1}), {.priority = head_priority}));
    prefix_match m;
    ASSERT_TRUE(c.add_sequence(2, ext, {.priority = tail_priority}, &m));
    ASSERT_EQ(m.blocks, blocks);
    c.begin_step();
    ASSERT_TRUE(c.free_sequence(2));
    ASSERT_TRUE(c.free_sequence(1));
    const auto& s = c.sharing();
    ASSERT_LE(s.num_entries(), s.max_entries()) << "round " << r;
    ASSERT_LE(s.num_entries() - s.num_orphan_entries(), s.num_cached()) << "round " << r;
  }
}
}  // namespace

// The case: priority_lru on a 24-block pool aborted on the fifth round ("content entries exhausted"),
// and wrote past the entry array with NDEBUG.
TEST(PrefixCaching, ContentEntriesNeverRunOutWithHeadsEvictedFirst) {
  using cache_t = paged_kv_cache<free_list_allocator, priority_lru, prefix_caching>;
  auto c = make<cache_t>(24, 4, 1);
  orphan_chain_rounds(c, 200, 6, 0, 100);
  EXPECT_GT(c.sharing().num_orphan_entries(), 0) << "the scenario must leave orphan chains";
}
