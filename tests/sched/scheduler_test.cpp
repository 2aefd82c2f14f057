// SPDX-License-Identifier: Apache-2.0
// Scheduler decisions: admission answers, watermark, victims, no admission in a step that preempted, swap-in
// before admission, aging.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/sched_helpers.hpp"

using namespace kvpager;

namespace {
using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;
using recompute_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;

using kvtest::prompt;
using kvtest::sample_all;
bool contains(const std::vector<seq_id>& v, seq_id id) { return std::find(v.begin(), v.end(), id) != v.end(); }
}  // namespace

TEST(Scheduler, AdmissionAnswers) {
  auto cache = *recompute_cache::create({16, 101, 0, 0});  // 101 blocks, watermark 1% = 1 block
  scheduler<recompute_cache> s(cache);
  EXPECT_EQ(*s.add_request(1, prompt(16 * 100)), admission::ok);  // 100 blocks + 1 watermark = 101
  EXPECT_EQ(*s.add_request(2, prompt(16 * 100 + 1)), admission::never) << "101 blocks + watermark can never fit";
  EXPECT_EQ(s.stats().rejected, 1);
  EXPECT_EQ(s.stats().waiting, 1) << "a NEVER request is not queued";
  EXPECT_EQ(s.add_request(1, prompt(4)).code(), errc::duplicate_sequence);
  EXPECT_EQ(s.add_request(3, {}).code(), errc::invalid_argument);
  const auto& out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].num_tokens, 1600);
  EXPECT_EQ(*s.add_request(4, prompt(16)), admission::later) << "the watermark block is all that is left";
}

TEST(Scheduler, WatermarkKeepsTenPercentOfThePool) {
  auto cache = *recompute_cache::create({16, 500, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 100;  // vLLM's watermark at 10% of the pool
  scheduler<recompute_cache> s(cache, cfg);
  EXPECT_EQ(*s.add_request(1, prompt(16 * 450)), admission::ok);
  EXPECT_EQ(*s.add_request(2, prompt(16 * 451)), admission::never);
}

namespace {
/// A 500-block pool with 100 blocks free: a 400-block request runs.
template <class S>
void fill_400_of_500(S& s) {
  ASSERT_TRUE(s.add_request(1, prompt(16 * 400)));
  (void)s.schedule();  // its sampled token is never given: it computes nothing more, the 100 free blocks stay free
  ASSERT_EQ(s.stats().running, 1);
}
}  // namespace

// The seed's GlobalBlockPool.admit_request: admit when free blocks >= 1.1 x blocks needed (a buffer relative to the
// request), against vLLM's watermark (a share of the pool). 500-block pool, 100 free: the seed admits up to 90
// blocks, a 10% watermark up to 50.
TEST(Scheduler, SeedRuleAdmitsUpToNinetyBlocksWhereATenPercentWatermarkAdmitsFifty) {
  auto seed_cache = *recompute_cache::create({16, 500, 0, 0});
  scheduler_config seed;
  seed.admit_rule = admission_rule::request_headroom;  // headroom_permille 100: free >= 1.1 x needed
  scheduler<recompute_cache> s(seed_cache, seed);
  fill_400_of_500(s);
  EXPECT_EQ(s.check_tokens(16 * 90), admission::ok) << "90 x 1.1 = 99 <= 100 free";
  EXPECT_EQ(s.check_tokens(16 * 91), admission::later) << "91 x 1.1 = 100.1 > 100 free";
  EXPECT_EQ(s.check_tokens(16 * 455), admission::never) << "455 + 46 > 500: never, even in an empty pool";

  auto wm_cache = *recompute_cache::create({16, 500, 0, 0});
  scheduler_config wm;
  wm.watermark_permille = 100;
  scheduler<recompute_cache> w(wm_cache, wm);
  fill_400_of_500(w);
  EXPECT_EQ(w.check_tokens(16 * 50), admission::ok) << "100 free - 50 = 50 kept";
  EXPECT_EQ(w.check_tokens(16 * 51), admission::later);

  // The admissions themselves follow the same rule: 91 blocks wait under the seed's rule, 90 are let in.
  ASSERT_TRUE(s.add_request(2, prompt(16 * 91)));
  (void)s.schedule();
  EXPECT_EQ(s.state(2), request_state::waiting);
  EXPECT_EQ(s.stats().admit_fail, 1);
  ASSERT_TRUE(s.finish(2));
  ASSERT_TRUE(s.add_request(3, prompt(16 * 90)));
  const auto& out = s.schedule();
  EXPECT_EQ(s.state(3), request_state::running);
  EXPECT_TRUE(std::any_of(out.scheduled.begin(), out.scheduled.end(), [](const auto& x) { return x.id == 3U; }));
}

TEST(Scheduler, NewestIsPreemptedAndNothingIsAdmittedInThatStep) {
  auto cache = *recompute_cache::create({4, 8, 0, 0});  // 8 blocks of 4 tokens, no watermark
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(12)));  // 3 blocks
  ASSERT_TRUE(s.add_request(2, prompt(12)));  // 3 blocks
  sample_all(s, s.schedule());                 // both admitted, each with a pending token at position 12
  ASSERT_TRUE(s.add_request(3, prompt(4)));    // would fit in the 2 free blocks
  // Step: 1 and 2 each need a 4th block (2 free): both fit; request 3 admitted too? It needs 1 more block: none.
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().running, 2);
  // Next growth: 1 and 2 write positions 13 in their 4th blocks; fine. Fill until a shortage.
  for (int i = 0; i < 3; ++i) sample_all(s, s.schedule());
  const auto& out = s.schedule();  // position 16: each needs a 5th block, none free: the newest (2) goes
  ASSERT_TRUE(contains(out.preempted_recompute, 2));
  EXPECT_FALSE(contains(out.preempted_recompute, 1));
  for (const auto& x : out.scheduled) EXPECT_FALSE(x.prefill) << "no admission in a step that preempted";
  EXPECT_EQ(s.waiting().front(), 2U) << "the victim goes to the front of the waiting queue";
}

