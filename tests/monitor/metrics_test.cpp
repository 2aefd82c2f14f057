// SPDX-License-Identifier: Apache-2.0
// metrics_snapshot from a real cache and scheduler, the cache's swap and waste counters, the scheduler's admission
// answers, and the recorder's bounded history and windows.
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/health.hpp>
#include <kvpager/monitor/prometheus.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "monitor/scenario.hpp"

using namespace kvpager;
using namespace std::chrono_literals;

namespace {
using plain_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;

/// Internal waste computed from the block tables themselves: slots of every live sequence's table minus its tokens.
template <class Cache>
std::int64_t waste_from_tables(const Cache& c, seq_id max_id) {
  std::int64_t waste = 0;
  for (seq_id id = 0; id <= max_id; ++id) {
    if (!c.contains(id)) continue;
    const auto table = c.is_swapped(id) ? c.host_block_table(id) : c.block_table(id);
    waste += static_cast<std::int64_t>(table->size()) * c.config().block_size - *c.num_tokens(id);
  }
  return waste;
}
}  // namespace

TEST(Metrics, BytesPerBlockFromTheGeometry) {
  // Llama-2-7B: 32 KV heads x 128 x fp16, K and V: 16 KiB per token per layer, 512 KiB over its 32 layers.
  const kv_geometry g{100, 16, 32, 128, kv_dtype::f16};
  EXPECT_EQ(kv_bytes_per_block(g), 16 * 16 * 1024);
  EXPECT_EQ(kv_bytes_per_block(g, 32), 16 * 512 * 1024);
  EXPECT_EQ(kv_bytes_per_block({100, 16, 8, 128, kv_dtype::f32}, 2), 2 * 16 * 8 * 128 * 4 * 2);
  EXPECT_EQ(kv_bytes_per_block(g, 0), 0);
  EXPECT_EQ(kv_bytes_per_block({100, 16, 0, 128, kv_dtype::f16}), 0);
}

// Issue 21, point 8: the monitor's byte and counter arithmetic at the extremes. A geometry whose block does not fit
// in int64 is an error (and 0 bytes per block, so no byte figure is reported), byte counts saturate instead of
// wrapping negative, and the summed counters saturate (UBSan reported signed overflow in each before).
namespace {
/// A cache whose stats() are whatever the test sets: take_snapshot reads nothing else.
struct stats_only_cache {
  cache_stats s;
  [[nodiscard]] cache_stats stats() const noexcept { return s; }
};
}  // namespace

