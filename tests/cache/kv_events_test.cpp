// SPDX-License-Identifier: Apache-2.0
// KV cache events (core/kv_events.hpp) from paged_kv_cache and hybrid_kv_cache: a consumer that sees only the
// events rebuilds, after every operation, exactly the blocks the cache holds cached (per medium, group and hash,
// counted per block as vLLM's events are); the events' shape (one chain per block_stored, parents, token ids);
// attaching late, a prefix-cache reset, and that a failed call reports nothing.

#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/kv_event_encoding.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <span>
#include <tuple>
#include <vector>

#include "cache/hybrid_test_support.hpp"

using namespace kvpager;

namespace {

cache_config small_config(std::int32_t num_blocks, std::int32_t block_size = 4) {
  cache_config c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.reserved_blocks = 1;
  return c;
}

std::vector<token_id> prompt(std::int32_t n, token_id base) {
  std::vector<token_id> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = base + i;
  return t;
}

/// What a router rebuilds from the events alone: per (medium, group, hash), how many blocks hold it, and the token
/// ids each stored hash was announced with. Checks each event as it applies it (a removal of something never stored,
/// token counts, block sizes).
struct event_view {
  std::map<std::tuple<int, std::int32_t, std::uint64_t>, std::int32_t> blocks;
  std::map<std::uint64_t, std::vector<token_id>> tokens;  ///< hash -> a block's tokens, as stored
  std::int64_t stored = 0, removed = 0, cleared = 0;