TEST(Scheduler, SwappedRequestsComeBackBeforeNewOnes) {
  auto cache = *swap_cache::create({4, 9, 1, 0, 16});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<swap_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(12)));
  ASSERT_TRUE(s.add_request(2, prompt(12)));
  sample_all(s, s.schedule());
  seq_id swapped = 0;
  for (int i = 0; i < 8 && swapped == 0; ++i) {
    const auto& out = s.schedule();
    if (!out.swapped_out.empty()) swapped = out.swapped_out[0];
    sample_all(s, out);
  }
  ASSERT_EQ(swapped, 2U) << "the newest running request was swapped out";
  ASSERT_TRUE(s.add_request(3, prompt(4)));
  ASSERT_TRUE(s.finish(1));  // room again
  const auto& out = s.schedule();
  ASSERT_TRUE(contains(out.swapped_in, 2));
  EXPECT_EQ(cache.plan().swap_ins().size(), 4U);
  // The swapped request resumes (its pending token is computed) before the new one is admitted.
  ASSERT_GE(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].id, 2U);
  EXPECT_FALSE(out.scheduled[0].prefill);
}

TEST(Scheduler, AgingLetsALowPriorityRequestIn) {
  auto cache = *recompute_cache::create({4, 6, 0, 0});  // room for one 5-block request at a time
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.aging_steps = 2;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(100, prompt(17), /*priority=*/0));
  seq_id next = 1;
  bool low_ran = false;
  for (int step = 0; step < 60 && !low_ran; ++step) {
    // A stream of high-priority requests, each finishing after one step.
    ASSERT_TRUE(s.add_request(next++, prompt(17), /*priority=*/5));
    const auto& out = s.schedule();
    for (const auto& x : out.scheduled) {
      if (x.id == 100) low_ran = true;
      ASSERT_TRUE(s.complete(x.id, 1, /*finished=*/true));
    }
  }
  EXPECT_TRUE(low_ran) << "without aging the priority-0 request would starve";
}

TEST(Scheduler, AgingOffStarves) {
  auto cache = *recompute_cache::create({4, 6, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(100, prompt(17), 0));
  seq_id next = 1;
  for (int step = 0; step < 30; ++step) {
    ASSERT_TRUE(s.add_request(next++, prompt(17), 5));
    const auto& out = s.schedule();
    for (const auto& x : out.scheduled) {
      EXPECT_NE(x.id, 100U);
      ASSERT_TRUE(s.complete(x.id, 1, true));
    }
  }
}

// ------------------------------------------------------------------------------------------------ regressions
namespace {
/// Checks the step's scheduled sequences against the cache: their tokens are the slot mapping's entries, in order,
/// each on the sequence's block table, and the cache holds what the scheduler counts as computed.
template <class Cache, class S>
void expect_complete_step(const Cache& cache, const S& s, const step_output& out) {
  std::size_t slot = 0;
  for (const auto& x : out.scheduled) {
    ASSERT_TRUE(cache.contains(x.id));
    const auto table = *cache.block_table(x.id);
    for (std::int32_t p = x.start; p < x.start + x.num_tokens; ++p, ++slot) {
      ASSERT_LT(slot, out.slot_mapping.size());
      const std::int64_t bs = cache.block_size();
      EXPECT_EQ(out.slot_mapping[slot], std::int64_t{table[static_cast<std::size_t>(p / bs)]} * bs + p % bs);
    }
    EXPECT_EQ(*cache.num_tokens(x.id), s.num_computed_tokens(x.id));
    EXPECT_EQ(x.start + x.num_tokens, s.num_computed_tokens(x.id));
  }
  EXPECT_EQ(slot, out.slot_mapping.size());
}
template <class S>
void sample_last_chunks(S& s, const step_output& out) {
  for (const auto& x : out.scheduled)
    if (x.last_chunk) {
      ASSERT_TRUE(s.complete(x.id, 1));
    }
}
/// Default options but at most `tokens` tokens computed per step.
scheduler_config budget(std::int64_t tokens, bool chunked = true) {
  scheduler_config cfg;
  cfg.max_num_batched_tokens = tokens;
  cfg.chunked_prefill = chunked;
  return cfg;
}
bool finished_with(const step_output& out, seq_id id, finish_reason why) {
  return std::find(out.finished.begin(), out.finished.end(), finished_request{id, why}) != out.finished.end();
}
}  // namespace

// Issue 9 item 5: a prompt longer than max_num_batched_tokens was answered OK and then blocked the queue forever.
TEST(Scheduler, PromptLongerThanTheTokenBudgetIsPrefilledInChunks) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache, budget(8));
  EXPECT_EQ(*s.add_request(1, prompt(30)), admission::ok);
  ASSERT_TRUE(s.add_request(2, prompt(3)));
  const std::int32_t chunks[] = {8, 8, 8, 6};
  for (std::int32_t i = 0; i < 4; ++i) {
    const auto& out = s.schedule();
    expect_complete_step(cache, s, out);
    ASSERT_GE(out.scheduled.size(), 1U);
    EXPECT_EQ(out.scheduled[0].id, 1U);
    EXPECT_EQ(out.scheduled[0].start, 8 * i);
    EXPECT_EQ(out.scheduled[0].num_tokens, chunks[i]);
    EXPECT_TRUE(out.scheduled[0].prefill);
    EXPECT_EQ(out.scheduled[0].last_chunk, i == 3);
    if (i < 3) {
      EXPECT_EQ(out.scheduled.size(), 1U) << "the budget is spent on the long prompt";
    }
  }
  ASSERT_TRUE(s.complete(1, 1));
  const auto& out = s.schedule();  // the decode of 1, then request 2 (no longer blocked)
  expect_complete_step(cache, s, out);
  ASSERT_EQ(out.scheduled.size(), 2U);
  EXPECT_EQ(out.scheduled[0].id, 1U);
  EXPECT_FALSE(out.scheduled[0].prefill);
  EXPECT_EQ(out.scheduled[1].id, 2U);
  EXPECT_TRUE(out.scheduled[1].last_chunk);
}

