// SPDX-License-Identifier: Apache-2.0
// host_tier (tier/host_tier.hpp) with lru_tier and arc_tier against a reference model written here from vLLM
// 0.22.0's offloading manager and policies (plain lists and maps, every decision spelled out as vLLM's Python makes
// it: scans from the least recent end, victims chosen before any is taken, ghosts trimmed after), over long random
// runs: every answer (lookups, host blocks, evictions in order, refusals) and the whole state (each key's block and
// state, free blocks, ARC's target and list sizes, the counts) equal after every call. Plus: bad input changes
// nothing, events, selective storing.

#include <kvpager/tier/arc_tier.hpp>
#include <kvpager/tier/host_tier.hpp>
#include <kvpager/tier/lru_tier.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

using namespace kvpager;

namespace {

/// vLLM's CPUOffloadingManager with its LRU or ARC policy, as plainly as possible.
struct reference_tier {
  bool arc = false;
  std::int32_t capacity = 0;
  std::int32_t threshold = 1;
  std::int32_t tracker = 64000;
  std::map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> blocks;  // key -> (state, block)
  std::list<std::uint64_t> lru;                                            // LRU order, or ARC's T1
  std::list<std::uint64_t> t2, b1, b2;
  double p = 0;
  std::int32_t allocated = 0;
  std::vector<std::int32_t> free_list;
  std::list<std::pair<std::uint64_t, std::int64_t>> counts;  // tracker, least recent first
  std::int32_t min_priority = INT32_MIN;
  bool inclusive = true;

  static void erase(std::list<std::uint64_t>& l, std::uint64_t k) { l.erase(std::find(l.begin(), l.end(), k)); }
  static bool in(const std::list<std::uint64_t>& l, std::uint64_t k) {
    return std::find(l.begin(), l.end(), k) != l.end();
  }
  std::int64_t count_of(std::uint64_t k) const {
    for (const auto& [key, n] : counts)
      if (key == k) return n;
    return 0;
  }

