// SPDX-License-Identifier: Apache-2.0
// The key acceptance test of memory pressure: nothing lost. A randomized serving run drives the scheduler and the
// CPU executor on real KV bytes: admissions with shared prefixes (prefix hits), decode growth, forks with
// copy-on-write, preemption by swap (to a small host pool) and by recompute, swap-ins, and allocation failures
// injected at random points by ballast sequences that take blocks away. A token's K and V bytes are a
// deterministic function of its sequence content (the token ids up to it) and its position. After every step,
// every running sequence's KV read through its block table (swapped ones through their host table) equals the
// expected bytes exactly; at the end every block is back.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstring>

#include "kvpager_testing/memcpy_executor.hpp"
#include "support/cache_snapshot.hpp"
#include "support/kv_content.hpp"
#include <random>
#include <unordered_map>
#include <vector>

using namespace kvpager;

namespace {

// In token mode the KV of a token is a function of its whole prefix (support/kv_content.hpp).
using kvtest::mix;

template <class Cache>
class serving_run {
 public:
  serving_run(std::int32_t num_blocks, std::int32_t host_blocks, scheduler_config cfg, std::uint32_t seed)
      : cache_(std::move(*Cache::create({4, num_blocks, 1, 0, host_blocks}))),
        sched_(cache_, cfg),
        exec_(kv_layout{num_blocks, 2, 4, 4, 4}, host_blocks),
        rng_(seed) {}

  void run(int steps) {
    for (int step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) {
      arrivals();
      ballast();
      const step_output& out = sched_.schedule();
      ASSERT_EQ(out.plan, &cache_.plan());
      failing_calls();
      execute(out);
      verify();
      sample(out);
    }
    // Drain: everything finishes, every block comes back.
    for (seq_id id : std::vector<seq_id>(sched_.running().begin(), sched_.running().end())) ASSERT_TRUE(sched_.finish(id));
    for (seq_id id : std::vector<seq_id>(sched_.swapped().begin(), sched_.swapped().end())) ASSERT_TRUE(sched_.finish(id));
    for (seq_id id : std::vector<seq_id>(sched_.waiting().begin(), sched_.waiting().end())) ASSERT_TRUE(sched_.finish(id));
    for (seq_id id : ballast_) ASSERT_TRUE(cache_.free_sequence(id));
    cache_.begin_step();
    const cache_stats st = cache_.stats();
    EXPECT_EQ(st.used, 0);
    EXPECT_EQ(st.free + st.evictable, st.total);
    EXPECT_EQ(st.host_free, st.host_total);
    EXPECT_EQ(st.sequences, 0);
    const scheduler_stats ss = sched_.stats();
    std::printf("serving: %lld steps, %lld admitted, %lld finished, %lld rejected, %lld recompute, %lld swap-outs, "
                "%lld swap-ins, %lld cow copies, %lld prefix hit tokens, %lld verified token reads\n",
                static_cast<long long>(ss.steps), static_cast<long long>(ss.admitted), static_cast<long long>(ss.finished),
                static_cast<long long>(ss.rejected), static_cast<long long>(ss.preempted_recompute),
                static_cast<long long>(ss.preempted_swap), static_cast<long long>(ss.swapped_in),
                static_cast<long long>(st.cow_copies), static_cast<long long>(st.prefix_hit_tokens),
                static_cast<long long>(verified_));
    EXPECT_GT(ss.preempted_swap, 0);
    EXPECT_GT(ss.swapped_in, 0);
    EXPECT_GT(ss.preempted_recompute, 0);
    EXPECT_GT(st.cow_copies, 0);
    EXPECT_GT(st.prefix_hit_tokens, 0);
    EXPECT_GT(ss.rejected, 0);
    EXPECT_GT(failed_calls_, 100);
  }

 private:
  void arrivals() {
    const auto k = rng_() % 3;
    for (std::uint32_t i = 0; i < k; ++i) {
      std::vector<token_id> p;
      const auto family = static_cast<token_id>(rng_() % 3);
      const auto shared = static_cast<std::int32_t>(rng_() % 13);
      for (std::int32_t t = 0; t < shared; ++t) p.push_back(1000 * (family + 1) + t);
      const auto own = static_cast<std::int32_t>(1 + rng_() % 10);
      for (std::int32_t t = 0; t < own; ++t) p.push_back(static_cast<token_id>(rng_() % 4));
      if (rng_() % 40 == 0) p.resize(4 * static_cast<std::size_t>(cache_.stats().total) + 1, 7);  // can never fit
      (void)sched_.add_request(next_id_++, p, static_cast<std::int32_t>(rng_() % 3));
    }
    if (rng_() % 6 == 0 && !sched_.running().empty()) {
      const seq_id parent = sched_.running()[rng_() % sched_.running().size()];
      (void)sched_.fork(parent, next_id_++);
    }
  }