TEST(Scheduler, ChunkedPrefillRunsDecodesFirstThenThePartialPromptThenNewRequests) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache, budget(10));
  ASSERT_TRUE(s.add_request(1, prompt(4)));
  ASSERT_TRUE(s.add_request(2, prompt(20)));
  auto out = s.schedule();  // 1 whole (4), 2 a first chunk (6)
  ASSERT_EQ(out.scheduled.size(), 2U);
  EXPECT_EQ(out.scheduled[1].num_tokens, 6);
  EXPECT_FALSE(out.scheduled[1].last_chunk);
  sample_last_chunks(s, out);
  ASSERT_TRUE(s.add_request(3, prompt(3)));
  out = s.schedule();  // decode of 1, then 9 more of 2; no room for 3
  ASSERT_EQ(out.scheduled.size(), 2U);
  EXPECT_EQ(out.scheduled[0].id, 1U);
  EXPECT_EQ(out.scheduled[1].id, 2U);
  EXPECT_EQ(out.scheduled[1].num_tokens, 9);
  sample_last_chunks(s, out);
  out = s.schedule();  // decode of 1, the last 5 of 2, then 3
  expect_complete_step(cache, s, out);
  ASSERT_EQ(out.scheduled.size(), 3U);
  EXPECT_EQ(out.scheduled[0].id, 1U);
  EXPECT_EQ(out.scheduled[1].id, 2U);
  EXPECT_EQ(out.scheduled[1].num_tokens, 5);
  EXPECT_TRUE(out.scheduled[1].last_chunk);
  EXPECT_EQ(out.scheduled[2].id, 3U);
  EXPECT_EQ(out.scheduled[2].num_tokens, 3);
}

TEST(Scheduler, ChunkedPrefillOffMakesAPromptOverTheBudgetNever) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache, budget(8, /*chunked=*/false));
  EXPECT_EQ(*s.add_request(1, prompt(9)), admission::never);
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_EQ(s.stats().rejected, 1);
  EXPECT_EQ(s.check_tokens(9), admission::never);
  EXPECT_EQ(*s.add_request(2, prompt(8)), admission::ok);
  ASSERT_TRUE(s.add_request(3, prompt(4)));
  const auto& out = s.schedule();  // 2 whole; 3 does not fit the rest of the budget and is not chunked
  ASSERT_EQ(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].num_tokens, 8);
  EXPECT_TRUE(out.scheduled[0].last_chunk);
}

TEST(Scheduler, ChunkedPrefillHitsThePrefixCacheOnTheFirstChunkAndCachesEveryBlock) {
  auto cache = *vllm_v1_cache::create({4, 32, 0, 0});
  scheduler<vllm_v1_cache> s(cache, budget(6));
  ASSERT_TRUE(s.add_request(1, prompt(20)));
  for (int i = 0; i < 4; ++i) {
    const auto& out = s.schedule();
    expect_complete_step(cache, s, out);
  }
  ASSERT_EQ(s.num_computed_tokens(1), 20);
  (void)s.schedule();  // the last chunk's bytes are written (freed before, its last block would not be cached)
  ASSERT_TRUE(s.finish(1));
  std::vector<token_id> p = prompt(20);
  p.push_back(99);
  ASSERT_TRUE(s.add_request(2, p));
  const auto& out = s.schedule();
  expect_complete_step(cache, s, out);
  ASSERT_EQ(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].start, 20) << "all five blocks written chunk by chunk were cached";
  EXPECT_EQ(out.scheduled[0].num_tokens, 1);
  EXPECT_EQ(cache.stats().prefix_hit_tokens, 20);
}

TEST(Scheduler, CompleteOfAMidPrefillChunkIsRefusedAndChangesNothing) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache, budget(8));
  ASSERT_TRUE(s.add_request(1, prompt(20)));
  ASSERT_TRUE(s.add_request(2, prompt(4)));
  (void)s.schedule();
  EXPECT_EQ(s.complete(1, 7).code(), errc::invalid_argument) << "no token is sampled for a partial chunk";
  EXPECT_EQ(s.tokens(1).size(), 20U);
  EXPECT_EQ(s.complete(2, 7).code(), errc::invalid_argument) << "a waiting request has no token to take";
  EXPECT_EQ(s.tokens(2).size(), 4U);
  EXPECT_TRUE(s.complete(1, 7, /*finished=*/true)) << "a request mid-prefill can still be cancelled";
  EXPECT_FALSE(cache.contains(1));
  EXPECT_EQ(cache.stats().used, 0);
}

// Issue 9 item 6: max_blocks_per_seq was ignored: an over-long prompt blocked the queue, and a request reaching
// the limit made every later step schedule it with an empty slot mapping.
TEST(Scheduler, PromptOverMaxBlocksPerSeqIsNever) {
  auto cache = *recompute_cache::create({4, 64, 0, 3});
  scheduler<recompute_cache> s(cache);
  EXPECT_EQ(*s.add_request(1, prompt(13)), admission::never);
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_EQ(*s.add_request(2, prompt(12)), admission::ok);
}

TEST(Scheduler, RunningRequestReachingMaxBlocksPerSeqFinishesWithLengthCap) {
  auto cache = *recompute_cache::create({4, 64, 0, 3});  // 12 tokens at most
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(10)));
  ASSERT_TRUE(s.add_request(2, prompt(2)));
  bool capped = false;
  for (int step = 0; step < 8 && !capped; ++step) {
    const auto& out = s.schedule();
    expect_complete_step(cache, s, out);
    EXPECT_TRUE(out.error.ok());
    if (finished_with(out, 1, finish_reason::length_cap)) {
      capped = true;
      EXPECT_EQ(step, 3) << "12 tokens computed, the 13th sampled: finished at the next step";
      EXPECT_FALSE(cache.contains(1));
      EXPECT_TRUE(s.tokens(1).empty());
      for (const auto& x : out.scheduled) EXPECT_NE(x.id, 1U);
      EXPECT_EQ(cache.stats().used, 2) << "its blocks are back; request 2 holds 2";
    }
    sample_last_chunks(s, out);
  }
  EXPECT_TRUE(capped);
  EXPECT_EQ(s.stats().finished_with_reason, 1);
}

