// SPDX-License-Identifier: Apache-2.0
// Health levels: the seed's monitor demo, its check order at every threshold, the usage band, validated thresholds,
// and swaps counted over the recorder's window.
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/health.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

using namespace kvpager;
using namespace std::chrono_literals;

namespace {
/// A sample as the seed's MemoryMonitor.record takes it: a pool of `total` blocks with `free` free, `active` and
/// `waiting` requests; swaps are given cumulatively here (the recorder counts them over its window).
metrics_snapshot seed_sample(std::int32_t total, std::int32_t free, std::int32_t active, std::int32_t waiting,
                             std::int64_t swaps_so_far, std::int64_t preemptions_so_far) {
  metrics_snapshot m;
  m.usable_blocks = total;
  m.free_blocks = free;
  m.used_blocks = total - free;
  m.kv_cache_usage = double(m.used_blocks) / double(total);
  m.running = active;
  m.waiting = waiting;
  m.swap_outs = swaps_so_far;
  m.preemptions_recompute = preemptions_so_far;
  return m;
}
}  // namespace

TEST(Health, SeedMonitorDemo) {
  // The seed's samples (3.3.5): (time, free blocks, active, waiting, swap events, preempt events) on 1000 blocks,
  // one every five minutes; its swap events are those of each interval.
  struct sample {
    int minute;
    std::int32_t free, active, waiting;
    std::int64_t swaps, preempts;
  };
  const sample samples[] = {{0, 700, 8, 0, 0, 0},   {5, 500, 15, 2, 0, 0},   {10, 200, 25, 8, 3, 0},
                            {15, 100, 28, 15, 12, 0}, {20, 50, 25, 22, 8, 2}};
  const health_level expected[] = {health_level::ok, health_level::ok, health_level::ok, health_level::critical,
                                   health_level::warning};
  const utilization_band bands[] = {utilization_band::below, utilization_band::below, utilization_band::healthy,
                                    utilization_band::healthy, utilization_band::above};
  const double usage[] = {0.30, 0.50, 0.80, 0.90, 0.95};
  auto rec = *metrics_recorder::create(16);
  const health_check health;  // the seed's thresholds, its 5-minute window
  std::int64_t swaps = 0;
  std::int64_t preempts = 0;
  std::string levels;
  for (int i = 0; i < 5; ++i) {
    const sample& s = samples[i];
    swaps += s.swaps;
    preempts += s.preempts;
    ASSERT_TRUE(rec.record(seed_sample(1000, s.free, s.active, s.waiting, swaps, preempts), std::chrono::minutes(s.minute)));
    const health_report h = health.check(rec);
    EXPECT_EQ(h.level, expected[i]) << "sample " << i;
    EXPECT_EQ(h.band, bands[i]) << "sample " << i;
    EXPECT_EQ(h.swaps_in_window, s.swaps) << "the window is the sample's interval";
    EXPECT_EQ(h.waiting, s.waiting);
    EXPECT_DOUBLE_EQ(h.usage, usage[i]);
    levels += std::string(to_string(h.level)) + " ";
  }
  EXPECT_EQ(levels, "OK OK OK CRITICAL WARNING ");
  EXPECT_EQ(rec.preemptions_in_window(5min), 2);
}

TEST(Health, ChecksInTheSeedsOrderWithStrictThresholds) {
  const health_check h;
  // CRITICAL first: swaps or waiting, whatever the usage.
  EXPECT_EQ(h.check(0.10, 0, 11).level, health_level::critical);
  EXPECT_EQ(h.check(0.10, 51, 0).level, health_level::critical);
  EXPECT_EQ(h.check(0.99, 51, 11).level, health_level::critical);
  EXPECT_EQ(h.check(0.10, 0, 10).level, health_level::ok) << "10 swaps is not more than 10";
  EXPECT_EQ(h.check(0.10, 50, 0).level, health_level::warning) << "50 waiting: not CRITICAL, but over 20";
  // WARNING next: usage over 95% or waiting over 20.
  EXPECT_EQ(h.check(0.96, 0, 0).level, health_level::warning);
  EXPECT_EQ(h.check(0.95, 0, 0).level, health_level::good) << "95% is not over 95%";
  EXPECT_EQ(h.check(0.10, 21, 0).level, health_level::warning);
  EXPECT_EQ(h.check(0.10, 20, 0).level, health_level::ok);
  // GOOD: usage over 80%; else OK.
  EXPECT_EQ(h.check(0.81, 0, 0).level, health_level::good);
  EXPECT_EQ(h.check(0.80, 0, 0).level, health_level::ok);
  EXPECT_EQ(h.check(0.0, 0, 0).level, health_level::ok);
}

TEST(Health, UsageBandIsReportedBesideTheLevel) {
  const health_check h;
  EXPECT_EQ(h.check(0.59, 0, 0).band, utilization_band::below);
  EXPECT_EQ(h.check(0.60, 0, 0).band, utilization_band::healthy);
  EXPECT_EQ(h.check(0.90, 0, 0).band, utilization_band::healthy);
  EXPECT_EQ(h.check(0.91, 0, 0).band, utilization_band::above);
  EXPECT_EQ(h.check(0.70, 60, 20).band, utilization_band::healthy) << "the band ignores the level";
  EXPECT_STREQ(to_string(utilization_band::above), "above");
  EXPECT_STREQ(describe(health_level::critical), "CRITICAL - many swaps or waiting requests, add capacity");
}

