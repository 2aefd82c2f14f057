#pragma once
// CUDA kernels against the CPU backend on the same inputs: shared by tests/kernels/cuda_test.cpp (GoogleTest) and
// tools/gpu_check (a standalone program for GPU machines without GoogleTest or Google Benchmark).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>

#include <cuda_runtime.h>

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

/// Tolerances of GPU against CPU outputs (both fp32-accumulated; fp16 a little above one rounding).
inline double gpu_tolerance(int32_t dtype) {
  return dtype == KVPAGER_DTYPE_FP32 ? 1e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

struct gpu_vs_cpu {
  bool calls_ok = true;  ///< every CPU and CUDA call returned OK and the device error flag stayed 0
  double out = 0, lse = 0;
};

/// One decode problem on the CPU backend and on the GPU with `splits` KV splits (1 = the unsplit entry point; the
/// CPU runs with the same split count); worst relative differences of the outputs and (splits > 1) of the LSEs.
inline gpu_vs_cpu run_decode_case(int32_t dtype, int32_t d, int32_t bs, int32_t hq, int32_t hkv,
                                  const std::vector<int32_t>& lens, int32_t splits, uint32_t seed) {
  gpu_vs_cpu worst;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
  const int32_t longest = *std::max_element(lens.begin(), lens.end());
  const int32_t maxb = std::max(1, (longest + bs - 1) / bs);
  int32_t nb = 3;
  for (int32_t len : lens) nb += (len + bs - 1) / bs;
  const size_t block_elems = 2ULL * hkv * bs * d;
  const bool f32 = dtype == KVPAGER_DTYPE_FP32;
  const size_t esz = f32 ? 4 : 2;
  auto fill = [&](std::vector<unsigned char>& bytes, size_t n) {
    bytes.resize(n * esz);
    for (size_t i = 0; i < n; ++i) {
      const float x = uni(rng);
      if (f32) {
        std::memcpy(bytes.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(x) : kvpager::detail::float_to_bf16(x);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
  };
  std::vector<unsigned char> kvh, qh;
  fill(kvh, static_cast<size_t>(nb) * block_elems);
  fill(qh, lens.size() * static_cast<size_t>(hq) * static_cast<size_t>(d));
  std::vector<int32_t> ids(static_cast<size_t>(nb));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(lens.size() * static_cast<size_t>(maxb), 0);
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[s * static_cast<size_t>(maxb) + static_cast<size_t>(b)] = ids[next++];
  const auto S = static_cast<int32_t>(lens.size());
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  std::vector<unsigned char> cpu_out(qh.size()), gpu_out(qh.size());
  std::vector<float> cpu_lse(lens.size() * static_cast<size_t>(hq)), gpu_lse(cpu_lse.size(), 0.0F);
  kvpager::decode_params p;
  p.out = cpu_out.data();
  p.query = qh.data();
  p.lse = cpu_lse.data();
  p.kv = kvpager::paged_kv_view::hnd(kvh.data(), dtype, nb, hkv, bs, d);
  p.pages.block_table = table.data();
  p.pages.row_stride = maxb;
  p.pages.seq_lens = lens.data();
  p.num_seqs = S;
  p.num_q_heads = hq;
  p.scale = scale;
  p.num_splits = splits;
  worst.calls_ok &= (kvpager::paged_attention_decode_cpu(p)) == KVPAGER_STATUS_OK;
  auto* dkv = to_device(kvh);
  auto* dq = to_device(qh);
  auto* dt = to_device(table);
  auto* dl = to_device(lens);
  auto* dout = to_device(gpu_out);
  auto* dlse = to_device(gpu_lse);
  auto* derr = to_device(std::vector<int32_t>{0});
  int64_t ws_bytes = 0;
  worst.calls_ok &= (kvpager_cuda_decode_workspace_size(S, hq, d, splits, &ws_bytes)) == KVPAGER_STATUS_OK;
  void* ws = nullptr;
  if (ws_bytes > 0) {
    worst.calls_ok &= (cudaMalloc(&ws, static_cast<size_t>(ws_bytes))) == cudaSuccess;
  }
  if (splits == 1) {
    worst.calls_ok &= (kvpager_cuda_paged_attention_decode(dout, dq, dkv, dt, dl, S, hq, hkv, d, bs, maxb, nb, scale, dtype, derr, nullptr)) == KVPAGER_STATUS_OK;
  } else {
    worst.calls_ok &= (kvpager_cuda_paged_attention_decode_split(dout, dlse, dq, dkv, dt, dl, S, hq, hkv, d, bs, maxb, nb, scale, dtype,
                                                        splits, ws, ws_bytes, derr, nullptr)) == KVPAGER_STATUS_OK;
  }
  worst.calls_ok &= (cudaDeviceSynchronize()) == cudaSuccess;
  gpu_out = to_host(dout, gpu_out.size());
  gpu_lse = to_host(dlse, gpu_lse.size());
  worst.calls_ok &= (to_host(derr, 1)[0]) == 0;
  for (size_t i = 0; i < gpu_out.size() / esz; ++i) {
    double a, b;
    if (f32) {
      float x, y;
      std::memcpy(&x, cpu_out.data() + 4 * i, 4);
      std::memcpy(&y, gpu_out.data() + 4 * i, 4);
      a = x;
      b = y;
    } else {
      uint16_t x, y;
      std::memcpy(&x, cpu_out.data() + 2 * i, 2);
      std::memcpy(&y, gpu_out.data() + 2 * i, 2);
      a = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(x) : kvpager::detail::bf16_to_float(x);
      b = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(y) : kvpager::detail::bf16_to_float(y);
    }
    worst.out = std::max(worst.out, std::abs(a - b) / (1.0 + std::abs(a)));
  }
  for (size_t i = 0; splits > 1 && i < cpu_lse.size(); ++i) {
    if (std::isinf(cpu_lse[i])) {
      if (!std::isinf(gpu_lse[i])) worst.lse = 1e9;
      continue;
    }
    worst.lse = std::max(worst.lse, std::abs(double{cpu_lse[i]} - gpu_lse[i]) / (1.0 + std::abs(cpu_lse[i])));
  }
  for (void* ptr : {static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(dt), static_cast<void*>(dl),
                    static_cast<void*>(dout), static_cast<void*>(dlse), static_cast<void*>(derr), ws})
    cudaFree(ptr);
  return worst;
}

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