  tier_hit lookup(std::uint64_t k) {
    if (threshold >= 2) {
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& e) { return e.first == k; });
      if (it != counts.end()) {
        auto e = *it;
        counts.erase(it);
        ++e.second;
        counts.push_back(e);
      } else {
        if (static_cast<std::int32_t>(counts.size()) >= tracker) counts.pop_front();
        counts.emplace_back(k, 1);
      }
    }
    auto it = blocks.find(k);
    if (it == blocks.end()) return tier_hit::miss;
    return it->second.first < 0 ? tier_hit::pending : tier_hit::hit;
  }
  void touch(const std::vector<std::uint64_t>& keys) {
    for (auto k = keys.rbegin(); k != keys.rend(); ++k) {
      if (!arc) {
        if (blocks.count(*k)) {
          erase(lru, *k);
          lru.push_back(*k);
        }
        continue;
      }
      if (in(lru, *k)) {
        erase(lru, *k);
        if (blocks[*k].first < 0) {
          lru.push_back(*k);
        } else {
          t2.push_back(*k);
        }
      } else if (in(t2, *k)) {
        erase(t2, *k);
        t2.push_back(*k);
      } else if (in(b1, *k)) {
        p = std::min(p + std::max(1.0, double(b2.size()) / double(b1.size())), double(capacity));
        erase(b1, *k);
        b1.push_back(*k);
      } else if (in(b2, *k)) {
        p = std::max(p - std::max(1.0, double(b1.size()) / double(b2.size())), 0.0);
        erase(b2, *k);
        b2.push_back(*k);
      }
    }
  }
  bool evictable(std::uint64_t k, const std::set<std::uint64_t>& prot, const std::set<std::uint64_t>& sel) {
    return blocks[k].first == 0 && !prot.count(k) && !sel.count(k);
  }
  std::optional<std::vector<std::uint64_t>> evict(std::int32_t n, const std::set<std::uint64_t>& prot) {
    std::vector<std::uint64_t> out;
    std::vector<bool> from1;
    std::set<std::uint64_t> sel;
    std::int64_t virt = static_cast<std::int64_t>(lru.size());
    for (std::int32_t i = 0; i < n; ++i) {
      std::optional<std::uint64_t> c;
      bool f1 = false;
      if (!arc || virt >= static_cast<std::int64_t>(p)) {
        for (auto k : lru)
          if (evictable(k, prot, sel)) {
            c = k;
            f1 = true;
            --virt;
            break;
          }
      }
      if (!c && arc) {
        for (auto k : t2)
          if (evictable(k, prot, sel)) {
            c = k;
            break;
          }
      }
      if (!c) return std::nullopt;
      out.push_back(*c);
      from1.push_back(f1);
      sel.insert(*c);
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (from1[i]) {
        erase(lru, out[i]);
        if (arc) b1.push_back(out[i]);
      } else {
        erase(t2, out[i]);
        b2.push_back(out[i]);
      }
    }
    while (static_cast<std::int32_t>(b1.size()) > capacity) b1.pop_front();
    while (static_cast<std::int32_t>(b2.size()) > capacity) b2.pop_front();
    return out;
  }
  std::int32_t free_count() const { return static_cast<std::int32_t>(free_list.size()) + capacity - allocated; }
  /// Returns nullopt when refused; else (keys, blocks, evicted).
  std::optional<tier_store_plan> prepare_store(std::vector<std::uint64_t> keys, std::int32_t priority = 0) {
    if (priority < min_priority) return tier_store_plan{};
    if (threshold >= 2) {
      std::vector<std::uint64_t> kept;
      for (auto k : keys)
        if (count_of(k) >= threshold) kept.push_back(k);
      keys = kept;
    }
    std::vector<std::uint64_t> to_store;
    for (auto k : keys)
      if (!blocks.count(k) && std::find(to_store.begin(), to_store.end(), k) == to_store.end()) to_store.push_back(k);
    tier_store_plan plan;
    if (to_store.empty()) return plan;
    const std::int32_t need = static_cast<std::int32_t>(to_store.size()) - free_count();
    if (need > 0) {
      const std::set<std::uint64_t> prot(keys.begin(), keys.end());
      auto ev = evict(need, prot);
      if (!ev) return std::nullopt;
      for (auto k : *ev) {
        free_list.push_back(blocks[k].second);
        blocks.erase(k);
        plan.evicted.push_back(k);
      }
    }
    for (auto k : to_store) {
      std::int32_t b;
      if (allocated < capacity) {
        b = allocated++;
      } else {
        b = free_list.back();
        free_list.pop_back();
      }
      blocks[k] = {-1, b};
      if (arc) {
        erase_if_in(b1, k);
        erase_if_in(b2, k);
      }
      lru.push_back(k);
      plan.keys.push_back(k);
      plan.host_blocks.push_back(b);
    }
    return plan;
  }
  static void erase_if_in(std::list<std::uint64_t>& l, std::uint64_t k) {
    if (in(l, k)) erase(l, k);
  }
  /// Forgets a held key with no history (vLLM's policy remove: no ghost) and frees its block.
  void drop(std::map<std::uint64_t, std::pair<std::int32_t, std::int32_t>>::iterator it) {
    free_list.push_back(it->second.second);
    if (in(lru, it->first)) {
      erase(lru, it->first);
    } else {
      erase_if_in(t2, it->first);
    }
    blocks.erase(it);
  }
  void complete_store(const std::vector<std::uint64_t>& keys, bool ok) {
    for (auto k : keys) {
      auto it = blocks.find(k);
      if (it == blocks.end() || it->second.first >= 0) continue;
      if (ok) {
        it->second.first = 0;
      } else {
        drop(it);
      }
    }
  }
  void complete_load(const std::vector<std::uint64_t>& keys, bool loaded) {
    for (auto k : keys) --blocks[k].first;
    if (inclusive || !loaded) return;
    for (auto k : keys) {
      auto it = blocks.find(k);
      if (it == blocks.end() || it->second.first != 0) continue;
      drop(it);
    }
  }
  void reset() {
    blocks.clear();
    lru.clear();
    t2.clear();
    b1.clear();
    b2.clear();
    p = 0;
    allocated = 0;
    free_list.clear();
  }
};

