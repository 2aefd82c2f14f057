// SPDX-License-Identifier: Apache-2.0
// vLLM's view of KV cache groups (issue 24, point 2): the layouts its layer grouping can produce, its per-kind
// lookups with their corners (a 1-token window, a chunk that is not a multiple of the block size), and its agreed
// hit, which equals the native fixed point (agreed_hit_tokens) wherever vLLM's lookups return the longest resumable
// length (windows of 2 tokens or more, chunks that are multiples of the block size), over random layouts.

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include <kvpager/groups/agreed_hit.hpp>
#include <kvpager/groups/group_kind_variant.hpp>
#include <kvpager/groups/vllm_hit.hpp>

namespace {

using kvpager::any_group_kind;
using kvpager::vllm_kind;
using kvpager::vllm_kind_tag;

const vllm_kind full{vllm_kind_tag::full, 0};
vllm_kind sw(std::int64_t w) { return {vllm_kind_tag::sliding_window, w}; }
vllm_kind chunk(std::int64_t c) { return {vllm_kind_tag::chunked_local, c}; }

bool valid(std::vector<vllm_kind> g) { return kvpager::check_vllm_layout(g).ok(); }

TEST(VllmLayout, OnlyWhatVllmsGroupingProduces) {
  EXPECT_TRUE(valid({full}));
  EXPECT_TRUE(valid({sw(256)}));  // an all-window model: one group
  EXPECT_TRUE(valid({chunk(8192)}));
  EXPECT_TRUE(valid({full, sw(128)}));
  EXPECT_TRUE(valid({sw(128), full}));
  EXPECT_TRUE(valid({full, full, sw(128)}));           // Gemma-like 2:1 after splitting the common spec
  EXPECT_TRUE(valid({sw(1024), sw(1024), sw(1024), sw(1024), sw(1024), full}));  // Gemma 3: 5 local to 1 global
  EXPECT_TRUE(valid({full, sw(128), chunk(512)}));     // three specs, each once
  EXPECT_TRUE(valid({full, sw(128), sw(256)}));        // two windows are two specs
  EXPECT_FALSE(valid({}));
  EXPECT_FALSE(valid({full, full}));                   // identical groups are one group in vLLM
  EXPECT_FALSE(valid({sw(256), sw(256)}));
  EXPECT_FALSE(valid({full, sw(128), full}));          // not adjacent
  EXPECT_FALSE(valid({full, full, sw(128), sw(128)})); // no spec occurs exactly once
  EXPECT_FALSE(valid({vllm_kind{}}));                  // a kind vLLM does not have
  EXPECT_FALSE(valid({full, vllm_kind{}}));
  const kvpager::status st = kvpager::check_vllm_layout(std::vector<vllm_kind>{full, sw(128), full});
  EXPECT_EQ(st.code(), kvpager::errc::invalid_argument);
  EXPECT_EQ(st.detail(), 2);  // the group that breaks the rule
}

TEST(VllmLayout, KindsOfTheVariantMapToVllmKinds) {
  EXPECT_EQ(kvpager::vllm_kind_of(any_group_kind{kvpager::full_attention{}}), full);
  EXPECT_EQ(kvpager::vllm_kind_of(any_group_kind{kvpager::sliding_window{128}}), sw(128));
  EXPECT_EQ(kvpager::vllm_kind_of(any_group_kind{kvpager::chunked_local{512}}), chunk(512));
  EXPECT_EQ(kvpager::vllm_kind_of(kvpager::group_kind_archetype{}).tag, vllm_kind_tag::none);
  const any_group_kind k = kvpager::sliding_window{7};
  EXPECT_STREQ(k.name(), "sliding_window");
  EXPECT_EQ(k.skipped_tokens(10), 4);
  ASSERT_NE(k.get_if<kvpager::sliding_window>(), nullptr);
  EXPECT_EQ(k.get_if<kvpager::full_attention>(), nullptr);
  EXPECT_EQ(any_group_kind{kvpager::chunked_local{0}}.validate().code(), kvpager::errc::invalid_argument);
}

struct hit_result {
  std::int64_t tokens = 0;
  std::vector<std::int32_t> nulls;
};

hit_result vllm_hit(const std::vector<vllm_kind>& kinds, const std::vector<std::vector<bool>>& cached, std::int32_t bs,
                    std::int64_t max_tokens) {
  kvpager::vllm_hit_scratch s;
  hit_result r;
  r.nulls.assign(kinds.size(), -1);
  r.tokens = kvpager::vllm_agreed_hit(
      kinds, bs, max_tokens,
      [&](std::int32_t g, std::int64_t i) {
        const auto& c = cached[static_cast<std::size_t>(g)];
        return static_cast<std::size_t>(i) < c.size() && c[static_cast<std::size_t>(i)];
      },
      r.nulls, s);
  return r;
}

std::vector<bool> blocks(std::size_t n, std::initializer_list<int> hits) {
  std::vector<bool> v(n, false);
  for (const int i : hits) v[static_cast<std::size_t>(i)] = true;
  return v;
}

TEST(VllmHit, SlidingWindowLookup) {
  // W = 128, bs = 16: a window needs cdiv(127, 16) = 8 blocks; the scan from the top finds blocks 2..9.
  std::vector<bool> c = blocks(12, {2, 3, 4, 5, 6, 7, 8, 9});
  hit_result r = vllm_hit({sw(128)}, {c}, 16, 12 * 16 - 1);  // m = 11
  EXPECT_EQ(r.tokens, 10 * 16);
  EXPECT_EQ(r.nulls[0], 2);
  // No full window: the run of hits from block 0.
  r = vllm_hit({sw(128)}, {blocks(12, {0, 1, 2, 5, 6})}, 16, 12 * 16 - 1);
  EXPECT_EQ(r.tokens, 3 * 16);
  EXPECT_EQ(r.nulls[0], 0);
  // A 1-token window needs no block, yet vLLM asks for one: the highest cached block below the limit, then stop.
  r = vllm_hit({sw(1)}, {blocks(12, {3, 7})}, 16, 12 * 16 - 1);
  EXPECT_EQ(r.tokens, 8 * 16);
  EXPECT_EQ(r.nulls[0], 7);
  r = vllm_hit({sw(1)}, {blocks(12, {})}, 16, 12 * 16 - 1);
  EXPECT_EQ(r.tokens, 0);
}

TEST(VllmHit, ChunkedLocalLookup) {
  // vLLM's docstring example: C = 8, bs = 4. L = 15: the chunk starts at 8 (block 2): [null, null, block 2 if
  // cached]. L = 16: a chunk boundary, four nulls.
  hit_result r = vllm_hit({chunk(8)}, {blocks(8, {2})}, 4, 15);
  EXPECT_EQ(r.tokens, 12);
  EXPECT_EQ(r.nulls[0], 2);
  r = vllm_hit({chunk(8)}, {blocks(8, {})}, 4, 16);
  EXPECT_EQ(r.tokens, 16);
  EXPECT_EQ(r.nulls[0], 4);
  // A chunk that is not a multiple of the block size: the chunk of the limit fixes the nulls, even where the
  // result ends in an earlier chunk (C = 24, bs = 16, L = 40: nulls before block 1, block 1 missing: 16 tokens).
  r = vllm_hit({chunk(24)}, {blocks(4, {})}, 16, 40);
  EXPECT_EQ(r.tokens, 16);
  EXPECT_EQ(r.nulls[0], 1);
}

TEST(VllmHit, AgreementAcrossTypes) {
  const std::int32_t bs = 16;
  // [full, sliding_window 128]: full hits 30 blocks; the window group kept 12..19 and 24..29 (7 < 8 at the top).
  std::vector<bool> f(32, false), w(32, false);
  for (int i = 0; i < 30; ++i) f[static_cast<std::size_t>(i)] = true;
  for (int i = 12; i < 20; ++i) w[static_cast<std::size_t>(i)] = true;
  for (int i = 24; i < 30; ++i) w[static_cast<std::size_t>(i)] = true;
  hit_result r = vllm_hit({full, sw(128)}, {f, w}, bs, 32 * bs - 1);
  EXPECT_EQ(r.tokens, 20 * bs);
  EXPECT_EQ(r.nulls, (std::vector<std::int32_t>{0, 12}));
  // The window group first in group order: full types are still looked up first (same answer).
  r = vllm_hit({sw(128), full}, {w, f}, bs, 32 * bs - 1);
  EXPECT_EQ(r.tokens, 20 * bs);
  EXPECT_EQ(r.nulls, (std::vector<std::int32_t>{12, 0}));
  // Two groups of one type hit a position only when both have it.
  std::vector<bool> f2 = f;
  f2[5] = false;
  r = vllm_hit({full, full, sw(128)}, {f, f2, f}, bs, 32 * bs - 1);
  EXPECT_EQ(r.tokens, 5 * bs);  // the window's lookup at 5 blocks: the run from block 0 (fewer than 8)
  EXPECT_EQ(r.nulls, (std::vector<std::int32_t>{0, 0, 0}));
  // Three types iterate to the fixed point: the second window lowers what the first agreed to, and the first is
  // looked up again at the lower limit (sliding_window 64 needs 4 blocks).
  std::vector<bool> w3(32, false), w4(32, false);
  for (int i = 4; i < 20; ++i) w3[static_cast<std::size_t>(i)] = true;
  for (int i = 0; i < 18; ++i) w4[static_cast<std::size_t>(i)] = true;
  r = vllm_hit({full, sw(128), sw(64)}, {f, w3, w4}, bs, 32 * bs - 1);
  EXPECT_EQ(r.tokens, 18 * bs);  // pass 1: 30 -> 20 -> 18 blocks; pass 2: 18 -> 18 -> 18
  EXPECT_EQ(r.nulls, (std::vector<std::int32_t>{0, 10, 14}));
  // No length every type resumes but 0.
  r = vllm_hit({full, sw(128), sw(64)}, {f, w, w4}, bs, 32 * bs - 1);
  EXPECT_EQ(r.tokens, 0);
}

TEST(VllmHit, EqualsTheNativeFixedPointWhereTheLookupsAreExact) {
#if defined(KVPAGER_TEST_REDUCED)
  constexpr int cases = 30'000;
#else
  constexpr int cases = 300'000;
#endif
  std::mt19937_64 rng(24);
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  kvpager::hit_scratch hs;
  std::int64_t tested = 0, cut = 0;
  for (int c = 0; c < cases; ++c) {
    const std::int32_t bs = std::int32_t{1} << pick(0, 4);
    const auto n = static_cast<std::size_t>(pick(0, 20));
    std::vector<vllm_kind> kinds;
    std::vector<any_group_kind> native;
    const auto groups = static_cast<std::size_t>(pick(1, 5));
    for (std::size_t g = 0; g < groups; ++g) {
      const std::int64_t k = pick(0, 2);
      if (k == 0 || (g > 0 && pick(0, 2) == 0)) {  // repeat the previous spec now and then: types of several groups
        const vllm_kind prev = g > 0 ? kinds.back() : full;
        kinds.push_back(k == 0 ? full : prev);
      } else if (k == 1) {
        kinds.push_back(sw(pick(2, 80)));
      } else {
        kinds.push_back(chunk(bs * pick(1, 6)));
      }
    }
    if (!kvpager::check_vllm_layout(kinds)) continue;
    for (const vllm_kind& k : kinds) {
      if (k.tag == vllm_kind_tag::full) native.emplace_back(kvpager::full_attention{});
      if (k.tag == vllm_kind_tag::sliding_window) native.emplace_back(kvpager::sliding_window{k.size});
      if (k.tag == vllm_kind_tag::chunked_local) native.emplace_back(kvpager::chunked_local{k.size});
    }
    std::vector<std::vector<bool>> cached(kinds.size(), std::vector<bool>(n));
    for (auto& row : cached) {
      const double density = std::uniform_real_distribution<double>(0.4, 1.0)(rng);
      for (std::size_t i = 0; i < n; ++i) row[i] = std::bernoulli_distribution(density)(rng);
    }
    const std::int64_t max_tokens = pick(0, static_cast<std::int64_t>(n) * bs);
    const auto is_cached = [&](std::int32_t g, std::int64_t i) {
      return static_cast<std::size_t>(i) < n && cached[static_cast<std::size_t>(g)][static_cast<std::size_t>(i)];
    };
    const std::int64_t want = kvpager::agreed_hit_tokens(
        static_cast<std::int32_t>(kinds.size()), bs, max_tokens,
        [&](std::int32_t g, std::int64_t t) { return native[static_cast<std::size_t>(g)].skipped_tokens(t); },
        [&](std::int32_t g, std::int32_t i) { return is_cached(g, i); }, hs);
    const hit_result got = vllm_hit(kinds, cached, bs, max_tokens);
    ASSERT_EQ(got.tokens, want) << "case " << c;
    // Every entry of every list past its nulls is cached, and the nulls cover at most the blocks the group skips.
    for (std::size_t g = 0; g < kinds.size(); ++g) {
      ASSERT_LE(got.nulls[g], native[g].skipped_tokens(got.tokens) / bs);
      for (std::int64_t i = got.nulls[g]; i < got.tokens / bs; ++i) ASSERT_TRUE(is_cached(static_cast<std::int32_t>(g), i));
    }
    ++tested;
    cut += got.tokens > 0 && got.tokens < max_tokens / bs * bs;
  }
  EXPECT_GT(tested, cases / 4);
  EXPECT_GT(cut, tested / 20);
}

}  // namespace