TEST(Metrics, CheckedArithmeticAtTheExtremes) {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  constexpr std::int32_t max32 = std::numeric_limits<std::int32_t>::max();
  const kv_geometry huge{1, max32, max32, max32, kv_dtype::f32};
  EXPECT_EQ(kv_bytes_per_block(huge, max32), 0);
  EXPECT_EQ(kv_bytes_per_block({1, 1 << 20, 1 << 20, 1 << 21, kv_dtype::f16}, 1), 0) << "2 x 2 bytes x 2^61 = 2^63";
  EXPECT_EQ(kv_bytes_per_block({1, 1 << 20, 1 << 20, 1 << 20, kv_dtype::f16}, 1), std::int64_t{1} << 62);
  const result<std::int64_t> r = checked_kv_bytes_per_block(huge, 32);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::invalid_argument);
  EXPECT_FALSE(checked_kv_bytes_per_block({1, 16, 0, 128, kv_dtype::f16}));
  ASSERT_TRUE(checked_kv_bytes_per_block({1, 16, 32, 128, kv_dtype::f16}, 32));
  EXPECT_EQ(*checked_kv_bytes_per_block({1, 16, 32, 128, kv_dtype::f16}, 32), 8 << 20);
  EXPECT_EQ(kv_block_bytes(huge, max32), 0) << "the swap cost model's block bytes, checked the same way";

  stats_only_cache c;
  c.s.block_size = max32;
  c.s.total = max32;
  c.s.logical = max;
  c.s.swapped_logical = max;
  c.s.tokens = 0;
  c.s.swapped_out_blocks = max;
  c.s.swapped_in_blocks = max / 3;
  c.s.swap_outs = max;
  c.s.swap_ins = max;
  c.s.preempted_swap = max;
  c.s.preempted_recompute = max;
  EXPECT_EQ(c.s.internal_waste_tokens(), max);
  const metrics_snapshot m = take_snapshot(c, std::int64_t{1} << 40);
  EXPECT_EQ(m.swapped_out_bytes, max);
  EXPECT_EQ(m.swapped_in_bytes, max);
  EXPECT_EQ(m.internal_waste_tokens, max);
  EXPECT_GE(m.internal_waste_bytes, 0);
  EXPECT_EQ(m.internal_waste_bytes, max) << "max x 2^40 / (2^31 - 1) does not fit: saturated";
  EXPECT_EQ(m.preemptions(), max);
  EXPECT_EQ(m.swap_events(), max);
  // Exact where the result fits although the product does not: x * b / bs with x * b past int64.
  c.s = cache_stats{};
  c.s.block_size = 1 << 20;
  c.s.logical = std::int64_t{1} << 30;
  const metrics_snapshot e = take_snapshot(c, std::int64_t{1} << 30);
  EXPECT_EQ(e.internal_waste_tokens, std::int64_t{1} << 50);
  EXPECT_EQ(e.internal_waste_bytes, std::int64_t{1} << 60) << "2^50 tokens x 2^30 bytes / 2^20 (2^80 on the way)";
  // The exports of a saturated snapshot hold no negative number.
  std::string prom;
  write_prometheus(prom, m);
  EXPECT_EQ(prom.find(" -"), std::string::npos) << prom;
}

TEST(Metrics, SnapshotOfARealRunAgreesWithTheCacheAndTheScheduler) {
  using namespace kvtest_monitor;
  cache_t cache = make_cache();
  sched_t s(cache, sched_config());
  const std::int64_t bpb = kv_bytes_per_block(geometry, num_layers);
  std::int64_t max_usage_steps = 0;
  run(cache, s, 40, [&](int) {
    const metrics_snapshot m = take_snapshot(cache, s, bpb);
    const cache_stats c = cache.stats();
    const scheduler_stats st = s.stats();
    // vLLM's usage: cached, unreferenced blocks are free.
    ASSERT_EQ(m.used_blocks, c.total - c.available());
    ASSERT_DOUBLE_EQ(m.kv_cache_usage, double(c.total - c.available()) / double(c.total));
    ASSERT_EQ(m.running, st.running);
    ASSERT_EQ(m.waiting, st.waiting);
    ASSERT_EQ(m.swapped, st.swapped);
    ASSERT_EQ(m.swap_outs, st.preempted_swap) << "the scheduler swaps out only to preempt";
    ASSERT_EQ(m.swap_ins, st.swapped_in);
    ASSERT_EQ(m.swapped_out_bytes, c.swapped_out_blocks * bpb);
    ASSERT_EQ(m.swapped_in_bytes, c.swapped_in_blocks * bpb);
    ASSERT_EQ(m.preemptions(), st.preempted_recompute + st.preempted_swap);
    ASSERT_EQ(m.prefix_queries, st.prefix.query_tokens);
    ASSERT_EQ(m.prefix_hits, st.prefix.hit_tokens);
    ASSERT_EQ(m.internal_waste_tokens, waste_from_tables(cache, 1000));
    ASSERT_GE(m.internal_waste_tokens, 0);
    ASSERT_LE(m.internal_waste_tokens, std::int64_t{m.block_size - 1} * c.sequences);
    ASSERT_EQ(m.internal_waste_bytes, m.internal_waste_tokens * bpb / 16);
    ASSERT_EQ(m.shared_blocks, c.shared);
    ASSERT_DOUBLE_EQ(m.sharing_ratio, c.logical > 0 ? 1.0 - double(c.used) / double(c.logical) : 0.0);
    ASSERT_EQ(m.admission_ok + m.admission_later + m.admission_never, st.answered_ok + st.answered_later + st.rejected);
    if (m.kv_cache_usage > 0.9) ++max_usage_steps;
  });
  const metrics_snapshot m = take_snapshot(cache, s, bpb);
  // The run reached every figure (the exposition test relies on it too).
  EXPECT_GT(max_usage_steps, 0);
  EXPECT_GT(m.waiting, 0);
  EXPECT_GT(m.preemptions_swap, 0);
  EXPECT_GT(m.preemptions_recompute, 0);
  EXPECT_EQ(m.swap_fallback_recompute, m.preemptions_recompute) << "every recompute here is a refused swap";
  EXPECT_GT(m.prefix_hits, 0);
  EXPECT_GT(m.resumed_prefix_queries, 0);
  EXPECT_GT(m.evictions, 0);
  EXPECT_GT(m.shared_blocks, 0);
  EXPECT_EQ(m.admission_never, 1);
  EXPECT_EQ(m.steps, 40);
}

