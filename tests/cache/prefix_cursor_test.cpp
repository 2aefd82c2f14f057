// prefix_cursors alone: walking a cached prefix, committing a prompt, extending on appends, stopping, and what a
// forked child inherits, over prefix_caching (a content cache) and refcount_sharing (none).
#include <kvpager/cache/prefix_cursor.hpp>
#include <kvpager/sharing/prefix_caching.hpp>
#include <kvpager/sharing/refcount_sharing.hpp>

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

using namespace kvpager;

namespace {
constexpr std::int32_t bs = 4;

std::vector<token_id> tokens(std::int32_t n, token_id first = 1) {
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
    prefix_caching::cursor cur{};
    pc.resume(share, cur, {}, 0);
    pc.commit_prompt(share, s, cur, toks, 0);
    return s;
  }
};
}  // namespace

TEST(PrefixCursor, WalkFindsTheCommittedFullBlocksCappedBelowTheLastToken) {
  fixture f;
  const auto t = tokens(10);  // two full blocks and two tokens
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

TEST(PrefixCursor, ResumeContinuesTheChainAfterTheHits) {
  fixture f;
  const auto t = tokens(12);
  f.add(t);  // blocks 10, 11, 12 cached
  prefix_caching::cursor walked{}, resumed{};
  std::vector<block_id> hits;
  const std::span<const token_id> nine(t.data(), 9);
  f.pc.walk(f.share, walked, nine, 0, [&](block_id b) { hits.push_back(b); });
  f.pc.resume(f.share, resumed, hits, 0);
  EXPECT_EQ(resumed, walked);
  // With no hits, resuming starts the chain of that key.
  f.pc.resume(f.share, resumed, {}, 3);
  EXPECT_EQ(resumed, f.share.first_cursor(3));
}

TEST(PrefixCursor, ExtendCommitsEachBlockAsItFills) {
  fixture f;
  const auto t = tokens(6);
  auto s = f.add(t);
  EXPECT_EQ(f.share.num_cached(), 1);
  const auto more = tokens(2, 7);  // fills block 11
  s.blocks = {10, 11};
  f.pc.extend(f.share, s, more, 6);
  s.num_tokens = 8;
  EXPECT_EQ(f.share.num_cached(), 2);
  EXPECT_TRUE(f.share.is_cached(11));
  EXPECT_TRUE(s.partial.empty());
  // After stop, appends are not cached any more (their token ids are unknown).
  prefix_cursors<prefix_caching>::stop(s);
  s.blocks.push_back(12);
  f.pc.extend(f.share, s, tokens(4, 9), 8);
  EXPECT_FALSE(f.share.is_cached(12));
}

TEST(PrefixCursor, ForkedChildKeepsCachingOnlyWhenItsPartialBlockIsKnown) {
  fixture f;
  const auto t = tokens(10);
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
  const auto t = tokens(10);
  sequence_state<prefix_cursors<refcount_sharing>::cursor> s;
  s.blocks = {1, 2, 3};
  prefix_cursors<refcount_sharing>::cursor cur{};
  EXPECT_EQ(pc.walk(share, cur, t, 0, [](block_id) { ADD_FAILURE() << "no hit without a content cache"; }), 0);
  pc.commit_prompt(share, s, cur, t, 0);
  EXPECT_TRUE(s.partial.empty());
}