template <class P>
void expect_same_state(const host_tier<P>& t, const reference_tier& r, std::uint64_t num_keys, int op) {
  ASSERT_EQ(t.free_blocks(), r.free_count()) << "op " << op;
  for (std::uint64_t k = 1; k <= num_keys; ++k) {
    const auto it = r.blocks.find(k);
    ASSERT_EQ(t.holds(k), it != r.blocks.end()) << "op " << op << " key " << k;
    if (it == r.blocks.end()) continue;
    ASSERT_EQ(t.host_block(k), it->second.second) << "op " << op << " key " << k;
    ASSERT_EQ(t.state(t.host_block(k)), it->second.first) << "op " << op << " key " << k;
  }
  std::int32_t writing = 0, reading = 0;
  for (const auto& [k, v] : r.blocks) {
    writing += v.first < 0;
    reading += v.first > 0;
  }
  const host_tier_stats s = t.stats();
  EXPECT_EQ(s.held, static_cast<std::int32_t>(r.blocks.size())) << "op " << op;
  EXPECT_EQ(s.held + t.free_blocks(), s.num_blocks) << "op " << op;
  EXPECT_EQ(s.writing, writing) << "op " << op;
  EXPECT_EQ(s.reading, reading) << "op " << op;
  if constexpr (std::is_same_v<P, arc_tier>) {
    ASSERT_EQ(t.policy().target_t1_size(), r.p) << "op " << op;
    ASSERT_EQ(t.policy().t1_size(), static_cast<std::int32_t>(r.lru.size())) << "op " << op;
    ASSERT_EQ(t.policy().t2_size(), static_cast<std::int32_t>(r.t2.size())) << "op " << op;
    ASSERT_EQ(t.policy().b1_size(), static_cast<std::int32_t>(r.b1.size())) << "op " << op;
    ASSERT_EQ(t.policy().b2_size(), static_cast<std::int32_t>(r.b2.size())) << "op " << op;
  }
}