  void apply(const kv_event_buffer& buf) {
    for (const kv_event& e : buf.events) {
      const auto hashes = buf.hashes_of(e);
      switch (e.type) {
        case kv_event_type::block_stored: {
          ASSERT_GT(e.block_size, 0);
          ASSERT_GE(hashes.size(), 1u);
          const auto toks = buf.tokens_of(e);
          ASSERT_EQ(toks.size(), hashes.size() * static_cast<std::size_t>(e.block_size));
          for (std::size_t i = 0; i < hashes.size(); ++i) {
            ++blocks[{static_cast<int>(e.medium), e.group, hashes[i]}];
            const std::vector<token_id> t(toks.begin() + static_cast<std::ptrdiff_t>(i) * e.block_size,
                                          toks.begin() + static_cast<std::ptrdiff_t>(i + 1) * e.block_size);
            auto [it, fresh] = tokens.try_emplace(hashes[i], t);
            if (!fresh) {
              EXPECT_EQ(it->second, t) << "one hash announced with two contents";
            }
            ++stored;
          }
          break;
        }
        case kv_event_type::block_removed:
          EXPECT_EQ(buf.tokens_of(e).size(), 0u);
          for (const std::uint64_t h : hashes) {
            auto it = blocks.find({static_cast<int>(e.medium), e.group, h});
            ASSERT_NE(it, blocks.end()) << "removal of a block never stored";
            if (--it->second == 0) blocks.erase(it);
            ++removed;
          }
          break;
        case kv_event_type::all_blocks_cleared:
          blocks.clear();
          ++cleared;
          break;
      }
    }
  }
};

/// The cache's own cached blocks, keyed as the view keys them (paged: group 0, block_hash).
template <class C>
std::map<std::tuple<int, std::int32_t, std::uint64_t>, std::int32_t> paged_state(const C& c) {
  std::map<std::tuple<int, std::int32_t, std::uint64_t>, std::int32_t> out;
  for (block_id b = 0; b < c.config().num_blocks; ++b)
    if (c.sharing().is_cached(b)) ++out[{static_cast<int>(kv_medium::device), 0, c.sharing().block_hash(b)}];
  return out;
}

/// The hybrid cache's cached blocks by the key the sharing policy holds (the hash mixed with its group); the
/// view's entries are mapped to the same key with cached_key, so hash and group are checked together.
template <class C>
std::map<std::uint64_t, std::int32_t> hybrid_state(const C& c) {
  std::map<std::uint64_t, std::int32_t> out;
  for (block_id b = 0; b < c.config().num_blocks; ++b)
    if (c.sharing().is_cached(b)) ++out[c.sharing().block_hash(b)];
  return out;
}
template <class C>
std::map<std::uint64_t, std::int32_t> hybrid_view(const event_view& v) {
  std::map<std::uint64_t, std::int32_t> out;
  for (const auto& [k, n] : v.blocks) {
    EXPECT_EQ(std::get<0>(k), static_cast<int>(kv_medium::device));
    out[C::cached_key(std::get<2>(k), std::get<1>(k))] += n;
  }
  return out;
}

TEST(KvEventBuffer, OneChainIsOneEventAndTheRestStartNewOnes) {
  kv_event_buffer buf;
  const std::vector<token_id> t{1, 2};
  buf.block_stored(kv_medium::device, 0, 10, false, 0, t);
  buf.block_stored(kv_medium::device, 0, 11, true, 10, t);  // continues the chain
  buf.block_stored(kv_medium::device, 0, 12, true, 99, t);  // another parent
  buf.block_stored(kv_medium::device, 1, 13, true, 12, t);  // another group
  buf.block_stored(kv_medium::host, 1, 14, true, 13, t);    // another medium
  buf.block_removed(kv_medium::device, 0, 10);
  buf.block_removed(kv_medium::device, 0, 11);
  buf.block_removed(kv_medium::device, 1, 12);
  buf.all_blocks_cleared();
  ASSERT_EQ(buf.size(), 7u);
  EXPECT_EQ(buf.events[0].num_hashes, 2u);
  EXPECT_FALSE(buf.events[0].has_parent);
  EXPECT_EQ(buf.tokens_of(buf.events[0]).size(), 4u);
  EXPECT_EQ(buf.events[1].parent_hash, 99u);
  EXPECT_EQ(buf.events[2].group, 1);
  EXPECT_EQ(buf.events[3].medium, kv_medium::host);
  EXPECT_EQ(buf.hashes_of(buf.events[4]).size(), 2u);
  EXPECT_EQ(buf.hashes_of(buf.events[5]).size(), 1u);
  EXPECT_EQ(buf.events[6].type, kv_event_type::all_blocks_cleared);
  EXPECT_STREQ(medium_name(kv_medium::device), "GPU");
  EXPECT_STREQ(medium_name(kv_medium::host), "CPU");
  const auto cap = buf.events.capacity();
  buf.clear();
  EXPECT_TRUE(buf.empty());
  EXPECT_EQ(buf.events.capacity(), cap);
}

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(KvEventEncoding, AnEmptyBatchIsTsEventsAndANilRank) {
  std::string out;
  encode_kv_event_batch(kv_event_buffer{}, 1.5, out);
  // [1.5, [], nil]: fixarray 3, float64 1.5 (0x3FF8000000000000), fixarray 0, nil.
  EXPECT_EQ(bytes(out), (std::vector<std::uint8_t>{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90, 0xc0}));
  encode_kv_event_batch(kv_event_buffer{}, 1.5, out, 3);
  EXPECT_EQ(out.back(), 3);
}

TEST(KvEventEncoding, EventsArePositionalArraysWithVllmsFieldsAndSmallestIntegers) {
  kv_event_buffer buf;
  const std::vector<token_id> t{1, 300};
  buf.block_stored(kv_medium::device, 0, (std::uint64_t{1} << 63) + 5, false, 0, t);
  buf.block_removed(kv_medium::host, 2, 200);
  buf.all_blocks_cleared();
  std::string out;
  encode_kv_event_batch(buf, 0.0, out);
  const std::vector<std::uint8_t> stored{
      0x9c, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',  // 12 elements, the tag
      0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 5,                               // [2^63 + 5] as uint64
      0xc0,                                                                // parent: nil
      0x92, 0x01, 0xcd, 0x01, 0x2c,                                        // [1, 300]
      0x02,                                                                // block_size 2
      0xc0, 0xa3, 'G', 'P', 'U', 0xc0, 0xc0, 0x00, 0xc0, 0xc0};            // lora_id .. window
  const std::vector<std::uint8_t> removed{0x94, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd',
                                          0x91, 0xcc, 200, 0xa3, 'C', 'P', 'U', 0x02};
  const std::vector<std::uint8_t> cleared{0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's',
                                          'C', 'l', 'e', 'a', 'r', 'e', 'd'};
  std::vector<std::uint8_t> want{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x93};
  want.insert(want.end(), stored.begin(), stored.end());
  want.insert(want.end(), removed.begin(), removed.end());
  want.insert(want.end(), cleared.begin(), cleared.end());
  want.push_back(0xc0);
  EXPECT_EQ(bytes(out), want);
}

TEST(KvEventEncoding, IntegersTakeTheirSmallestForm) {
  std::string out;
  detail::msgpack_writer w(out);
  w.sint(-1);
  w.sint(-33);
  w.sint(-200);
  w.sint(-40000);
  w.uint(127);
  w.uint(128);
  w.uint(65536);
  w.uint(std::uint64_t{1} << 32);
  EXPECT_EQ(bytes(out), (std::vector<std::uint8_t>{0xff, 0xd0, 0xdf, 0xd1, 0xff, 0x38, 0xd2, 0xff, 0xff, 0x63, 0xc0,
                                                   0x7f, 0xcc, 0x80, 0xce, 0, 1, 0, 0, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0}));
}

TEST(KvEvents, APromptIsOneStoredChainAndDecodeContinuesIt) {
  auto c = std::move(*vllm_v1_cache::create(small_config(16)));
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  const auto p = prompt(14, 100);  // 3 full blocks of 4 and 2 tokens
  ASSERT_TRUE(c.add_sequence(1, p));
  ASSERT_EQ(buf.size(), 1u);
  const kv_event& e = buf.events[0];
  EXPECT_EQ(e.type, kv_event_type::block_stored);
  EXPECT_EQ(e.medium, kv_medium::device);
  EXPECT_FALSE(e.has_parent);
  EXPECT_EQ(e.block_size, 4);
  const auto hashes = buf.hashes_of(e);
  ASSERT_EQ(hashes.size(), 3u);
  const auto ids = c.block_table(1);
  ASSERT_TRUE(ids);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(hashes[i], c.sharing().block_hash((*ids)[i]));
  EXPECT_EQ(std::vector<token_id>(buf.tokens_of(e).begin(), buf.tokens_of(e).end()),
            std::vector<token_id>(p.begin(), p.begin() + 12));
  const std::uint64_t last = hashes[2];
  buf.clear();
  // Two tokens fill block 3: one event whose parent is block 2.
  const std::vector<token_id> more{500, 501};
  ASSERT_TRUE(c.append_tokens(1, more));
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_TRUE(buf.events[0].has_parent);
  EXPECT_EQ(buf.events[0].parent_hash, last);
  EXPECT_EQ(buf.tokens_of(buf.events[0])[3], 501);
  buf.clear();
  // A second request hitting the prefix stores only its own new block, after the hit.
  auto q = prompt(9, 100);
  q[8] = 7;
  ASSERT_TRUE(c.add_sequence(2, q));
  EXPECT_TRUE(buf.empty());  // 2 hit blocks, the third is partial: nothing new cached
}

TEST(KvEvents, AttachingLateIsRefusedAndChangesNothing) {
  auto c = std::move(*vllm_v1_cache::create(small_config(16)));
  ASSERT_TRUE(c.add_sequence(1, prompt(9, 0)));
  kv_event_buffer buf;
  const auto before = c.stats();
  const auto st = c.set_kv_event_buffer(&buf);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(before.used, 3);
  EXPECT_TRUE(buf.empty());  // not attached: the free reported nothing
  // Detaching is always allowed; a cache without content caching accepts a buffer and reports nothing.
  EXPECT_TRUE(c.set_kv_event_buffer(nullptr));
  auto n = std::move(*vllm_v1_no_caching_cache::create(small_config(16)));
  ASSERT_TRUE(n.set_kv_event_buffer(&buf));
  ASSERT_TRUE(n.add_sequence(1, prompt(9, 0)));
  EXPECT_TRUE(buf.empty());
}

TEST(KvEvents, ResetPrefixCacheClearsEverythingOnlyWhenNothingIsInUse) {
  auto c = std::move(*vllm_v1_cache::create(small_config(16)));
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  ASSERT_TRUE(c.add_sequence(1, prompt(9, 0)));
  const auto before = c.stats();
  EXPECT_EQ(c.reset_prefix_cache().code(), errc::invalid_block);
  const auto after = c.stats();
  EXPECT_EQ(before.cached, after.cached);
  EXPECT_EQ(before.free, after.free);
  c.begin_step();  // the prompt's bytes are written: freed now, its blocks stay cached
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_EQ(c.stats().cached, 2);
  buf.clear();
  ASSERT_TRUE(c.reset_prefix_cache());
  EXPECT_EQ(c.stats().cached, 0);
  EXPECT_EQ(c.stats().evictable, 0);
  EXPECT_EQ(c.available_blocks(), 15);
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_EQ(buf.events[0].type, kv_event_type::all_blocks_cleared);
  // The same prompt misses now, and is stored again.
  buf.clear();
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, prompt(9, 0), {}, &m));
  EXPECT_EQ(m.blocks, 0);
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_EQ(buf.hashes_of(buf.events[0]).size(), 2u);
}

