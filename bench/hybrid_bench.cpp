// SPDX-License-Identifier: Apache-2.0
// KV cache groups (issue 24): hybrid_kv_cache with one full-attention group against paged_kv_cache over the same
// policies (vllm_v1_cache), the baseline measured in the same run, and with a sliding-window group beside it: a
// decode step of 256 sequences with token ids and prefix caching, and the admission of a 2048-token prompt whose
// blocks are cached. See bench/RESULTS.md ("Hybrid KV cache groups").
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include "bench_util.hpp"

#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

namespace {

using namespace kvpager;
using kvbench::must;

using one_group = hybrid_kv_cache<full_attention>;
using two_groups = hybrid_kv_cache<any_group_kind>;

/// The cache of `num_blocks` blocks of 16 tokens: paged, one full group, or [full, sliding_window 128].
template <class C>
C make(std::int32_t num_blocks) {
  const cache_config cfg{16, num_blocks, 1, 0};
  if constexpr (std::is_same_v<C, one_group>) {
    const std::vector<full_attention> g{full_attention{}};
    return must(C::create(cfg, g));
  } else if constexpr (std::is_same_v<C, two_groups>) {
    const std::vector<any_group_kind> g{full_attention{}, sliding_window{128}};
    return must(C::create(cfg, g));
  } else {
    return must(C::create(cfg));
  }
}

template <class C>
void BM_DecodeStep(benchmark::State& state) {
  constexpr int batch = 256;
  constexpr std::int32_t start = 1024, limit = 2048;
  auto cache = make<C>(2 * batch * (limit / 16 + 2) + 1);
  std::mt19937 rng(5);
  std::vector<std::vector<token_id>> tokens;
  for (int i = 0; i < batch; ++i) tokens.push_back(kvbench::random_prompt(rng, limit));
  kvbench::decode_steps(state, cache, tokens, start, limit, true);
}
BENCHMARK(BM_DecodeStep<vllm_v1_cache>)->Name("decode_step_256/paged_kv_cache_baseline");
BENCHMARK(BM_DecodeStep<one_group>)->Name("decode_step_256/hybrid_one_full_group");
BENCHMARK(BM_DecodeStep<two_groups>)->Name("decode_step_256/hybrid_full_and_window128");

/// Admission of a 2048-token prompt whose 127 leading blocks are cached (freed, so every hit is revived), then its
/// free: the lookup, the hits and the commit of the last block.
template <class C>
void BM_AdmitCached(benchmark::State& state) {
  auto cache = make<C>(4096);
  std::mt19937 rng(9);
  const auto prompt = kvbench::random_prompt(rng, 2048);
  must(cache.add_sequence(1, prompt));
  cache.begin_step();
  must(cache.free_sequence(1));
  for (auto _ : state) {
    prefix_match m;
    must(cache.add_sequence(2, prompt, {}, &m));
    benchmark::DoNotOptimize(m);
    cache.begin_step();
    must(cache.free_sequence(2));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AdmitCached<vllm_v1_cache>)->Name("admit_cached_2048/paged_kv_cache_baseline");
BENCHMARK(BM_AdmitCached<one_group>)->Name("admit_cached_2048/hybrid_one_full_group");
BENCHMARK(BM_AdmitCached<two_groups>)->Name("admit_cached_2048/hybrid_full_and_window128");

}  // namespace

BENCHMARK_MAIN();