template <class P>
void run_against_reference(std::int32_t capacity, std::int32_t threshold, std::uint32_t seed, int ops,
                           std::int32_t min_priority = INT32_MIN, bool inclusive = true) {
  host_tier_config cfg{capacity, threshold, 12, min_priority, inclusive};
  auto made = host_tier<P>::create(cfg);
  ASSERT_TRUE(made) << made.error().message();
  host_tier<P> t = std::move(*made);
  reference_tier r;
  r.arc = std::is_same_v<P, arc_tier>;
  r.capacity = capacity;
  r.threshold = threshold;
  r.tracker = 12;
  r.min_priority = min_priority;
  r.inclusive = inclusive;
  std::mt19937_64 rng(seed);
  const std::uint64_t num_keys = static_cast<std::uint64_t>(capacity) * 3;
  auto key = [&] { return 1 + rng() % num_keys; };
  auto keys = [&](std::size_t max) {
    std::vector<std::uint64_t> v(1 + rng() % max);
    const std::uint64_t start = key();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = (rng() % 4 == 0) ? key() : 1 + (start + i) % num_keys;
    return v;
  };
  std::vector<std::uint64_t> loading;  // keys with a load in flight (one entry per load)
  std::vector<std::uint64_t> writing;
  tier_store_plan plan;
  std::int64_t stores = 0, refusals = 0, evictions = 0, loads = 0;
  for (int op = 0; op < ops; ++op) {
    const int what = static_cast<int>(rng() % 100);
    if (what < 25) {
      const auto ks = keys(6);
      tier_hit stop_t{}, stop_r = tier_hit::hit;
      const std::int32_t n = t.lookup_prefix(ks, &stop_t);
      std::int32_t m = 0;
      for (auto k : ks) {
        stop_r = r.lookup(k);
        if (stop_r != tier_hit::hit) break;
        ++m;
      }
      ASSERT_EQ(n, m) << "op " << op;
      ASSERT_EQ(stop_t, stop_r) << "op " << op;
      if (rng() % 2) {
        t.touch(ks);
        r.touch(ks);
      }
    } else if (what < 45) {
      const auto ks = keys(capacity / 2 + 1);
      const auto priority = static_cast<std::int32_t>(rng() % 3);
      const auto got = r.prepare_store(ks, priority);
      const status st = t.prepare_store(ks, plan, {}, priority);
      ASSERT_EQ(static_cast<bool>(st), got.has_value()) << "op " << op;
      if (!st) {
        ASSERT_EQ(st.code(), errc::host_pool_full);
        ++refusals;
      } else {
        ASSERT_EQ(plan.keys, got->keys) << "op " << op;
        ASSERT_EQ(plan.host_blocks, got->host_blocks) << "op " << op;
        ASSERT_EQ(plan.evicted, got->evicted) << "op " << op;
        evictions += static_cast<std::int64_t>(plan.evicted.size());
        writing.insert(writing.end(), plan.keys.begin(), plan.keys.end());
      }
    } else if (what < 60 && !writing.empty()) {
      // Complete some stores (ok or failed), in any order.
      std::shuffle(writing.begin(), writing.end(), rng);
      const std::size_t n = 1 + rng() % writing.size();
      const std::vector<std::uint64_t> done(writing.begin(), writing.begin() + static_cast<std::ptrdiff_t>(n));
      writing.erase(writing.begin(), writing.begin() + static_cast<std::ptrdiff_t>(n));
      const bool ok = rng() % 5 != 0;
      t.complete_store(done, ok);
      r.complete_store(done, ok);
      stores += ok ? static_cast<std::int64_t>(n) : 0;
    } else if (what < 75) {
      // Load a run of ready keys (or try a bad one: refused, nothing changes).
      const auto ks = keys(4);
      bool good = true;
      for (auto k : ks) good = good && r.blocks.count(k) && r.blocks[k].first >= 0;
      std::vector<block_id> hb(ks.size());
      const host_tier_stats before = t.stats();
      const status st = t.prepare_load(ks, hb);
      ASSERT_EQ(static_cast<bool>(st), good) << "op " << op;
      if (!good) {
        ASSERT_EQ(st.code(), errc::invalid_block);
        ASSERT_EQ(t.stats(), before);
        continue;
      }
      for (std::size_t i = 0; i < ks.size(); ++i) {
        ASSERT_EQ(hb[i], r.blocks[ks[i]].second);
        ++r.blocks[ks[i]].first;
        loading.push_back(ks[i]);
      }
      loads += static_cast<std::int64_t>(ks.size());
    } else if (what < 88 && !loading.empty()) {
      std::shuffle(loading.begin(), loading.end(), rng);
      const std::size_t n = 1 + rng() % std::min<std::size_t>(loading.size(), 4);
      const std::vector<std::uint64_t> done(loading.begin(), loading.begin() + static_cast<std::ptrdiff_t>(n));
      loading.erase(loading.begin(), loading.begin() + static_cast<std::ptrdiff_t>(n));
      const bool loaded = rng() % 6 != 0;
      ASSERT_TRUE(t.complete_load(done, loaded));
      r.complete_load(done, loaded);
    } else if (what < 96) {
      // A completion of a load never prepared: refused, nothing changes.
      const std::uint64_t k = key();
      const std::int64_t in_flight = std::count(loading.begin(), loading.end(), k);
      const std::vector<std::uint64_t> done(static_cast<std::size_t>(in_flight + 1), k);
      const host_tier_stats before = t.stats();
      const std::int32_t st_before = t.holds(k) ? t.state(t.host_block(k)) : 0;
      const status st = t.complete_load(done);
      ASSERT_EQ(st.code(), errc::invalid_block) << "op " << op;
      ASSERT_EQ(t.stats(), before);
      if (t.holds(k)) {
        ASSERT_EQ(t.state(t.host_block(k)), st_before);
      }
    } else if (what < 98 && loading.empty() && writing.empty()) {
      t.reset();
      r.reset();
    } else {
      const auto ks = keys(8);
      t.touch(ks);
      r.touch(ks);
    }
    expect_same_state(t, r, num_keys, op);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(stores, 0);
  EXPECT_GT(evictions, 0);
  EXPECT_GT(loads, 0);
  if (threshold == 1) {  // selective storing keeps the tier too empty to refuse often
    EXPECT_GT(refusals, 0);
  }
}

#if KVPAGER_TEST_REDUCED
constexpr int ops = 20000;
#else
constexpr int ops = 200000;
#endif

TEST(HostTier, LruDecidesAsVllmsOffloadingLru) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) run_against_reference<lru_tier>(8, 1, seed, ops);
  run_against_reference<lru_tier>(1, 1, 9, ops / 4);
  run_against_reference<lru_tier>(32, 1, 10, ops / 4);
}

