// scheduler_config::vllm_v1() and the counters kvpager-replay reports (docs/KVTRACE.md "One run step"), the
// per-request sequence_options of add_request, state() and compute_pending().
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <vector>

using namespace kvpager;

namespace {
using recompute_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;
using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;

std::vector<token_id> prompt(std::int32_t n, token_id first = 0) {
  std::vector<token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}
template <class S>
void sample_all(S& s, const step_output& out) {
  for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
}
}  // namespace

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
  auto cache = *swap_cache::create({4, 6, 0, 0}, {}, {}, {}, host_swap(host_pool_config{1}));
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
