// SPDX-License-Identifier: Apache-2.0
// CPU decode attention as KV bytes read per second, against a streaming read of the same bytes in the same run
// (see bench/RESULTS.md). Shape: batch 8, 32 query heads over 8 KV heads (GQA 4), head_dim 128, block 16.
#include <kvpager/c/kernels.h>
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <algorithm>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr std::int32_t batch = 8, hq = 32, hkv = 8, dim = 128, bs = 16;

struct setup {
  std::int32_t context;
  std::int32_t max_blocks, num_blocks;
  std::vector<std::uint16_t> kv, q, out;
  std::vector<std::int32_t> table, lens;
  explicit setup(std::int32_t ctx) : context(ctx) {
    max_blocks = (ctx + bs - 1) / bs;
    num_blocks = batch * max_blocks;
    kv.assign(static_cast<std::size_t>(num_blocks) * 2 * hkv * bs * dim, 0x3C00);  // fp16 1.0
    q.assign(static_cast<std::size_t>(batch) * hq * dim, 0x3C00);
    out.resize(q.size());
    table.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(max_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(1));
    lens.assign(batch, ctx);
  }
  [[nodiscard]] std::int64_t kv_bytes() const { return std::int64_t{batch} * context * 2 * hkv * dim * 2; }
};

void BM_Decode(benchmark::State& state) {
  setup s(static_cast<std::int32_t>(state.range(0)));
  for (auto _ : state) {
    const auto rc = kvpager_cpu_paged_attention_decode(s.out.data(), s.q.data(), s.kv.data(), s.table.data(), s.lens.data(),
                                                       batch, hq, hkv, dim, bs, s.max_blocks, s.num_blocks, 0.088F,
                                                       KVPAGER_DTYPE_FP16, 0);
    if (rc != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
}
BENCHMARK(BM_Decode)->Name("decode_fp16_b8_gqa4_d128/kvpager")->Arg(1024)->Arg(4096)->Arg(16384)->UseRealTime();

/// Short contexts, where a call's fixed cost shows: all cores against one thread (the baseline) on the same call.
void BM_DecodeShort(benchmark::State& state) {
  setup s(static_cast<std::int32_t>(state.range(0)));
  const auto threads = static_cast<std::int32_t>(state.range(1));
  for (auto _ : state) {
    const auto rc = kvpager_cpu_paged_attention_decode(s.out.data(), s.q.data(), s.kv.data(), s.table.data(), s.lens.data(),
                                                       batch, hq, hkv, dim, bs, s.max_blocks, s.num_blocks, 0.088F,
                                                       KVPAGER_DTYPE_FP16, threads);
    if (rc != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
}
BENCHMARK(BM_DecodeShort)->Name("decode_fp16_b8_gqa4_d128_short/all_cores")->Args({16, 0})->Args({128, 0})->UseRealTime();
BENCHMARK(BM_DecodeShort)->Name("decode_fp16_b8_gqa4_d128_short/one_thread_baseline")->Args({16, 1})->Args({128, 1})->UseRealTime();

/// Baseline: a streaming read of the same KV bytes with all cores: 64-bit words summed into four independent
/// accumulators (the compiler vectorizes it), so the loop is limited by memory, not by arithmetic.
void BM_StreamRead(benchmark::State& state) {
  setup s(static_cast<std::int32_t>(state.range(0)));
  const auto threads = std::max(1U, std::thread::hardware_concurrency());
  const auto* words = reinterpret_cast<const std::uint64_t*>(s.kv.data());
  const std::size_t n = s.kv.size() / 4;
  for (auto _ : state) {
    std::vector<std::uint64_t> sums(threads, 0);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const std::size_t end = n * (t + 1) / threads / 4 * 4;
        for (std::size_t i = n * t / threads / 4 * 4; i < end; i += 4) {
          a0 += words[i];
          a1 += words[i + 1];
          a2 += words[i + 2];
          a3 += words[i + 3];
        }
        sums[t] = a0 + a1 + a2 + a3;
      });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
}
BENCHMARK(BM_StreamRead)->Name("decode_fp16_b8_gqa4_d128/stream_read_baseline")->Arg(1024)->Arg(4096)->Arg(16384)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
