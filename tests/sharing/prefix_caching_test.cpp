// SPDX-License-Identifier: Apache-2.0
// Prefix caching: chained block hashes, longest-prefix hits capped at num_tokens - 1, blocks that stay hit-able
// after their last reference until evicted, vLLM's LRU order, collision safety and salts, and every eviction
// policy's order.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "sharing/tokens.hpp"
#include "support/cache_snapshot.hpp"

using namespace kvpager;

namespace {

using kvtest::concat;
using kvtest::iota_tokens;
template <class Cache>
Cache make(std::int32_t num_blocks, std::int32_t block_size = 4, std::int32_t reserved = 1,
           typename Cache::sharing_policy_type sharing = {}) {
  auto r = Cache::create({block_size, num_blocks, reserved, 0}, {.sharing = std::move(sharing)});
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
  for (const token_id t : more) ASSERT_TRUE(c.append_token(1, t));
  EXPECT_EQ(c.stats().cached, 2);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, iota_tokens(9, 0), {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 2)[1], table(c, 1)[1]);
}

TEST(PrefixCaching, CountAppendsStopCaching) {
  auto c = make<vllm>(32);
  ASSERT_TRUE(c.add_sequence(1, iota_tokens(3, 0)));
  ASSERT_TRUE(c.append_tokens(1, token_count{5}));  // ids unknown
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
  EXPECT_GT(c.sharing().reclaimed_orphans(), 0) << "more orphans than the bound allows: some were reclaimed";
}

namespace {
/// Directly on the policy: chains of 2-token blocks committed into given blocks. `first` is the chain's first
/// token; block i of the chain holds {first + 2i, first + 2i + 1}.
template <class P>
struct chain_driver {
  P& p;
  std::vector<token_id> block(token_id first, int i) const {
    return {static_cast<token_id>(first + 2 * i), static_cast<token_id>(first + 2 * i + 1)};
  }
  /// Commits the chain's blocks 0.. into `blocks`, reusing cached entries as a recompute would.
  void commit(token_id first, std::vector<block_id> blocks) {
    auto c = p.first_cursor(0);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto t = block(first, static_cast<int>(i));
      p.commit(blocks[i], c, t);
      ASSERT_TRUE(p.valid(c));
    }
  }
  /// Walks the chain as a lookup would, after recomputing its first `recomputed` blocks into `blocks`; returns the
  /// block that block `recomputed` of the chain hits, or no_block.
  block_id hit_after(token_id first, std::vector<block_id> blocks) {
    auto c = p.first_cursor(0);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      auto probe = c;
      EXPECT_EQ(p.lookup(probe, block(first, static_cast<int>(i))), no_block) << "block " << i << " is not cached";
      p.commit(blocks[i], c, block(first, static_cast<int>(i)));
    }
    return p.lookup(c, block(first, static_cast<int>(blocks.size())));
  }
  void check_bound() const {
    ASSERT_LE(p.num_entries(), p.max_entries());
    ASSERT_LE(p.num_entries() - p.num_orphan_entries(), p.num_cached());
  }
};

template <class P>
void reclaim_cuts_off_only_the_oldest_chain(P p) {
  p.reset(pool_geometry{6, 2, 0});
  ASSERT_EQ(p.max_entries(), 13);
  chain_driver<P> d{p};
  const token_id x = 100, y = 200, z = 300, w = 400, v = 500, q = 600;
  // Four 3-block chains whose heads are dropped before their tails: 8 orphans, 4 cached tails (blocks 2..5).
  const std::pair<token_id, block_id> chains[] = {{x, 2}, {y, 3}, {z, 4}, {w, 5}};
  for (const auto& [first, tail] : chains) {
    d.commit(first, {0, 1, tail});
    p.uncache(0);
    p.uncache(1);
  }
  EXPECT_EQ(p.num_entries(), 12);
  EXPECT_EQ(p.num_orphan_entries(), 8);
  d.check_bound();
  // Two more entries: the 13th is the last free one, the 14th reclaims the oldest orphan (x's head).
  d.commit(v, {0, 1});
  EXPECT_EQ(p.num_entries(), 13);
  EXPECT_EQ(p.reclaimed_orphans(), 1);
  d.check_bound();
  p.uncache(1);  // v's second entry goes: its slot, x's head's, is the next one handed out
  // Another head q takes that slot. x's second block, still an orphan naming that slot as parent, must not be
  // taken for q's second block (its parent is x's head, not q's): a new entry, and x's tail stays out of reach.
  auto cq = p.first_cursor(0);
  p.commit(1, cq, d.block(q, 0));
  p.uncache(0);
  p.commit(0, cq, d.block(x, 1));
  EXPECT_EQ(p.lookup(cq, d.block(x, 2)), no_block) << "x's tail reached behind another head";
  d.check_bound();
  p.uncache(0);
  p.uncache(1);
  // x's tail is still cached, but its chain is cut: recomputing x's head does not reach it.
  EXPECT_TRUE(p.is_cached(2));
  EXPECT_EQ(d.hit_after(x, {0, 1}), no_block);
  d.check_bound();
  p.uncache(1);
  p.uncache(0);
  // y's orphans were kept: once its head is recomputed, its old tail is hit again.
  EXPECT_EQ(d.hit_after(y, {0, 1}), 3);
  d.check_bound();
}
}  // namespace