TEST(Scheduler, RunningRequestOutgrowingTheWholeCacheFinishesTooLong) {
  auto cache = *recompute_cache::create({4, 4, 0, 0});  // 16 tokens in all, no max_blocks_per_seq
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(14)));
  for (int step = 0; step < 3; ++step) {
    const auto& out = s.schedule();
    EXPECT_TRUE(out.finished.empty());
    EXPECT_TRUE(out.preempted_recompute.empty());
    sample_all(s, out);
  }
  const auto& out = s.schedule();  // its 17th token cannot be held by the whole cache
  EXPECT_TRUE(finished_with(out, 1, finish_reason::too_long));
  EXPECT_TRUE(out.scheduled.empty());
  EXPECT_TRUE(out.preempted_recompute.empty()) << "not preempted and re-queued forever";
  EXPECT_EQ(cache.stats().used, 0);
  EXPECT_EQ(std::string(to_string(finish_reason::too_long)), "too_long");
}

// Issue 9 item 7: over a cache whose swap policy does not preempt (no_swap), schedule() stalled with a partial
// step forever. Recompute preemption is the scheduler's own: free the victim and re-queue it.
template <class Cache>
void recompute_over(Cache cache, scheduler_config cfg) {
  cfg.watermark_permille = 0;
  scheduler<Cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(12)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 100)));
  bool preempted = false;
  std::int64_t steps = 0;
  while (s.stats().finished < 2 && steps++ < 200) {
    const auto& out = s.schedule();
    expect_complete_step(cache, s, out);
    if (!out.preempted_recompute.empty()) {
      preempted = true;
      EXPECT_EQ(out.preempted_recompute[0], 2U);
      EXPECT_FALSE(cache.contains(2));
    }
    for (const auto& x : out.scheduled)
      if (x.last_chunk) {
        ASSERT_TRUE(s.complete(x.id, 1, s.tokens(x.id).size() >= 24));
      }
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(s.stats().finished, 2) << "both requests ran to the end";
  EXPECT_EQ(cache.stats().used, 0);
}
TEST(Scheduler, RecomputePreemptionWorksOverACacheThatCannotPreempt) {
  recompute_over(*vllm_v1_cache::create({4, 8, 0, 0}), {});
  recompute_over(*paged_kv_cache<>::create({4, 8, 0, 0}), {});
}
TEST(Scheduler, PreemptionModesOverEveryCache) {
  scheduler_config cfg;
  cfg.preemption = preemption_mode::recompute;  // over a swap cache: recompute anyway
  recompute_over(*swap_cache::create({4, 8, 0, 0, 16}), cfg);
  cfg.preemption = preemption_mode::swap;  // over a cache without a host pool: recompute
  recompute_over(*recompute_cache::create({4, 8, 0, 0}), cfg);
  recompute_over(*vllm_v1_cache::create({4, 8, 0, 0}), cfg);
  // Swap mode over a host pool swaps, whatever the policy would do (recompute would be hybrid's answer for a
  // pool too small: here it has room).
  using hybrid_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, hybrid_swap>;
  auto cache = *hybrid_cache::create({4, 8, 0, 0, 16});
  scheduler<hybrid_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(12)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 100)));
  bool swapped = false;
  for (int i = 0; i < 10 && !swapped; ++i) {
    const auto& out = s.schedule();
    swapped = !out.swapped_out.empty();
    EXPECT_TRUE(out.preempted_recompute.empty());
    sample_last_chunks(s, out);
  }
  EXPECT_TRUE(swapped);
  EXPECT_TRUE(cache.is_swapped(2));
}

// Issue 9 item 8: a swapped request with more than usable - watermark blocks never came back (and, since admission
// waits for an empty swapped queue, nothing else was admitted again).
TEST(Scheduler, SwappedRequestLargerThanUsableMinusWatermarkComesBack) {
  auto cache = *swap_cache::create({4, 10, 0, 0, 16});
  scheduler_config cfg;
  cfg.watermark_permille = 200;  // 2 blocks
  scheduler<swap_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(4)));
  ASSERT_TRUE(s.add_request(2, prompt(4, 100)));
  (void)s.schedule();
  ASSERT_TRUE(s.complete(2, 1));  // 1 idles (no token given): only 2 grows
  bool out_once = false;
  for (int i = 0; i < 40 && !out_once; ++i) {
    const auto& out = s.schedule();
    out_once = !out.swapped_out.empty();
    for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
  }
  ASSERT_TRUE(out_once);
  ASSERT_TRUE(cache.is_swapped(2));
  ASSERT_EQ(cache.host_block_table(2)->size(), 9U) << "more than 10 - 2 watermark blocks";
  ASSERT_TRUE(s.finish(1));
  ASSERT_TRUE(s.add_request(3, prompt(4, 200)));
  const auto& out = s.schedule();
  ASSERT_TRUE(contains(out.swapped_in, 2)) << "nothing else runs: the watermark is not kept";
  expect_complete_step(cache, s, out);
  ASSERT_EQ(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].id, 2U);
  ASSERT_TRUE(s.finish(2));
  const auto& next = s.schedule();
  ASSERT_FALSE(next.scheduled.empty());
  EXPECT_EQ(next.scheduled[0].id, 3U) << "admission resumes";
}

// Issue 9 item 9: add_request took the id of a pending fork child: the request then sat in two queues.
TEST(Scheduler, AddRequestRefusesThePendingForkChildId) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(10)));
  sample_all(s, s.schedule());
  ASSERT_TRUE(s.fork(1, 5));
  EXPECT_EQ(s.add_request(5, prompt(3)).code(), errc::duplicate_sequence);
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_EQ(s.fork(1, 5).code(), errc::duplicate_sequence);
  const auto& out = s.schedule();
  expect_complete_step(cache, s, out);
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_EQ(*cache.num_tokens(5), 11);
  EXPECT_EQ(s.num_computed_tokens(5), 11);
}

