// SPDX-License-Identifier: Apache-2.0
// What an engine does with the monitor every step (snapshot, record, health check) allocates nothing, and writing
// the Prometheus text or the JSON allocates nothing after the first call. This executable replaces the global
// operator new to count allocations (so it is a test executable of its own).
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/health.hpp>
#include <kvpager/monitor/prometheus.hpp>
#include <kvpager/monitor/json.hpp>

#include <gtest/gtest.h>

#include "kvpager_testing/allocation_probe.hpp"

#include <chrono>
#include <cstdint>
#include <string>

#include "monitor/scenario.hpp"

using namespace kvpager;

TEST(MonitorAllocations, EveryStepOfARealRunAllocatesNothingInTheMonitor) {
  using namespace kvtest_monitor;
  cache_t cache = make_cache();
  sched_t s(cache, sched_config());
  auto rec = *metrics_recorder::create(16);  // wraps during the run
  const health_check health;
  std::string prom;
  metrics_json_writer json;
  const std::int64_t bpb = kv_bytes_per_block(geometry, num_layers);
  write_prometheus(prom, take_snapshot(cache, s, bpb));  // the first call sizes the string
  std::int64_t inside = 0;
  int critical = 0;
  std::size_t text_bytes = 0;
  run(cache, s, 60, [&](int step) {
    const std::int64_t before = probe::allocations.load();
    const metrics_snapshot m = take_snapshot(cache, s, bpb);
    const status st = rec.record(m, std::chrono::seconds(step));
    const health_report h = health.check(rec);
    write_prometheus(prom, m);
    const std::string& j = json.write(m);
    inside += probe::allocations.load() - before;
    EXPECT_TRUE(st);
    critical += h.level == health_level::critical ? 1 : 0;
    text_bytes += prom.size() + j.size();
  });
  EXPECT_EQ(inside, 0);
  EXPECT_GT(text_bytes, 0U);
  EXPECT_EQ(rec.size(), 16U);
  EXPECT_GT(critical, 0) << "43 waiting requests and more: CRITICAL";
}

TEST(MonitorAllocations, TheCounterCounts) {
  // The probe sees allocations: the first Prometheus write into an empty string allocates, as does building the
  // JSON writer.
  std::string prom;
  std::int64_t before = probe::allocations.load();
  write_prometheus(prom, metrics_snapshot{});
  EXPECT_GT(probe::allocations.load() - before, 0);
  before = probe::allocations.load();
  const metrics_json_writer json;
  EXPECT_GT(probe::allocations.load() - before, 0);
  before = probe::allocations.load();
  write_prometheus(prom, metrics_snapshot{});
  EXPECT_EQ(probe::allocations.load() - before, 0);
}
