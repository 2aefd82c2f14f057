// SPDX-License-Identifier: Apache-2.0
// Moving whole blocks between the device and host pools on the CPU backend (issue 25, point 2): a plan of n swap-outs
// (scattered blocks) run by step_executor over per-layer pools (n x layers pieces of one layer's block) and over a
// block-major pool (n runs of every layer's bytes), against memcpy of the same bytes as one run in the same run (the
// baseline: a tuned memcpy). Two geometries: 64 KiB per layer and block (8 KV heads x 128, fp16) and 4 KiB (one KV
// head x 64: kvpager-sim's layer), 32 layers. Timings on a shared machine vary by 2x run to run for moves that fit
// the caches; the DRAM-sized ones are steadier: take medians of repetitions. Run: build/default/bench/bench_block_moves (bench/RESULTS.md).
// Every row also states `of_memcpy`: its copied bytes per second over the one-thread memcpy bound of the host's
// roofline measured at the start of the same run (bench/roofline.hpp: the `kvpager-roofline:` line on stderr, the
// figures in the benchmark context; KVPAGER_BENCH_NO_ROOFLINE=1 skips it, and the counter).
#include <kvpager/kernels/step_executor.hpp>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace kvpager;

constexpr std::int32_t layers = 32;

kv_geometry geometry(std::int64_t kv_heads, std::int32_t num_blocks) {
  return kv_geometry{num_blocks, 16, static_cast<std::int32_t>(kv_heads), kv_heads == 8 ? 128 : 64, kv_dtype::f16};
}

/// n swap-outs of scattered device blocks to scattered host blocks (no two adjacent: no run merges).
step_plan scattered_swap_outs(std::int32_t n, std::int32_t pool_blocks) {
  std::vector<block_id> dev(static_cast<std::size_t>(pool_blocks)), host(dev.size());
  std::iota(dev.begin(), dev.end(), 0);
  std::iota(host.begin(), host.end(), 0);
  std::mt19937 rng(9);
  std::shuffle(dev.begin(), dev.end(), rng);
  std::shuffle(host.begin(), host.end(), rng);
  step_plan plan;
  for (std::int32_t i = 0; i < n; ++i) plan.add_swap_out({dev[static_cast<std::size_t>(i)], host[static_cast<std::size_t>(i)]});
  return plan;
}

void BM_Swap(benchmark::State& state, kv_pool_layout layout) {
  const std::int64_t kv_heads = state.range(0);
  const auto n = static_cast<std::int32_t>(state.range(1));
  const std::int32_t pool = 2 * n;
  auto pools = host_kv_pools::create(geometry(kv_heads, pool), pool, layers, {}, layout);
  if (!pools) std::abort();
  const step_plan plan = scattered_swap_outs(n, pool);
  for (auto _ : state) {
    if (!pools->executor().run_plan(plan)) std::abort();
    benchmark::ClobberMemory();
  }
  kvbench::set_copied_bytes(state, state.iterations() * n * layers * block_bytes(geometry(kv_heads, pool)));
}

void BM_Memcpy(benchmark::State& state) {
  const std::int64_t kv_heads = state.range(0);
  const auto n = static_cast<std::int32_t>(state.range(1));
  const auto bytes = static_cast<std::size_t>(n) * layers * static_cast<std::size_t>(block_bytes(geometry(kv_heads, 1)));
  // Buffers of the pools' size (2n blocks each, as the swaps' pools), the first n blocks' bytes copied as one run.
  std::vector<std::byte> src(2 * bytes, std::byte{1}), dst(2 * bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  kvbench::set_copied_bytes(state, static_cast<std::int64_t>(state.iterations() * bytes));
}

/// Moves of 128 MiB (beyond the caches, as a step's offload of 64+ blocks of a real model is): 64 blocks of 2 MiB
/// (8 KV heads) and 1024 of 128 KiB (1 KV head); and 256 blocks of 128 KiB (32 MiB, about the L3's size).
void args(benchmark::internal::Benchmark* b) {
  b->Args({8, 64});
  b->Args({1, 1024});
  b->Args({1, 256});
}

BENCHMARK(BM_Memcpy)->Name("swap_out/memcpy_baseline")->Apply(args)->UseRealTime();
BENCHMARK_CAPTURE(BM_Swap, per_layer, kv_pool_layout::per_layer)->Name("swap_out/per_layer")->Apply(args)->UseRealTime();
BENCHMARK_CAPTURE(BM_Swap, block_major, kv_pool_layout::block_major)->Name("swap_out/block_major")->Apply(args)->UseRealTime();

}  // namespace

// The host's roofline (bench/roofline.hpp) is measured first: its `kvpager-roofline:` line goes to stderr and its
// figures into the benchmark context (`roofline_*`), and of_memcpy is over its memcpy figure.
int main(int argc, char** argv) { return kvbench::roofline_main(argc, argv); }