// Issue 9 item 13: priority + aging overflowed int32 (the highest priority became the lowest).
TEST(Scheduler, PriorityAgingSaturatesInsteadOfOverflowing) {
  auto cache = *recompute_cache::create({4, 4, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.aging_steps = 1;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(16)));  // takes the whole cache
  (void)s.schedule();
  ASSERT_TRUE(s.add_request(2, prompt(4), INT32_MAX - 1));
  ASSERT_TRUE(s.add_request(3, prompt(4), INT32_MAX));
  ASSERT_TRUE(s.add_request(4, prompt(4), INT32_MIN));
  for (int i = 0; i < 3; ++i) (void)s.schedule();
  EXPECT_EQ(s.priority(3), INT32_MAX);
  EXPECT_EQ(s.priority(2), INT32_MAX);
  EXPECT_EQ(s.priority(4), INT32_MIN + 3);
  ASSERT_TRUE(s.finish(1));
  const auto& out = s.schedule();
  ASSERT_GE(out.scheduled.size(), 1U);
  EXPECT_EQ(out.scheduled[0].id, 3U) << "the highest priority stays the highest while aging";
}

// Issue 9 item 14: a fork whose parent stopped running before the next step was dropped silently.
TEST(Scheduler, ForkDroppedBecauseTheParentStoppedIsReported) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(10)));
  ASSERT_TRUE(s.add_request(2, prompt(10, 50)));
  sample_all(s, s.schedule());
  ASSERT_TRUE(s.fork(1, 7));
  ASSERT_TRUE(s.fork(2, 8));
  EXPECT_EQ(s.pending_forks().size(), 2U);
  ASSERT_TRUE(s.finish(1));
  const auto& out = s.schedule();
  ASSERT_EQ(out.dropped_forks, std::vector<seq_id>{7});
  EXPECT_EQ(s.stats().dropped_forks, 1);
  EXPECT_FALSE(cache.contains(7));
  EXPECT_EQ(s.complete(7, 1).code(), errc::unknown_sequence);
  EXPECT_TRUE(cache.contains(8));
  EXPECT_TRUE(s.pending_forks().empty());
}

TEST(Scheduler, FinishOfAPendingForkChildCancelsIt) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(10)));
  sample_all(s, s.schedule());
  ASSERT_TRUE(s.fork(1, 7));
  ASSERT_TRUE(s.finish(7));
  const auto& out = s.schedule();
  EXPECT_TRUE(out.dropped_forks.empty());
  EXPECT_FALSE(cache.contains(7));
  EXPECT_EQ(s.stats().running, 1);
}

// General: schedule() returned a partial step (`return out_;` mid-loop) on a cache error. Now the request concerned
// ends with a reason, the error is reported, and the rest of the step is complete.
TEST(Scheduler, CacheErrorEndsOnlyThatRequestAndTheStepIsComplete) {
  auto cache = *recompute_cache::create({4, 64, 0, 0});
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(10)));
  ASSERT_TRUE(s.add_request(2, prompt(10, 50)));
  ASSERT_TRUE(s.add_request(3, prompt(10, 80)));
  sample_all(s, s.schedule());
  ASSERT_TRUE(cache.free_sequence(1));  // behind the scheduler's back
  const auto& out = s.schedule();
  EXPECT_EQ(out.error.code(), errc::unknown_sequence);
  EXPECT_TRUE(finished_with(out, 1, finish_reason::cache_error));
  expect_complete_step(cache, s, out);
  ASSERT_EQ(out.scheduled.size(), 2U);
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_TRUE(s.tokens(1).empty());
  const auto& next = s.schedule();
  EXPECT_TRUE(next.error.ok()) << "the error is reported once, with the step it happened in";
}

// scheduler_config::vllm_v1() and the counters kvpager-replay reports (docs/KVTRACE.md "One run step"), the
// per-request sequence_options of add_request, state() and compute_pending().

TEST(VllmPreset, IsFcfsRecomputeNewestFirstWithoutChunking) {
  constexpr scheduler_config c = scheduler_config::vllm_v1();
  EXPECT_EQ(c.order, admission_order::fcfs);
  EXPECT_EQ(c.victim, preemption_order::newest_first);
  EXPECT_EQ(c.preemption, preemption_mode::recompute);
  EXPECT_FALSE(c.chunked_prefill);
  EXPECT_FALSE(c.reject_impossible);
  EXPECT_EQ(c.watermark_permille, 0);
  EXPECT_EQ(c.aging_steps, 0);
  // The engines' defaults stay as they were.
  constexpr scheduler_config d{};
  EXPECT_TRUE(d.reject_impossible);
  EXPECT_EQ(d.order, admission_order::priority);
  EXPECT_EQ(d.preemption, preemption_mode::cache_policy);
}

TEST(VllmPreset, RequestThatCanNeverFitIsQueuedAndFailsAdmissionEveryStep) {
  auto cache = *recompute_cache::create({16, 4, 0, 0});
  scheduler<recompute_cache> s(cache, scheduler_config::vllm_v1());
  EXPECT_EQ(*s.add_request(1, prompt(16 * 5)), admission::later) << "vLLM queues it (5 blocks of 4)";
  EXPECT_EQ(s.state(1), request_state::waiting);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.schedule().scheduled.empty());
  EXPECT_EQ(s.stats().admit_fail, 3) << "one failed admission per step, as allocate_slots fails";
  EXPECT_EQ(s.stats().rejected, 0);
  // The default configuration rejects it at once.
  auto cache2 = *recompute_cache::create({16, 4, 0, 0});
  scheduler<recompute_cache> d(cache2);
  EXPECT_EQ(*d.add_request(1, prompt(16 * 5)), admission::never);
  EXPECT_EQ(d.state(1), request_state::unknown);
}

