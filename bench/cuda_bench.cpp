// SPDX-License-Identifier: Apache-2.0
// CUDA kernels against the hardware in the same run: decode attention as KV bytes read per second (against the
// H200's 4.8 TB/s and a device-to-device cudaMemcpy of the same bytes), copy_blocks against cudaMemcpy of the same
// bytes, swap against one large pinned cudaMemcpy; paged prefill as achieved FLOP/s against the dense bf16
// tensor-core peak (989 TFLOP/s on H100/H200 SXM). Runs only where a GPU is present (skips otherwise).
#include <kvpager/c/kernels.h>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kvpager_testing/cuda_compare.hpp"
#include "kvpager_testing/cuda_prefill_compare.hpp"

namespace {

using kvpager_gpu_check::have_gpu;

/// Times `fn` with CUDA events over the benchmark's iterations (manual time).
template <class Fn>
void time_gpu(benchmark::State& state, Fn fn) {
  kvpager_gpu_check::event_timer timer(fn);
  for (auto _ : state) state.SetIterationTime(timer.seconds(fn));
}

void BM_CudaDecode(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const kvpager_gpu_check::decode_bench bench(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)));
  if (!bench.ok) return state.SkipWithError("setup failed");
  int32_t rc = KVPAGER_STATUS_OK;
  time_gpu(state, [&] { rc |= bench.run(); });
  if (rc != KVPAGER_STATUS_OK) state.SkipWithError("decode failed");
  state.counters["splits"] = bench.splits;
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bench.kv_bytes));
  state.counters["fraction_of_4.8TBps"] = benchmark::Counter(static_cast<double>(bench.kv_bytes) / 4.8e12,
                                                             benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CudaDecode)->Name("cuda_decode_fp16_gqa4_d128/kvpager")->Args({4096, 8})->Args({16384, 8})->Args({32768, 1})->Args({32768, 32})->UseManualTime();

/// Prefill, bf16, 32 query / 8 KV heads, head_dim 128, causal: args (context, new tokens, sequences). FLOPs count the
/// (query, key) pairs the causal mask keeps; the counter is the fraction of the dense bf16 tensor-core peak
/// (issue 12 target: >= 0.5 at q_len >= 1024).
void BM_CudaPrefill(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const kvpager_gpu_check::prefill_bench bench(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
                                               static_cast<int32_t>(state.range(2)));
  if (!bench.ok) return state.SkipWithError("setup failed");
  int32_t rc = KVPAGER_STATUS_OK;
  time_gpu(state, [&] { rc |= bench.run(); });
  if (rc != KVPAGER_STATUS_OK) state.SkipWithError("prefill failed");
  state.counters["ctas"] = bench.ctas;
  state.counters["TFLOPs"] = benchmark::Counter(bench.flops() / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fraction_of_bf16_peak"] =
      benchmark::Counter(bench.flops() / kvpager_gpu_check::kH200DenseBf16Flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CudaPrefill)
    ->Name("cuda_prefill_bf16_gqa4_d128/kvpager")
    ->Args({1024, 1024, 8})   // whole prompts
    ->Args({4096, 4096, 2})
    ->Args({4096, 1024, 8})   // 1024 new tokens over a 3072-token cached prefix
    ->Args({8192, 256, 8})    // a chunk of chunked prefill
    ->UseManualTime();

void BM_CudaMemcpy(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  void *a, *b;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  time_gpu(state, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  cudaFree(a);
  cudaFree(b);
}
BENCHMARK(BM_CudaMemcpy)->Name("cuda_device_memcpy_baseline")->Arg(512)->Arg(2048)->UseManualTime();

void BM_CudaCopyBlocks(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const int32_t nb = 8192, pairs = 2048;
  const int64_t block_bytes = 2LL * 8 * 16 * 128 * 2;  // 64 KiB
  void* pool;
  cudaMalloc(&pool, static_cast<size_t>(nb) * static_cast<size_t>(block_bytes));
  std::vector<int64_t> map;
  for (int32_t i = 0; i < pairs; ++i) {
    map.push_back(i);
    map.push_back(nb - 1 - i);
  }
  void *dmap, *dptr;
  cudaMalloc(&dmap, map.size() * 8);
  cudaMemcpy(dmap, map.data(), map.size() * 8, cudaMemcpyHostToDevice);
  cudaMalloc(&dptr, sizeof(void*));
  cudaMemcpy(dptr, &pool, sizeof(void*), cudaMemcpyHostToDevice);
  time_gpu(state, [&] {
    kvpager_cuda_copy_blocks(static_cast<void* const*>(dptr), 1, static_cast<int64_t*>(dmap), pairs, nb, block_bytes, nullptr, nullptr);
  });
  state.SetBytesProcessed(state.iterations() * pairs * block_bytes * 2);  // read + write
  for (void* p : {pool, dmap, dptr}) cudaFree(p);
}
BENCHMARK(BM_CudaCopyBlocks)->Name("cuda_copy_blocks_2048x64KiB/kvpager")->UseManualTime();

void BM_CudaSwap(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const int32_t nb = 4096;
  const int64_t block_bytes = 64 * 1024;
  void *dev, *host;
  cudaMalloc(&dev, static_cast<size_t>(nb) * static_cast<size_t>(block_bytes));
  cudaMallocHost(&host, static_cast<size_t>(nb) * static_cast<size_t>(block_bytes));
  std::vector<int64_t> pairs;
  for (int32_t i = 0; i < nb; i += 2) {  // every other block: no run merging, the worst case
    pairs.push_back(i);
    pairs.push_back(i);
  }
  time_gpu(state, [&] {
    kvpager_cuda_swap_blocks(host, nb, dev, nb, block_bytes, pairs.data(), static_cast<int32_t>(pairs.size() / 2), nullptr);
  });
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pairs.size() / 2) * block_bytes);
  cudaFree(dev);
  cudaFreeHost(host);
}
BENCHMARK(BM_CudaSwap)->Name("cuda_swap_out_2048x64KiB/kvpager")->UseManualTime();

void BM_CudaPinnedMemcpy(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const size_t bytes = 2048ULL * 64 * 1024;
  void *dev, *host;
  cudaMalloc(&dev, bytes);
  cudaMallocHost(&host, bytes);
  time_gpu(state, [&] { cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost); });
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  cudaFree(dev);
  cudaFreeHost(host);
}
BENCHMARK(BM_CudaPinnedMemcpy)->Name("cuda_swap_out_2048x64KiB/one_pinned_memcpy_baseline")->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
