// prefix_cursors alone: the lookup of match_prefix, a prefix_hit's freshness, and the hit blocks an admission
// takes from it, over a prefix_caching policy fed by hand.
#include <kvpager/cache/prefix_cursor.hpp>
#include <kvpager/sharing/no_sharing.hpp>
#include <kvpager/sharing/prefix_caching.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

using namespace kvpager;

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