TEST(HostTier, ArcDecidesAsVllmsOffloadingArc) {
  for (std::uint32_t seed = 1; seed <= 3; ++seed) run_against_reference<arc_tier>(8, 1, seed, ops);
  run_against_reference<arc_tier>(1, 1, 9, ops / 4);
  run_against_reference<arc_tier>(32, 1, 10, ops / 4);
}

TEST(HostTier, RetentionPriorityAndExclusiveTiersDecideAsTheReference) {
  run_against_reference<lru_tier>(8, 1, 31, ops / 2, 1);          // priority 0 requests are not stored
  run_against_reference<arc_tier>(8, 1, 32, ops / 2, 1);
  run_against_reference<lru_tier>(8, 1, 33, ops / 2, INT32_MIN, false);  // exclusive
  run_against_reference<arc_tier>(8, 1, 34, ops / 2, INT32_MIN, false);
  auto t = std::move(*host_tier<lru_tier>::create({4, 1, 64000, 2, false}));
  tier_store_plan plan;
  const std::vector<std::uint64_t> k{1, 2};
  ASSERT_TRUE(t.prepare_store(k, plan, {}, 1));
  EXPECT_TRUE(plan.keys.empty());
  EXPECT_EQ(t.stats().below_priority, 2);
  ASSERT_TRUE(t.prepare_store(k, plan, {}, 2));
  EXPECT_EQ(plan.keys, k);
  t.complete_store(k, true);
  std::vector<block_id> hb(2);
  ASSERT_TRUE(t.prepare_load(k, hb));
  ASSERT_TRUE(t.complete_load(std::vector<std::uint64_t>{1}, false));  // failed: stays
  ASSERT_TRUE(t.complete_load(std::vector<std::uint64_t>{2}));         // loaded: moved up, gone
  EXPECT_TRUE(t.holds(1));
  EXPECT_FALSE(t.holds(2));
  EXPECT_EQ(t.stats().moved_up, 1);
  EXPECT_EQ(t.free_blocks(), 3);
}

TEST(HostTier, SelectiveStoringKeepsOnlyKeysLookedUpOften) {
  run_against_reference<lru_tier>(8, 2, 21, ops / 2);
  run_against_reference<arc_tier>(8, 3, 22, ops / 2);
  auto t = std::move(*host_tier<lru_tier>::create({4, 2, 100}));
  tier_store_plan plan;
  const std::vector<std::uint64_t> k{7};
  ASSERT_TRUE(t.prepare_store(k, plan));
  EXPECT_TRUE(plan.keys.empty());  // never looked up
  EXPECT_EQ(t.lookup(7), tier_hit::miss);
  ASSERT_TRUE(t.prepare_store(k, plan));
  EXPECT_TRUE(plan.keys.empty());  // looked up once
  EXPECT_EQ(t.lookup(7), tier_hit::miss);
  ASSERT_TRUE(t.prepare_store(k, plan));
  EXPECT_EQ(plan.keys, k);  // twice
  EXPECT_EQ(t.lookup(7), tier_hit::pending);
  t.complete_store(k, true);
  EXPECT_EQ(t.lookup(7), tier_hit::hit);
}

