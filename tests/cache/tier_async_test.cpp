// SPDX-License-Identifier: Apache-2.0
// paged_kv_cache with an asynchronous host tier (host_tier_options::async): loads and stores complete when the engine
// reports them (complete_tier_transfers), ok or failed, not at the next begin_step.
//
// The unit tests check each rule: a sequence admitted with blocks to load waits (tier_load_state::loading: no slots,
// no appends, forks, swaps or preemption) until its loads are in, then its loaded blocks are cached; a failed load
// fails it (the blocks before are cached, the failed copy is forgotten), a load past load_timeout_steps too; the
// blocks of loads still in flight when their sequence is freed stay held until reported; a write-through store keeps
// its source block until reported; bad reports are refused and change nothing.
//
// The model test (issue 25, point 3) runs random admissions, appends, frees and steps against the cache with an
// emulated engine that completes transfers after random delays, fails some and holds some past the timeout, and a
// reference model of both tiers kept by the test alone: which content each device block holds (from the sequences'
// tokens) and the state and content of every host tier block (from the plans and the reports: empty, being written,
// ready, being read). After every step every block's bytes in both tiers are what the reference says; at every
// admission the hit (device blocks, then host blocks) is the reference's; every load reads a host block whose store
// completed and that nothing being read was evicted for; no block a sequence, a transfer or a pinned store holds is
// handed out; every sequence waiting for loads resolves within load_timeout_steps. The policies' victim choice is the
// one input the reference takes from the cache (tests/tier/host_tier_test.cpp checks it against vLLM's).

#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/tier_test_support.hpp"
#include "support/kv_content.hpp"

namespace kvpager {
namespace {

using lru_cache = tiered_cache_with<lru_tier, no_swap>;
using arc_cache = tiered_cache_with<arc_tier, no_swap>;

constexpr std::int32_t bs = kvtest::tier_block_size;
using kvtest::iota_prompt;
using kvtest::tier_transfers;
using kvtest::host_state;
using kvtest::ref_host_block;
using kvtest::in_flight;

/// kvtest::tier_config with asynchronous transfers and a load timeout of `timeout` steps.
cache_config config(std::int32_t device_blocks, std::int32_t tier_blocks, tier_write w = tier_write::through,
                    std::int32_t timeout = 64) {
  cache_config c = kvtest::tier_config(device_blocks, tier_blocks, w);
  c.host_tier.async = true;
  c.host_tier.load_timeout_steps = timeout;
  return c;
}

/// Caches prompt `p` in the tier (stored and reported), then evicts it from the device.
template <class Cache>
void cache_in_tier_only(Cache& c, const std::vector<token_id>& p) {
  ASSERT_TRUE(c.add_sequence(777, p));
  c.begin_step();  // write-through stores planned
  const auto stores = tier_transfers(c);
  ASSERT_FALSE(stores.empty());
  ASSERT_TRUE(c.complete_tier_transfers(stores));
  ASSERT_TRUE(c.free_sequence(777));
  c.begin_step();
  for (std::int32_t r = 0; r < 3; ++r) {  // other content pushes p's blocks out of the device
    const seq_id id = 900'000 + r;
    ASSERT_TRUE(c.add_sequence(id, iota_prompt(4 * bs + 1, 5000 + 1000 * r)));
    c.begin_step();
    ASSERT_TRUE(c.complete_tier_transfers(tier_transfers(c)));
    ASSERT_TRUE(c.free_sequence(id));
    c.begin_step();
    ASSERT_TRUE(c.complete_tier_transfers(tier_transfers(c)));
  }
  ASSERT_EQ(c.stats().tier_in_flight, 0);
}

TEST(TierAsync, ConfigurationAndUnsupportedCalls) {
  cache_config c = config(9, 4, tier_write::through, 0);
  EXPECT_EQ(lru_cache::create(c).error().code(), errc::invalid_argument) << "a load could hold a request forever";
  c.host_tier.load_timeout_steps = 1;
  EXPECT_TRUE(lru_cache::create(c));
  c.host_tier.async = false;
  auto sync = *lru_cache::create(c);
  const tier_done d{{1, 0, 0}, true};
  EXPECT_EQ(sync.complete_tier_transfers({&d, 1}).code(), errc::unsupported) << "synchronous: done at begin_step";
  auto plain = *vllm_v1_cache::create(cache_config{bs, 9, 1});
  EXPECT_EQ(plain.complete_tier_transfers({&d, 1}).code(), errc::unsupported);
  ASSERT_TRUE(plain.add_sequence(1, iota_prompt(5, 1)));
  EXPECT_EQ(*plain.load_state(1), tier_load_state::none);
  EXPECT_EQ(plain.load_state(2).error().code(), errc::unknown_sequence);
}

TEST(TierAsync, ASequenceWaitsForItsLoadsThenItsBlocksAreCached) {
  auto c = *lru_cache::create(config(9, 16));
  const auto p = iota_prompt(3 * bs + 2, 10);
  cache_in_tier_only(c, p);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, p, {}, &m));
  EXPECT_EQ(m, (prefix_match{0, 3 * bs, 4, 3}));
  EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  EXPECT_EQ(*c.num_tokens(2), 3 * bs) << "it holds its hit only: the rest is appended once the loads are in";
  EXPECT_TRUE(c.plan().appends().empty());
  const auto loads = tier_transfers(c);
  ASSERT_EQ(loads.size(), 3U);
  const auto table = *c.block_table(2);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(loads[i].swap.device, table[i]);
    EXPECT_FALSE(c.sharing().is_cached(table[i])) << "not cached before its bytes are in";
  }
  // Nothing can compute it, fork it, swap or preempt it meanwhile; nothing is loaded twice.
  const token_id t = 3;
  EXPECT_EQ(c.append_tokens(2, {&t, 1}).code(), errc::pending_append);
  EXPECT_EQ(c.append_tokens(2, token_count{1}).code(), errc::pending_append);
  EXPECT_EQ(c.fork(2, 3).code(), errc::pending_append);
  EXPECT_EQ(c.preempt_decision(2).error().code(), errc::pending_append);
  EXPECT_EQ(c.match_prefix(p)->host_blocks, 0) << "blocks being loaded are not offered to another request";
  // The steps go by; the loads complete when reported, in any order.
  c.begin_step();
  c.begin_step();
  EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  EXPECT_EQ(c.stats().tier_in_flight, 3);
  ASSERT_TRUE(c.complete_tier_transfers({&loads[2], 1}));
  ASSERT_TRUE(c.complete_tier_transfers({&loads[0], 2}));
  EXPECT_EQ(*c.load_state(2), tier_load_state::none);
  EXPECT_EQ(c.stats().tier_in_flight, 0);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(c.sharing().is_cached(table[i]));
  const std::vector<token_id> rest(p.begin() + 3 * bs, p.end());
  ASSERT_TRUE(c.append_tokens(2, rest));
  EXPECT_EQ(c.plan().appends().back(), (token_range{2, 3 * bs, 2}));
  // Another request now hits the device.
  EXPECT_EQ(c.match_prefix(p)->blocks, 3);
}

