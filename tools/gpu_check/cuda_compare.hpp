#pragma once
// CUDA kernels against the CPU backend on the same inputs: shared by tests/kernels/cuda_test.cpp (GoogleTest) and
// tools/gpu_check (a standalone program for GPU machines without GoogleTest or Google Benchmark).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>

#include <cuda_runtime.h>

#include "decode_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvpager_gpu_check {

inline bool have_gpu() {
  int32_t n = 0;
  return kvpager_cuda_device_count(&n) == KVPAGER_STATUS_OK && n > 0;
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))) != cudaSuccess) return nullptr;
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

/// One decode problem on the CPU backend and on the GPU with `splits` KV splits (1 = the unsplit entry point; the
/// CPU runs with the same split count); worst relative differences of the outputs and (splits > 1) of the LSEs.
inline gpu_vs_cpu run_decode_case(int32_t dtype, int32_t d, int32_t bs, int32_t hq, int32_t hkv,
                                  const std::vector<int32_t>& lens, int32_t splits, uint32_t seed) {
  const decode_problem pr(dtype, d, bs, hq, hkv, lens, splits, seed);
  bool ok = pr.cpu_ok;
  auto* dkv = to_device(pr.kv);
  auto* dq = to_device(pr.q);
  auto* dt = to_device(pr.table);
  auto* dl = to_device(pr.lens);
  std::vector<unsigned char> out(pr.q.size());
  std::vector<float> lse(pr.cpu_lse.size(), 0.0F);
  auto* dout = to_device(out);
  auto* dlse = to_device(lse);
  auto* derr = to_device(std::vector<int32_t>{0});
  int64_t ws_bytes = 0;
  ok &= kvpager_cuda_decode_workspace_size(pr.S, hq, d, splits, &ws_bytes) == KVPAGER_STATUS_OK;
  void* ws = nullptr;
  if (ws_bytes > 0) ok &= cudaMalloc(&ws, static_cast<size_t>(ws_bytes)) == cudaSuccess;
  if (splits == 1) {
    ok &= kvpager_cuda_paged_attention_decode(dout, dq, dkv, dt, dl, pr.S, hq, hkv, d, bs, pr.maxb, pr.nb, pr.scale, dtype,
                                              derr, nullptr) == KVPAGER_STATUS_OK;
  } else {
    ok &= kvpager_cuda_paged_attention_decode_split(dout, dlse, dq, dkv, dt, dl, pr.S, hq, hkv, d, bs, pr.maxb, pr.nb,
                                                    pr.scale, dtype, splits, ws, ws_bytes, derr, nullptr) == KVPAGER_STATUS_OK;
  }
  ok &= cudaDeviceSynchronize() == cudaSuccess;
  out = to_host(dout, out.size());
  lse = to_host(dlse, lse.size());
  ok &= to_host(derr, 1)[0] == 0;
  gpu_vs_cpu worst = pr.compare(out, splits > 1 ? lse : std::vector<float>{});
  worst.calls_ok = worst.calls_ok && ok;
  for (void* ptr : {static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(dt), static_cast<void*>(dl),
                    static_cast<void*>(dout), static_cast<void*>(dlse), static_cast<void*>(derr), ws})
    cudaFree(ptr);
  return worst;
}

/// Times calls that queue work on the default stream, with a pair of CUDA events (after one warm-up call).
class event_timer {
 public:
  template <class Fn>
  explicit event_timer(Fn&& warm_up) {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
    warm_up();
    cudaDeviceSynchronize();
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  ~event_timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  /// Seconds fn's work took on the device.
  template <class Fn>
  double seconds(Fn&& fn) {
    cudaEventRecord(a_);
    fn();
    cudaEventRecord(b_);
    cudaEventSynchronize(b_);
    float ms = 0;
    cudaEventElapsedTime(&ms, a_, b_);
    return static_cast<double>(ms) / 1e3;
  }

 private:
  cudaEvent_t a_{}, b_{};
};

/// The decode bandwidth setup shared by bench_cuda and kvpager-gpu-check: an fp16 pool holding `batch` sequences of
/// `ctx` tokens behind shuffled block ids (32 query heads over 8 KV heads, head_dim 128, block 16), with the split
/// count planned on the host and its workspace allocated up front, as an engine would before the step.
struct decode_bench {
  static constexpr int32_t hq = 32, hkv = 8, d = 128, bs = 16;
  int32_t ctx, batch, maxb, nb, splits = 1;
  size_t kv_bytes;
  int64_t ws_bytes = 0;
  void *kv = nullptr, *q = nullptr, *out = nullptr, *ws = nullptr;
  int32_t *table = nullptr, *lens = nullptr;
  bool ok = true;

  decode_bench(int32_t context, int32_t sequences)
      : ctx(context), batch(sequences), maxb((context + bs - 1) / bs), nb(sequences * maxb),
        kv_bytes(static_cast<size_t>(nb) * 2 * hkv * bs * d * 2) {
    const size_t qbytes = static_cast<size_t>(batch) * hq * d * 2;
    ok = cudaMalloc(&kv, kv_bytes) == cudaSuccess && cudaMalloc(&q, qbytes) == cudaSuccess &&
         cudaMalloc(&out, qbytes) == cudaSuccess && cudaMemset(kv, 0, kv_bytes) == cudaSuccess &&
         cudaMemset(q, 0, qbytes) == cudaSuccess;
    std::vector<int32_t> ids(static_cast<size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
    table = to_device(ids);
    lens = to_device(std::vector<int32_t>(static_cast<size_t>(batch), ctx));
    ok = ok && table != nullptr && lens != nullptr && kvpager_cuda_plan_decode(batch, hkv, ctx, 0, &splits) == KVPAGER_STATUS_OK &&
         kvpager_cuda_decode_workspace_size(batch, hq, d, splits, &ws_bytes) == KVPAGER_STATUS_OK &&
         (ws_bytes == 0 || cudaMalloc(&ws, static_cast<size_t>(ws_bytes)) == cudaSuccess);
  }
  decode_bench(const decode_bench&) = delete;
  decode_bench& operator=(const decode_bench&) = delete;
  ~decode_bench() {
    for (void* p : {kv, q, out, ws, static_cast<void*>(table), static_cast<void*>(lens)}) cudaFree(p);
  }
  /// Queues one decode step; returns its status.
  int32_t run() const {
    return kvpager_cuda_paged_attention_decode_split(out, nullptr, q, kv, table, lens, batch, hq, hkv, d, bs, maxb, nb, 0.088F,
                                                     KVPAGER_DTYPE_FP16, splits, ws, ws_bytes, nullptr, nullptr);
  }
};

}  // namespace kvpager_gpu_check
