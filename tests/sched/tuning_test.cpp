// SPDX-License-Identifier: Apache-2.0
// The tuning policies inside the scheduler: the bound on the longest wait under priority aging, checked against
// adversarial arrivals; the dynamic max batch size capping admissions; preemption_mode::adaptive choosing swap or
// recompute per victim; bad tuning configs refused by create() and by the setters, changing nothing.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "support/sched_helpers.hpp"

using namespace kvpager;

namespace {
using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;
using recompute_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;

using kvtest::prompt;

/// Deterministic pseudo-random numbers (a linear congruential generator).
struct lcg {
  std::uint64_t x;
  std::int32_t below(std::int32_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(n));
  }
};

/// One run of the load model of priority_aging's bound: the pool holds one request at a time and each admitted
/// request finishes after its step, so exactly one waiting request is admitted per step (S = 1). `queued` requests
/// of priority `spread` wait before R (priority 0) arrives; then before every step `arrivals` more join, each of
/// priority `spread` (the worst case) or, with `random_priorities`, anywhere in [0, spread]. Returns the step R
/// is admitted in (1 = the first step after it arrived), or none within `horizon` steps.
std::optional<std::int64_t> wait_of_r(std::int32_t steps_per_level, std::int32_t spread, std::int32_t queued,
                                      std::int32_t arrivals, bool random_priorities, std::int64_t horizon,
                                      std::uint64_t seed = 1) {
  auto cache = *recompute_cache::create({4, 6, 0, 0});  // a 17-token request takes 5 of the 6 blocks
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.aging_steps = steps_per_level;
  scheduler<recompute_cache> s(cache, cfg);
  lcg rng{seed};
  seq_id next = 1000;
  for (std::int32_t i = 0; i < queued; ++i) EXPECT_TRUE(s.add_request(next++, prompt(17), spread));
  const seq_id r = 1;
  EXPECT_TRUE(s.add_request(r, prompt(17), 0));
  for (std::int64_t step = 1; step <= horizon; ++step) {
    for (std::int32_t i = 0; i < arrivals; ++i)
      EXPECT_TRUE(s.add_request(next++, prompt(17), random_priorities ? rng.below(spread + 1) : spread));
    const auto& out = s.schedule();
    EXPECT_EQ(out.scheduled.size(), 1U) << "the load model: one admission per step";
    for (const auto& x : out.scheduled) {
      if (x.id == r) return step;
      EXPECT_TRUE(s.complete(x.id, 1, /*finished=*/true));
    }
  }
  return std::nullopt;
}
}  // namespace

// priority_aging's bound, W + A x k x P + 1 steps (one admission a step), is reached by the adversary that sends
// the highest priority allowed before every step, and never exceeded.
TEST(TunedScheduler, AgingBoundsTheLongestWaitAndTheAdversaryReachesIt) {
  for (const std::int32_t k : {1, 2, 3, 5}) {
    for (const std::int32_t p : {0, 1, 2, 4}) {
      for (const std::int32_t a : {1, 2, 3}) {
        for (const std::int32_t w : {0, 3}) {
          const auto bound = priority_aging{k}.wait_bound(w, a, p, 1);
          ASSERT_TRUE(bound.has_value());
          ASSERT_EQ(*bound, w + std::int64_t{a} * k * p + 1);
          const auto worst = wait_of_r(k, p, w, a, false, *bound + 50);
          ASSERT_TRUE(worst.has_value()) << "k " << k << " P " << p << " A " << a << " W " << w;
          EXPECT_EQ(*worst, *bound) << "k " << k << " P " << p << " A " << a << " W " << w << ": the bound is tight";
          for (std::uint64_t seed = 1; seed <= 3; ++seed) {
            const auto random = wait_of_r(k, p, w, a, true, *bound + 50, seed);
            ASSERT_TRUE(random.has_value());
            EXPECT_LE(*random, *bound) << "k " << k << " P " << p << " A " << a << " W " << w << " seed " << seed;
          }
        }
      }
    }
  }
}

