// SPDX-License-Identifier: Apache-2.0
// prefix_cursors alone: the lookup of match_prefix, a prefix_hit's freshness, and the hit blocks an admission
// takes from it, over a prefix_caching policy fed by hand.
#include <kvpager/cache/detail/prefix_cursor.hpp>
#include <kvpager/sharing/no_sharing.hpp>
#include <kvpager/sharing/prefix_caching.hpp>

#include <kvpager/sharing/refcount_sharing.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

using namespace kvpager;
using namespace kvpager::detail;  // the cache's parts, tested alone

namespace {
constexpr std::int32_t bs = 4;

std::vector<token_id> tokens(std::int32_t n) {
  std::vector<token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(100 + i);
  return p;
}

/// A policy over 8 blocks with blocks 3 and 5 caching the first two blocks of tokens(...) under key 7.
prefix_caching cached_two() {
  prefix_caching share;
  share.reset(pool_geometry{8, bs, 0});
  const auto p = tokens(8);
  auto cur = share.first_cursor(7);
  share.commit(3, cur, std::span<const token_id>(p).first(bs));
  share.commit(5, cur, std::span<const token_id>(p).subspan(bs, bs));
  return share;
}
}  // namespace

TEST(PrefixCursors, MatchCountsHitsAndTheBlocksAnAdmissionTakes) {
  const prefix_caching share = cached_two();
  const prefix_cursors<prefix_caching> ops{bs};
  std::vector<block_id> seen;
  const auto p = tokens(13);  // 3 full blocks and one token: 2 hits, 4 blocks in all
  const prefix_match m = ops.match(
      share, p, 7, [](block_id b) { return b == 5; }, [&](block_id b) { seen.push_back(b); });
  EXPECT_EQ(seen, (std::vector<block_id>{3, 5}));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.tokens, 2 * bs);
  EXPECT_EQ(m.blocks_to_allocate, 2 + 1) << "2 new blocks and the hit that consumes capacity";
  // Another key, or a prompt whose last token would be in a hit, finds less.
  EXPECT_EQ(ops.match(share, p, 8, [](block_id) { return false; }, [](block_id) {}).blocks, 0);
  EXPECT_EQ(ops.match(share, std::span<const token_id>(p).first(8), 7, [](block_id) { return false; },
                      [](block_id) {}).blocks,
            1);
}

TEST(PrefixCursors, HitIsFreshOnlyForItsKeyGenerationAndAtMostItsTokens) {
  prefix_caching share = cached_two();
  prefix_hit hit;
  EXPECT_FALSE(prefix_cursors<prefix_caching>::fresh(share, hit, 1, 0)) << "no lookup yet";
  hit.num_tokens = 9;
  hit.extra_key = 7;
  hit.generation = share.generation();
  EXPECT_TRUE(prefix_cursors<prefix_caching>::fresh(share, hit, 9, 7));
  EXPECT_TRUE(prefix_cursors<prefix_caching>::fresh(share, hit, 5, 7));
  EXPECT_FALSE(prefix_cursors<prefix_caching>::fresh(share, hit, 10, 7));
  EXPECT_FALSE(prefix_cursors<prefix_caching>::fresh(share, hit, 9, 8));
  share.uncache(5);
  EXPECT_FALSE(prefix_cursors<prefix_caching>::fresh(share, hit, 9, 7)) << "the cache changed";
  EXPECT_TRUE(prefix_cursors<no_sharing>::fresh(no_sharing{}, hit, 9, 7)) << "no content: no generation to check";
}

TEST(PrefixCursors, TakeCapsTheHitBelowTheLastTokenAndResumesAfterIt) {
  const prefix_caching share = cached_two();
  const prefix_cursors<prefix_caching> ops{bs};
  prefix_hit hit;
  hit.match.blocks = 2;
  hit.blocks = {3, 5};
  std::vector<block_id> taken;
  prefix_caching::cursor cur;
  ops.take(share, cur, hit, 8, 7, [&](block_id b) { taken.push_back(b); });  // its last token is in block 1
  EXPECT_EQ(taken, (std::vector<block_id>{3}));
  EXPECT_EQ(cur, share.cursor_after(3));
  taken.clear();
  ops.take(share, cur, hit, 12, 7, [&](block_id b) { taken.push_back(b); });
  EXPECT_EQ(taken, (std::vector<block_id>{3, 5}));
  EXPECT_EQ(cur, share.cursor_after(5));
  ops.take(share, cur, hit, 4, 7, [&](block_id b) { taken.push_back(b); });
  EXPECT_EQ(taken.size(), 2U) << "a one-block prompt takes no hit";
  EXPECT_EQ(cur, share.first_cursor(7));
}