TEST(Metrics, CacheAloneCountsItsOwnSwapsAndTheHostTablesWaste) {
  auto cache = *plain_cache::create({16, 32, 0, 0, 16});
  ASSERT_TRUE(cache.add_sequence(1, 20));  // 2 blocks, 12 slots unused
  ASSERT_TRUE(cache.add_sequence(2, 33));  // 3 blocks, 15 unused
  cache.begin_step();
  metrics_snapshot m = take_snapshot(cache, 1000);
  EXPECT_EQ(m.internal_waste_tokens, 27);
  EXPECT_EQ(m.internal_waste_bytes, 27 * 1000 / 16);
  EXPECT_EQ(m.used_blocks, 5);
  EXPECT_EQ(m.running, 0) << "no scheduler: no request figures";
  ASSERT_TRUE(cache.swap_out(2));
  m = take_snapshot(cache, 1000);
  EXPECT_EQ(m.swap_outs, 1);
  EXPECT_EQ(m.swapped_out_blocks, 3);
  EXPECT_EQ(m.swapped_out_bytes, 3000);
  EXPECT_EQ(m.swapped, 1);
  EXPECT_EQ(m.internal_waste_tokens, 27) << "the swapped table's slots still count";
  EXPECT_EQ(m.used_blocks, 2);
  cache.begin_step();
  ASSERT_TRUE(cache.swap_in(2));
  m = take_snapshot(cache, 1000);
  EXPECT_EQ(m.swap_ins, 1);
  EXPECT_EQ(m.swap_events(), 2);
  EXPECT_EQ(m.swapped_in_bytes, 3000);
  EXPECT_EQ(take_snapshot(cache).swapped_in_bytes, 0) << "no bytes per block: no bytes";
  // A failed swap counts nothing.
  cache.begin_step();
  ASSERT_FALSE(cache.swap_in(2));
  EXPECT_EQ(take_snapshot(cache, 1000), m);
}

TEST(Metrics, SchedulerCountsEachAdmissionAnswer) {
  using cache_t = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, recompute>;
  auto cache = *cache_t::create({16, 10, 0, 0});
  scheduler<cache_t> s(cache);
  const std::vector<token_id> six_blocks(16 * 6, 1);
  EXPECT_EQ(*s.add_request(1, six_blocks), admission::ok);
  (void)s.schedule();
  EXPECT_EQ(*s.add_request(2, six_blocks), admission::later);
  EXPECT_EQ(*s.add_request(3, std::vector<token_id>(16 * 11, 1)), admission::never);
  EXPECT_EQ(s.add_request(2, six_blocks).code(), errc::duplicate_sequence);  // an error is no answer
  const scheduler_stats st = s.stats();
  EXPECT_EQ(st.answered_ok, 1);
  EXPECT_EQ(st.answered_later, 1);
  EXPECT_EQ(st.rejected, 1);
  const metrics_snapshot m = take_snapshot(cache, s);
  EXPECT_EQ(m.admission_ok, 1);
  EXPECT_EQ(m.admission_later, 1);
  EXPECT_EQ(m.admission_never, 1);
}