// Issue 21, point 10: priority preemption keeps the aging bound. R (priority 0) runs a long decode in a pool that
// holds one request at a time; before every step the adversary sends a request of priority P that decodes for a
// while. Each displaces R while R's aged priority is below P; R keeps what it gained waiting, so after at most
// k x P steps of waiting in all it outranks every arrival, can no longer be displaced, and finishes. Recompute and
// swap alike; a bound on R's displacements (k x P) and on its completion step, and nothing stuck.
TEST(TunedScheduler, PriorityPreemptionKeepsTheAgingBound) {
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    for (const std::int32_t k : {1, 3}) {
      constexpr std::int32_t P = 4, decode = 30, adversary_decode = 6;
      auto cache = *swap_cache::create({4, 12, 0, 0, 64});  // R's 17 + 30 tokens take 12 blocks: one at a time
      scheduler_config cfg;
      cfg.watermark_permille = 0;
      cfg.aging_steps = k;
      cfg.priority_preemption = true;
      cfg.preemption = mode;
      scheduler<swap_cache> s(cache, cfg);
      const seq_id r = 1;
      ASSERT_TRUE(s.add_request(r, prompt(17), 0));
      std::vector<std::int32_t> outputs(4096, 0);
      seq_id next = 100;
      std::int64_t r_done = -1, r_displaced = 0;
      for (std::int64_t step = 1; step <= 2000 && r_done < 0; ++step) {
        ASSERT_TRUE(s.add_request(next++, prompt(17), P));
        const auto& out = s.schedule();
        for (const seq_id v : out.preempted_recompute) r_displaced += v == r ? 1 : 0;
        for (const seq_id v : out.swapped_out) r_displaced += v == r ? 1 : 0;
        for (const auto& x : out.scheduled) {
          if (!x.last_chunk) continue;
          const std::int32_t want = x.id == r ? decode : adversary_decode;
          const bool fin = ++outputs[x.id < 4096 ? x.id : 4095] >= want;
          ASSERT_TRUE(s.complete(x.id, 3, fin));
          if (fin && x.id == r) r_done = step;
        }
      }
      ASSERT_GE(r_done, 0) << "R never finished: mode " << static_cast<int>(mode) << " k " << k;
      EXPECT_LE(r_displaced, std::int64_t{k} * P) << "mode " << static_cast<int>(mode) << " k " << k;
      EXPECT_GT(r_displaced, 0) << "the adversary never displaced R: the test shows nothing";
      EXPECT_GT(s.stats().preempted_for_priority, 0);
    }
  }
}

TEST(TunedScheduler, WithoutAgingTheAdversaryStarvesTheRequest) {
  EXPECT_FALSE(priority_aging{}.wait_bound(0, 1, 1, 1).has_value()) << "no bound to promise";
  EXPECT_FALSE(wait_of_r(0, 1, 0, 1, false, 500).has_value()) << "500 steps and R never ran";
}

namespace {
/// Requests of `prompt_len` tokens that each decode `decode` tokens, `per_step` new ones before each step.
struct decode_load {
  std::int32_t prompt_len;
  std::int32_t decode;
  std::int32_t per_step;
};

/// Runs `steps` steps of `load`; calls `check(s)` after each step. Returns the scheduler's stats.
template <class S, class Check>
scheduler_stats run_load(S& s, const decode_load& load, int steps, Check check) {
  seq_id next = 1;
  std::vector<std::int32_t> sampled(100000, 0);
  for (int step = 0; step < steps; ++step) {
    for (std::int32_t i = 0; i < load.per_step; ++i, ++next)
      EXPECT_TRUE(s.add_request(next, prompt(load.prompt_len, static_cast<token_id>(next) * 1000)).ok());
    const auto& out = s.schedule();
    for (const auto& x : out.scheduled) {
      if (!x.last_chunk) continue;
      const bool done = ++sampled[x.id] >= load.decode;
      const status st = s.complete(x.id, 7, done);
      EXPECT_TRUE(st) << st.message() << " id " << x.id;
    }
    check(s);
  }
  return s.stats();
}
}  // namespace