/// Random operations over a cache with a small pool (evictions, shared prefixes, forks and their copy-on-write,
/// frees in the step that appended, resets): after every operation the view rebuilt from the events equals the
/// cache's cached blocks.
template <class C, class State, class View>
void run_random(C& c, State state, View view, std::uint32_t seed, int ops) {
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  event_view v;
  std::mt19937 rng(seed);
  std::vector<seq_id> live;
  seq_id next = 1;
  for (int op = 0; op < ops; ++op) {
    const int what = static_cast<int>(rng() % 10);
    if (what < 4) {
      const auto len = static_cast<std::int32_t>(1 + rng() % 24);
      auto t = prompt(len, static_cast<token_id>(rng() % 3) * 1000);  // three prefixes, shared often
      for (std::size_t i = static_cast<std::size_t>(rng() % 16); i < t.size(); i += 7) t[i] += static_cast<token_id>(rng() % 2);
      if (c.add_sequence(next, t)) live.push_back(next);
      ++next;
    } else if (what < 7 && !live.empty()) {
      const seq_id id = live[rng() % live.size()];
      std::vector<token_id> t(1 + rng() % 5);
      for (auto& x : t) x = static_cast<token_id>(rng() % 4);
      (void)c.append_tokens(id, t);
    } else if (what < 8 && !live.empty()) {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(c.free_sequence(live[i]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (what < 9 && !live.empty()) {
      // A fork shares the parent's blocks; the child's first write into a shared partial block copies it.
      if (c.fork(live[rng() % live.size()], next)) live.push_back(next);
      ++next;
    } else if (live.empty()) {
      c.begin_step();
      ASSERT_TRUE(c.reset_prefix_cache());
      EXPECT_EQ(c.stats().cached, 0);
      EXPECT_EQ(c.available_blocks(), c.stats().total) << "a reset leaves every usable block free";
    } else {
      c.begin_step();
    }
    v.apply(buf);
    buf.clear();
    ASSERT_EQ(view(v), state(c)) << "op " << op;
  }
  EXPECT_GT(v.stored, 0);
  EXPECT_GT(v.removed, 0);
}

TEST(KvEvents, PagedCacheEventsRebuildItsCachedBlocksAfterEveryOperation) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    auto c = std::move(*vllm_v1_cache::create(small_config(24)));
    run_random(
        c, [](const vllm_v1_cache& x) { return paged_state(x); }, [](const event_view& v) { return v.blocks; }, seed,
        3000);
  }
}

TEST(KvEvents, HybridCacheEventsRebuildItsCachedBlocksPerGroupAfterEveryOperation) {
  using C = kvpager_test::hybrid;
  const std::vector<std::vector<any_group_kind>> layouts{
      {full_attention{}, sliding_window{6}},
      {sliding_window{5}, full_attention{}, chunked_local{8}},
  };
  for (const auto& kinds : layouts)
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      auto c = std::move(*C::create(kvpager_test::config(40), kinds, {hybrid_conventions::native}));
      run_random(
          c, [](const C& x) { return hybrid_state(x); }, [](const event_view& v) { return hybrid_view<C>(v); }, seed,
          3000);
    }
  // Groups of several units: a lead's companions are not cached and never reported; a reset frees them.
  const std::vector<std::int32_t> units{1, 2};
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    auto c = std::move(*C::create(kvpager_test::config(60), std::vector<any_group_kind>{full_attention{}, sliding_window{6}},
                                  {hybrid_conventions::native, units}));
    run_random(
        c, [](const C& x) { return hybrid_state(x); }, [](const event_view& v) { return hybrid_view<C>(v); }, seed,
        3000);
  }
}