// An orphan reclaimed to make room cuts off its own descendants only (its slot is reused: the serials keep its old
// children from matching the new occupant, even when every hash collides); other orphan chains still rejoin.
TEST(PrefixCaching, ReclaimingTheOldestOrphanCutsOffOnlyItsChain) {
  reclaim_cuts_off_only_the_oldest_chain(prefix_caching{});
}
TEST(PrefixCaching, ReclaimingTheOldestOrphanCutsOffOnlyItsChainWhenHashesCollide) {
  reclaim_cuts_off_only_the_oldest_chain(basic_prefix_caching<colliding_hasher>{});
}

// Without token verification an entry is the hash alone: it lives exactly while a block holds it (no orphans),
// and a recomputed head reaches its old children through the hash, as vLLM does.
TEST(PrefixCaching, UnverifiedEntriesLiveOnlyWhileHeld) {
  prefix_caching p(prefix_caching_config{false});
  p.reset(pool_geometry{4, 2, 0});
  chain_driver<prefix_caching> d{p};
  d.commit(100, {0, 1, 2});
  p.uncache(0);
  p.uncache(1);
  EXPECT_EQ(p.num_entries(), 1);
  EXPECT_EQ(p.num_orphan_entries(), 0);
  EXPECT_EQ(d.hit_after(100, {0, 1}), 2);
}

// first_holder_stamp and commits() (stamped_content_cache): what a cache needs to keep a lookup and re-check it.
TEST(PrefixCaching, FirstHolderStampsChangeExactlyWhenALookupWouldAnswerOtherwise) {
  for (const bool verify : {true, false}) {
    prefix_caching p(prefix_caching_config{verify});
    p.reset(pool_geometry{8, 2, 0});
    const std::vector<token_id> t{1, 2};
    const auto lookup = [&] {
      auto c = p.first_cursor(0);
      return p.lookup(c, t);
    };
    const auto commit = [&](block_id b) {
      auto c = p.first_cursor(0);
      p.commit(b, c, t);
    };
    EXPECT_EQ(p.commits(), 0u);
    EXPECT_EQ(p.first_holder_stamp(1), 0u);  // not cached
    commit(1);
    EXPECT_EQ(p.commits(), 1u);
    const std::uint64_t s1 = p.first_holder_stamp(1);
    EXPECT_NE(s1, 0u);
    commit(2);  // a duplicate: lookup still answers block 1, whose stamp stays
    EXPECT_EQ(lookup(), 1);
    EXPECT_EQ(p.first_holder_stamp(1), s1);
    EXPECT_EQ(p.first_holder_stamp(2), 0u);  // cached, but not what a lookup answers
    EXPECT_EQ(p.commits(), 2u);
    p.uncache(1);  // now block 2 answers: block 1's stamp is gone
    EXPECT_EQ(lookup(), 2);
    EXPECT_EQ(p.first_holder_stamp(1), 0u);
    EXPECT_NE(p.first_holder_stamp(2), 0u);
    EXPECT_EQ(p.commits(), 2u);  // uncaching commits nothing
    p.uncache(2);
    EXPECT_EQ(lookup(), no_block);
    commit(1);  // block 1 again, with a new entry: a stamp never seen before
    EXPECT_EQ(lookup(), 1);
    const std::uint64_t s2 = p.first_holder_stamp(1);
    EXPECT_NE(s2, 0u);
    EXPECT_NE(s2, s1);
    p.reset(pool_geometry{8, 2, 0});  // stamps and commits go on counting across a reset
    EXPECT_EQ(p.first_holder_stamp(1), 0u);
    EXPECT_EQ(p.commits(), 3u);
    commit(1);
    EXPECT_NE(p.first_holder_stamp(1), 0u);
    EXPECT_NE(p.first_holder_stamp(1), s1);
    EXPECT_NE(p.first_holder_stamp(1), s2);
    EXPECT_EQ(p.commits(), 4u);
  }
}

