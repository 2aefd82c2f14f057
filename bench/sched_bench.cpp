// SPDX-License-Identifier: Apache-2.0
// Memory pressure: a scheduler step with 256 running requests under pressure, and the cost of planning swaps per
// block, each against a baseline measured in the same run (see bench/RESULTS.md).
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bench_util.hpp"

namespace {

using namespace kvpager;
using kvbench::must;
using cache_t = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;

/// One schedule() + sampling for 256 running requests whose KV outgrows the pool: every step decodes one token
/// each, and about one step in sixteen preempts (swap while the host pool has room, else recompute) or swaps in.
/// `Tuning` 1: the batch size tuner runs every step but its bounds pin the limit at 256 (same decisions: its cost
/// alone). 2: tuning for real (dynamic batch size in [1, 256], adaptive swap-or-recompute): other decisions.
template <int Tuning>
void BM_SchedulerStep(benchmark::State& state) {
  constexpr int batch = 256;
  auto cache = must(cache_t::create({16, batch * 34, 1, 0, batch * 8}));
  scheduler_config cfg;
  cfg.max_num_seqs = batch;
  cfg.max_num_batched_tokens = 1 << 20;
  if constexpr (Tuning > 0) {
    cfg.batch_tuning.enabled = true;
    cfg.batch_tuning.max_seqs = batch;
    cfg.batch_tuning.min_seqs = Tuning == 1 ? batch : 1;
  }
  if constexpr (Tuning == 2) {
    cfg.preemption = preemption_mode::adaptive;
    cfg.swap_cost.block_bytes = kv_block_bytes({.num_blocks = 1, .block_size = 16, .num_kv_heads = 8}, 32);
    cfg.swap_cost.prefill_seconds_per_token = 50e-6;
  }
  scheduler<cache_t> sched(must(scheduler<cache_t>::create(cache, cfg)));
  std::mt19937 rng(1);
  seq_id next = 0;
  auto top_up = [&] {
    while (sched.stats().running + sched.stats().waiting + sched.stats().swapped < batch)
      (void)sched.add_request(next++, kvbench::random_prompt(rng, 384 + static_cast<std::int32_t>(rng() % 256)));
  };
  top_up();
  for (int i = 0; i < 8; ++i) {  // warm up past the admissions
    const auto& out = sched.schedule();
    for (const auto& s : out.scheduled) (void)sched.complete(s.id, static_cast<token_id>(rng() % 50000));
  }
  std::int64_t preempted = 0;
  std::int64_t scheduled = 0;
  for (auto _ : state) {
    const auto& out = sched.schedule();
    preempted += static_cast<std::int64_t>(out.swapped_out.size() + out.preempted_recompute.size());
    scheduled += static_cast<std::int64_t>(out.scheduled.size());
    state.PauseTiming();
    for (const auto& s : out.scheduled)
      (void)sched.complete(s.id, static_cast<token_id>(rng() % 50000), sched.tokens(s.id).size() > 1200);
    top_up();
    state.ResumeTiming();
  }
  state.counters["preemptions_per_step"] = static_cast<double>(preempted) / static_cast<double>(state.iterations());
  state.counters["scheduled_per_step"] = static_cast<double>(scheduled) / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_SchedulerStep<0>)->Name("scheduler_step_256/kvpager");
BENCHMARK(BM_SchedulerStep<1>)->Name("scheduler_step_256/kvpager_tuner_pinned");
BENCHMARK(BM_SchedulerStep<2>)->Name("scheduler_step_256/kvpager_tuned");

/// Baseline: the cache work alone for the same step shape (256 token-id appends, prefix caching on).
void BM_CacheStep(benchmark::State& state) {
  constexpr int batch = 256;
  auto cache = must(cache_t::create({16, batch * 140, 1, 0, 0}));
  std::mt19937 rng(1);
  std::vector<std::vector<token_id>> tokens;
  for (seq_id id = 0; id < batch; ++id) {
    tokens.push_back(kvbench::random_prompt(rng, 2048));
    must(cache.add_sequence(id, std::span<const token_id>(tokens.back()).first(512)));
  }
  std::int32_t pos = 512;
  for (auto _ : state) {
    if (pos == 2048) {
      state.PauseTiming();
      cache.begin_step();
      for (seq_id id = 0; id < batch; ++id) must(cache.free_sequence(id));
      for (seq_id id = 0; id < batch; ++id) must(cache.add_sequence(id, std::span<const token_id>(tokens[id]).first(512)));
      pos = 512;
      state.ResumeTiming();
    }
    cache.begin_step();
    for (seq_id id = 0; id < batch; ++id)
      must(cache.append_token(id, tokens[id][static_cast<std::size_t>(pos)]));
    ++pos;
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_CacheStep)->Name("scheduler_step_256/cache_appends_only_baseline");

/// Planning a swap-out and a swap-in of a 128-block sequence, per block.
void BM_SwapPlan(benchmark::State& state) {
  using swap_cache = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, host_swap>;
  auto cache = must(swap_cache::create({16, 4096, 1, 0, 4096}));
  must(cache.add_sequence(1, 128 * 16));
  for (auto _ : state) {
    cache.begin_step();
    must(cache.swap_out(1));
    cache.begin_step();
    must(cache.swap_in(1));
  }
  state.SetItemsProcessed(state.iterations() * 2 * 128);
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations() * 2 * 128), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SwapPlan)->Name("swap_plan_128_blocks/kvpager");

/// Baseline: allocating and freeing the same 128 blocks in the device pool.
void BM_AllocPlan(benchmark::State& state) {
  auto cache = must(paged_kv_cache<>::create({16, 4096, 1, 0}));
  for (auto _ : state) {
    must(cache.add_sequence(1, 128 * 16));
    cache.begin_step();
    must(cache.free_sequence(1));
  }
  state.SetItemsProcessed(state.iterations() * 2 * 128);
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations() * 2 * 128), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AllocPlan)->Name("swap_plan_128_blocks/allocate_free_baseline");

}  // namespace

BENCHMARK_MAIN();
