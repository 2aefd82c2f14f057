// SPDX-License-Identifier: Apache-2.0
// A scheduler step in steady state allocates nothing: the step output and every scratch buffer are reused. This
// executable replaces the global operator new to count allocations (so it is a test executable of its own).
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include "kvpager_testing/allocation_probe.hpp"

#include <vector>

using namespace kvpager;

namespace {
using cache_t = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;

std::vector<token_id> prompt(std::int32_t n, token_id first) {
  std::vector<token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

/// Allocations made by `steps` calls of schedule() (the engine's complete() calls, which store the sampled
/// tokens, are outside the count).
std::int64_t allocations_in_schedule(scheduler<cache_t>& s, int steps) {
  std::int64_t inside = 0;
  for (int i = 0; i < steps; ++i) {
    const std::int64_t before = probe::allocations.load();
    const step_output& out = s.schedule();
    inside += probe::allocations.load() - before;
    for (const scheduled_sequence& x : out.scheduled) {
      if (x.last_chunk) {
        EXPECT_TRUE(s.complete(x.id, 7));
      }
    }
  }
  return inside;
}
}  // namespace

TEST(ScheduleAllocations, SteadyDecodeStepAllocatesNothing) {
  // Block size 256: every decode lands in a block the sequence already has, so the cache allocates nothing either.
  auto cache = *cache_t::create({256, 64, 0, 0});
  scheduler<cache_t> s(cache, scheduler_config{.max_num_seqs = 32});
  for (seq_id id = 0; id < 32; ++id) ASSERT_TRUE(s.add_request(id, prompt(8, static_cast<token_id>(id) * 100)));
  EXPECT_GT(allocations_in_schedule(s, 3), 0) << "the first steps grow the buffers (the counter counts)";
  EXPECT_EQ(allocations_in_schedule(s, 100), 0);
  EXPECT_EQ(s.stats().running, 32);
}

TEST(ScheduleAllocations, StepWithAStuckPriorityQueueAllocatesNothing) {
  // 8 requests run; 40 wait with rising priorities and aging (the waiting queue is re-ordered every step) and
  // fail admission every step (no free block); the step still allocates nothing once warm.
  auto cache = *cache_t::create({256, 8, 0, 0});
  scheduler_config cfg;
  cfg.max_num_seqs = 64;
  cfg.aging_steps = 1;
  cfg.watermark_permille = 0;
  scheduler<cache_t> s(cache, cfg);
  for (seq_id id = 0; id < 8; ++id) ASSERT_TRUE(s.add_request(id, prompt(8, 0), 100));
  (void)allocations_in_schedule(s, 1);
  for (seq_id id = 8; id < 48; ++id)
    ASSERT_TRUE(s.add_request(id, prompt(8, 1000), static_cast<std::int32_t>(id % 5)));
  (void)allocations_in_schedule(s, 3);
  const std::int64_t fails = s.stats().admit_fail;
  EXPECT_EQ(allocations_in_schedule(s, 50), 0);
  EXPECT_EQ(s.stats().admit_fail, fails + 50) << "every step tried to admit the head and failed";
  EXPECT_EQ(s.stats().waiting, 40);
}

TEST(ScheduleAllocations, RequestQueueReusesItsRing) {
  request_queue q;
  for (seq_id i = 0; i < 20; ++i) q.push_back(i);
  const std::int64_t before = probe::allocations.load();
  for (int round = 0; round < 1000; ++round) {  // the ends move around the ring, as a queue's do
    const seq_id front = q.front();
    q.pop_front();
    q.push_back(front);
    if (round % 7 == 0) {
      const seq_id f = q.front();
      q.pop_front();
      q.push_front(f);
    }
  }
  EXPECT_EQ(probe::allocations.load() - before, 0);
  EXPECT_EQ(q.size(), 20U);
}

TEST(ScheduleAllocations, TunedStepAllocatesNothing) {
  // 32 requests in 34 blocks: 94% utilization, so the batch size tuner shrinks its limit step after step (the
  // running requests stay: a shrink preempts nobody); the adaptive preemption model's swap rate is fed every step.
  auto cache = *cache_t::create({256, 34, 0, 0});
  scheduler_config cfg;
  cfg.max_num_seqs = 32;
  cfg.watermark_permille = 0;
  cfg.batch_tuning.enabled = true;
  cfg.batch_tuning.max_seqs = 32;
  cfg.batch_tuning.patience_steps = 1;
  cfg.batch_tuning.cooldown_steps = 1;
  cfg.preemption = preemption_mode::adaptive;
  cfg.swap_cost.block_bytes = 1 << 20;
  cfg.swap_cost.prefill_seconds_per_token = 1e-4;
  auto made = scheduler<cache_t>::create(cache, cfg);
  ASSERT_TRUE(made.ok());
  scheduler<cache_t> s = *std::move(made);
  for (seq_id id = 0; id < 32; ++id) ASSERT_TRUE(s.add_request(id, prompt(8, static_cast<token_id>(id) * 100)));
  EXPECT_GT(allocations_in_schedule(s, 3), 0);
  EXPECT_EQ(allocations_in_schedule(s, 100), 0);
  EXPECT_EQ(s.stats().running, 32);
  EXPECT_GT(s.tuning().batch().shrinks(), 3) << "the tuner was at work";
}
