// CUDA kernels against the hardware in the same run: decode attention as KV bytes read per second (against the
// H200's 4.8 TB/s and a device-to-device cudaMemcpy of the same bytes), copy_blocks against cudaMemcpy of the same
// bytes, swap against one large pinned cudaMemcpy. Runs only where a GPU is present (skips otherwise).
#include <kvpager/c/kernels.h>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace {

bool have_gpu() {
  int32_t n = 0;
  return kvpager_cuda_device_count(&n) == KVPAGER_STATUS_OK && n > 0;
}

/// Times `fn` with CUDA events over the benchmark's iterations (manual time).
template <class Fn>
void time_gpu(benchmark::State& state, Fn fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm-up
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

void BM_CudaDecode(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const int32_t batch = static_cast<int32_t>(state.range(1)), ctx = static_cast<int32_t>(state.range(0));
  const int32_t hq = 32, hkv = 8, d = 128, bs = 16, maxb = (ctx + bs - 1) / bs, nb = batch * maxb;
  const size_t kv_bytes = static_cast<size_t>(nb) * 2 * hkv * bs * d * 2;
  void *kv, *q, *out, *table, *lens;
  cudaMalloc(&kv, kv_bytes);
  cudaMemset(kv, 0, kv_bytes);
  cudaMalloc(&q, static_cast<size_t>(batch) * hq * d * 2);
  cudaMemset(q, 0, static_cast<size_t>(batch) * hq * d * 2);
  cudaMalloc(&out, static_cast<size_t>(batch) * hq * d * 2);
  std::vector<int32_t> t(static_cast<size_t>(nb));
  std::iota(t.begin(), t.end(), 0);
  std::shuffle(t.begin(), t.end(), std::mt19937(1));
  cudaMalloc(&table, t.size() * 4);
  cudaMemcpy(table, t.data(), t.size() * 4, cudaMemcpyHostToDevice);
  std::vector<int32_t> l(static_cast<size_t>(batch), ctx);
  cudaMalloc(&lens, l.size() * 4);
  cudaMemcpy(lens, l.data(), l.size() * 4, cudaMemcpyHostToDevice);
  // Split-KV as an engine would call it: the plan and the workspace size come from the host before the step.
  int32_t splits = 1;
  int64_t ws_bytes = 0;
  void* ws = nullptr;
  if (kvpager_cuda_plan_decode(batch, hkv, ctx, 0, &splits) != KVPAGER_STATUS_OK ||
      kvpager_cuda_decode_workspace_size(batch, hq, d, splits, &ws_bytes) != KVPAGER_STATUS_OK)
    return state.SkipWithError("plan failed");
  if (ws_bytes > 0) cudaMalloc(&ws, static_cast<size_t>(ws_bytes));
  int32_t rc = KVPAGER_STATUS_OK;
  time_gpu(state, [&] {
    rc |= kvpager_cuda_paged_attention_decode_split(out, nullptr, q, kv, static_cast<int32_t*>(table), static_cast<int32_t*>(lens),
                                                    batch, hq, hkv, d, bs, maxb, nb, 0.088F, KVPAGER_DTYPE_FP16, splits, ws,
                                                    ws_bytes, nullptr, nullptr);
  });
  if (rc != KVPAGER_STATUS_OK) state.SkipWithError("decode failed");
  state.counters["splits"] = splits;
  cudaFree(ws);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kv_bytes));
  state.counters["fraction_of_4.8TBps"] = benchmark::Counter(static_cast<double>(kv_bytes) / 4.8e12,
                                                             benchmark::Counter::kIsIterationInvariantRate);
  for (void* p : {kv, q, out, table, lens}) cudaFree(p);
}
BENCHMARK(BM_CudaDecode)->Name("cuda_decode_fp16_gqa4_d128/kvpager")->Args({4096, 8})->Args({16384, 8})->Args({32768, 1})->Args({32768, 32})->UseManualTime();

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