namespace {
/// Drives a cache with token ids, remembering for every cached block the whole prefix it ends (recorded when the
/// block is committed), and checks every prefix hit against it: a hit must be a block holding exactly the request's
/// prefix, whatever orphans were reclaimed and whatever hashes collide.
template <class Cache>
struct content_checker {
  Cache& c;
  std::map<seq_id, std::vector<token_id>> tokens;
  std::map<block_id, std::vector<token_id>> prefix_of;

  /// Records the blocks of `id` in [from, to) that are cached now.
  void record(seq_id id, std::int32_t from, std::int32_t to) {
    const auto t = *c.block_table(id);
    const auto& toks = tokens[id];
    const std::int32_t bs = c.block_size();
    for (std::int32_t i = from; i < to; ++i) {
      const block_id b = t[static_cast<std::size_t>(i)];
      if (c.sharing().is_cached(b))
        prefix_of[b].assign(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(i + 1) * bs);
    }
  }
  bool add(seq_id id, const std::vector<token_id>& prompt, std::int32_t priority) {
    prefix_match m;
    if (!c.add_sequence(id, prompt, {.priority = priority}, &m)) return false;
    tokens[id] = prompt;
    const auto t = *c.block_table(id);
    const std::int32_t bs = c.block_size();
    for (std::int32_t i = 0; i < m.blocks; ++i) {
      const auto it = prefix_of.find(t[static_cast<std::size_t>(i)]);
      EXPECT_TRUE(it != prefix_of.end() &&
                  std::equal(it->second.begin(), it->second.end(), prompt.begin(), prompt.begin() + (i + 1) * bs) &&
                  static_cast<std::int32_t>(it->second.size()) == (i + 1) * bs)
          << "a hit on block " << t[static_cast<std::size_t>(i)] << " at position " << i << " holds another prefix";
    }
    record(id, m.blocks, static_cast<std::int32_t>(prompt.size()) / bs);
    return true;
  }
  bool append(seq_id id, const std::vector<token_id>& more) {
    if (!c.append_tokens(id, more)) return false;
    auto& toks = tokens[id];
    const std::int32_t bs = c.block_size();
    const auto before = static_cast<std::int32_t>(toks.size());
    toks.insert(toks.end(), more.begin(), more.end());
    record(id, before / bs, static_cast<std::int32_t>(toks.size()) / bs);
    return true;
  }
  bool fork(seq_id parent, seq_id child, std::int32_t n) {
    if (!c.fork(parent, child, n)) return false;
    const auto& p = tokens[parent];
    tokens[child].assign(p.begin(), p.begin() + n);
    return true;
  }
  void free(seq_id id) {
    ASSERT_TRUE(c.free_sequence(id));
    tokens.erase(id);
  }
};

/// Head-first eviction driven through the cache, for any eviction policy: chains whose head block is overwritten
/// in place (a fork ending inside it writes into it), chains recomputed after their heads went (LFU: the
/// recomputed head has fewer hits than the old tail), fresh chains whose heads are released before their tails or
/// at a lower priority, and random frees, steps, hits and appends. After every call the entries stay within the
/// bound and the counts agree; every hit is checked against the content its block was committed with.
template <class Eviction, class Sharing = prefix_caching>
void entries_stay_bounded(std::uint32_t seed, int ops, bool keeps_orphans = true, bool must_reclaim = false) {
  using cache_t = paged_kv_cache<free_list_allocator, Eviction, Sharing>;
  auto c = make<cache_t>(24, 4, 1);
  content_checker<cache_t> k{c, {}, {}};
  std::mt19937 rng(seed);
  std::vector<seq_id> live;
  seq_id next = 1;
  std::int32_t next_family = 40;
  std::int32_t max_orphans = 0;
  const auto check = [&] {
    const auto& s = c.sharing();
    ASSERT_LE(s.num_entries(), s.max_entries());
    ASSERT_EQ(s.max_entries(), 2 * 24 + 1);
    ASSERT_LE(s.num_entries() - s.num_orphan_entries(), s.num_cached());
    ASSERT_EQ(c.stats().cached, s.num_cached());
    max_orphans = std::max(max_orphans, s.num_orphan_entries());
  };
  for (int op = 0; op < ops && !::testing::Test::HasFatalFailure(); ++op) {
    const auto r = rng() % 100;
    if ((r < 10 && !live.empty()) || live.size() > 6) {
      const auto i = rng() % live.size();
      k.free(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else if (r < 20) {
      c.begin_step();
    } else if (r < 45) {
      // A fresh chain and a prefix of it, in the two orders that evict heads first: the prefix cached and freed
      // before the chain hits it (FIFO: the head became evictable first), or the chain freed before the prefix
      // (the head is released last, at the prefix's lower priority; the chain's tail is kept longest).
      const auto family = static_cast<token_id>(next_family++);
      const auto cut = static_cast<std::int32_t>(1 + rng() % 5);
      const auto blocks = cut + 1;  // a one-block extension: the most orphans per cached tail
      const auto chain = concat(iota_tokens(4 * blocks, 1000 * family), {1});
      const auto prefix = concat(iota_tokens(4 * cut, 1000 * family), {1});
      const seq_id a = next++, b = next++;
      if (rng() % 2 == 0) {
        if (k.add(a, prefix, 0)) {
          c.begin_step();
          k.free(a);
        }
        if (k.add(b, chain, 100)) {
          c.begin_step();
          k.free(b);
        }
      } else if (k.add(b, chain, 100)) {
        if (k.add(a, prefix, 0)) {
          c.begin_step();
          k.free(b);
          k.free(a);
        } else {
          k.free(b);
        }
      }
    } else if (r < 70) {
      // A chain from one of 40 families, cut at a random length; priority rising with the length (or random).
      const auto family = static_cast<token_id>(rng() % 40);
      const auto blocks = static_cast<std::int32_t>(1 + rng() % 6);
      const auto prompt = concat(iota_tokens(4 * blocks, 1000 * family), {1});
      const std::int32_t priority = rng() % 4 == 0 ? static_cast<std::int32_t>(rng() % 8) : blocks;
      if (k.add(next, prompt, priority)) live.push_back(next);
      ++next;
    } else if (r < 85 && !live.empty()) {
      // Overwrite a head: fork inside the first block, drop the parent, write.
      const seq_id parent = live[rng() % live.size()];
      c.begin_step();
      if (k.fork(parent, next, 2)) {
        k.free(parent);
        live.erase(std::find(live.begin(), live.end(), parent));
        live.push_back(next);
        ASSERT_TRUE(k.append(next, std::vector<token_id>{static_cast<token_id>(rng() % 1000)}) ||
                    c.stats().available() == 0);
      }
      ++next;
    } else if (!live.empty()) {
      const seq_id id = live[rng() % live.size()];
      (void)k.append(id, std::vector<token_id>(1 + rng() % 6, static_cast<token_id>(rng() % 3)));
    }
    check();
  }
  if (keeps_orphans) {
    EXPECT_GT(max_orphans, 0) << "the mix should leave orphan chains";
  } else {
    EXPECT_EQ(max_orphans, 0) << "nothing unreferenced is kept, so no chain loses its head while its tail stays";
  }
  if (must_reclaim) {
    EXPECT_GT(c.sharing().reclaimed_orphans(), 0) << "the mix should reach the bound";
  }
  EXPECT_GT(c.stats().prefix_hit_tokens, 0);
  std::printf("orphans at most %d, reclaimed %lld, hit tokens %lld\n", max_orphans,
              static_cast<long long>(c.sharing().reclaimed_orphans()),
              static_cast<long long>(c.stats().prefix_hit_tokens));
}
}  // namespace

// Entries never run out, nor exceed the bound, whichever policy orders the evictions.
TEST(PrefixCaching, ContentEntriesStayBoundedWithLru) { entries_stay_bounded<lru_eviction>(1, 50000); }
TEST(PrefixCaching, ContentEntriesStayBoundedWithLruIndex) { entries_stay_bounded<lru_index_eviction>(2, 50000); }
TEST(PrefixCaching, ContentEntriesStayBoundedWithLfu) { entries_stay_bounded<lfu_eviction>(3, 50000); }
TEST(PrefixCaching, ContentEntriesStayBoundedWithPriority) { entries_stay_bounded<priority_lru>(4, 50000, true, true); }
TEST(PrefixCaching, ContentEntriesStayBoundedWithFifo) { entries_stay_bounded<fifo_eviction>(5, 50000); }
TEST(PrefixCaching, ContentEntriesStayBoundedWithNoRetention) {
  entries_stay_bounded<no_eviction>(6, 50000, false);
}
// Every hash collides: only the entries' parent links, serials and token compares keep prefixes apart, while
// orphans are reclaimed and their slots reused.
TEST(PrefixCaching, ContentEntriesStayBoundedWithPriorityAndCollidingHashes) {
  entries_stay_bounded<priority_lru, basic_prefix_caching<colliding_hasher>>(4, 50000, true, true);
}

// LFU evicting a head first: a chain's head is overwritten in place (its tail, hit three times, stays cached), the
// chain is recomputed (a fresh head with no hits, the tail hit through the old entry), and LFU then evicts the
// fresh head before the old tail. The head's entry lives on as an orphan and the tail is hit again once the head
// is computed once more.
TEST(PrefixCaching, LfuEvictsARecomputedHeadBeforeItsHitTail) {
  using cache_t = paged_kv_cache<free_list_allocator, lfu_eviction, prefix_caching>;
  auto c = make<cache_t>(16, 4, 1);
  const auto prompt = concat(iota_tokens(8, 0), {1});  // head [0..3], tail [4..7]
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  for (seq_id k = 10; k < 13; ++k) {
    ASSERT_TRUE(c.add_sequence(k, prompt));
    c.begin_step();
    ASSERT_TRUE(c.free_sequence(k));
  }
  const block_id tail = table(c, 1)[1];
  ASSERT_TRUE(c.fork(1, 2, 2));  // ends inside the head
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(2, std::vector<token_id>{55}));  // overwrites the head in place
  EXPECT_EQ(c.sharing().num_orphan_entries(), 1);
  ASSERT_TRUE(c.add_sequence(3, prompt));  // recomputes the head (and the tail, as a duplicate)
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(3));
  EXPECT_EQ(c.sharing().num_orphan_entries(), 0) << "the recomputed head holds the entry again";
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 2);
  // Take every clean block and two more: LFU's victims are the never-hit duplicate tail and fresh head.
  ASSERT_TRUE(c.add_sequence(4, 4 * (c.stats().free + 2)));
  EXPECT_TRUE(c.sharing().is_cached(tail));
  EXPECT_EQ(c.eviction().hits(tail), 3u);
  EXPECT_EQ(c.sharing().num_orphan_entries(), 1);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 0) << "the head is gone";
  ASSERT_TRUE(c.free_sequence(4));
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(5, concat(iota_tokens(4, 0), {9})));  // the head once more
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(6, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(table(c, 6)[1], tail) << "the old tail is hit again";
}

