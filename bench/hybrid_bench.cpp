// SPDX-License-Identifier: Apache-2.0
// KV cache groups (issue 24): hybrid_kv_cache with one full-attention group against paged_kv_cache over the same
// policies (vllm_v1_cache), the baseline measured in the same run, and with a sliding-window group beside it: a
// decode step of 256 sequences with token ids and prefix caching, and the admission of a 2048-token prompt whose
// blocks are cached. And the KV bytes a pool of one budget holds, run through the cache (issue 24, point 3): the
// built-in hybrid shapes at 8k, 32k and 128k context, grouped natively (no padding layers), as vLLM groups them
// (padded), by units (one group per kind, no padding), and as one full-attention group, against the bytes the held
// tokens strictly need (bench/hybrid_units_bench.cpp: Gemma-3-27b's bookkeeping by units). See bench/RESULTS.md
// ("Hybrid KV cache groups", "KV bytes held against needed").
#include <kvpager/kvpager.hpp>
#include <kvpager/sizing/hybrid_sizing.hpp>

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
// Fixed iteration counts here and below: a callgrind run counts exactly these calls.
BENCHMARK(BM_DecodeStep<vllm_v1_cache>)->Name("decode_step_256/paged_kv_cache_baseline")->Iterations(2000);
BENCHMARK(BM_DecodeStep<one_group>)->Name("decode_step_256/hybrid_one_full_group")->Iterations(2000);
BENCHMARK(BM_DecodeStep<two_groups>)->Name("decode_step_256/hybrid_full_and_window128")->Iterations(2000);

/// Admission of a 2048-token prompt whose 127 leading blocks are cached (freed, so every hit is revived), then its
/// free: the lookup, the hits and the commit of the last block (kvbench::admit_cached).
template <class C>
void BM_AdmitCached(benchmark::State& state) {
  auto cache = make<C>(4096);
  kvbench::admit_cached(state, cache);
}
BENCHMARK(BM_AdmitCached<vllm_v1_cache>)->Name("admit_cached_2048/paged_kv_cache_baseline")->Iterations(2000);
BENCHMARK(BM_AdmitCached<one_group>)->Name("admit_cached_2048/hybrid_one_full_group")->Iterations(2000);
BENCHMARK(BM_AdmitCached<two_groups>)->Name("admit_cached_2048/hybrid_full_and_window128")->Iterations(2000);

/// The lookup of the request at the head of the waiting queue, as the scheduler repeats it every step while the pool
/// is full (issue 24, P3's margin): a 2048-token prompt whose first 1024 tokens are cached by a live sequence, in
/// [full, sliding_window 128], one decode token appended to another sequence between lookups (a block committed
/// every 16). `kept`: the same prompt every time (hybrid_kv_cache keeps its lookup and re-checks it); `fresh`: two
/// such prompts in turn, so that every lookup is made anew. Items: lookups.
void BM_HeadLookup(benchmark::State& state) {
  const bool alternate = state.range(0) != 0;
  auto cache = make<two_groups>(4096);
  std::mt19937 rng(11);
  std::vector<std::vector<token_id>> prompts;
  for (seq_id id = 0; id < 2; ++id) {
    prompts.push_back(kvbench::random_prompt(rng, 2048));
    const auto& p = prompts.back();
    must(cache.add_sequence(id, std::span<const token_id>(p).first(1024)));  // caches the first 64 blocks
  }
  const auto decode = kvbench::random_prompt(rng, 1 << 16);
  must(cache.add_sequence(2, std::span<const token_id>(decode).first(16)));
  cache.begin_step();
  prefix_hit hit;
  std::vector<std::vector<std::uint64_t>> hashes(2);  // the request keeps its hashes, as the scheduler's do
  for (std::size_t k = 0; k < 2; ++k) {
    must(cache.match_prefix(prompts[k], {}, hit));
    hashes[k] = hit.known_hashes;
  }
  std::size_t pos = 16;
  std::int64_t lookups = 0;
  for (auto _ : state) {
    for (std::size_t k = 0; k <= (alternate ? 1u : 0u); ++k) {
      must(cache.match_prefix(prompts[k], {}, hit, hashes[k]));
      benchmark::DoNotOptimize(hit.match.blocks);
      ++lookups;
    }
    must(cache.append_token(2, decode[pos++ % decode.size()]));
    if (pos % 4096 == 0) {  // keep the decoding sequence short: restart it
      must(cache.free_sequence(2));
      must(cache.add_sequence(2, std::span<const token_id>(decode).first(16)));
    }
    cache.begin_step();
  }
  state.SetItemsProcessed(lookups);
}
BENCHMARK(BM_HeadLookup)->Name("head_lookup_2048/fresh")->Arg(1)->Iterations(20000);
BENCHMARK(BM_HeadLookup)->Name("head_lookup_2048/kept")->Arg(0)->Iterations(20000);


