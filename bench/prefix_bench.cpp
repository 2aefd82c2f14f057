// SPDX-License-Identifier: Apache-2.0
// Prefix caching: lookup cost per block, a decode step with caching on, and the hit rate each eviction policy
// reaches on trace B at several pool sizes. Baselines are measured in the same run (see bench/RESULTS.md).
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include "bench_util.hpp"

#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kvtrace.hpp"
#include "replayer.hpp"

namespace {

using namespace kvpager;

using kvbench::must;

std::vector<token_id> prompt_tokens(std::int32_t n, token_id seed) {
  std::vector<token_id> v(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = kvreplay::token_of(static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(i));
  return v;
}

// ------------------------------------------------------------------------------------------- lookup
/// match_prefix of a 2048-token prompt whose 127 leading blocks are cached (the cap keeps the last block out).
void BM_PrefixLookup(benchmark::State& state) {
  auto cache = must(vllm_v1_cache::create({16, 4096, 1, 0}));
  const auto prompt = prompt_tokens(2048, 7);
  must(cache.add_sequence(1, prompt));
  cache.begin_step();
  std::int64_t blocks = 0;
  for (auto _ : state) {
    const auto m = cache.match_prefix(prompt);
    benchmark::DoNotOptimize(m->blocks);
    blocks += m->blocks;
  }
  state.SetItemsProcessed(blocks);
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(blocks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PrefixLookup)->Name("prefix_lookup_2048_tokens/kvpager");

/// Baseline: hashing the same 127 blocks with XXH3 and nothing else (the lower bound of any lookup).
void BM_PrefixHashOnly(benchmark::State& state) {
  const auto prompt = prompt_tokens(2048, 7);
  const xxh3_hasher h;
  std::int64_t blocks = 0;
  for (auto _ : state) {
    std::uint64_t seed = 0;
    for (std::size_t b = 0; b < 127; ++b) seed = h(seed, std::span<const token_id>(prompt).subspan(b * 16, 16));
    benchmark::DoNotOptimize(seed);
    blocks += 127;
  }
  state.SetItemsProcessed(blocks);
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(blocks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PrefixHashOnly)->Name("prefix_lookup_2048_tokens/xxh3_hash_only_baseline");

// ------------------------------------------------------------------------------------------- decode step
/// One decode step of 256 sequences with token ids and prefix caching on (every 16th token commits a block);
/// the baseline is the same step through paged_kv_cache<> by count (no caching).
template <bool Caching>
void BM_DecodeStep(benchmark::State& state) {
  constexpr int batch = 256;
  constexpr std::int32_t start = 1024, limit = 2048;
  using cache_t = std::conditional_t<Caching, vllm_v1_cache, paged_kv_cache<>>;
  auto cache = must(cache_t::create({16, batch * (limit / 16 + 2) + 1, 1, 0}));
  std::vector<std::vector<token_id>> tokens;
  for (int i = 0; i < batch; ++i) tokens.push_back(prompt_tokens(limit, 1000 + i));
  kvbench::decode_steps(state, cache, tokens, start, limit, Caching);
}
BENCHMARK(BM_DecodeStep<true>)->Name("decode_step_256/prefix_caching");
BENCHMARK(BM_DecodeStep<false>)->Name("decode_step_256/no_caching_baseline");

// ------------------------------------------------------------------------------------------- hit rate on B
const std::string& trace_b() {
  static const std::string text = [] {
    std::ifstream in(std::string(KVPAGER_TRACE_DIR) + "/B_prefix_caching.kvtrace", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  return text;
}

/// Replays trace B with eviction policy E and a pool of state.range(0) blocks; reports the token hit rate.
template <class E>
void BM_HitRateB(benchmark::State& state) {
  auto parsed = kvreplay::parse_kvtrace(trace_b(), "B");
  if (!parsed.value) {
    state.SkipWithError(parsed.error.c_str());
    return;
  }
  kvreplay::trace t = std::move(*parsed.value);
  for (auto& [k, v] : t.params)
    if (k == "num_blocks") v = state.range(0);
  using cache_t = paged_kv_cache<free_list_allocator, E, prefix_caching>;
  double hit_rate = 0, evictions = 0;
  for (auto _ : state) {
    const auto r = kvreplay::detail::replay_manager<cache_t>(t, "B", {});
    if (!r.error.empty()) {
      state.SkipWithError(r.error.c_str());
      return;
    }
    const kvreplay::json& res = r.result;
    hit_rate = res["hit_rate_tokens"].template get<double>();
    evictions = static_cast<double>(res["prefix_cache_evictions"].template get<std::int64_t>());
  }
  state.counters["hit_rate"] = hit_rate;
  state.counters["evictions"] = evictions;
}
#define KVPAGER_HIT_RATE(policy)                                                                   \
  BENCHMARK(BM_HitRateB<policy>)->Name("hit_rate_trace_B/" #policy)->ArgName("blocks")->Arg(1024)->Arg(1536) \
      ->Arg(2048)->Arg(3072)->Arg(4096)->Arg(8192)->Iterations(1)->Unit(benchmark::kMillisecond)
KVPAGER_HIT_RATE(lru_eviction);
KVPAGER_HIT_RATE(lru_index_eviction);
KVPAGER_HIT_RATE(lfu_eviction);
KVPAGER_HIT_RATE(fifo_eviction);
KVPAGER_HIT_RATE(priority_lru);

}  // namespace

BENCHMARK_MAIN();