TEST(TunedScheduler, BatchTuningCapsTheRunningRequestsAndShrinksUnderPreemption) {
  // 64 blocks of 4 tokens; requests of 8 prompt tokens decoding 40: each grows to 12 blocks, so a few fill the pool.
  const decode_load load{8, 40, 2};
  scheduler_config base;
  base.watermark_permille = 0;
  base.preemption = preemption_mode::recompute;

  auto plain_cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> plain(plain_cache, base);
  const auto untuned = run_load(plain, load, 300, [](const auto&) {});
  ASSERT_GT(untuned.preempted_recompute, 0) << "the load must overload the pool";

  scheduler_config tuned_cfg = base;
  tuned_cfg.batch_tuning.enabled = true;
  tuned_cfg.batch_tuning.max_seqs = 64;
  tuned_cfg.batch_tuning.cooldown_steps = 4;
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  auto s = *scheduler<recompute_cache>::create(cache, tuned_cfg);
  EXPECT_EQ(s.tuning().batch().limit(), 64);
  std::int32_t lowest = 64;
  std::int32_t limit_in_step = 64;  // the limit the step ran under (set by the step before)
  std::int64_t admitted = 0;
  int capped_steps = 0;
  const auto tuned = run_load(s, load, 300, [&](const auto& sched) {
    const scheduler_stats st = sched.stats();
    // A step that admitted stops at the limit it ran under (a shrink applies from the next step, preempting none).
    if (st.admitted > admitted) {
      EXPECT_LE(st.running, limit_in_step);
      if (st.running == limit_in_step && st.waiting > 0) ++capped_steps;
    }
    admitted = st.admitted;
    limit_in_step = sched.tuning().batch().limit();
    lowest = std::min(lowest, limit_in_step);
  });
  EXPECT_GT(capped_steps, 0) << "the limit, not the pool, stopped some admissions";
  EXPECT_LT(lowest, 64) << "preemptions shrank the limit";
  EXPECT_GT(s.tuning().batch().shrinks(), 0);
  EXPECT_LT(tuned.preempted_recompute, untuned.preempted_recompute) << "fewer requests admitted, fewer preempted";
}

TEST(TunedScheduler, AdmissionsStopAtTheTunedLimit) {
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.batch_tuning.enabled = true;
  cfg.batch_tuning.max_seqs = 3;  // the tuner's bound: below max_num_seqs
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  auto s = *scheduler<recompute_cache>::create(cache, cfg);
  for (seq_id id = 1; id <= 6; ++id) ASSERT_TRUE(s.add_request(id, prompt(4, static_cast<token_id>(id) * 10)));
  (void)s.schedule();
  EXPECT_EQ(s.stats().running, 3);
  EXPECT_EQ(s.stats().waiting, 3);
  // The pool is nearly empty (3 of 64 blocks): after patience_steps steps below 60% the limit grows by one.
  for (int i = 0; i < 3; ++i) (void)s.schedule();
  EXPECT_EQ(s.tuning().batch().limit(), 3) << "max_seqs bounds the growth";
}

namespace {
/// A swap cache under pressure with preemption_mode::adaptive and `model`: the kinds of the first preemption.
struct first_preemption {
  bool swapped = false;
  bool recomputed = false;
};
first_preemption preempt_once(const swap_cost_model& model, scheduler_config cfg = {}) {
  auto cache = *swap_cache::create({4, 9, 1, 0, 16});
  cfg.watermark_permille = 0;
  cfg.preemption = preemption_mode::adaptive;
  cfg.swap_cost = model;
  auto made = scheduler<swap_cache>::create(cache, cfg);
  EXPECT_TRUE(made.ok());
  auto s = *std::move(made);
  EXPECT_TRUE(s.add_request(1, prompt(12)));
  EXPECT_TRUE(s.add_request(2, prompt(12, 100)));
  first_preemption r;
  for (int i = 0; i < 12 && !r.swapped && !r.recomputed; ++i) {
    const auto& out = s.schedule();
    r.swapped = !out.swapped_out.empty();
    r.recomputed = !out.preempted_recompute.empty();
    for (const auto& x : out.scheduled) EXPECT_TRUE(s.complete(x.id, 1));
    if (r.swapped) {
      EXPECT_NEAR(s.tuning().preemption().swap_rate(), model.rate_smoothing, 1e-12) << "the scheduler fed the rate";
    }
  }
  return r;
}
swap_cost_model model(double prefill_seconds_per_token) {
  swap_cost_model m;
  m.block_bytes = 1 << 20;          // 1 MiB a block
  m.link_bytes_per_second = 1.0e9;  // 2 ms to move a block out and back
  m.prefill_seconds_per_token = prefill_seconds_per_token;
  return m;
}
}  // namespace

TEST(TunedScheduler, AdaptivePreemptionSwapsWhenRecomputeCostsMore) {
  // The victim holds 4 blocks for about 14 tokens: swapping costs ~8.4 ms.
  const auto slow = preempt_once(model(1e-3));  // recompute: ~14 ms
  EXPECT_TRUE(slow.swapped);
  EXPECT_FALSE(slow.recomputed);
  const auto fast = preempt_once(model(1e-4));  // recompute: ~1.4 ms
  EXPECT_TRUE(fast.recomputed);
  EXPECT_FALSE(fast.swapped);
}