/// A pool of `budget` bytes of KV for model `m` grouped by `plan` (a block: group_size layers), in `conv`; requests
/// of `ctx` tokens admitted one after another in 2048-token chunks (each chunk its own step, so window groups give
/// blocks back as they go, as under chunked prefill), each then decoding one token, until the pool is full. Reports
/// the requests that fit and the bytes held: allocated (the groups' blocks x block bytes, padding layers included)
/// over strictly needed (each layer's tokens the last token read, itself included).
struct fill_result {
  std::int64_t requests = 0;
  double allocated = 0, needed = 0;
};
fill_result fill(const hybrid_model& m, const group_plan<any_group_kind>& plan, hybrid_conventions conv,
                 std::int64_t budget, std::int32_t ctx) {
  constexpr std::int32_t bs = 16, chunk = 2048;
  const std::int64_t token_layer = 2 * std::int64_t{m.num_kv_heads} * m.head_dim * 2;  // K and V, 2-byte elements
  const std::int64_t block_bytes = token_layer * bs * plan.group_size;
  const cache_config cfg{bs, static_cast<std::int32_t>(budget / block_bytes) + 1, 1, 0};
  auto cache = must(hybrid_kv_cache<any_group_kind>::create(cfg, plan.groups, {conv, plan.units}));
  fill_result r;
  for (seq_id id = 0;; ++id) {
    std::int32_t pos = std::min(chunk, ctx);
    bool ok = cache.add_sequence(id, pos).ok();
    while (ok && pos < ctx) {
      cache.begin_step();
      const std::int32_t n = std::min(chunk, ctx - pos);
      ok = cache.append_tokens(id, token_count{n}).ok();
      pos += n;
    }
    cache.begin_step();
    ok = ok && cache.append_tokens(id, token_count{1}).ok();
    if (!ok) {
      (void)cache.free_sequence(id);
      break;
    }
    ++r.requests;
  }
  for (std::int32_t g = 0; g < cache.num_groups(); ++g) r.allocated += static_cast<double>(cache.stats(g).blocks) * block_bytes;
  for (std::int32_t i = 0; i < m.num_kinds; ++i) {
    const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
    r.needed += static_cast<double>(r.requests) * static_cast<double>(needed_tokens(k, ctx) + 1) * k.layers * token_layer;
  }
  return r;
}

/// state.range(0): the built-in model; state.range(1): the context. One run (the counters are the result).
void BM_KvHeldOverNeeded(benchmark::State& state) {
  const hybrid_model& m = builtin_hybrid_models[static_cast<std::size_t>(state.range(0))];
  const auto ctx = static_cast<std::int32_t>(state.range(1));
  constexpr std::int64_t budget = std::int64_t{16} << 30;  // 16 GiB of KV
  std::vector<kind_layers<any_group_kind>> kinds;
  for (std::int32_t i = 0; i < m.num_kinds; ++i) {
    const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
    kinds.push_back({to_group_kind(k.kind, k.size), k.layers});
  }
  const auto native = must(plan_groups<any_group_kind>(kinds, grouping::native));
  const auto vllm = must(plan_groups<any_group_kind>(kinds, grouping::vllm));
  const auto units = must(plan_groups<any_group_kind>(kinds, grouping::units));
  group_plan<any_group_kind> one;
  one.groups = {full_attention{}};
  one.group_size = m.num_layers();
  fill_result a, b, c, u;
  for (auto _ : state) {
    a = fill(m, native, hybrid_conventions::native, budget, ctx);
    u = fill(m, units, hybrid_conventions::native, budget, ctx);
    b = fill(m, vllm, hybrid_conventions::vllm, budget, ctx);
    c = fill(m, one, hybrid_conventions::native, budget, ctx);
  }
  state.SetLabel(std::string(m.name));
  // Where not one request fits the budget there is nothing held: report 0.
  const auto ratio = [](const fill_result& r) { return r.needed > 0 ? r.allocated / r.needed : 0.0; };
  state.counters["native_over_needed"] = ratio(a);
  state.counters["units_over_needed"] = ratio(u);
  state.counters["vllm_over_needed"] = ratio(b);
  state.counters["one_group_over_needed"] = ratio(c);
  state.counters["fit_native"] = static_cast<double>(a.requests);
  state.counters["fit_units"] = static_cast<double>(u.requests);
  state.counters["fit_vllm"] = static_cast<double>(b.requests);
  state.counters["fit_one_group"] = static_cast<double>(c.requests);
  state.counters["groups_native"] = native.num_groups();
  state.counters["groups_vllm"] = vllm.num_groups();
  state.counters["groups_units"] = units.num_groups();
}
void kv_held_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t m = 0; m < static_cast<std::int64_t>(builtin_hybrid_models.size()); ++m)
    for (const std::int64_t ctx : {8192, 32768, 131072}) b->Args({m, ctx});
}
BENCHMARK(BM_KvHeldOverNeeded)->Name("kv_held_16gib")->Apply(kv_held_args)
    ->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