  /// Fault injection: calls that must fail, each checked to leave the cache exactly as it was.
  void failing_calls() {
    if (rng_() % 4 != 0) return;
    std::vector<seq_id> ids(sched_.running().begin(), sched_.running().end());
    ids.insert(ids.end(), sched_.swapped().begin(), sched_.swapped().end());
    const auto before = kvtest::take_snapshot(cache_, ids);
    status st;
    switch (rng_() % 4) {
      case 0:  // swap-in refused: the sequence is not swapped out
        if (sched_.running().empty()) return;
        st = cache_.swap_in(sched_.running()[rng_() % sched_.running().size()]);
        EXPECT_EQ(st.code(), errc::sequence_swapped);
        break;
      case 1:  // an allocation that cannot succeed
        st = cache_.add_sequence(next_id_++, 4 * cache_.stats().total + 4);
        EXPECT_EQ(st.code(), errc::out_of_blocks);
        break;
      case 2:  // swapping out sequences whose bytes of this step are not in place yet
        if (out_ids().empty()) return;
        st = cache_.swap_out(out_ids());
        EXPECT_TRUE(st.code() == errc::pending_append || st.code() == errc::host_pool_full) << st.message();
        break;
      default:  // host pool too small for everything at once
        if (sched_.swapped().empty()) return;
        st = cache_.swap_out(sched_.swapped().front());
        EXPECT_EQ(st.code(), errc::sequence_swapped);
    }
    ASSERT_FALSE(st.ok());
    ASSERT_TRUE(kvtest::take_snapshot(cache_, ids) == before) << "a failed call changed the cache: " << st.message();
    ++failed_calls_;
  }
  /// The running sequences scheduled in this step (their appends are pending).
  std::vector<seq_id> out_ids() const { return std::vector<seq_id>(sched_.running().begin(), sched_.running().end()); }

  /// Fault injection: ballast sequences take blocks away (and give them back) at random points.
  void ballast() {
    if (rng_() % 5 == 0 && !ballast_.empty()) {
      ASSERT_TRUE(cache_.free_sequence(ballast_.back()));
      ballast_.pop_back();
    } else if (rng_() % 5 == 0 && ballast_.size() < 3) {
      const seq_id id = 1'000'000'000ULL + next_id_++;
      if (cache_.add_sequence(id, static_cast<std::int32_t>(4 * (1 + rng_() % 6)))) ballast_.push_back(id);
    }
  }

  /// KV word of (content hash, kv, head, dim).
  static std::uint32_t word(std::uint64_t h, int kv, int head, int d) {
    return static_cast<std::uint32_t>(mix(h, static_cast<std::uint64_t>(kv * 64 + head * 8 + d)));
  }
  std::uint64_t content_hash(std::span<const token_id> tokens, std::int32_t pos) {
    std::uint64_t h = 0x1234;
    for (std::int32_t i = 0; i <= pos; ++i) h = mix(h, static_cast<std::uint64_t>(tokens[static_cast<std::size_t>(i)]) + 1);
    return h;
  }

  void execute(const step_output& out) {
    const step_plan& plan = cache_.plan();
    std::vector<std::uint32_t> k, v;
    for (const token_range& r : plan.appends()) {
      std::span<const token_id> tokens = sched_.tokens(r.seq);
      for (std::int32_t p = r.first_pos; p < r.first_pos + r.count; ++p) {
        const std::uint64_t h = tokens.empty() ? 0 : content_hash(tokens, p);  // ballast: any bytes
        for (int head = 0; head < 2; ++head)
          for (int d = 0; d < 4; ++d) {
            k.push_back(word(h, 0, head, d));
            v.push_back(word(h, 1, head, d));
          }
      }
    }
    ASSERT_TRUE(exec_.execute(plan, out.slot_mapping, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))));
  }

  void verify() {
    auto check = [&](seq_id id, std::span<const block_id> table, bool host) {
      const std::span<const token_id> tokens = sched_.tokens(id);
      const auto n = *cache_.num_tokens(id);
      std::uint64_t h = 0x1234;
      for (std::int32_t p = 0; p < n; ++p) {
        h = mix(h, static_cast<std::uint64_t>(tokens[static_cast<std::size_t>(p)]) + 1);
        for (int kv = 0; kv < 2; ++kv)
          for (int head = 0; head < 2; ++head) {
            const auto bytes = exec_.token(table, p, kv, head, host);
            for (int d = 0; d < 4; ++d) {
              std::uint32_t w;
              std::memcpy(&w, bytes.data() + d * 4, 4);
              if (w != word(h, kv, head, d))
                FAIL() << "sequence " << id << (host ? " (swapped)" : "") << " lost KV at position " << p;
            }
          }
        ++verified_;
      }
    };
    for (const seq_id id : sched_.running()) check(id, *cache_.block_table(id), false);
    for (const seq_id id : sched_.swapped()) check(id, *cache_.host_block_table(id), true);
  }

  void sample(const step_output& out) {
    for (const scheduled_sequence& s : out.scheduled) {
      if (!s.last_chunk) continue;  // a prefill chunk that is not the prompt's last: nothing is sampled
      const bool done = rng_() % 16 == 0 || sched_.tokens(s.id).size() > 60;
      ASSERT_TRUE(sched_.complete(s.id, static_cast<token_id>(rng_() % 4), done));
    }
  }

  Cache cache_;
  scheduler<Cache> sched_;
  kvpager_testing::memcpy_executor exec_;
  std::mt19937 rng_;
  seq_id next_id_ = 1;
  std::vector<seq_id> ballast_;
  std::int64_t verified_ = 0;
  std::int64_t failed_calls_ = 0;
};

}  // namespace

TEST(NothingLost, HybridSwapPrefixCachingNewestFirst) {
  using cache_t = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
  scheduler_config cfg;
  cfg.max_num_seqs = 12;
  cfg.max_num_batched_tokens = 64;
  cfg.watermark_permille = 50;
  serving_run<cache_t>(64, 24, cfg, 1).run(4000);
}

TEST(NothingLost, HostSwapLowestPriorityWithAging) {
  using cache_t = paged_kv_cache<free_list_allocator, lru_index_eviction, prefix_caching, host_swap>;
  scheduler_config cfg;
  cfg.max_num_seqs = 10;
  cfg.max_num_batched_tokens = 48;
  cfg.victim = preemption_order::lowest_priority;
  cfg.aging_steps = 8;
  serving_run<cache_t>(56, 16, cfg, 2).run(4000);
}