TEST(TunedScheduler, AdaptivePreemptionFollowsTheEnginesMeasurements) {
  auto cache = *swap_cache::create({4, 9, 1, 0, 16});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.preemption = preemption_mode::adaptive;
  cfg.swap_cost = model(1e-3);
  cfg.swap_cost.measurement_smoothing = 1.0;  // take the measurement as it is
  auto s = *scheduler<swap_cache>::create(cache, cfg);
  // The engine measured a link 100x slower than configured: swapping now costs far more than recomputing.
  ASSERT_TRUE(s.preemption_model().observe_transfer(10'000'000, 1.0));
  ASSERT_TRUE(s.add_request(1, prompt(12)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 100)));
  bool recomputed = false;
  for (int i = 0; i < 12 && !recomputed; ++i) {
    const auto& out = s.schedule();
    EXPECT_TRUE(out.swapped_out.empty());
    recomputed = !out.preempted_recompute.empty();
    for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(s.stats().swap_fallback_recompute, 0) << "recompute was chosen, not a refused swap";
}

TEST(TunedScheduler, AdaptiveSwapOverACacheWithoutHostPoolRecomputes) {
  auto cache = *recompute_cache::create({4, 8, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.preemption = preemption_mode::adaptive;
  cfg.swap_cost = model(1.0);  // swapping always looks cheaper
  auto s = *scheduler<recompute_cache>::create(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(12)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 100)));
  for (int i = 0; i < 12; ++i) {
    const auto& out = s.schedule();
    EXPECT_TRUE(out.swapped_out.empty());
    for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
  }
  EXPECT_GT(s.stats().preempted_recompute, 0);
  EXPECT_EQ(s.stats().swap_fallback_recompute, 0) << "no host pool (unsupported) is not a fallback";
}

TEST(TunedScheduler, BadTuningConfigsAreRefusedByCreate) {
  auto cache = *recompute_cache::create({4, 8, 0, 0});
  scheduler_config cfg;
  cfg.batch_tuning.enabled = true;
  cfg.batch_tuning.min_seqs = 0;
  auto a = scheduler<recompute_cache>::create(cache, cfg);
  EXPECT_EQ(a.code(), errc::invalid_argument);
  EXPECT_NE(std::string_view(a.error().message()).find("batch_size_tuning"), std::string_view::npos);
  cfg.batch_tuning.enabled = false;  // a disabled tuning is not checked by create
  EXPECT_TRUE(scheduler<recompute_cache>::create(cache, cfg).ok());

  scheduler_config adaptive;
  adaptive.preemption = preemption_mode::adaptive;  // swap_cost left at its defaults: block_bytes 0
  EXPECT_EQ(scheduler<recompute_cache>::create(cache, adaptive).code(), errc::invalid_argument);
  scheduler_config headroom;
  headroom.headroom_permille = -1;
  EXPECT_EQ(scheduler<recompute_cache>::create(cache, headroom).code(), errc::invalid_argument);
  scheduler_config aging;
  aging.aging_steps = -3;
  EXPECT_EQ(scheduler<recompute_cache>::create(cache, aging).code(), errc::invalid_argument);
  EXPECT_TRUE(scheduler_config::vllm_v1().validate()) << "the preset is valid";
  EXPECT_TRUE(scheduler_config{}.validate());
  EXPECT_EQ(cache.stats().used, 0) << "nothing was created";
}