TEST(TierAsync, AFailedLoadFailsTheSequenceCachesWhatArrivedAndForgetsTheCopy) {
  auto c = *lru_cache::create(config(9, 16));
  const auto p = iota_prompt(3 * bs + 2, 10);
  cache_in_tier_only(c, p);
  ASSERT_TRUE(c.add_sequence(2, p));
  const auto loads = tier_transfers(c);
  const auto table = *c.block_table(2);
  const std::vector<block_id> blocks(table.begin(), table.end());
  const tier_done first{loads[0].swap, true}, second{loads[1].swap, false};
  ASSERT_TRUE(c.complete_tier_transfers({&first, 1}));
  EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  const std::int32_t held = c.tier().stats().held;
  ASSERT_TRUE(c.complete_tier_transfers({&second, 1}));
  EXPECT_EQ(*c.load_state(2), tier_load_state::failed);
  EXPECT_EQ(c.stats().tier_failed_loads, 1);
  EXPECT_TRUE(c.sharing().is_cached(blocks[0])) << "the block that arrived before the failure is cached";
  EXPECT_FALSE(c.sharing().is_cached(blocks[1]));
  EXPECT_EQ(c.tier().stats().held, held - 1) << "the copy that failed to load is forgotten";
  // Freed with its third load in flight: that block stays held until the engine reports it.
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.refcount(blocks[2]), 1);
  EXPECT_EQ(c.refcount(blocks[1]), 0);
  c.begin_step();
  EXPECT_EQ(c.refcount(blocks[2]), 1) << "a step does not release a block a transfer still writes";
  ASSERT_TRUE(c.complete_tier_transfers({&loads[2], 1}));
  EXPECT_EQ(c.refcount(blocks[2]), 0);
  EXPECT_FALSE(c.sharing().is_cached(blocks[2]));
  const cache_stats s = c.stats();
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.free + s.evictable, s.total);
  // Admitted again: the device serves block 0; the forgotten copy is recomputed, not loaded again.
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(3, p, {}, &m));
  EXPECT_EQ(m.blocks, 1);
  EXPECT_EQ(m.host_blocks, 0) << "the tier's run stops at the forgotten block";
}

TEST(TierAsync, LoadsPastTheTimeoutFailTheSequence) {
  auto c = *lru_cache::create(config(9, 16, tier_write::through, 2));
  const auto p = iota_prompt(2 * bs + 1, 10);
  cache_in_tier_only(c, p);
  ASSERT_TRUE(c.add_sequence(2, p));
  const auto loads = tier_transfers(c);
  ASSERT_EQ(loads.size(), 2U);
  c.begin_step();
  EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  c.begin_step();
  EXPECT_EQ(*c.load_state(2), tier_load_state::failed);
  EXPECT_EQ(c.stats().tier_load_timeouts, 1);
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.stats().used, 2) << "both blocks stay with their transfers";
  ASSERT_TRUE(c.complete_tier_transfers(loads));  // late, but in: released, not cached
  EXPECT_EQ(c.stats().used, 0);
  EXPECT_EQ(c.stats().tier_in_flight, 0);
  EXPECT_EQ(c.tier().stats().reading, 0);
}

