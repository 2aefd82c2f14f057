// SPDX-License-Identifier: Apache-2.0
// The host tier (tier/host_tier.hpp): its lookup per block, against the device prefix cache's lookup of the same
// blocks (prefix_caching, hashes known) in the same run; and a store that evicts, per block. Issue 25's target: the
// tier lookup at most 1 us per 16-token block. Run: build/default/bench/bench_tier (bench/RESULTS.md).
#include <kvpager/kvpager.hpp>
#include <kvpager/tier/arc_tier.hpp>
#include <kvpager/tier/host_tier.hpp>
#include <kvpager/tier/lru_tier.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bench_util.hpp"

namespace {

using namespace kvpager;

constexpr std::int32_t tier_blocks = 65536;  // 16-token blocks: 1 M tokens of host KV
constexpr std::int32_t run = 64;             // blocks looked up per request

/// Keys of `n` chains of `run` blocks (the chained hashes a request's blocks have).
std::vector<std::uint64_t> chain_keys(std::int32_t n) {
  std::vector<std::uint64_t> k(static_cast<std::size_t>(n) * run);
  std::mt19937_64 rng(7);
  for (auto& x : k) x = rng();
  return k;
}

template <class P>
host_tier<P> full_tier(const std::vector<std::uint64_t>& keys) {
  auto t = kvbench::must(host_tier<P>::create({tier_blocks}));
  tier_store_plan plan;
  for (std::size_t i = 0; i < keys.size(); i += run) {
    const std::span<const std::uint64_t> ks(keys.data() + i, run);
    kvbench::must(t.prepare_store(ks, plan));
    t.complete_store(ks, true);
  }
  return t;
}

/// A request's 64 blocks looked up in the tier (all hits) and touched, as a scheduler does at admission.
template <class P>
void BM_TierLookup(benchmark::State& state) {
  const auto keys = chain_keys(tier_blocks / run);
  auto t = full_tier<P>(keys);
  std::mt19937 rng(1);
  std::int64_t blocks = 0;
  for (auto _ : state) {
    const std::size_t r = rng() % (tier_blocks / run);
    const std::span<const std::uint64_t> ks(keys.data() + r * run, run);
    benchmark::DoNotOptimize(t.lookup_prefix(ks));
    t.touch(ks);
    blocks += run;
  }
  state.SetItemsProcessed(blocks);
}

/// The baseline: the device prefix cache's lookup of a request's 64 cached blocks (hashes known, tokens verified).
void BM_DeviceLookup(benchmark::State& state) {
  constexpr std::int32_t bs = 16;
  const std::int32_t requests = tier_blocks / run;
  auto cache = kvbench::must(vllm_v1_cache::create(
      cache_config{.block_size = bs, .num_blocks = requests * (run + 1) + 1, .reserved_blocks = 1}));
  std::mt19937 rng(3);
  std::vector<std::vector<token_id>> prompts;
  for (std::int32_t r = 0; r < requests; ++r) {
    prompts.push_back(kvbench::random_prompt(rng, run * bs + 1));
    kvbench::must(cache.add_sequence(r, prompts.back()));
  }
  cache.begin_step();
  prefix_hit hit;
  std::int64_t blocks = 0;
  for (auto _ : state) {
    const std::size_t r = rng() % static_cast<std::size_t>(requests);
    kvbench::must(cache.match_prefix(prompts[r], {}, hit));
    benchmark::DoNotOptimize(hit.match.blocks);
    blocks += run;
  }
  state.SetItemsProcessed(blocks);
}

/// A full tier stores 64 new blocks (evicting 64 ready ones) and completes them: per block.
template <class P>
void BM_TierStoreEvicting(benchmark::State& state) {
  const auto keys = chain_keys(tier_blocks / run);
  auto t = full_tier<P>(keys);
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> fresh(run);
  tier_store_plan plan;
  std::int64_t blocks = 0;
  for (auto _ : state) {
    for (auto& x : fresh) x = rng();
    kvbench::must(t.prepare_store(fresh, plan));
    t.complete_store(fresh, true);
    blocks += run;
  }
  state.SetItemsProcessed(blocks);
}

BENCHMARK(BM_DeviceLookup)->Name("lookup_64_blocks/device_prefix_cache_baseline");
BENCHMARK(BM_TierLookup<lru_tier>)->Name("lookup_64_blocks/host_tier_lru");
BENCHMARK(BM_TierLookup<arc_tier>)->Name("lookup_64_blocks/host_tier_arc");
BENCHMARK(BM_TierStoreEvicting<lru_tier>)->Name("store_64_blocks_evicting/host_tier_lru");
BENCHMARK(BM_TierStoreEvicting<arc_tier>)->Name("store_64_blocks_evicting/host_tier_arc");

}  // namespace

BENCHMARK_MAIN();
