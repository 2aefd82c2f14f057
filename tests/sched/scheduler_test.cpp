// Scheduler decisions: admission answers, watermark, victims, no admission in a step that preempted, swap-in
// before admission, aging.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

using namespace kvpager;

namespace {
using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;
using recompute_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;

std::vector<token_id> prompt(std::int32_t n, token_id first = 0) {
  std::vector<token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}
template <class S>
void sample_all(S& s, const step_output& out) {
  for (const auto& x : out.scheduled) ASSERT_TRUE(s.complete(x.id, 1));
}
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

TEST(Scheduler, SeedWatermarkKeepsTenPercent) {
  auto cache = *recompute_cache::create({16, 500, 0, 0});
  scheduler_config cfg;
  cfg.watermark_permille = 100;  // the seed's 10% buffer
  scheduler<recompute_cache> s(cache, cfg);
  EXPECT_EQ(*s.add_request(1, prompt(16 * 450)), admission::ok);
  EXPECT_EQ(*s.add_request(2, prompt(16 * 451)), admission::never);
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
  auto cache = *swap_cache::create({4, 9, 1, 0}, {}, {}, {}, host_swap(host_pool_config{16}));
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