TEST(Health, CustomThresholdsAreValidated) {
  health_thresholds t;
  t.critical_swaps = 2;
  t.good_usage = 0.5;
  t.window = 1min;
  const auto h = health_check::create(t);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->thresholds(), t);
  EXPECT_EQ(h->check(0.1, 0, 3).level, health_level::critical);
  EXPECT_EQ(h->check(0.6, 0, 2).level, health_level::good);

  const auto refused = [](health_thresholds bad) { return health_check::create(bad).error().code(); };
  health_thresholds bad;
  bad.warning_usage = 1.5;
  EXPECT_EQ(refused(bad), errc::invalid_argument);
  bad = {};
  bad.good_usage = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(refused(bad), errc::invalid_argument);
  bad = {};
  bad.band_low = 0.95;
  EXPECT_EQ(refused(bad), errc::invalid_argument) << "band_low over band_high";
  bad = {};
  bad.critical_waiting = -1;
  EXPECT_EQ(refused(bad), errc::invalid_argument);
  bad = {};
  bad.window = -1s;
  EXPECT_EQ(refused(bad), errc::invalid_argument);
  EXPECT_TRUE(validate(health_thresholds{}));
}

TEST(Health, SwapsOutsideTheWindowDoNotCount) {
  auto rec = *metrics_recorder::create(64);
  const health_check h;
  EXPECT_EQ(h.check(rec), h.check(0.0, 0, 0)) << "an empty history is OK";
  // 20 swaps in the first minute, none after: CRITICAL until they leave the 5-minute window.
  metrics_snapshot m;
  ASSERT_TRUE(rec.record(m, 0s));
  m.swap_outs = 20;
  ASSERT_TRUE(rec.record(m, 60s));
  EXPECT_EQ(h.check(rec).level, health_level::critical);
  ASSERT_TRUE(rec.record(m, 300s));
  EXPECT_EQ(h.check(rec).swaps_in_window, 20) << "the window reaches back to 0 s";
  ASSERT_TRUE(rec.record(m, 360s));
  EXPECT_EQ(h.check(rec).swaps_in_window, 0);
  EXPECT_EQ(h.check(rec).level, health_level::ok);
}

// Issue 21, point 10 (seed 3.3.5, point 3: "a waiting queue that keeps growing means the pool needs more capacity"):
// the check sees the queue's growth over the recorder's window, not only its length. 15 waiting is below the
// WARNING length (20), but a queue that went from 0 to 25 within the window is WARNING; once the growth leaves the
// window (the queue stays at 25: no longer growing) only the length counts, and 25 is WARNING by length. A queue
// that shrank is not growth.
TEST(Health, GrowingWaitingQueueOverTheWindowIsWarning) {
  auto rec = *metrics_recorder::create(64);
  const health_check h;
  metrics_snapshot m;
  m.kv_cache_usage = 0.5;
  m.waiting = 0;
  ASSERT_TRUE(rec.record(m, 0s));
  m.waiting = 15;
  ASSERT_TRUE(rec.record(m, 60s));
  EXPECT_EQ(h.check(rec).waiting_growth, 15);
  EXPECT_EQ(h.check(rec).level, health_level::ok) << "grew by 15: not more than the threshold (20)";
  m.waiting = 21;
  ASSERT_TRUE(rec.record(m, 120s));
  EXPECT_EQ(h.check(rec).waiting_growth, 21);
  EXPECT_EQ(h.check(rec).level, health_level::warning) << "21 > 20 waiting, and grew by 21";
  // A threshold of its own, below the length's: growth alone makes it WARNING.
  health_thresholds t;
  t.warning_waiting_growth = 10;
  t.warning_waiting = 1000;
  const health_check g = *health_check::create(t);
  EXPECT_EQ(g.check(rec).level, health_level::warning) << "grew by 21 > 10 within 5 minutes";
  ASSERT_TRUE(rec.record(m, 500s));  // the window (200-500 s) starts at 21 waiting: no growth
  EXPECT_EQ(g.check(rec).waiting_growth, 0);
  EXPECT_EQ(g.check(rec).level, health_level::ok) << "a long queue that stopped growing is the length rule's";
  m.waiting = 5;
  ASSERT_TRUE(rec.record(m, 520s));
  EXPECT_LT(g.check(rec).waiting_growth, 0);
  EXPECT_EQ(g.check(rec).level, health_level::ok);
  t.warning_waiting_growth = -1;
  EXPECT_FALSE(health_check::create(t)) << "a negative threshold is refused";
  t.warning_waiting_growth = std::numeric_limits<std::int64_t>::max();
  ASSERT_TRUE(health_check::create(t));
  EXPECT_EQ(h.check(0.5, 0, 0, std::numeric_limits<std::int64_t>::max()).level, health_level::warning);
  EXPECT_EQ(health_check::create(t)->check(0.5, 0, 0, std::numeric_limits<std::int64_t>::max()).level,
            health_level::ok)
      << "INT64_MAX turns the growth rule off";
}
