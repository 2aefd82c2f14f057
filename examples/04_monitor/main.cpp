// SPDX-License-Identifier: Apache-2.0
// The seed's MemoryMonitor demo (3.3.5), then the same monitor on a real serving run.
//
// Part 1: a pool of 1000 blocks sampled every five minutes with the seed's numbers (free blocks, active and waiting
// requests, swap events in the interval). The recorder keeps the history; the health check, with the seed's
// thresholds and order, prints OK, OK, OK, CRITICAL (12 swaps), WARNING (22 waiting) and the usage band beside it.
// Part 2: a scheduler over a prefix-caching cache; every step is snapshotted, recorded and checked, and the last
// snapshot is exposed as Prometheus text (the vLLM-named lines are printed). Exits non-zero if a number is wrong.
// The seed's own demo prints the same levels; its fifth sample also carries 2 preemptions, which the seed's health
// rule does not read (recorded here as the counter an engine would report).
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/health.hpp>
#include <kvpager/monitor/prometheus.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.hpp"

namespace {
// Checks a statement silently when it holds (these run every sample or step); a wrong one is printed and counted.
void expect(bool ok, const char* what) {
  if (!ok) example::check_that(ok, what);
}

int seed_demo() {
  struct sample {
    const char* time;
    std::int32_t free, active, waiting;
    std::int64_t swaps, preemptions;
    std::int32_t usage_percent;  // what the seed prints: (1000 - free) / 1000 x 100
  };
  const sample samples[] = {{"10:00", 700, 8, 0, 0, 0, 30},
                            {"10:05", 500, 15, 2, 0, 0, 50},
                            {"10:10", 200, 25, 8, 3, 0, 80},
                            {"10:15", 100, 28, 15, 12, 0, 90},
                            {"10:20", 50, 25, 22, 8, 2, 95}};
  const kvpager::health_level expected[] = {kvpager::health_level::ok, kvpager::health_level::ok,
                                            kvpager::health_level::ok, kvpager::health_level::critical,
                                            kvpager::health_level::warning};
  auto rec = kvpager::metrics_recorder::create(100);
  if (!rec) return 1;
  const kvpager::health_check health;  // the seed's thresholds; swaps counted over 5 minutes
  std::int64_t swaps = 0, preemptions = 0;
  for (int i = 0; i < 5; ++i) {
    const sample& s = samples[i];
    kvpager::metrics_snapshot m;
    m.usable_blocks = 1000;
    m.used_blocks = 1000 - s.free;
    m.free_blocks = s.free;
    m.kv_cache_usage = double(m.used_blocks) / 1000.0;
    m.running = s.active;
    m.waiting = s.waiting;
    swaps += s.swaps;
    m.swap_outs = swaps;  // cumulative, as an engine's counters are
    preemptions += s.preemptions;
    m.preemptions_recompute = preemptions;
    if (!rec->record(m, std::chrono::minutes(5 * i))) return 1;
    const kvpager::health_report h = health.check(*rec);
    std::printf("%s: usage=%.0f%% (%s band), active=%d, waiting=%d, swaps in 5 min=%lld, state=%s\n", s.time,
                h.usage * 100, kvpager::to_string(h.band), s.active, s.waiting,
                static_cast<long long>(h.swaps_in_window), kvpager::describe(h.level));
    expect(h.level == expected[i], "the seed's demo prints OK, OK, OK, CRITICAL, WARNING");
    expect(h.swaps_in_window == s.swaps, "swaps in the window are the interval's");
    expect(static_cast<std::int32_t>(h.usage * 100 + 0.5) == s.usage_percent, "usage is the seed's");
  }
  return 0;
}

using cache_t = kvpager::vllm_v1_cache;

std::vector<kvpager::token_id> prompt(std::int32_t n, kvpager::token_id own) {
  std::vector<kvpager::token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(i < 32 ? 500 + i : own * 1000 + i);  // a shared system prompt
  return p;
}

int serving_run() {
  const kvpager::kv_geometry g{256, 16, 8, 128, kvpager::kv_dtype::f16};  // per layer; 32 layers
  auto created = cache_t::create(kvpager::cache_config_for(g, {.reserved_blocks = 1}));
  if (!created) return 1;
  cache_t& cache = *created;
  kvpager::scheduler<cache_t> sched(cache, kvpager::scheduler_config::vllm_v1());
  auto rec = kvpager::metrics_recorder::create(1024);
  if (!rec) return 1;
  const kvpager::health_check health;
  const std::int64_t bytes_per_block = kvpager::kv_bytes_per_block(g, 32);
  std::string text;  // reused: allocates only on the first write

  kvpager::seq_id next = 0;
  std::vector<std::int32_t> generated(64, 0);
  int worst = 0;
  for (int step = 0; step < 120; ++step) {
    if (step % 4 == 0 && next < 40) {
      (void)sched.add_request(next, prompt(100 + 20 * static_cast<std::int32_t>(next % 4), static_cast<kvpager::token_id>(next)));
      ++next;
    }
    const kvpager::step_output& out = sched.schedule();
    for (const kvpager::scheduled_sequence& x : out.scheduled) {
      if (!x.last_chunk) continue;
      const bool done = ++generated[static_cast<std::size_t>(x.id)] >= 60;
      (void)sched.complete(x.id, 1, done);
    }
    const kvpager::metrics_snapshot m = kvpager::take_snapshot(cache, sched, bytes_per_block);
    if (!rec->record(m, std::chrono::milliseconds(25 * step))) return 1;  // a 25 ms step
    const kvpager::health_report h = health.check(*rec);
    if (static_cast<int>(h.level) > worst) worst = static_cast<int>(h.level);
  }
  const kvpager::metrics_snapshot& last = rec->newest().metrics;
  kvpager::write_prometheus(text, last);
  std::printf("\nafter 120 steps (worst health %s); the vLLM-named lines of the Prometheus text:\n",
              kvpager::to_string(static_cast<kvpager::health_level>(worst)));
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = text.find('\n', pos);
    const std::string_view line(text.data() + pos, end - pos);
    for (const char* name : {"kv_cache_usage_perc ", "num_requests_running ", "num_requests_waiting ",
                             "num_preemptions_total ", "prefix_cache_queries_total ", "prefix_cache_hits_total "})
      if (line.rfind(std::string("kvpager:") + name, 0) == 0) std::printf("  %.*s\n", int(line.size()), line.data());
    pos = end + 1;
  }
  expect(last.steps == 120, "the snapshot counts the steps");
  expect(last.prefix_hits > 0 && last.prefix_hits < last.prefix_queries, "the shared system prompt hits");
  expect(last.kv_cache_usage >= 0.0 && last.kv_cache_usage <= 1.0, "usage is a fraction");
  expect(last.internal_waste_tokens <= std::int64_t{15} * (last.running + last.swapped),
         "internal waste is under one block per sequence");
  expect(text.size() <= kvpager::prometheus_max_size(), "the text fits its bound");
  return 0;
}
}  // namespace

int main() {
  if (seed_demo() != 0 || serving_run() != 0) return 1;
  return example::exit_code();
}