TEST(VllmPreset, PromptOverTheBudgetStopsAdmissionAndIsCounted) {
  auto cache = *recompute_cache::create({16, 64, 0, 0});
  scheduler_config cfg = scheduler_config::vllm_v1();
  cfg.max_num_batched_tokens = 32;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(8)));
  ASSERT_TRUE(s.add_request(2, prompt(40)));  // more than the whole budget: never admitted, never rejected
  ASSERT_TRUE(s.add_request(3, prompt(8)));
  const auto& out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1U) << "FCFS: request 3 waits behind request 2";
  EXPECT_EQ(out.scheduled[0].id, 1U);
  EXPECT_EQ(s.stats().admit_budget_stop, 1);
  sample_all(s, out);
  (void)s.schedule();
  EXPECT_EQ(s.stats().admit_budget_stop, 2);
  EXPECT_EQ(s.stats().admit_fail, 0);
}

TEST(VllmPreset, PrefixCountersSplitFirstAndResumedAdmissions) {
  auto cache = *vllm_v1_cache::create({4, 9, 1, 0});  // 8 usable blocks of 4 tokens
  scheduler<vllm_v1_cache> s(cache, scheduler_config::vllm_v1());
  ASSERT_TRUE(s.add_request(1, prompt(16)));       // 4 blocks
  ASSERT_TRUE(s.add_request(2, prompt(16, 100)));  // 4 blocks
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().prefix.admissions, 2);
  EXPECT_EQ(s.stats().prefix.query_tokens, 32);
  EXPECT_EQ(s.stats().prefix.hit_tokens, 0);
  EXPECT_EQ(s.stats().peak_used_blocks, 8);
  // Request 1's sampled token needs a fifth block: request 2, the newest, is the victim. Its blocks stay cached
  // except its tail block, which request 1 takes (the tail is freed first, so evicted first).
  const auto& out = s.schedule();
  ASSERT_EQ(out.preempted_recompute.size(), 1U);
  EXPECT_EQ(out.preempted_recompute[0], 2U);
  EXPECT_EQ(s.stats().decode_alloc_fail, 1);
  sample_all(s, out);
  ASSERT_TRUE(s.finish(1));
  const auto& back = s.schedule();
  ASSERT_EQ(back.scheduled.size(), 1U);
  EXPECT_EQ(back.scheduled[0].id, 2U);
  EXPECT_EQ(s.stats().resumed_prefix.admissions, 1);
  EXPECT_EQ(s.stats().resumed_prefix.query_tokens, 17) << "prompt and its sampled token";
  EXPECT_EQ(s.stats().resumed_prefix.hit_blocks, 3) << "up to its evicted tail block";
  EXPECT_EQ(s.stats().resumed_prefix.hit_tokens, 12);
  EXPECT_EQ(s.stats().prefix.admissions, 2) << "a resumed admission is not a first one";
}

TEST(Scheduler, SwapRefusedByAFullHostPoolIsCountedAsFallback) {
  auto cache = *swap_cache::create({.block_size = 4, .num_blocks = 6, .num_host_blocks = 1});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<swap_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(8)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 50)));
  sample_all(s, s.schedule());  // 2 + 3 of 6 blocks
  // Request 1 takes the sixth block; request 2's next token needs a seventh: it is its own victim, and its 3
  // blocks do not fit the 1-block host pool.
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().preempted_recompute, 1);
  EXPECT_EQ(s.stats().swap_fallback_recompute, 1);
  EXPECT_EQ(s.stats().preempted_swap, 0);
  // Without a host pool nothing is a fallback: recompute is the only way.
  auto cache2 = *recompute_cache::create({4, 6, 0, 0});
  scheduler<recompute_cache> r(cache2, cfg);
  ASSERT_TRUE(r.add_request(1, prompt(8)));
  ASSERT_TRUE(r.add_request(2, prompt(12, 50)));
  for (int i = 0; i < 3; ++i) sample_all(r, r.schedule());
  EXPECT_EQ(r.stats().preempted_recompute, 1);
  EXPECT_EQ(r.stats().swap_fallback_recompute, 0);
}

TEST(Scheduler, AddRequestSaltSeparatesTenants) {
  auto cache = *vllm_v1_cache::create({4, 33, 1, 0});
  scheduler<vllm_v1_cache> s(cache, scheduler_config::vllm_v1());
  const auto p = prompt(13);
  ASSERT_TRUE(s.add_request(1, p, sequence_options{.extra_key = 11}));
  sample_all(s, s.schedule());
  sample_all(s, s.schedule());  // its prompt's bytes are written: its full blocks are computed
  ASSERT_TRUE(s.finish(1));  // its three full blocks stay cached under tenant 11's key
  ASSERT_TRUE(s.add_request(2, p, sequence_options{.extra_key = 22}));
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().prefix.hit_tokens, 0) << "another tenant's salt never hits";
  ASSERT_TRUE(s.add_request(3, p, sequence_options{.extra_key = 11}));
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().prefix.hit_tokens, 12) << "the same tenant hits its own blocks";
  EXPECT_EQ(s.stats().prefix.hit_blocks, 3);
}

TEST(Scheduler, StateNamesTheQueue) {
  auto cache = *recompute_cache::create({16, 8, 0, 0});
  scheduler<recompute_cache> s(cache);
  EXPECT_EQ(s.state(1), request_state::unknown);
  ASSERT_TRUE(s.add_request(1, prompt(4)));
  EXPECT_EQ(s.state(1), request_state::waiting);
  sample_all(s, s.schedule());
  EXPECT_EQ(s.state(1), request_state::running);
  ASSERT_TRUE(s.finish(1));
  EXPECT_EQ(s.state(1), request_state::unknown);
}

TEST(Scheduler, ComputePendingAppendsThePendingTokenOutsideAStep) {
  auto cache = *recompute_cache::create({4, 4, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(4)));
  ASSERT_TRUE(s.add_request(2, prompt(8, 9)));
  EXPECT_EQ(s.compute_pending(1).code(), errc::unknown_sequence) << "waiting: not running";
  const auto& out = s.schedule();
  EXPECT_EQ(s.compute_pending(1).code(), errc::invalid_argument) << "no token given yet";
  sample_all(s, out);
  // 1 + 2 of 4 blocks used; request 1's pending token takes the last one.
  ASSERT_TRUE(s.compute_pending(1));
  EXPECT_EQ(s.num_computed_tokens(1), 5);
  EXPECT_EQ(*cache.num_tokens(1), 5);
  ASSERT_TRUE(s.complete(1, 3));
  // No block left for request 2's pending token: refused, nothing changed.
  const auto before = cache.stats();
  EXPECT_EQ(s.compute_pending(2).code(), errc::out_of_blocks);
  EXPECT_EQ(cache.stats(), before);
  EXPECT_EQ(s.num_computed_tokens(2), 8);
  EXPECT_EQ(s.tokens(2).size(), 9U);
}

