// SPDX-License-Identifier: Apache-2.0
// Groups of different sizes from one pool (issue 24, point 3; hybrid_options::units): Gemma-3-27b's layers as 31
// native groups of 2 layers (the baseline, measured in the same run) against 2 groups of 26 and 5 units of 2 layers
// (plan_groups(grouping::units)): the same pool blocks and tables per request, the decisions made once per group.
// A translation unit of its own, so that bench_hybrid's measurements stay those of its own code. See
// bench/RESULTS.md ("Groups of different sizes from one pool").
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include "bench_util.hpp"

#include <cstdint>
#include <random>
#include <vector>

namespace {

using namespace kvpager;
using kvbench::must;
using two_groups = hybrid_kv_cache<any_group_kind>;

/// Gemma-3-27b's layers (52 sliding-window 1024, 10 full) grouped natively (31 groups of 2 layers) and by units (2
/// groups of 26 and 5 units of 2 layers): the same pool blocks and tables per request, the decisions made once
/// per group. The admission of a cached 2048-token prompt, and a decode step of 32 sequences.
two_groups make_gemma3(grouping how, std::int32_t num_blocks) {
  const std::vector<kind_layers<any_group_kind>> kinds{{sliding_window{1024}, 52}, {full_attention{}, 10}};
  const auto plan = must(plan_groups<any_group_kind>(kinds, how));
  return must(two_groups::create(cache_config{16, num_blocks, 1, 0}, plan.groups,
                                 {hybrid_conventions::native, plan.units}));
}
template <grouping How>
void BM_AdmitCachedGemma3(benchmark::State& state) {
  auto cache = make_gemma3(How, 10000);
  kvbench::admit_cached(state, cache);
}
// Fixed iteration counts, so that a callgrind run counts exactly these calls (instructions per call = total / 2000).
BENCHMARK(BM_AdmitCachedGemma3<grouping::native>)->Name("admit_cached_2048_gemma3_27b/native_31_groups_baseline")
    ->Iterations(2000);
BENCHMARK(BM_AdmitCachedGemma3<grouping::units>)->Name("admit_cached_2048_gemma3_27b/units_2_groups")->Iterations(2000);
template <grouping How>
void BM_DecodeStepGemma3(benchmark::State& state) {
  constexpr int batch = 32;
  constexpr std::int32_t start = 1024, limit = 2048;
  auto cache = make_gemma3(How, 31 * 2 * batch * (limit / 16 + 2) + 1);
  std::mt19937 rng(5);
  std::vector<std::vector<token_id>> tokens;
  for (int i = 0; i < batch; ++i) tokens.push_back(kvbench::random_prompt(rng, limit));
  kvbench::decode_steps(state, cache, tokens, start, limit, true);
}
BENCHMARK(BM_DecodeStepGemma3<grouping::native>)->Name("decode_step_32_gemma3_27b/native_31_groups_baseline")
    ->Iterations(2000);
BENCHMARK(BM_DecodeStepGemma3<grouping::units>)->Name("decode_step_32_gemma3_27b/units_2_groups")->Iterations(2000);

}  // namespace

BENCHMARK_MAIN();