TEST(KvEvents, RecordingAllocatesNothingOnceTheBufferHasGrown) {
  auto c = std::move(*vllm_v1_cache::create(small_config(24)));
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  // The same operations twice, with the buffer cleared in between: the second round finds room for every event.
  std::size_t caps[3] = {};
  const void* data[3] = {};
  for (int round = 0; round < 2; ++round) {
    std::size_t most = 0;
    for (seq_id id = 1; id <= 40; ++id) {
      ASSERT_TRUE(c.add_sequence(id, prompt(12 + static_cast<std::int32_t>(id % 5), static_cast<token_id>(id % 7) * 100)));
      c.begin_step();
      ASSERT_TRUE(c.free_sequence(id));
      most = std::max(most, buf.size());
    }
    EXPECT_GT(most, 0u);
    if (round == 1) {
      EXPECT_EQ(buf.events.capacity(), caps[0]);
      EXPECT_EQ(buf.hashes.capacity(), caps[1]);
      EXPECT_EQ(buf.tokens.capacity(), caps[2]);
      EXPECT_EQ(static_cast<const void*>(buf.events.data()), data[0]);
      EXPECT_EQ(static_cast<const void*>(buf.hashes.data()), data[1]);
      EXPECT_EQ(static_cast<const void*>(buf.tokens.data()), data[2]);
    }
    caps[0] = buf.events.capacity(), caps[1] = buf.hashes.capacity(), caps[2] = buf.tokens.capacity();
    data[0] = buf.events.data(), data[1] = buf.hashes.data(), data[2] = buf.tokens.data();
    buf.clear();
    ASSERT_TRUE(c.reset_prefix_cache());
    buf.clear();
  }
}