TEST(Scheduler, PriorityOrderIsStableWithoutAllocatingPerStep) {
  auto cache = *recompute_cache::create({16, 2, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(9, prompt(16)));  // runs and keeps 1 of 2 blocks
  sample_all(s, s.schedule());
  for (seq_id id = 1; id <= 6; ++id) ASSERT_TRUE(s.add_request(id, prompt(32), static_cast<std::int32_t>(id % 3)));
  (void)s.schedule();  // none fits: the queue is ordered by priority, FCFS among equals
  const std::vector<seq_id> order(s.waiting().begin(), s.waiting().end());
  EXPECT_EQ(order, (std::vector<seq_id>{2, 5, 1, 4, 3, 6}));
}

TEST(Scheduler, CompleteScheduledTakesTheTokenOfAStepEntry) {
  auto cache = *recompute_cache::create({16, 8, 0, 0});
  scheduler<recompute_cache> s(cache);
  ASSERT_TRUE(s.add_request(1, prompt(4)));
  ASSERT_TRUE(s.add_request(2, prompt(4, 50)));
  const auto& out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2U);
  EXPECT_EQ(s.complete_scheduled(2, 9).code(), errc::invalid_argument) << "no third entry";
  ASSERT_TRUE(s.complete_scheduled(0, 9));
  EXPECT_EQ(s.tokens(1).back(), 9);
  EXPECT_EQ(s.complete_scheduled(0, 9).code(), errc::invalid_argument) << "a second token for one step";
  ASSERT_TRUE(s.complete_scheduled(1, 5, true));  // finished: freed
  EXPECT_EQ(s.state(2), request_state::unknown);
  ASSERT_TRUE(s.add_request(3, prompt(4, 70)));  // reuses request 2's slot
  EXPECT_EQ(s.complete_scheduled(1, 5).code(), errc::unknown_sequence) << "entry 1 names request 2, gone";
  EXPECT_EQ(s.tokens(3).size(), 4U);
}

namespace {
std::int64_t blocks_hashed = 0;
/// xxh3_hasher that counts the blocks it hashes.
struct counting_hasher {
  [[nodiscard]] std::uint64_t operator()(std::uint64_t seed, std::span<const token_id> tokens) const noexcept {
    ++blocks_hashed;
    return xxh3_hasher{}(seed, tokens);
  }
};
}  // namespace

TEST(VllmPreset, RequestKeepsItsBlockHashesAcrossRecomputeAndHashesEachBlockOnce) {
  using counting_cache = paged_kv_cache<free_list_allocator, lru_eviction, basic_prefix_caching<counting_hasher>>;
  auto cache = *counting_cache::create({4, 9, 1, 0});  // 8 usable blocks of 4 tokens
  scheduler<counting_cache> s(cache, scheduler_config::vllm_v1());
  blocks_hashed = 0;
  ASSERT_TRUE(s.add_request(1, prompt(16)));       // 4 blocks
  ASSERT_TRUE(s.add_request(2, prompt(16, 100)));  // 4 blocks
  sample_all(s, s.schedule());
  EXPECT_EQ(blocks_hashed, 8) << "4 full blocks each, the lookup's first miss included";
  const auto& out = s.schedule();  // request 2 is preempted by recompute; its tail block is evicted for request 1
  ASSERT_EQ(out.preempted_recompute.size(), 1U);
  sample_all(s, out);
  ASSERT_TRUE(s.finish(1));
  const auto& back = s.schedule();  // request 2 comes back with 17 tokens: its 4 blocks' hashes are known
  ASSERT_EQ(back.scheduled.size(), 1U);
  EXPECT_EQ(s.stats().resumed_prefix.hit_blocks, 3);
  EXPECT_EQ(blocks_hashed, 8) << "the re-admission recommits the evicted tail with its kept hash";
  sample_all(s, back);
  for (int i = 0; i < 3; ++i) sample_all(s, s.schedule());  // tokens 18..20: the fifth block fills
  EXPECT_EQ(blocks_hashed, 9);
}

namespace {
/// A cache that counts how often the scheduler reads a sequence's block hashes.
template <class Base>
struct hash_reading_cache : Base {
  explicit hash_reading_cache(Base&& b) : Base(std::move(b)) {}
  status block_hashes(seq_id id, std::vector<std::uint64_t>& out) const {
    ++reads;
    return Base::block_hashes(id, out);
  }
  mutable int reads = 0;
};
using caching_swap_cache = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, host_swap>;
}  // namespace

TEST(Scheduler, OnlyARecomputeVictimHasItsBlockHashesRead) {
  // Preemption is the same shortage each time (request 2, 3 blocks, is its own victim); only the mode differs.
  for (const preemption_mode mode : {preemption_mode::cache_policy, preemption_mode::swap, preemption_mode::recompute}) {
    SCOPED_TRACE(static_cast<int>(mode));
    hash_reading_cache<caching_swap_cache> cache(
        *caching_swap_cache::create({.block_size = 4, .num_blocks = 6, .num_host_blocks = 8}));
    scheduler_config cfg;
    cfg.watermark_permille = 0;
    cfg.preemption = mode;
    scheduler<hash_reading_cache<caching_swap_cache>> s(cache, cfg);
    ASSERT_TRUE(s.add_request(1, prompt(8)));
    ASSERT_TRUE(s.add_request(2, prompt(12, 50)));
    sample_all(s, s.schedule());
    sample_all(s, s.schedule());
    const scheduler_stats st = s.stats();
    ASSERT_EQ(st.preempted_swap + st.preempted_recompute, 1);
    EXPECT_EQ(st.preempted_swap, mode == preemption_mode::recompute ? 0 : 1);
    EXPECT_EQ(cache.reads, st.preempted_recompute) << "a swap keeps the sequence, and its hashes, in the cache";
  }
}