TEST(TierAsync, AWriteThroughStoreKeepsItsSourceUntilReported) {
  auto c = *lru_cache::create(config(5, 16));  // 4 usable blocks
  const auto p = iota_prompt(2 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  const auto t = *c.block_table(1);
  const std::vector<block_id> table(t.begin(), t.end());
  c.begin_step();
  const auto stores = tier_transfers(c);
  ASSERT_EQ(stores.size(), 2U);
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.refcount(table[0]), 1) << "pinned by its store";
  EXPECT_EQ(c.refcount(table[1]), 1);
  EXPECT_EQ(c.available_blocks(), 2) << "the stores' sources cannot be handed out";
  EXPECT_EQ(c.add_sequence(2, iota_prompt(4 * bs, 500)).code(), errc::out_of_blocks);
  ASSERT_TRUE(c.complete_tier_transfers(stores));
  EXPECT_EQ(c.refcount(table[0]), 0);
  EXPECT_TRUE(c.sharing().is_cached(table[0])) << "released as cached: still a device hit";
  EXPECT_EQ(c.available_blocks(), 4);
  EXPECT_EQ(c.tier().stats().stored, 2);
}

TEST(TierAsync, AFailedStoreForgetsTheCopy) {
  auto c = *lru_cache::create(config(9, 16));
  const auto p = iota_prompt(2 * bs + 1, 10);
  ASSERT_TRUE(c.add_sequence(1, p));
  c.begin_step();
  ASSERT_TRUE(c.complete_tier_transfers(tier_transfers(c, false)));
  EXPECT_EQ(c.stats().tier_failed_stores, 2);
  EXPECT_EQ(c.tier().stats().held, 0);
  EXPECT_EQ(c.tier().stats().failed_stores, 2);
}

TEST(TierAsync, BadReportsAreRefusedAndChangeNothing) {
  auto c = *lru_cache::create(config(9, 16));
  const auto p = iota_prompt(3 * bs + 2, 10);
  cache_in_tier_only(c, p);
  ASSERT_TRUE(c.add_sequence(2, p));
  const auto loads = tier_transfers(c);
  const cache_stats before = c.stats();
  const host_tier_stats tier_before = c.tier().stats();
  const auto refused = [&](std::vector<tier_done> d) {
    EXPECT_EQ(c.complete_tier_transfers(d).code(), errc::invalid_argument);
    EXPECT_EQ(c.stats(), before);
    EXPECT_EQ(c.tier().stats(), tier_before);
    EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  };
  refused({loads[0], loads[0]});                                    // twice
  refused({loads[1], {{loads[0].swap.device, 15, 0}, true}});       // a tier block with nothing in flight
  refused({{{loads[1].swap.device, loads[0].swap.host, 0}, true}});  // the wrong device block
  refused({{{loads[0].swap.device, -5, 0}, true}});                  // not a host block
  refused({{{loads[0].swap.device, 1 << 30, 0}, true}});
  ASSERT_TRUE(c.complete_tier_transfers({}));  // nothing to report: fine
  ASSERT_TRUE(c.complete_tier_transfers(loads));
  EXPECT_EQ(*c.load_state(2), tier_load_state::none);
}

// ------------------------------------------------------------------------------------------------ the model test

#if defined(KVPAGER_TEST_REDUCED)
constexpr std::int64_t model_ops = 200'000;
#else
constexpr std::int64_t model_ops = 10'000'000;
#endif

using kvtest::mix;

struct ref_seq {
  std::vector<token_id> tokens;
  std::vector<std::uint64_t> values;  ///< emulated KV of each token
  std::uint64_t extra = 0;
  bool waiting = false;               ///< admitted with loads, not resolved
  std::int32_t loads_first = 0, loads = 0, outstanding = 0;
  bool failed = false;                ///< a load failed (expects tier_load_state::failed)
  std::int64_t admitted_step = 0;
};

template <class Cache>
class async_model {
 public:
  async_model(std::int32_t device_blocks, host_tier_options t, std::uint32_t seed)
      : cache_(std::move(*Cache::create(make_config(device_blocks, t)))), rng_(seed) {
    const auto nb = static_cast<std::size_t>(device_blocks);
    mem_.assign(nb * bs, 0);
    content_.assign(nb, 0);
    orphan_.assign(nb, 0);
    pinned_.assign(nb, 0);
    ref_.assign(static_cast<std::size_t>(t.num_blocks), ref_host_block{});
    host_mem_.assign(static_cast<std::size_t>(t.num_blocks) * bs, 0);
    timeout_ = t.load_timeout_steps;
    inclusive_ = t.inclusive;
  }
  static cache_config make_config(std::int32_t device_blocks, host_tier_options t) {
    cache_config c{bs, device_blocks, 1, 0, 0};
    c.host_tier = t;
    return c;
  }

