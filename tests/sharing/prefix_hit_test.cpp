// SPDX-License-Identifier: Apache-2.0
// Two-phase admission: match_prefix's prefix_hit is consumed by add_sequence without a second lookup, and a stale
// hit (the cache changed since) is refused and changes nothing.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

using namespace kvpager;

namespace {
std::int64_t hashes = 0;  ///< blocks hashed by counting_hasher

/// xxh3_hasher that counts its calls (one call = one block hashed).
struct counting_hasher {
  [[nodiscard]] std::uint64_t operator()(std::uint64_t seed, std::span<const token_id> tokens) const noexcept {
    ++hashes;
    return xxh3_hasher{}(seed, tokens);
  }
};
using counting_cache = paged_kv_cache<free_list_allocator, lru_eviction, basic_prefix_caching<counting_hasher>>;

std::vector<token_id> tokens(std::int32_t n, token_id first = 0) {
  std::vector<token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}
}  // namespace

TEST(PrefixHit, AddSequenceConsumesTheHitWithoutHashingItsBlocksAgain) {
  auto cache = *counting_cache::create({4, 64, 1, 0});
  const auto p = tokens(40);  // 10 full blocks
  ASSERT_TRUE(cache.add_sequence(1, std::span<const token_id>(p).first(24)));  // caches 6 blocks
  prefix_hit hit;
  hashes = 0;
  ASSERT_TRUE(cache.match_prefix(p, {}, hit));
  EXPECT_EQ(hit.match.blocks, 6);
  EXPECT_EQ(hit.blocks.size(), 6U);
  EXPECT_EQ(hashes, 7) << "6 hits and the first miss";
  prefix_match got;
  ASSERT_TRUE(cache.add_sequence(2, p, {}, hit, &got));
  EXPECT_EQ(got, hit.match);
  EXPECT_EQ(hashes, 7 + 3) << "only the 3 blocks after the first miss are hashed (to cache them): each block once";
  EXPECT_EQ(std::vector<block_id>(cache.block_table(2)->begin(), cache.block_table(2)->begin() + 6),
            std::vector<block_id>(cache.block_table(1)->begin(), cache.block_table(1)->end()));
  // Without the hit, the same admission looks every hit block up again.
  const auto q = tokens(40, 1000);
  ASSERT_TRUE(cache.add_sequence(3, std::span<const token_id>(q).first(24)));
  hashes = 0;
  ASSERT_TRUE(cache.match_prefix(q, {}));
  ASSERT_TRUE(cache.add_sequence(4, q));
  EXPECT_EQ(hashes, 7 + 7 + 3);
}

TEST(PrefixHit, StaleHitIsRefusedAndChangesNothing) {
  auto cache = *vllm_v1_cache::create({4, 64, 1, 0});
  const auto p = tokens(20);
  ASSERT_TRUE(cache.add_sequence(1, std::span<const token_id>(p).first(8)));
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(p, {}, hit));
  EXPECT_EQ(hit.match.blocks, 2);
  // Another admission caches the rest of this prompt's blocks: the hit no longer says what a lookup would.
  ASSERT_TRUE(cache.add_sequence(2, p));
  cache.begin_step();
  const cache_stats before = cache.stats();
  const status st = cache.add_sequence(3, p, {}, hit);
  EXPECT_EQ(st.code(), errc::stale_prefix_hit);
  EXPECT_EQ(cache.stats(), before);
  EXPECT_FALSE(cache.contains(3));
  // Looked up again, it is exact.
  ASSERT_TRUE(cache.match_prefix(p, {}, hit));
  EXPECT_EQ(hit.match.blocks, 4);
  ASSERT_TRUE(cache.add_sequence(3, p, {}, hit));
}

TEST(PrefixHit, EvictionSinceTheLookupMakesTheHitStale) {
  auto cache = *vllm_v1_cache::create({4, 5, 1, 0});  // 4 usable blocks
  const auto p = tokens(12);
  ASSERT_TRUE(cache.add_sequence(1, p));  // 3 blocks, 2 full ones cached
  cache.begin_step();
  ASSERT_TRUE(cache.free_sequence(1));  // cached, unreferenced
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(p, {}, hit));
  EXPECT_EQ(hit.match.blocks, 2);
  ASSERT_TRUE(cache.add_sequence(2, tokens(16, 500)));  // takes all 4 blocks: evicts the hit's blocks
  ASSERT_TRUE(cache.free_sequence(2));
  const cache_stats before = cache.stats();
  EXPECT_EQ(cache.add_sequence(3, p, {}, hit).code(), errc::stale_prefix_hit);
  EXPECT_EQ(cache.stats(), before);
}