namespace {
metrics_snapshot with_swaps(std::int64_t outs, std::int32_t waiting = 0) {
  metrics_snapshot m;
  m.swap_outs = outs;
  m.swap_ins = outs / 2;
  m.waiting = waiting;
  return m;
}
}  // namespace

TEST(Recorder, CapacityIsChecked) {
  EXPECT_EQ(metrics_recorder::create(0).error().code(), errc::invalid_argument);
  EXPECT_EQ(metrics_recorder::create(-3).error().code(), errc::invalid_argument);
  EXPECT_EQ(metrics_recorder::create(metrics_recorder::max_capacity + 1).error().code(), errc::invalid_argument);
  const auto r = metrics_recorder::create(3);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->capacity(), 3U);
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(r->swaps_in_window(1s), 0);
}

TEST(Recorder, KeepsTheNewestSamplesInOrder) {
  auto r = *metrics_recorder::create(3);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(r.record(with_swaps(i, i), std::chrono::seconds(i)));
  EXPECT_EQ(r.size(), 3U);
  EXPECT_EQ(r.recorded(), 5);
  EXPECT_EQ(r.oldest().time, 2s);
  EXPECT_EQ(r.newest().time, 4s);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(r[i].metrics.waiting, static_cast<std::int32_t>(i) + 2);
  r.clear();
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.capacity(), 3U);
}

TEST(Recorder, AnEarlierTimeIsRefusedAndChangesNothing) {
  auto r = *metrics_recorder::create(4);
  ASSERT_TRUE(r.record(with_swaps(1), 10s));
  ASSERT_TRUE(r.record(with_swaps(2), 10s)) << "the same time is fine";
  const timed_snapshot newest = r.newest();
  EXPECT_EQ(r.record(with_swaps(3), 9s).code(), errc::invalid_argument);
  EXPECT_EQ(r.size(), 2U);
  EXPECT_EQ(r.recorded(), 2);
  EXPECT_EQ(r.newest(), newest);
}

TEST(Recorder, WindowsStartAtTheLastSampleOldEnough) {
  auto r = *metrics_recorder::create(8);
  // Cumulative swap-outs 0, 4, 10, 30 at 0, 60, 120, 180 s (swap-ins are half of them).
  const std::int64_t outs[] = {0, 4, 10, 30};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.record(with_swaps(outs[i]), std::chrono::seconds(60 * i)));
  EXPECT_EQ(r.window_start(60s).time, 120s);
  EXPECT_EQ(r.window_start(61s).time, 60s);
  EXPECT_EQ(r.window_start(0s).time, 180s);
  EXPECT_EQ(r.window_start(1h).time, 0s) << "a window longer than the history starts at its oldest sample";
  EXPECT_EQ(r.window_start(std::chrono::nanoseconds::max()).time, 0s) << "no overflow";
  EXPECT_EQ(r.window_start(std::chrono::nanoseconds::min()).time, 180s) << "a negative window: the newest alone";
  EXPECT_EQ(r.swaps_in_window(60s), (30 + 15) - (10 + 5));
  EXPECT_EQ(r.swaps_in_window(1h), 45);
  EXPECT_EQ(r.increase(&metrics_snapshot::swap_outs, 120s), 26);
  // After the ring wrapped, windows are computed over what it holds.
  for (int i = 4; i < 12; ++i) ASSERT_TRUE(r.record(with_swaps(30 + i), std::chrono::seconds(60 * i)));
  EXPECT_EQ(r.oldest().time, 240s);
  EXPECT_EQ(r.window_start(120s).time, 540s);
  EXPECT_EQ(r.increase(&metrics_snapshot::swap_outs, 120s), 2);
}