  void run(std::int64_t ops) {
    for (std::int64_t op = 0; op < ops && !::testing::Test::HasFatalFailure(); ++op) {
      const auto r = rng_() % 100;
      if (r < 24 || seqs_.empty()) {
        admit();
      } else if (r < 52) {
        append();
      } else if (r < 68) {
        free_one();
      } else if (r < 86) {
        step();
      } else if (r < 92) {
        deliver(false);
        if (!::testing::Test::HasFatalFailure()) run_ready();
      } else if (r < 96) {
        lookup();
      } else {
        bad_call();
      }
      if (::testing::Test::HasFatalFailure()) return;
      check_blocks();
    }
    // Drain: every sequence freed, every transfer reported, nothing leaked on either side.
    while (!seqs_.empty()) {
      const seq_id id = seqs_.begin()->first;
      free_seq(id);
    }
    for (int round = 0; round < 4 && (!flying_.empty() || !planned_.empty()); ++round) {
      for (auto* list : {&flying_, &planned_})
        for (in_flight& f : *list) f.due = 0;
      step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    ASSERT_TRUE(flying_.empty());
    ASSERT_TRUE(planned_.empty());
    const cache_stats s = cache_.stats();
    EXPECT_EQ(s.used, 0);
    EXPECT_EQ(s.tier_in_flight, 0);
    EXPECT_EQ(s.free + s.evictable, s.total);
    EXPECT_EQ(cache_.tier().stats().reading, 0);
    EXPECT_EQ(cache_.tier().stats().writing, 0);
    std::printf("async tier: %lld ops, %lld steps, %lld admissions (%lld waited for loads), hits: %lld device, %lld "
                "host tokens; loads %lld (%lld failed, %lld timed out sequences), stores %lld (%lld failed), %lld "
                "late reports\n",
                static_cast<long long>(ops), static_cast<long long>(steps_), static_cast<long long>(admissions_),
                static_cast<long long>(waits_), static_cast<long long>(s.prefix_hit_tokens),
                static_cast<long long>(s.prefix_hit_tokens_host), static_cast<long long>(s.tier_loaded_blocks),
                static_cast<long long>(s.tier_failed_loads), static_cast<long long>(s.tier_load_timeouts),
                static_cast<long long>(s.tier_stored_blocks), static_cast<long long>(s.tier_failed_stores),
                static_cast<long long>(late_));
    EXPECT_GT(waits_, ops / 1000) << "admissions should wait for loads";
    EXPECT_GT(s.tier_failed_loads, 0);
    EXPECT_GT(s.tier_failed_stores, 0);
    EXPECT_GT(s.tier_load_timeouts, 0);
    EXPECT_GT(late_, 0) << "loads reported after their sequence gave up";
  }

 private:
  // ------------------------------------------------------------------ workload

  std::vector<token_id> random_prompt(std::uint64_t& extra) {
    extra = rng_() % 5 == 0 ? 1 : 0;
    std::vector<token_id> t;
    const auto family = static_cast<token_id>(rng_() % 12);
    const auto cut = static_cast<std::int32_t>(rng_() % (5 * bs + 1));
    for (std::int32_t i = 0; i < cut; ++i) t.push_back(1000 * (family + 1) + i);
    const auto suffix = static_cast<std::int32_t>(1 + rng_() % bs);
    for (std::int32_t i = 0; i < suffix; ++i) t.push_back(static_cast<token_id>(rng_() % 3));
    return t;
  }
  static std::vector<std::uint64_t> values_of(const std::vector<token_id>& t, std::uint64_t extra) {
    std::vector<std::uint64_t> v;
    std::uint64_t h = mix(0x1234, extra);
    for (const token_id x : t) v.push_back(h = mix(h, static_cast<std::uint64_t>(x) + 1));
    return v;
  }

  /// The hit the reference expects for `v` (a prompt's values): device blocks holding each block's content, then
  /// ready host blocks, capped below the last token.
  prefix_match expected_hit(const std::vector<std::uint64_t>& v) {
    const auto n = static_cast<std::int32_t>(v.size());
    const std::int32_t cap = (n - 1) / bs;
    std::unordered_set<std::uint64_t> device;
    for (block_id b = 1; b < cache_.pool().num_blocks(); ++b)
      if (cache_.sharing().is_cached(b)) device.insert(content_[static_cast<std::size_t>(b)]);
    prefix_match m;
    while (m.blocks < cap && device.count(v[static_cast<std::size_t>((m.blocks + 1) * bs - 1)])) ++m.blocks;
    std::int32_t i = m.blocks;
    while (i < cap) {
      const auto it = held_.find(v[static_cast<std::size_t>((i + 1) * bs - 1)]);
      if (it == held_.end() || ref_[static_cast<std::size_t>(it->second)].state != host_state::ready) break;
      ++i;
    }
    m.host_blocks = i - m.blocks;
    m.tokens = i * bs;
    return m;
  }

  void admit() {
    ref_seq s;
    s.tokens = random_prompt(s.extra);
    s.values = values_of(s.tokens, s.extra);
    const prefix_match want = expected_hit(s.values);
    const seq_id id = next_id_++;
    const cache_stats before = cache_.stats();
    prefix_match m;
    const status st = cache_.add_sequence(id, s.tokens, {.extra_key = s.extra}, &m);
    if (!st) {
      ASSERT_EQ(st.code(), errc::out_of_blocks) << st.message();
      ASSERT_EQ(cache_.stats(), before) << "a refused admission changed the cache";
      return;
    }
    ++admissions_;
    ASSERT_EQ(m.blocks, want.blocks) << "device hit differs from the reference";
    ASSERT_EQ(m.host_blocks, want.host_blocks) << "host tier hit differs from the reference";
    ASSERT_EQ(m.tokens, want.tokens);
    const auto t = *cache_.block_table(id);
    const std::vector<block_id> table(t.begin(), t.end());
    if (m.host_blocks > 0) {
      ++waits_;
      ASSERT_EQ(*cache_.load_state(id), tier_load_state::loading);
      ASSERT_EQ(static_cast<std::int32_t>(table.size()), m.blocks + m.host_blocks);
      s.waiting = true;
      s.loads_first = m.blocks;
      s.loads = s.outstanding = m.host_blocks;
      s.admitted_step = steps_;
    } else {
      ASSERT_EQ(*cache_.load_state(id), tier_load_state::none);
    }
    const ref_seq& kept = seqs_.emplace(id, std::move(s)).first->second;
    take_plan();  // before learning: a write-back store reads what its block held before this admission
    learn(table, kept, m.blocks);
  }

  /// The reference learns which content the full blocks of a table hold (from block `from` on).
  void learn(std::span<const block_id> table, const ref_seq& s, std::int32_t from) {
    const auto full = static_cast<std::int32_t>(s.values.size()) / bs;
    for (std::int32_t i = from; i < full && i < static_cast<std::int32_t>(table.size()); ++i) {
      const block_id b = table[static_cast<std::size_t>(i)];
      const std::uint64_t c = s.values[static_cast<std::size_t>((i + 1) * bs - 1)];
      content_[static_cast<std::size_t>(b)] = c;
      if (cache_.sharing().is_cached(b)) key_of_[c] = cache_.sharing().block_hash(b);  // the tier's key for it
    }
  }

  seq_id random_seq() {
    auto it = seqs_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % seqs_.size()));
    return it->first;
  }

  void append() {
    const seq_id id = random_seq();
    ref_seq& s = seqs_.at(id);
    std::vector<token_id> more;
    if (s.waiting) {  // a sequence waiting for loads cannot be computed
      const token_id t = 1;
      const cache_stats before = cache_.stats();
      ASSERT_EQ(cache_.append_tokens(id, {&t, 1}).code(), errc::pending_append);
      ASSERT_EQ(cache_.fork(id, next_id_).code(), errc::pending_append);
      ASSERT_EQ(cache_.stats(), before);
      return;
    }
    const auto n = static_cast<std::int32_t>(1 + rng_() % (rng_() % 6 == 0 ? 9 : 2));
    for (std::int32_t i = 0; i < n; ++i) more.push_back(static_cast<token_id>(rng_() % 3));
    const cache_stats before = cache_.stats();
    const status st = cache_.append_tokens(id, more);
    if (!st) {
      ASSERT_EQ(st.code(), errc::out_of_blocks) << st.message();
      ASSERT_EQ(cache_.stats(), before);
      return;
    }
    const auto old = static_cast<std::int32_t>(s.tokens.size());
    s.tokens.insert(s.tokens.end(), more.begin(), more.end());
    s.values = values_of(s.tokens, s.extra);
    take_plan();
    learn(*cache_.block_table(id), s, old / bs);
  }

  void free_one() { free_seq(random_seq()); }
  void free_seq(seq_id id) {
    ref_seq& s = seqs_.at(id);
    const auto t = *cache_.block_table(id);
    const std::vector<block_id> table(t.begin(), t.end());
    ASSERT_TRUE(cache_.free_sequence(id));
    if (s.waiting) {  // loads still in flight keep their blocks
      for (auto* list : {&flying_, &planned_})
        for (in_flight& f : *list)
          if (f.load && owner_.count(f.done.swap.host) && owner_[f.done.swap.host] == id) {
            ++orphan_[static_cast<std::size_t>(f.done.swap.device)];
            owner_.erase(f.done.swap.host);
          }
    }
    freed_.emplace(id, std::move(s.values));  // tokens it appended in this step may still be written (shared)
    seqs_.erase(id);
    take_plan();
  }

  // ------------------------------------------------------------------ the plan and the engine

  /// Reads the tier transfers the cache planned since the last look: stores start being written (evicting what the
  /// reference held in their host block), loads start being read (the reference must hold the content ready).
  void take_plan() {
    const step_plan& plan = cache_.plan();
    const auto outs = plan.swap_outs();
    for (std::size_t i = seen_outs_; i < outs.size(); ++i) {
      const block_swap& w = outs[i];
      const auto h = static_cast<std::size_t>(w.host);
      ref_host_block& r = ref_[h];
      ASSERT_TRUE(r.state == host_state::empty || r.state == host_state::ready)
          << "a store into a host block being read or written";
      if (r.state == host_state::ready) held_.erase(r.content);  // evicted for this store
      const std::uint64_t c = content_[static_cast<std::size_t>(w.device)];
      ASSERT_FALSE(held_.count(c)) << "a content stored twice";
      ASSERT_TRUE(cache_.sharing().is_cached(w.device) || !async_through()) << "a store of a block not cached";
      r = {host_state::writing, c};
      held_[c] = w.host;
      in_flight f{{w, true}, false, steps_ + delay(), {}};
      if (!async_through()) {
        // Write-back: the device block is read when the plan runs, before the step's writes; nothing has written
        // the emulated pool since the operation that planned it, so its bytes now are those.
        f.bytes.assign(mem_.begin() + w.device * bs, mem_.begin() + (w.device + 1) * bs);
      } else {
        ++pinned_[static_cast<std::size_t>(w.device)];
      }
      planned_.push_back(std::move(f));
    }
    seen_outs_ = outs.size();
    const auto ins = plan.swap_ins();
    for (std::size_t i = seen_ins_; i < ins.size(); ++i) {
      const block_swap& w = ins[i];
      ref_host_block& r = ref_[static_cast<std::size_t>(w.host)];
      ASSERT_EQ(r.state, host_state::ready) << "a load of a host block not ready (being written, read, or empty)";
      // Loads are planned by admissions only: its sequence is the one just admitted, which waits for it.
      const seq_id owner = next_id_ - 1;
      const ref_seq& s = seqs_.at(owner);
      const auto table = *cache_.block_table(owner);
      const auto k = static_cast<std::size_t>(std::find(table.begin(), table.end(), w.device) - table.begin());
      ASSERT_LT(k, table.size());
      ASSERT_EQ(r.content, s.values[(k + 1) * bs - 1]) << "a load of other content";
      r.state = host_state::reading;
      owner_[w.host] = owner;
      std::int64_t due = steps_ + delay();
      if (rng_() % 40 == 0) due = steps_ + timeout_ + 1 + static_cast<std::int64_t>(rng_() % 3);  // stuck
      planned_.push_back({{w, true}, true, due, {}});
    }
    seen_ins_ = ins.size();
  }
  bool async_through() const { return cache_.config().host_tier.write == tier_write::through; }
  std::int64_t delay() { return static_cast<std::int64_t>(rng_() % 4); }

  /// Runs the plan on the emulated pools: write-back stores read their blocks, copies, then the appends' values.
  void execute() {
    const step_plan& plan = cache_.plan();
    for (in_flight& f : planned_) flying_.push_back(std::move(f));  // the engine starts them
    planned_.clear();
    for (const block_copy& c : plan.copies())
      std::copy_n(mem_.begin() + c.src * bs, bs, mem_.begin() + c.dst * bs);
    std::vector<std::int64_t> slots(static_cast<std::size_t>(cache_.slot_mapping_size()));
    ASSERT_TRUE(cache_.export_slot_mapping(slots));
    std::size_t i = 0;
    for (const token_range& r : plan.appends()) {
      const auto it = seqs_.find(r.seq);
      const auto gone = freed_.find(r.seq);
      for (std::int32_t p = r.first_pos; p < r.first_pos + r.count; ++p, ++i) {
        if (slots[i] < 0) continue;  // freed in the step
        const std::vector<std::uint64_t>& v = it != seqs_.end() ? it->second.values : gone->second;
        mem_[static_cast<std::size_t>(slots[i])] = v[static_cast<std::size_t>(p)];
      }
    }
    freed_.clear();
  }

  /// Reports the due transfers (all of them with `all`), in random order and batches, some failed.
  void deliver(bool all) {
    std::shuffle(flying_.begin(), flying_.end(), rng_);
    std::vector<tier_done> batch;
    std::vector<in_flight> keep;
    for (in_flight& f : flying_) {
      if (!all && f.due > steps_) {
        keep.push_back(std::move(f));
        continue;
      }
      f.done.ok = rng_() % 12 != 0;
      const auto h = static_cast<std::size_t>(f.done.swap.host);
      const auto d = static_cast<std::size_t>(f.done.swap.device);
      ref_host_block& r = ref_[h];
      if (!f.load) {
        if (f.done.ok) {
          if (f.bytes.empty()) {  // write-through: read now; the pinned source still holds the content
            std::copy_n(mem_.begin() + static_cast<std::ptrdiff_t>(d * bs), bs, host_mem_.begin() + static_cast<std::ptrdiff_t>(h * bs));
          } else {
            std::copy(f.bytes.begin(), f.bytes.end(), host_mem_.begin() + static_cast<std::ptrdiff_t>(h * bs));
          }
          r.state = host_state::ready;
        } else {
          std::fill_n(host_mem_.begin() + static_cast<std::ptrdiff_t>(h * bs), bs, 0xBAD);
          held_.erase(r.content);
          r = {};
        }
        if (f.bytes.empty()) --pinned_[d];
      } else {
        // Its copy is used only if its sequence still waits for it (not freed, failed or timed out).
        const auto o = owner_.find(f.done.swap.host);
        bool used = o != owner_.end();
        if (used) {
          const ref_seq& w = seqs_.at(o->second);
          used = !w.failed && steps_ - w.admitted_step < timeout_;
        }
        if (f.done.ok) {
          std::copy_n(host_mem_.begin() + static_cast<std::ptrdiff_t>(h * bs), bs, mem_.begin() + static_cast<std::ptrdiff_t>(d * bs));
          r.state = host_state::ready;
          if (!inclusive_ && used) {  // moved up: it leaves the tier (a copy nobody uses stays)
            held_.erase(r.content);
            r = {};
          }
        } else {
          std::fill_n(mem_.begin() + static_cast<std::ptrdiff_t>(d * bs), bs, 0xBAD);
          held_.erase(r.content);  // a copy that failed to load is forgotten
          r = {};
        }
        resolve_load(f);
      }
      batch.push_back(f.done);
      if (batch.size() >= 1 + rng_() % 4) {
        ASSERT_TRUE(cache_.complete_tier_transfers(batch));
        batch.clear();
      }
    }
    if (!batch.empty()) {
      ASSERT_TRUE(cache_.complete_tier_transfers(batch));
    }
    flying_ = std::move(keep);
    check_waiting();
  }

  /// A load is reported: its sequence's outstanding count, or an orphaned block returned.
  void resolve_load(const in_flight& f) {
    const auto d = static_cast<std::size_t>(f.done.swap.device);
    const auto o = owner_.find(f.done.swap.host);
    if (o == owner_.end()) {  // its sequence was freed
      --orphan_[d];
      ++late_;
      return;
    }
    ref_seq& s = seqs_.at(o->second);
    owner_.erase(o);
    --s.outstanding;
    if (!f.done.ok) s.failed = true;
  }

  /// Waiting sequences: all in and none failed -> runs (its hit's bytes read back); failed or timed out -> failed.
  void check_waiting() {
    for (auto& [id, s] : seqs_) {
      if (!s.waiting) continue;
      const tier_load_state st = *cache_.load_state(id);
      if (s.failed || steps_ - s.admitted_step >= timeout_) {
        ASSERT_EQ(st, tier_load_state::failed) << "sequence " << id;
        continue;
      }
      if (s.outstanding == 0) {
        ASSERT_EQ(st, tier_load_state::none) << "sequence " << id << " has all its loads";
        s.waiting = false;
        ready_.push_back(id);
      } else {
        ASSERT_EQ(st, tier_load_state::loading) << "sequence " << id;
      }
    }
  }

  /// Sequences whose loads are all in compute the rest of their prompt (in the current step's plan).
  void run_ready() {
    for (const seq_id id : ready_) {
      const auto it = seqs_.find(id);
      if (it == seqs_.end()) continue;
      ref_seq& s = it->second;
      {
        const std::vector<token_id> rest(s.tokens.begin() + (s.loads_first + s.loads) * bs, s.tokens.end());
        const cache_stats before = cache_.stats();
        const status ap = cache_.append_tokens(id, rest);
        if (!ap) {
          ASSERT_EQ(ap.code(), errc::out_of_blocks);
          ASSERT_EQ(cache_.stats(), before);
          s.tokens.resize(static_cast<std::size_t>((s.loads_first + s.loads) * bs));  // the rest is dropped
          s.values.resize(s.tokens.size());
        } else {
          take_plan();
          learn(*cache_.block_table(id), s, s.loads_first + s.loads);
        }
      }
    }
    ready_.clear();
  }

  void step() {
    execute();
    if (::testing::Test::HasFatalFailure()) return;
    deliver(false);
    if (::testing::Test::HasFatalFailure()) return;
    cache_.begin_step();
    ++steps_;
    seen_outs_ = seen_ins_ = 0;
    take_plan();  // write-through stores planned at the boundary
    check_waiting();
    verify_content();
    run_ready();  // in the new step: the plan that ran is gone
  }

  // ------------------------------------------------------------------ checks

  void verify_content() {
    // Every sequence that runs reads back its values through its table.
    for (const auto& [id, s] : seqs_) {
      if (s.waiting) continue;
      const auto table = *cache_.block_table(id);
      const auto held = static_cast<std::size_t>(*cache_.num_tokens(id));
      const bool resumes = std::find(ready_.begin(), ready_.end(), id) != ready_.end();  // its rest comes next
      ASSERT_TRUE(held == s.values.size() || (resumes && held < s.values.size())) << "sequence " << id;
      for (std::size_t p = 0; p < held; ++p) {
        const std::size_t slot = static_cast<std::size_t>(table[p / bs]) * bs + p % bs;
        if (mem_[slot] != s.values[p])
          FAIL() << "sequence " << id << " lost its token at position " << p << " (block " << table[p / bs]
                 << ", cached " << cache_.sharing().is_cached(table[p / bs]) << ", loads from block " << s.loads_first
                 << " x" << s.loads << ", admitted at step " << s.admitted_step << ", now " << steps_
                 << ", mem==0xBAD " << (mem_[slot] == 0xBAD) << ", len " << s.values.size() << ")";
      }
    }
    // Every cached device block holds the content the reference says; every ready host block too.
    for (block_id b = 1; b < cache_.pool().num_blocks(); ++b)
      if (cache_.sharing().is_cached(b) && mem_[static_cast<std::size_t>(b) * bs + bs - 1] != content_[static_cast<std::size_t>(b)])
        FAIL() << "cached device block " << b << " does not hold its content";
    for (std::size_t h = 0; h < ref_.size(); ++h) {
      const ref_host_block& r = ref_[h];
      if (r.state != host_state::ready && r.state != host_state::reading) continue;
      if (host_mem_[h * bs + bs - 1] != r.content) FAIL() << "host tier block " << h << " does not hold its content";
      const auto k = key_of_.find(r.content);
      if (k == key_of_.end() || cache_.tier().host_block(k->second) != static_cast<block_id>(h))
        FAIL() << "the tier does not hold host block " << h << " as the reference does";
    }
  }

  /// Every block's references: the tables, the loads left in flight by freed sequences, the pinned stores' sources.
  void check_blocks() {
    const auto nb = static_cast<std::size_t>(cache_.pool().num_blocks());
    std::vector<std::int32_t> refs(nb, 0);
    for (const auto& [id, s] : seqs_)
      for (const block_id b : *cache_.block_table(id)) ++refs[static_cast<std::size_t>(b)];
    for (std::size_t b = 1; b < nb; ++b) {
      const std::int32_t want = refs[b] + orphan_[b] + pinned_[b];
      if (cache_.refcount(static_cast<block_id>(b)) != want)
        FAIL() << "block " << b << ": refcount " << cache_.refcount(static_cast<block_id>(b)) << ", expected " << want
               << " (tables " << refs[b] << ", loads in flight " << orphan_[b] << ", pinned " << pinned_[b] << ")";
    }
    const cache_stats st = cache_.stats();
    ASSERT_EQ(st.free + st.used + st.pending_free + st.evictable, st.total);
    ASSERT_EQ(st.tier_in_flight, static_cast<std::int32_t>(flying_.size() + planned_.size()));
  }

  void bad_call() {
    const cache_stats before = cache_.stats();
    const host_tier_stats tier_before = cache_.tier().stats();
    std::vector<tier_done> bad;
    if (!flying_.empty() && rng_() % 2 == 0) {
      const in_flight& f = flying_[rng_() % flying_.size()];
      bad = {f.done, f.done};  // twice
    } else {
      const block_id h = static_cast<block_id>(rng_() % ref_.size());
      bool busy = false;
      for (const in_flight& f : flying_) busy |= f.done.swap.host == h;
      for (const in_flight& f : planned_) busy |= f.done.swap.host == h;
      if (busy) return;
      bad = {{{static_cast<block_id>(rng_() % 8), h, 0}, true}};
    }
    ASSERT_EQ(cache_.complete_tier_transfers(bad).code(), errc::invalid_argument);
    ASSERT_EQ(cache_.stats(), before);
    ASSERT_EQ(cache_.tier().stats(), tier_before);
  }

  void lookup() {
    std::uint64_t extra = 0;
    const auto t = random_prompt(extra);
    const auto m = cache_.match_prefix(t, {.extra_key = extra});
    ASSERT_TRUE(m);
    const prefix_match want = expected_hit(values_of(t, extra));
    ASSERT_EQ(m->blocks, want.blocks);
    ASSERT_EQ(m->host_blocks, want.host_blocks);
  }

  Cache cache_;
  std::mt19937 rng_;
  std::vector<std::uint64_t> mem_, host_mem_;
  std::vector<std::uint64_t> content_;  ///< per device block: the content the reference says it holds
  std::vector<std::int32_t> orphan_;    ///< per device block: loads in flight whose sequence was freed
  std::vector<std::int32_t> pinned_;    ///< per device block: write-through stores in flight reading it
  std::vector<ref_host_block> ref_;     ///< per host tier block
  std::unordered_map<std::uint64_t, block_id> held_;  ///< content -> host tier block (ready, read or written)
  std::unordered_map<std::uint64_t, std::uint64_t> key_of_;  ///< content -> the cache's chained hash of it
  std::unordered_map<block_id, seq_id> owner_;          ///< host block of a load in flight -> its waiting sequence
  std::unordered_map<seq_id, ref_seq> seqs_;
  std::unordered_map<seq_id, std::vector<std::uint64_t>> freed_;  ///< freed in this step: their values
  std::vector<seq_id> ready_;  ///< their loads are all in: they compute the rest of their prompt next
  std::vector<in_flight> flying_;   ///< started by the engine (the plan that holds them ran)
  std::vector<in_flight> planned_;  ///< planned in this step, not started yet
  std::size_t seen_outs_ = 0, seen_ins_ = 0;
  std::int64_t steps_ = 0, admissions_ = 0, waits_ = 0, late_ = 0;
  std::int32_t timeout_ = 0;
  bool inclusive_ = true;
  seq_id next_id_ = 1;
};

TEST(TierAsyncModel, LruWriteThrough) {
  async_model<lru_cache>(24, {.num_blocks = 20, .async = true, .load_timeout_steps = 6}, 51).run(model_ops / 4);
}
TEST(TierAsyncModel, ArcWriteBack) {
  async_model<arc_cache>(24, {.num_blocks = 16, .write = tier_write::back, .async = true, .load_timeout_steps = 5},
                         52)
      .run(model_ops / 4);
}
TEST(TierAsyncModel, LruWriteBackExclusive) {
  async_model<lru_cache>(20, {.num_blocks = 12, .write = tier_write::back, .inclusive = false, .async = true,
                              .load_timeout_steps = 4},
                         53)
      .run(model_ops / 4);
}
TEST(TierAsyncModel, ArcWriteThroughSmallTier) {
  async_model<arc_cache>(18, {.num_blocks = 10, .async = true, .load_timeout_steps = 3}, 54).run(model_ops / 4);
}

}  // namespace
}  // namespace kvpager
