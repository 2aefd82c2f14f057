// SPDX-License-Identifier: Apache-2.0
// The monitor's cost per step against the scheduler step it watches, measured in the same run (bench/RESULTS.md):
// a snapshot + record + health check (target: under 1 us), the Prometheus text (target: under 20 us) and the JSON
// text of a snapshot, and the scheduler step of 256 running requests under memory pressure as the baseline.
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/health.hpp>
#include <kvpager/monitor/prometheus.hpp>
#include <kvpager/monitor/json.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

using namespace kvpager;
using kvbench::must;
using cache_t = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;

/// bench_sched's scheduler_step_256 set-up: 256 running requests whose KV outgrows the pool (about one step in
/// sixteen preempts or swaps in), warmed up past the admissions.
struct pressured_run {
  static constexpr int batch = 256;
  cache_t cache = must(cache_t::create({16, batch * 34, 1, 0, batch * 8}));
  scheduler<cache_t> sched{cache, [] {
                             scheduler_config cfg;
                             cfg.max_num_seqs = batch;
                             cfg.max_num_batched_tokens = 1 << 20;
                             return cfg;
                           }()};
  std::mt19937 rng{1};
  seq_id next = 0;

  pressured_run() {
    top_up();
    for (int i = 0; i < 8; ++i) sample(sched.schedule());
  }
  void top_up() {
    while (sched.stats().running + sched.stats().waiting + sched.stats().swapped < batch)
      (void)sched.add_request(next++, kvbench::random_prompt(rng, 384 + static_cast<std::int32_t>(rng() % 256)));
  }
  void sample(const step_output& out) {
    for (const auto& s : out.scheduled)
      (void)sched.complete(s.id, static_cast<token_id>(rng() % 50000), sched.tokens(s.id).size() > 1200);
  }
};

constexpr std::int64_t bytes_per_block = kv_bytes_per_block({0, 16, 8, 128, kv_dtype::f16}, 32);

/// Baseline: one schedule() (sampling and new arrivals outside the timing), as bench_sched measures it.
void BM_SchedulerStep(benchmark::State& state) {
  pressured_run r;
  for (auto _ : state) {
    const auto& out = r.sched.schedule();
    state.PauseTiming();
    r.sample(out);
    r.top_up();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_SchedulerStep)->Name("monitor/scheduler_step_256 (baseline)");

/// What an engine adds per step: a snapshot of the cache and the scheduler, recorded, and the health check over
/// the recorder's window.
void BM_SnapshotAndHealth(benchmark::State& state) {
  pressured_run r;
  auto rec = must(metrics_recorder::create(4096));
  const health_check health;
  std::int64_t t = 0;
  for (auto _ : state) {
    const metrics_snapshot m = take_snapshot(r.cache, r.sched, bytes_per_block);
    (void)rec.record(m, std::chrono::milliseconds(t += 20));
    const health_report h = health.check(rec);
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_SnapshotAndHealth)->Name("monitor/snapshot+record+health");

/// The snapshot alone.
void BM_Snapshot(benchmark::State& state) {
  pressured_run r;
  for (auto _ : state) {
    const metrics_snapshot m = take_snapshot(r.cache, r.sched, bytes_per_block);
    benchmark::DoNotOptimize(m);
  }
}
BENCHMARK(BM_Snapshot)->Name("monitor/snapshot");

/// The Prometheus text of a snapshot of the run, into a reused string (a scrape).
void BM_PrometheusText(benchmark::State& state) {
  pressured_run r;
  const metrics_snapshot m = take_snapshot(r.cache, r.sched, bytes_per_block);
  std::string text;
  for (auto _ : state) {
    write_prometheus(text, m);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
}
BENCHMARK(BM_PrometheusText)->Name("monitor/prometheus_text");

/// The JSON text of the same snapshot (metrics_json_writer, compact).
void BM_JsonText(benchmark::State& state) {
  pressured_run r;
  const metrics_snapshot m = take_snapshot(r.cache, r.sched, bytes_per_block);
  metrics_json_writer json;
  for (auto _ : state) benchmark::DoNotOptimize(json.write(m).data());
}
BENCHMARK(BM_JsonText)->Name("monitor/json_text");

}  // namespace

BENCHMARK_MAIN();
