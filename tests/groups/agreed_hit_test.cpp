// SPDX-License-Identifier: Apache-2.0
// KV cache group kinds and the hit agreed across groups (issue 24, points 1 and 5): the shipped kinds' skipped
// tokens, a kind of one's own, and agreed_hit_tokens against a brute-force oracle that checks every candidate length
// against every group's cached blocks, over 10^6 randomized cases (10^5 under sanitizers).

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <variant>
#include <vector>

#include <kvpager/groups/agreed_hit.hpp>
#include <kvpager/groups/group_kinds.hpp>

namespace {

using kvpager::chunked_local;
using kvpager::full_attention;
using kvpager::sliding_window;

/// A kind of one's own: a window that only ever drops whole pages of `page` tokens (a kernel that reads from the
/// start of a page), so it keeps up to page - 1 tokens more than sliding_window{window}.
struct paged_window {
  static constexpr const char* kind_name = "paged_window";
  std::int64_t window = 1, page = 1;
  [[nodiscard]] std::int64_t skipped_tokens(std::int64_t t) const noexcept {
    const std::int64_t s = t - window + 1 > 0 ? t - window + 1 : 0;
    return s / page * page;
  }
  [[nodiscard]] kvpager::status validate() const noexcept {
    return window >= 1 && page >= 1 ? kvpager::ok_status()
                                    : kvpager::status{kvpager::errc::invalid_argument, "paged_window: sizes below 1"};
  }
};
static_assert(kvpager::group_kind<paged_window>);
static_assert(kvpager::group_kind<kvpager::group_kind_archetype>);

using any_kind = std::variant<full_attention, sliding_window, chunked_local, paged_window>;

std::int64_t skipped_of(const any_kind& k, std::int64_t t) {
  return std::visit([t](const auto& x) { return x.skipped_tokens(t); }, k);
}

TEST(GroupKinds, SkippedTokensAsVllmCountsThem) {
  EXPECT_EQ(full_attention{}.skipped_tokens(100000), 0);
  const sliding_window w{128};
  EXPECT_EQ(w.skipped_tokens(0), 0);
  EXPECT_EQ(w.skipped_tokens(127), 0);
  EXPECT_EQ(w.skipped_tokens(128), 1);   // position 128 reads [1, 128]
  EXPECT_EQ(w.skipped_tokens(1000), 873);  // docs: 1000 - 128 + 1
  EXPECT_EQ(sliding_window{1}.skipped_tokens(7), 7);
  const chunked_local c{512};
  EXPECT_EQ(c.skipped_tokens(511), 0);
  EXPECT_EQ(c.skipped_tokens(512), 512);
  EXPECT_EQ(c.skipped_tokens(1500), 1024);
  for (std::int64_t t = 0; t < 3000; ++t) {  // the concept's contract: in [0, t], non-decreasing
    for (const any_kind& k : {any_kind{full_attention{}}, any_kind{sliding_window{37}}, any_kind{chunked_local{50}},
                              any_kind{paged_window{40, 16}}}) {
      const std::int64_t s = skipped_of(k, t);
      ASSERT_GE(s, 0);
      ASSERT_LE(s, t);
      if (t > 0) {
        ASSERT_GE(s, skipped_of(k, t - 1));
      }
    }
  }
}

TEST(GroupKinds, SizesBelowOneAreRefused) {
  EXPECT_TRUE(full_attention{}.validate());
  EXPECT_TRUE(sliding_window{1}.validate());
  EXPECT_EQ(sliding_window{0}.validate().code(), kvpager::errc::invalid_argument);
  EXPECT_EQ(sliding_window{-4}.validate().code(), kvpager::errc::invalid_argument);
  EXPECT_EQ(chunked_local{0}.validate().code(), kvpager::errc::invalid_argument);
  EXPECT_TRUE(chunked_local{8192}.validate());
  EXPECT_STREQ(sliding_window::kind_name, "sliding_window");
}

std::int64_t agreed(const std::vector<any_kind>& kinds, const std::vector<std::vector<bool>>& cached, std::int32_t bs,
                    std::int64_t max_tokens, kvpager::hit_scratch& s) {
  return kvpager::agreed_hit_tokens(
      static_cast<std::int32_t>(kinds.size()), bs, max_tokens,
      [&](std::int32_t g, std::int64_t t) { return skipped_of(kinds[static_cast<std::size_t>(g)], t); },
      [&](std::int32_t g, std::int32_t i) {
        const auto& c = cached[static_cast<std::size_t>(g)];
        return static_cast<std::size_t>(i) < c.size() && c[static_cast<std::size_t>(i)];
      },
      s);
}

/// Every candidate length, longest first, checked against every block every group needs for it.
std::int64_t oracle(const std::vector<any_kind>& kinds, const std::vector<std::vector<bool>>& cached, std::int32_t bs,
                    std::int64_t max_tokens) {
  for (std::int64_t k = max_tokens / bs; k >= 0; --k) {
    const std::int64_t len = k * bs;
    bool all = true;
    for (std::size_t g = 0; g < kinds.size() && all; ++g) {
      const std::int64_t first_token = skipped_of(kinds[g], len);
      for (std::int64_t i = 0; i < k && all; ++i) {
        const bool needed = (i + 1) * bs > first_token;  // the block holds a token of [first_token, len)
        const bool have = static_cast<std::size_t>(i) < cached[g].size() && cached[g][static_cast<std::size_t>(i)];
        if (needed && !have) all = false;
      }
    }
    if (all) return len;
  }
  return -1;  // unreachable: 0 always resumes
}

TEST(AgreedHit, WorkedCases) {
  kvpager::hit_scratch s;
  const std::int32_t bs = 16;
  // [full, sliding_window 128]: 40 blocks cached in full; the window group kept only blocks 20..31 (the rest was
  // released or evicted): the longest prefix both can resume is 32 blocks (window needs blocks 24..31).
  std::vector<bool> full(40, true), win(40, false);
  for (int i = 20; i < 32; ++i) win[static_cast<std::size_t>(i)] = true;
  EXPECT_EQ(agreed({full_attention{}, sliding_window{128}}, {full, win}, bs, 999, s), 32 * bs);
  // The window group needs ceil(127 / 16) = 8 blocks: with only 7 before the end, it falls back to a shorter end.
  win.assign(40, false);
  for (int i = 25; i < 32; ++i) win[static_cast<std::size_t>(i)] = true;
  EXPECT_EQ(agreed({full_attention{}, sliding_window{128}}, {full, win}, bs, 999, s), 0);
  // A miss in full attention bounds everything.
  full[10] = false;
  win.assign(40, true);
  EXPECT_EQ(agreed({full_attention{}, sliding_window{128}}, {full, win}, bs, 999, s), 10 * bs);
  // Chunked local 64 (4 blocks per chunk): only the current chunk's blocks are needed.
  std::vector<bool> chunk(40, false);
  for (int i = 28; i < 31; ++i) chunk[static_cast<std::size_t>(i)] = true;
  EXPECT_EQ(agreed({chunked_local{64}}, {chunk}, bs, 500, s), 31 * bs);  // L's chunk starts at block 28: 28..30 cached
  // At a chunk boundary nothing is needed: the next token starts a chunk of its own (vLLM's lookup agrees).
  EXPECT_EQ(agreed({chunked_local{64}}, {chunk}, bs, 999, s), 60 * bs);
  EXPECT_EQ(agreed({full_attention{}, chunked_local{64}}, {std::vector<bool>(40, true), chunk}, bs, 999, s), 40 * bs);  // 640: a chunk boundary
  // The limit is respected and rounded down to whole blocks.
  EXPECT_EQ(agreed({full_attention{}}, {std::vector<bool>(40, true)}, bs, 100, s), 96);
  EXPECT_EQ(agreed({full_attention{}}, {std::vector<bool>(40, true)}, bs, 15, s), 0);
}

TEST(AgreedHit, MatchesBruteForceOracle) {
#if defined(KVPAGER_TEST_REDUCED)
  constexpr int cases = 100'000;
#else
  constexpr int cases = 1'000'000;
#endif
  std::mt19937_64 rng(20261202);
  kvpager::hit_scratch s;
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  const std::int32_t sizes[] = {1, 2, 3, 4, 8, 16};
  std::int64_t nonzero = 0, below_full = 0;
  for (int c = 0; c < cases; ++c) {
    const std::int32_t bs = sizes[pick(0, 5)];
    const auto blocks = static_cast<std::size_t>(pick(0, 24));
    const auto groups = static_cast<std::size_t>(pick(1, 5));
    std::vector<any_kind> kinds;
    std::vector<std::vector<bool>> cached(groups, std::vector<bool>(blocks));
    for (std::size_t g = 0; g < groups; ++g) {
      switch (pick(0, 3)) {
        case 0: kinds.emplace_back(full_attention{}); break;
        case 1: kinds.emplace_back(sliding_window{pick(1, 60)}); break;
        case 2: kinds.emplace_back(chunked_local{pick(1, 60)}); break;
        default: kinds.emplace_back(paged_window{pick(1, 60), pick(1, 20)}); break;
      }
      const double density = std::uniform_real_distribution<double>(0.3, 1.0)(rng);
      for (std::size_t i = 0; i < blocks; ++i) cached[g][i] = std::bernoulli_distribution(density)(rng);
    }
    const std::int64_t max_tokens = pick(0, static_cast<std::int64_t>(blocks) * bs + bs);
    const std::int64_t want = oracle(kinds, cached, bs, max_tokens);
    const std::int64_t got = agreed(kinds, cached, bs, max_tokens, s);
    ASSERT_EQ(got, want) << "case " << c << ": block size " << bs << ", " << groups << " groups, " << blocks
                         << " blocks, max_tokens " << max_tokens;
    nonzero += got > 0;
    below_full += got > 0 && got < max_tokens / bs * bs;
  }
  // The cases exercise the search: many non-empty hits, many of them cut below the limit.
  EXPECT_GT(nonzero, cases / 10);
  EXPECT_GT(below_full, cases / 20);
}

}  // namespace