TEST(KvEvents, HybridStoredChainsNameTheirGroupAndTheBlockBefore) {
  using C = kvpager_test::hybrid;
  auto c = std::move(*C::create(kvpager_test::config(40), std::vector<any_group_kind>{full_attention{}, sliding_window{4}},
                                {hybrid_conventions::native}));
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  ASSERT_TRUE(c.add_sequence(1, prompt(13, 0)));  // 3 full blocks in each group
  std::map<std::int32_t, std::vector<std::uint64_t>> per_group;
  for (const kv_event& e : buf.events) {
    ASSERT_EQ(e.type, kv_event_type::block_stored);
    const auto h = buf.hashes_of(e);
    per_group[e.group].insert(per_group[e.group].end(), h.begin(), h.end());
  }
  ASSERT_EQ(per_group.size(), 2u);
  EXPECT_EQ(per_group[0].size(), 3u);
  // Both groups name blocks by the same chained hashes (the group is a field, not mixed in).
  EXPECT_EQ(per_group[1], per_group[0]);
  // Three more tokens fill block 3: in each group one event whose parent is block 2's hash (in the window group
  // block 2 may be outside the window: its hash still names the chain).
  buf.clear();
  ASSERT_TRUE(c.append_tokens(1, std::vector<token_id>{70, 71, 72}));
  ASSERT_EQ(buf.size(), 2u);
  for (const kv_event& e : buf.events) {
    EXPECT_EQ(e.type, kv_event_type::block_stored);
    EXPECT_TRUE(e.has_parent);
    EXPECT_EQ(e.parent_hash, per_group[0][2]) << "group " << e.group;
    EXPECT_EQ(buf.hashes_of(e).size(), 1u);
  }
  EXPECT_NE(buf.events[0].group, buf.events[1].group);
  EXPECT_EQ(buf.hashes_of(buf.events[0])[0], buf.hashes_of(buf.events[1])[0]);
}

TEST(KvEvents, AttachingAgainTellsTheConsumerToForgetWhatItWasToldBefore) {
  auto c = std::move(*vllm_v1_cache::create(small_config(16)));
  kv_event_buffer buf;
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  ASSERT_TRUE(c.add_sequence(1, prompt(9, 0)));
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.set_kv_event_buffer(nullptr));  // detached: the reset below reports nothing
  ASSERT_TRUE(c.reset_prefix_cache());
  buf.clear();
  ASSERT_TRUE(c.set_kv_event_buffer(&buf));
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_EQ(buf.events[0].type, kv_event_type::all_blocks_cleared);
  // A copy starts detached; attached, it tells its consumer to start afresh too (it may have been told the original's).
  auto copy = c;
  kv_event_buffer other;
  ASSERT_TRUE(copy.set_kv_event_buffer(&other));
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other.events[0].type, kv_event_type::all_blocks_cleared);
  // The first attach of a fresh cache says nothing.
  auto fresh = std::move(*vllm_v1_cache::create(small_config(16)));
  kv_event_buffer third;
  ASSERT_TRUE(fresh.set_kv_event_buffer(&third));
  EXPECT_TRUE(third.empty());
}

}  // namespace