// A copy of the policy (entries and token ids live in separately allocated chunks) is deep: it answers the same
// lookups, and changing one leaves the other as it was.
TEST(PrefixCaching, CopiesAreDeepAndIndependent) {
  prefix_caching p;
  p.reset(pool_geometry{8, 2, 0});
  chain_driver<prefix_caching> d{p};
  d.commit(100, {0, 1, 2});
  prefix_caching copy = p;
  chain_driver<prefix_caching> dc{copy};
  p.uncache(2);
  p.uncache(1);
  p.uncache(0);
  EXPECT_EQ(p.num_entries(), 0);
  EXPECT_EQ(copy.num_entries(), 3);
  EXPECT_EQ(copy.memory_bytes(), prefix_caching(copy).memory_bytes());
  auto c = copy.first_cursor(0);
  EXPECT_EQ(copy.lookup(c, dc.block(100, 0)), 0);
  EXPECT_EQ(copy.lookup(c, dc.block(100, 1)), 1);
  EXPECT_EQ(copy.lookup(c, dc.block(100, 2)), 2);
  auto pc = p.first_cursor(0);
  EXPECT_EQ(p.lookup(pc, d.block(100, 0)), no_block);
  p = copy;  // copy assignment
  pc = p.first_cursor(0);
  EXPECT_EQ(p.lookup(pc, d.block(100, 0)), 0);
}