TEST(TunedScheduler, BadTuningPassedBetweenStepsChangesNothing) {
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.batch_tuning.enabled = true;
  cfg.batch_tuning.max_seqs = 8;
  cfg.preemption = preemption_mode::adaptive;
  cfg.swap_cost = model(1e-3);
  auto cache_a = *swap_cache::create({4, 9, 1, 0, 16});
  auto cache_b = *swap_cache::create({4, 9, 1, 0, 16});
  auto a = *scheduler<swap_cache>::create(cache_a, cfg);
  auto b = *scheduler<swap_cache>::create(cache_b, cfg);
  const auto step_both = [&] {
    const auto& oa = a.schedule();
    const auto& ob = b.schedule();
    EXPECT_EQ(oa.scheduled.size(), ob.scheduled.size());
    EXPECT_EQ(oa.swapped_out, ob.swapped_out);
    EXPECT_EQ(oa.preempted_recompute, ob.preempted_recompute);
    EXPECT_EQ(oa.slot_mapping, ob.slot_mapping);
    for (const auto& x : oa.scheduled) ASSERT_TRUE(a.complete(x.id, 1));
    for (const auto& x : ob.scheduled) ASSERT_TRUE(b.complete(x.id, 1));
  };
  for (seq_id id = 1; id <= 2; ++id) {
    ASSERT_TRUE(a.add_request(id, prompt(12, static_cast<token_id>(id) * 100)));
    ASSERT_TRUE(b.add_request(id, prompt(12, static_cast<token_id>(id) * 100)));
  }
  for (int i = 0; i < 3; ++i) step_both();

  batch_size_tuning bad_batch = cfg.batch_tuning;
  bad_batch.low_utilization = 0.95;  // above high_utilization
  const status st = a.set_batch_tuning(bad_batch);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(std::string_view(st.message()).find("low_utilization"), std::string_view::npos) << st.message();
  swap_cost_model bad_model = cfg.swap_cost;
  bad_model.link_bytes_per_second = -1.0;
  EXPECT_EQ(a.set_swap_cost(bad_model).code(), errc::invalid_argument);
  EXPECT_EQ(a.config().batch_tuning.low_utilization, cfg.batch_tuning.low_utilization);
  EXPECT_EQ(a.config().swap_cost.link_bytes_per_second, cfg.swap_cost.link_bytes_per_second);
  EXPECT_EQ(a.tuning().batch().limit(), b.tuning().batch().limit());
  EXPECT_EQ(a.tuning().preemption().link_bytes_per_second(), b.tuning().preemption().link_bytes_per_second());
  // The refused calls left no trace: both schedulers keep deciding alike through the preemptions to come.
  for (int i = 0; i < 12; ++i) step_both();
  EXPECT_EQ(a.stats().preempted_swap + a.stats().preempted_recompute,
            b.stats().preempted_swap + b.stats().preempted_recompute);
  EXPECT_GT(a.stats().preempted_swap + a.stats().preempted_recompute, 0);

  // A good one is taken.
  batch_size_tuning good = cfg.batch_tuning;
  good.max_seqs = 1;
  ASSERT_TRUE(a.set_batch_tuning(good));
  EXPECT_EQ(a.config().batch_tuning.max_seqs, 1);
  EXPECT_EQ(a.tuning().batch().limit(), 1);
}

TEST(TunedScheduler, BlockSizeAdvisorSeesEveryFinishedRequestsLengths) {
  auto cache = *recompute_cache::create({16, 257, 0, 0});
  scheduler_config cfg;
  cfg.advise_block_size = true;
  scheduler<recompute_cache> s(cache, cfg);
  block_size_advisor expected(cfg.block_size_advice);
  // Prompts of 3..40 tokens, each request sampling (id % 5) tokens before the engine finishes it.
  for (seq_id id = 1; id <= 24; ++id) {
    const auto len = static_cast<std::int32_t>(3 + (id * 7) % 38);
    ASSERT_TRUE(s.add_request(id, prompt(len, id * 100)));
    const std::int32_t outputs = id % 5;
    for (std::int32_t t = 0; t <= outputs; ++t) {
      const auto& out = s.schedule();
      for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 7, t == outputs));
    }
    ASSERT_TRUE(expected.observe(len, outputs));
  }
  const block_size_advisor& got = s.tuning().block_sizes();
  EXPECT_EQ(got.observations(), 24);
  for (std::size_t i = 0; i < advisor_block_sizes.size(); ++i)
    EXPECT_DOUBLE_EQ(got.estimate(i).waste_fraction, expected.estimate(i).waste_fraction) << advisor_block_sizes[i];
  EXPECT_EQ(*got.recommend(), *expected.recommend());
  // Off (the default): nothing observed.
  auto cache2 = *recompute_cache::create({16, 257, 0, 0});
  scheduler<recompute_cache> off(cache2);
  ASSERT_TRUE(off.add_request(1, prompt(20)));
  const auto& out = off.schedule();
  ASSERT_EQ(out.scheduled.size(), 1U);
  ASSERT_TRUE(off.complete(1, 7, true));
  EXPECT_EQ(off.tuning().block_sizes().observations(), 0);
}