TEST(Scheduler, ACachePolicyRecomputeReadsTheHashesBeforeTheCacheFreesThem) {
  // The host pool is too small for the victim: hybrid_swap decides recompute, and the cache frees the victim itself.
  using hybrid_cache = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
  hash_reading_cache<hybrid_cache> cache(*hybrid_cache::create({.block_size = 4, .num_blocks = 6, .num_host_blocks = 1}));
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  scheduler<hash_reading_cache<hybrid_cache>> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(8)));
  ASSERT_TRUE(s.add_request(2, prompt(12, 50)));
  sample_all(s, s.schedule());
  sample_all(s, s.schedule());
  EXPECT_EQ(s.stats().preempted_recompute, 1);
  EXPECT_EQ(s.stats().swap_fallback_recompute, 0) << "the policy's own choice, not a refused swap";
  EXPECT_EQ(cache.stats().preempted_recompute, 1) << "the cache carried it out";
  EXPECT_EQ(cache.reads, 1);
}

// Issue 21, point 10 (the seed's 3.3.3: a request's KV is swapped out to make room for a higher-priority one; vLLM
// V0's priority preemption). A low-priority request holds most of the pool and keeps decoding; a high-priority one
// arrives that does not fit. Without priority_preemption it waits; with it, the next step preempts the low one (by
// the configured mode) and admits the high one in that same step.
namespace {
template <class Cache>
void priority_preemption_case(Cache& cache, preemption_mode mode, bool on) {
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.preemption = mode;
  cfg.priority_preemption = on;
  ASSERT_TRUE(cfg.validate());
  scheduler<Cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(24), /*priority=*/0));  // 6 of the 8 blocks
  sample_all(s, s.schedule());
  ASSERT_TRUE(s.add_request(2, prompt(12), /*priority=*/0));  // equal priority: never displaces request 1
  ASSERT_TRUE(s.add_request(3, prompt(12), /*priority=*/5));  // 3 blocks: does not fit beside request 1
  const auto& out = s.schedule();
  if (!on) {
    EXPECT_EQ(s.state(3), request_state::waiting);
    EXPECT_EQ(s.stats().preempted_for_priority, 0);
    EXPECT_EQ(s.state(1), request_state::running);
    return;
  }
  EXPECT_EQ(s.stats().preempted_for_priority, 1);
  EXPECT_EQ(s.state(3), request_state::running) << "admitted in the step that displaced request 1";
  ASSERT_FALSE(out.scheduled.empty());
  EXPECT_EQ(out.scheduled[0].id, 3U);
  EXPECT_TRUE(out.scheduled[0].prefill);
  if (mode == preemption_mode::swap) {
    EXPECT_EQ(s.state(1), request_state::swapped);
    EXPECT_TRUE(contains(out.swapped_out, 1));
  } else {
    EXPECT_EQ(s.state(1), request_state::waiting);
    EXPECT_TRUE(contains(out.preempted_recompute, 1));
  }
  EXPECT_EQ(s.state(2), request_state::waiting) << "nothing else is admitted in a step that preempted";
  // Request 3 finishes; the others run to the end: nobody is lost, nothing preempted again.
  ASSERT_TRUE(s.finish(3));
  for (int step = 0; step < 40 && s.stats().running + s.stats().waiting + s.stats().swapped > 0; ++step) {
    const auto& o = s.schedule();
    for (const auto& x : o.scheduled) {
      if (x.last_chunk) {
        ASSERT_TRUE(s.complete(x.id, 7, /*finished=*/true));
      }
    }
  }
  EXPECT_EQ(s.stats().running + s.stats().waiting + s.stats().swapped, 0);
  EXPECT_EQ(s.stats().preempted_for_priority, 1);
}
}  // namespace

TEST(Scheduler, PriorityPreemptionDisplacesALowerPriorityRunningRequest) {
  for (const bool on : {false, true}) {
    {
      auto cache = *recompute_cache::create({4, 8, 0, 0});
      priority_preemption_case(cache, preemption_mode::recompute, on);
    }
    {
      auto cache = *swap_cache::create({4, 8, 0, 0, 16});
      priority_preemption_case(cache, preemption_mode::swap, on);
    }
  }
}

TEST(Scheduler, PriorityPreemptionNeedsAStrictInversionAndPriorityOrder) {
  auto cache = *recompute_cache::create({4, 8, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 0;
  cfg.priority_preemption = true;
  cfg.order = admission_order::fcfs;
  EXPECT_EQ(cfg.validate().code(), errc::invalid_argument) << "FCFS admission has no priority head";
  cfg.order = admission_order::priority;
  cfg.aging_steps = 1;
  scheduler<recompute_cache> s(cache, cfg);
  ASSERT_TRUE(s.add_request(1, prompt(16), /*priority=*/3));  // 4 blocks, 6 after six more steps
  sample_all(s, s.schedule());
  // Priority 2 waiting ages past 3 within two steps, but its own priority stays below: no displacement, ever.
  ASSERT_TRUE(s.add_request(2, prompt(16), /*priority=*/2));  // 4 blocks: never fit beside request 1
  for (int step = 0; step < 6; ++step) sample_all(s, s.schedule());
  EXPECT_GT(s.priority(2), s.priority(1)) << "aged above the running request";
  EXPECT_EQ(s.stats().preempted_for_priority, 0) << "aging alone never displaces a higher-priority request";
  EXPECT_EQ(s.state(1), request_state::running);
  // A request that fits is admitted in turn, displacing nobody.
  ASSERT_TRUE(s.finish(2));
  ASSERT_TRUE(s.add_request(3, prompt(4), /*priority=*/9));
  sample_all(s, s.schedule());
  EXPECT_EQ(s.state(3), request_state::running);
  EXPECT_EQ(s.stats().preempted_for_priority, 0);
}
