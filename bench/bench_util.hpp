// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the benchmarks: a failed call aborts the benchmark run (it would measure nothing); random prompts.

#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace kvbench {

template <class T>
T must(kvpager::result<T> r) {
  if (!r) std::abort();
  return std::move(*r);
}
inline void must(kvpager::status s) {
  if (!s) std::abort();
}

/// `n` token ids drawn uniformly from a 50000-token vocabulary.
inline std::vector<kvpager::token_id> random_prompt(std::mt19937& rng, std::int32_t n) {
  std::vector<kvpager::token_id> p(static_cast<std::size_t>(n));
  for (auto& t : p) t = static_cast<kvpager::token_id>(rng() % 50000);
  return p;
}

/// One decode step: every sequence of `tokens` gets its token at `pos`. Not inlined, so that callgrind can count it
/// alone: `--toggle-collect='*kvbench::decode_step<*'` (not `decode_step*`, which also matches decode_steps and
/// cancels), its instructions over (calls x sequences) are a token's (with 1/sequences of a begin_step).
template <class Cache>
KVPAGER_NOINLINE void decode_step(Cache& cache, const std::vector<std::vector<kvpager::token_id>>& tokens,
                                  std::int32_t pos, bool by_id) {
  cache.begin_step();
  const auto batch = static_cast<kvpager::seq_id>(tokens.size());
  for (kvpager::seq_id id = 0; id < batch; ++id) {
    if (by_id) {
      must(cache.append_token(id, tokens[id][static_cast<std::size_t>(pos)]));
    } else {
      must(cache.append_tokens(id));
    }
  }
}

/// The timed loop of a decode-step benchmark: `tokens.size()` sequences admitted with their first `start` tokens,
/// then one token each per iteration (by id, or by count when `by_id` is false), re-admitted (untimed) when they
/// reach `limit`. Items: one per token.
template <class Cache, class State>
void decode_steps(State& state, Cache& cache, const std::vector<std::vector<kvpager::token_id>>& tokens,
                  std::int32_t start, std::int32_t limit, bool by_id) {
  const auto batch = static_cast<kvpager::seq_id>(tokens.size());
  auto admit_all = [&] {  // and the admissions' step ended, so that no timed step ends it
    for (kvpager::seq_id id = 0; id < batch; ++id)
      must(cache.add_sequence(id, std::span<const kvpager::token_id>(tokens[id]).first(static_cast<std::size_t>(start))));
    cache.begin_step();
  };
  admit_all();
  std::int32_t pos = start;
  for (auto _ : state) {
    if (pos == limit) {
      state.PauseTiming();
      cache.begin_step();
      for (kvpager::seq_id id = 0; id < batch; ++id) must(cache.free_sequence(id));
      admit_all();
      pos = start;
      state.ResumeTiming();
    }
    decode_step(cache, tokens, pos, by_id);
    ++pos;
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
}

/// Admission of a 2048-token prompt whose 127 leading blocks are cached (freed, so every hit is revived), then
/// its free: the lookup, the hits and the commit of the last block.
template <class Cache, class State>
void admit_cached(State& state, Cache& cache) {
  std::mt19937 rng(9);
  const auto prompt = random_prompt(rng, 2048);
  must(cache.add_sequence(1, prompt));
  cache.begin_step();
  must(cache.free_sequence(1));
  for (auto _ : state) {
    kvpager::prefix_match m;
    must(cache.add_sequence(2, prompt, {}, &m));
    benchmark::DoNotOptimize(m);
    cache.begin_step();
    must(cache.free_sequence(2));
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace kvbench