// Walking, committing, extending and inheriting hash-chain positions (the per-sequence side).
namespace walk_commit {
namespace {

std::vector<token_id> iota(std::int32_t n, token_id first = 1) {
  std::vector<token_id> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

struct fixture {
  prefix_caching share;
  prefix_cursors<prefix_caching> pc{bs};
  fixture() { share.reset(pool_geometry{32, bs, 0}); }

  // A sequence holding `toks`, blocks 10, 11, ... committed as add_sequence would (no hits).
  sequence_state<prefix_caching::cursor> add(std::span<const token_id> toks, block_id first_block = 10) {
    sequence_state<prefix_caching::cursor> s;
    s.num_tokens = static_cast<std::int32_t>(toks.size());
    for (std::int32_t i = 0; i < (s.num_tokens + bs - 1) / bs; ++i) s.blocks.push_back(first_block + i);
    prefix_caching::cursor cur = share.first_cursor(0);
    pc.commit_prompt(share, s, cur, toks, 0);
    return s;
  }
};
}  // namespace

TEST(PrefixCursor, WalkFindsTheCommittedFullBlocksCappedBelowTheLastToken) {
  fixture f;
  const auto t = iota(10);  // two full blocks and two tokens
  auto s = f.add(t);
  EXPECT_EQ(f.share.num_cached(), 2);
  EXPECT_EQ(s.partial, std::vector<token_id>({9, 10}));
  std::vector<block_id> hits;
  prefix_caching::cursor cur{};
  EXPECT_EQ(f.pc.walk(f.share, cur, t, 0, [&](block_id b) { hits.push_back(b); }), 2);
  EXPECT_EQ(hits, std::vector<block_id>({10, 11}));
  // A prompt of exactly the two cached blocks hits only the first: its last token is always computed.
  hits.clear();
  const std::span<const token_id> eight(t.data(), 8);
  EXPECT_EQ(f.pc.walk(f.share, cur, eight, 0, [&](block_id b) { hits.push_back(b); }), 1);
  // Another extra key (tenant salt) hits nothing.
  EXPECT_EQ(f.pc.walk(f.share, cur, t, 7, [](block_id) {}), 0);
}

TEST(PrefixCursor, ExtendCommitsEachBlockAsItFills) {
  fixture f;
  const auto t = iota(6);
  auto s = f.add(t);
  EXPECT_EQ(f.share.num_cached(), 1);
  const auto more = iota(2, 7);  // fills block 11
  s.blocks = {10, 11};
  f.pc.extend(f.share, s, more, 6);
  s.num_tokens = 8;
  EXPECT_EQ(f.share.num_cached(), 2);
  EXPECT_TRUE(f.share.is_cached(11));
  EXPECT_TRUE(s.partial.empty());
  // After stop, appends are not cached any more (their token ids are unknown).
  prefix_cursors<prefix_caching>::stop(s);
  s.blocks.push_back(12);
  f.pc.extend(f.share, s, iota(4, 9), 8);
  EXPECT_FALSE(f.share.is_cached(12));
}

TEST(PrefixCursor, ForkedChildKeepsCachingOnlyWhenItsPartialBlockIsKnown) {
  fixture f;
  const auto t = iota(10);
  auto p = f.add(t);  // blocks 10, 11 full, 12 holds 9, 10
  sequence_state<prefix_caching::cursor> c;
  f.pc.inherit(f.share, c, p, 8);  // block-aligned fork point: chain after block 11
  EXPECT_TRUE(f.share.valid(c.cursor));
  EXPECT_EQ(c.cursor, f.share.cursor_after(11));
  f.pc.inherit(f.share, c, p, 10);  // inside the parent's partial block: its tokens are kept
  EXPECT_EQ(c.partial, std::vector<token_id>({9, 10}));
  EXPECT_TRUE(f.share.valid(c.cursor));
  f.pc.inherit(f.share, c, p, 6);  // inside a full block: the partial tokens are not kept, caching stops
  EXPECT_FALSE(f.share.valid(c.cursor));
  EXPECT_TRUE(c.partial.empty());
}

TEST(PrefixCursor, WithoutAContentCacheNothingIsWalkedOrCommitted) {
  refcount_sharing share;
  prefix_cursors<refcount_sharing> pc{bs};
  const auto t = iota(10);
  sequence_state<prefix_cursors<refcount_sharing>::cursor> s;
  s.blocks = {1, 2, 3};
  prefix_cursors<refcount_sharing>::cursor cur{};
  EXPECT_EQ(pc.walk(share, cur, t, 0, [](block_id) { ADD_FAILURE() << "no hit without a content cache"; }), 0);
  pc.commit_prompt(share, s, cur, t, 0);
  EXPECT_TRUE(s.partial.empty());
}

}  // namespace walk_commit