TEST(PrefixHit, HitForOtherOptionsOrFewerTokensIsRefused) {
  auto cache = *vllm_v1_cache::create({4, 64, 1, 0});
  const auto p = tokens(20);
  ASSERT_TRUE(cache.add_sequence(1, p, sequence_options{.extra_key = 5}));
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(std::span<const token_id>(p).first(12), sequence_options{.extra_key = 5}, hit));
  EXPECT_EQ(cache.add_sequence(2, p, sequence_options{.extra_key = 6}, hit).code(), errc::stale_prefix_hit);
  EXPECT_EQ(cache.add_sequence(2, p, sequence_options{.extra_key = 5}, hit).code(), errc::stale_prefix_hit)
      << "the hit was looked up for 12 tokens, not 20";
  EXPECT_FALSE(cache.contains(2));
  prefix_hit none;
  EXPECT_EQ(cache.add_sequence(2, p, {}, none).code(), errc::stale_prefix_hit) << "no lookup made";
  // A shorter prefix of the looked-up tokens takes the hit blocks it can use (capped below its last token).
  prefix_match got;
  ASSERT_TRUE(cache.add_sequence(2, std::span<const token_id>(p).first(8), sequence_options{.extra_key = 5}, hit, &got));
  EXPECT_EQ(got.blocks, 1);
}

TEST(PrefixHit, EachFullBlockIsHashedOnceAcrossAdmissionAndDecode) {
  auto cache = *counting_cache::create({4, 64, 1, 0});
  const auto p = tokens(23);  // 5 full blocks and 3 tokens
  hashes = 0;
  ASSERT_TRUE(cache.add_sequence(1, p));  // one-phase: the lookup's first miss is committed with its hash
  EXPECT_EQ(hashes, 5);
  prefix_hit hit;
  const auto q = tokens(30);  // the same 5 blocks, then 2 more and 2 tokens
  hashes = 0;
  ASSERT_TRUE(cache.match_prefix(q, {}, hit));
  ASSERT_TRUE(cache.add_sequence(2, q, {}, hit));
  EXPECT_EQ(hashes, 5 + 1 + 1) << "5 hits, the first miss (its hash kept in the hit), one more block";
  hashes = 0;
  for (token_id t = 30; t < 40; ++t) ASSERT_TRUE(cache.append_token(2, t));  // blocks fill at 32, 36 and 40 tokens
  EXPECT_EQ(hashes, 3);
}

TEST(PrefixHit, BlockHashesReadmitARecomputedSequenceWithoutHashing) {
  auto cache = *counting_cache::create({4, 64, 1, 0});
  auto p = tokens(18);  // 4 full blocks
  ASSERT_TRUE(cache.add_sequence(1, p));
  cache.begin_step();
  for (token_id t = 18; t < 21; ++t) {
    ASSERT_TRUE(cache.append_token(1, t));  // token 19 fills the fifth block
    p.push_back(t);
  }
  std::vector<std::uint64_t> saved{42};
  ASSERT_TRUE(cache.block_hashes(1, saved));
  ASSERT_EQ(saved.size(), 5U);
  for (std::size_t i = 0; i < saved.size(); ++i)
    EXPECT_EQ(saved[i], cache.sharing().block_hash((*cache.block_table(1))[i]));
  cache.begin_step();
  ASSERT_TRUE(cache.free_sequence(1));  // preempted by recompute: its blocks stay cached
  hashes = 0;
  prefix_match m;
  ASSERT_TRUE(cache.add_sequence(1, p, {}, &m, saved));  // 21 tokens: 5 full blocks, 5 looked up
  EXPECT_EQ(m.blocks, 5);
  EXPECT_EQ(hashes, 0) << "every block's hash was known";
  // Two-phase: the lookup takes the known hashes into the hit, and the admission hashes nothing either.
  cache.begin_step();
  ASSERT_TRUE(cache.free_sequence(1));
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(p, {}, hit, saved));
  EXPECT_EQ(hashes, 0);
  EXPECT_EQ(hit.known_hashes, saved);
  ASSERT_TRUE(cache.add_sequence(1, p, {}, hit));
  EXPECT_EQ(hashes, 0);
}

TEST(PrefixHit, WrongKnownHashesNeverGiveAWrongHit) {
  auto cache = *counting_cache::create({4, 64, 1, 0});
  const auto p = tokens(12);
  const auto q = tokens(12, 500);
  ASSERT_TRUE(cache.add_sequence(1, p));
  std::vector<std::uint64_t> of_p;
  ASSERT_TRUE(cache.block_hashes(1, of_p));
  ASSERT_EQ(of_p.size(), 3U);
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(q, {}, hit, of_p));  // p's hashes given for q's tokens: tokens are compared
  EXPECT_EQ(hit.match.blocks, 0);
}

TEST(PrefixHit, BlockHashesOfAnUnknownSequenceIsAnErrorAndKeepsOut) {
  auto cache = *counting_cache::create({4, 64, 1, 0});
  std::vector<std::uint64_t> out{1, 2};
  EXPECT_EQ(cache.block_hashes(9, out).code(), errc::unknown_sequence);
  EXPECT_EQ(out, (std::vector<std::uint64_t>{1, 2}));
  auto plain = *vllm_v1_cache::create({4, 64, 1, 0});
  const auto p = tokens(12);
  ASSERT_TRUE(plain.add_sequence(1, p));
  ASSERT_TRUE(plain.block_hashes(1, out));
  EXPECT_EQ(out.size(), 3U) << "vllm_v1_cache's prefix_caching is a prehashed_content_cache";
  auto count_only = *paged_kv_cache<>::create({4, 64, 1, 0});
  ASSERT_TRUE(count_only.add_sequence(1, p));
  ASSERT_TRUE(count_only.block_hashes(1, out));
  EXPECT_TRUE(out.empty()) << "no content cache: no hashes";
}