TEST(HostTier, BadInputIsRefusedAndChangesNothing) {
  EXPECT_EQ(host_tier<lru_tier>::create({0}).error().code(), errc::invalid_pool_size);
  EXPECT_EQ(host_tier<lru_tier>::create({-3}).error().code(), errc::invalid_pool_size);
  EXPECT_EQ(host_tier<lru_tier>::create({4, 0}).error().code(), errc::invalid_argument);
  EXPECT_EQ(host_tier<arc_tier>::create({4, 2, 0}).error().code(), errc::invalid_argument);
  auto t = std::move(*host_tier<arc_tier>::create({4}));
  tier_store_plan plan;
  const std::vector<std::uint64_t> ks{1, 2, 3};
  ASSERT_TRUE(t.prepare_store(ks, plan));
  t.complete_store(std::vector<std::uint64_t>{1, 2}, true);
  const host_tier_stats before = t.stats();
  std::vector<block_id> hb(2, -7);
  // A key not held, a key still being written, a length mismatch, a load never prepared.
  EXPECT_EQ(t.prepare_load(std::vector<std::uint64_t>{1, 9}, hb).code(), errc::invalid_block);
  EXPECT_EQ(t.prepare_load(std::vector<std::uint64_t>{1, 3}, hb).code(), errc::invalid_block);
  EXPECT_EQ(t.prepare_load(std::vector<std::uint64_t>{1}, hb).code(), errc::invalid_argument);
  EXPECT_EQ(t.complete_load(std::vector<std::uint64_t>{1}).code(), errc::invalid_block);
  EXPECT_EQ(t.stats(), before);
  EXPECT_EQ(t.state(t.host_block(1)), 0);
  EXPECT_EQ(t.state(t.host_block(3)), -1);
  // More blocks than the tier has, and a tier whose ready blocks are all being read: host_pool_full, no change.
  EXPECT_EQ(t.prepare_store(std::vector<std::uint64_t>{10, 11, 12, 13, 14}, plan).code(), errc::host_pool_full);
  ASSERT_TRUE(t.prepare_load(std::vector<std::uint64_t>{1, 2}, hb));
  EXPECT_EQ(t.prepare_store(std::vector<std::uint64_t>{10, 11}, plan).code(), errc::host_pool_full);
  EXPECT_FALSE(t.holds(10));
  EXPECT_TRUE(t.holds(1) && t.holds(2) && t.holds(3));
  EXPECT_EQ(t.free_blocks(), 1);
  // A store's own held keys are never its victims.
  ASSERT_TRUE(t.complete_load(std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(t.prepare_store(std::vector<std::uint64_t>{1, 2, 10, 11, 12}, plan).code(), errc::host_pool_full);
  ASSERT_TRUE(t.prepare_store(std::vector<std::uint64_t>{2, 10, 11}, plan));
  EXPECT_EQ(plan.evicted, std::vector<std::uint64_t>{1});
}

TEST(HostTier, EventsReportStoresEvictionsAndResetsOnTheHostMediumByTheNamesGiven) {
  auto t = std::move(*host_tier<lru_tier>::create({2}));
  kv_event_buffer buf;
  t.set_kv_event_buffer(&buf);
  tier_store_plan plan;
  // Keys mixed with a group (as hybrid_kv_cache::cached_key), named by hash and group as the device events name them.
  const std::vector<std::uint64_t> keys{105, 106};
  const std::vector<kv_block_name> names{{5, 1}, {6, 1}};
  ASSERT_TRUE(t.prepare_store(keys, plan, names));
  EXPECT_TRUE(buf.empty());  // nothing is readable before the copy completes
  t.complete_store(plan.keys, true);
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_EQ(buf.events[0].type, kv_event_type::block_stored);
  EXPECT_EQ(buf.events[0].medium, kv_medium::host);
  EXPECT_EQ(buf.events[0].group, 1);
  EXPECT_EQ(buf.events[0].block_size, 0);
  EXPECT_FALSE(buf.events[0].has_parent);
  EXPECT_EQ(std::vector<std::uint64_t>(buf.hashes_of(buf.events[0]).begin(), buf.hashes_of(buf.events[0]).end()),
            (std::vector<std::uint64_t>{5, 6}));
  buf.clear();
  ASSERT_TRUE(t.prepare_store(std::vector<std::uint64_t>{7}, plan));  // no names: the key, group 0
  ASSERT_EQ(buf.size(), 1u);
  EXPECT_EQ(buf.events[0].type, kv_event_type::block_removed);
  EXPECT_EQ(buf.events[0].group, 1);
  EXPECT_EQ(buf.hashes_of(buf.events[0])[0], 5u);
  buf.clear();
  t.complete_store(plan.keys, false);  // a failed store was never announced: nothing to remove
  EXPECT_TRUE(buf.empty());
  ASSERT_TRUE(t.prepare_store(std::vector<std::uint64_t>{8}, plan));
  t.complete_store(plan.keys, true);
  buf.clear();
  // A reset removes each announced block on the host medium only (all_blocks_cleared would empty the device's too).
  t.reset();
  ASSERT_EQ(buf.size(), 2u);
  EXPECT_EQ(buf.events[0].type, kv_event_type::block_removed);
  EXPECT_EQ(buf.hashes_of(buf.events[0])[0], 8u);  // host block 0 (5's, then 7's, now 8's), then block 1
  EXPECT_EQ(buf.events[0].group, 0);
  EXPECT_EQ(buf.hashes_of(buf.events[1])[0], 6u);
  EXPECT_EQ(buf.events[1].group, 1);
  EXPECT_EQ(t.prepare_store(keys, plan, std::vector<kv_block_name>{{5, 1}}).code(), errc::invalid_argument);
  EXPECT_EQ(host_tier<lru_tier>::create({host_tier<lru_tier>::max_blocks + 1}).error().code(), errc::invalid_pool_size);
}

/// A policy of one's own: first in, first out (touches change nothing), over plain standard containers.
struct fifo_tier {
  std::map<std::uint64_t, std::int32_t> index;
  std::list<std::int32_t> order;
  std::vector<std::uint64_t> keys;
  void reset(std::int32_t capacity) { keys.assign(static_cast<std::size_t>(capacity), 0); }
  [[nodiscard]] std::int32_t find(std::uint64_t k) const noexcept {
    const auto it = index.find(k);
    return it == index.end() ? -1 : it->second;
  }
  [[nodiscard]] std::uint64_t key_of(std::int32_t s) const noexcept { return keys[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::int32_t size() const noexcept { return static_cast<std::int32_t>(index.size()); }
  void insert(std::uint64_t k, std::int32_t s) noexcept {
    index[k] = s;
    keys[static_cast<std::size_t>(s)] = k;
    order.push_back(s);
  }
  void remove(std::uint64_t k) noexcept {
    order.remove(index[k]);
    index.erase(k);
  }
  void touch(std::uint64_t, bool) noexcept {}
  bool evict(std::int32_t n, const tier_evictable& ok, std::vector<std::int32_t>& out) noexcept {
    out.clear();
    for (const std::int32_t s : order)
      if (static_cast<std::int32_t>(out.size()) < n && ok(s)) out.push_back(s);
    if (static_cast<std::int32_t>(out.size()) < n) {
      out.clear();
      return false;
    }
    for (const std::int32_t s : out) remove(keys[static_cast<std::size_t>(s)]);
    return true;
  }
  void clear() noexcept {
    index.clear();
    order.clear();
  }
};
static_assert(tier_policy<fifo_tier>);
static_assert(!tier_policy<int>);
struct no_touch : fifo_tier {
  void touch() = delete;
};
static_assert(!tier_policy<no_touch>, "a policy without touch(key, ready) is not a tier policy");

TEST(HostTier, APolicyOfOnesOwnComposes) {
  auto t = std::move(*host_tier<fifo_tier>::create({2}));
  tier_store_plan plan;
  ASSERT_TRUE(t.prepare_store(std::vector<std::uint64_t>{1, 2}, plan));
  t.complete_store(plan.keys, true);
  t.touch(std::vector<std::uint64_t>{1});  // FIFO: no effect, 1 is still the first to go
  ASSERT_TRUE(t.prepare_store(std::vector<std::uint64_t>{3}, plan));
  EXPECT_EQ(plan.evicted, std::vector<std::uint64_t>{1});
  EXPECT_EQ(plan.host_blocks, std::vector<block_id>{0});
}

}  // namespace
