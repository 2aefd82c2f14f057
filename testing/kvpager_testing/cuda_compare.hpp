// SPDX-License-Identifier: Apache-2.0
#pragma once
// CUDA kernels against the CPU backend on the same inputs: shared by tests/kernels/cuda_test.cpp (GoogleTest) and
// tools/gpu_check (a standalone program for GPU machines without GoogleTest or Google Benchmark).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>

#include <cuda_runtime.h>

#include "kvpager_testing/decode_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
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
                                  const std::vector<int32_t>& lens, int32_t splits, uint32_t seed,
                                  int32_t window_left = -1, float logits_soft_cap = 0.0F) {
  const decode_problem pr(dtype, d, bs, hq, hkv, lens, splits, seed, window_left, logits_soft_cap);
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
  if (window_left != -1 || logits_soft_cap != 0.0F) {
    ok &= kvpager_cuda_paged_attention_decode_split_ex(dout, dlse, dq, dkv, dt, dl, pr.S, hq, hkv, d, bs, pr.maxb, pr.nb,
                                                       pr.scale, window_left, logits_soft_cap, dtype, splits, ws,
                                                       ws_bytes, derr, nullptr) == KVPAGER_STATUS_OK;
  } else if (splits == 1) {
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
  const bool has_lse = splits > 1 || window_left != -1 || logits_soft_cap != 0.0F;
  gpu_vs_cpu worst = pr.compare(out, has_lse ? lse : std::vector<float>{});
  worst.calls_ok = worst.calls_ok && ok;
  for (void* ptr : {static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(dt), static_cast<void*>(dl),
                    static_cast<void*>(dout), static_cast<void*>(dlse), static_cast<void*>(derr), ws})
    cudaFree(ptr);
  return worst;
}

/// Decode over an fp8 E4M3 pool on the GPU (kvpager_cuda_paged_attention_decode_fp8 without window, cap or splits,
/// kvpager_cuda_paged_attention_decode_fp8_split_ex otherwise) against the CPU fp8 backend
/// (kvpager_cpu_paged_attention_decode_fp8_ex) on the same inputs: a decode_problem's shapes, table and query (query
/// and output of its dtype) over a pool of random finite e4m3 codes with per-tensor scales. Worst relative difference
/// of the outputs; calls_ok when every call returned OK and the device error flag stayed 0.
inline gpu_vs_cpu run_fp8_decode_case(int32_t q_dtype, int32_t d, int32_t bs, int32_t hq, int32_t hkv,
                                      const std::vector<int32_t>& lens, int32_t splits, uint32_t seed,
                                      int32_t window_left = -1, float logits_soft_cap = 0.0F) {
  const decode_problem pr(q_dtype, d, bs, hq, hkv, lens, splits, seed);
  std::vector<uint8_t> kv(static_cast<size_t>(pr.nb) * 2 * static_cast<size_t>(hkv * bs * d));
  std::mt19937 rng(seed + 1);
  for (auto& b : kv) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7F) == 0x7F) b ^= 1;  // S.1111.111 is NaN
  }
  const float k_scale = 1.0F / 160, v_scale = 1.0F / 224;
  std::vector<unsigned char> cpu(pr.q.size(), 0), out(pr.q.size(), 0xAB);
  bool ok = kvpager_cpu_paged_attention_decode_fp8_ex(cpu.data(), pr.q.data(), kv.data(), pr.table.data(), pr.lens.data(),
                                                      pr.S, hq, hkv, d, bs, pr.maxb, pr.nb, pr.scale, window_left,
                                                      logits_soft_cap, q_dtype, k_scale, v_scale, 0) == KVPAGER_STATUS_OK;
  auto* dkv = to_device(kv);
  auto* dq = to_device(pr.q);
  auto* dt = to_device(pr.table);
  auto* dl = to_device(pr.lens);
  auto* dout = to_device(out);
  auto* derr = to_device(std::vector<int32_t>{0});
  int64_t ws_bytes = 0;
  ok &= kvpager_cuda_decode_workspace_size(pr.S, hq, d, splits, &ws_bytes) == KVPAGER_STATUS_OK;
  void* ws = nullptr;
  if (ws_bytes > 0) ok &= cudaMalloc(&ws, static_cast<size_t>(ws_bytes)) == cudaSuccess;
  if (window_left == -1 && logits_soft_cap == 0.0F && splits == 1) {
    ok &= kvpager_cuda_paged_attention_decode_fp8(dout, dq, dkv, dt, dl, pr.S, hq, hkv, d, bs, pr.maxb, pr.nb, pr.scale,
                                                  q_dtype, k_scale, v_scale, derr, nullptr) == KVPAGER_STATUS_OK;
  } else {
    ok &= kvpager_cuda_paged_attention_decode_fp8_split_ex(dout, nullptr, dq, dkv, dt, dl, pr.S, hq, hkv, d, bs, pr.maxb,
                                                           pr.nb, pr.scale, window_left, logits_soft_cap, q_dtype,
                                                           k_scale, v_scale, splits, ws, ws_bytes, derr,
                                                           nullptr) == KVPAGER_STATUS_OK;
  }
  ok &= cudaDeviceSynchronize() == cudaSuccess;
  out = to_host(dout, out.size());
  ok &= to_host(derr, 1)[0] == 0;
  gpu_vs_cpu worst;
  worst.calls_ok = ok;
  for (size_t i = 0; i < cpu.size() / pr.esz(); ++i) {
    const double a = pr.value(cpu, i), b = pr.value(out, i);
    worst.out = std::max(worst.out, std::isnan(b) ? 1e9 : std::abs(a - b) / (1.0 + std::abs(a)));
  }
  for (void* ptr : {static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(dt), static_cast<void*>(dl),
                    static_cast<void*>(dout), static_cast<void*>(derr), ws})
    cudaFree(ptr);
  return worst;
}

/// kv_append, copy_blocks and swap_blocks (device -> pinned host -> device) on the GPU against the CPU functions,
/// bit for bit, plus a bad swap id refused before anything is copied: (what, passed) per check.
inline std::vector<std::pair<std::string, bool>> blocks_vs_cpu() {
  std::vector<std::pair<std::string, bool>> results;
  auto check = [&](bool ok, const char* what) { results.emplace_back(what, ok); };
  const int32_t hkv = 2, d = 64, bs = 16, nb = 64;
  const size_t block_elems = 2ULL * hkv * bs * d, block_bytes = block_elems * 2;
  std::vector<uint16_t> cache(nb * block_elems), k(40 * hkv * d), v(k.size());
  std::mt19937 rng(5);
  for (auto& x : cache) x = static_cast<uint16_t>(rng());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(rng());
    v[i] = static_cast<uint16_t>(rng());
  }
  std::vector<int64_t> slots(40);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = t % 7 == 3 ? -1 : static_cast<int64_t>((t * 37) % (nb * bs));
  auto cpu = cache;
  check(kvpager_cpu_kv_append(cpu.data(), k.data(), v.data(), slots.data(), 40, hkv, d, bs, nb, KVPAGER_DTYPE_FP16) == 0, "cpu kv_append");
  auto* dc = to_device(cache);
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  auto* ds = to_device(slots);
  check(kvpager_cuda_kv_append(dc, dk, dv, ds, 40, hkv, d, bs, nb, KVPAGER_DTYPE_FP16, nullptr, nullptr) == 0 &&
            to_host(dc, cache.size()) == cpu,
        "kv_append bit-exact");
  const std::vector<int64_t> pairs = {5, 1, 2, 3, 40, 41, 7, 60};
  void* cpu_ptr = cpu.data();
  check(kvpager_cpu_copy_blocks(&cpu_ptr, 1, pairs.data(), 4, nb, static_cast<int64_t>(block_bytes)) == 0, "cpu copy_blocks");
  auto* dptrs = to_device(std::vector<void*>{dc});
  auto* dpairs = to_device(pairs);
  check(kvpager_cuda_copy_blocks(dptrs, 1, dpairs, 4, nb, static_cast<int64_t>(block_bytes), nullptr, nullptr) == 0 &&
            to_host(dc, cache.size()) == cpu,
        "copy_blocks bit-exact");
  void* pinned = nullptr;
  cudaMallocHost(&pinned, nb * block_bytes);
  std::memset(pinned, 0, nb * block_bytes);
  std::vector<uint16_t> host_ref(nb * block_elems, 0);
  const std::vector<int64_t> out_pairs = {1, 4, 2, 5, 3, 6, 9, 30, 10, 0};
  check(kvpager_cpu_swap_blocks(host_ref.data(), nb, cpu.data(), nb, static_cast<int64_t>(block_bytes), out_pairs.data(), 5) == 0,
        "cpu swap_blocks");
  check(kvpager_cuda_swap_blocks(pinned, nb, dc, nb, static_cast<int64_t>(block_bytes), out_pairs.data(), 5, nullptr) == 0 &&
            cudaDeviceSynchronize() == cudaSuccess && std::memcmp(pinned, host_ref.data(), nb * block_bytes) == 0,
        "swap_blocks device -> pinned host bit-exact");
  const std::vector<int64_t> in_pairs = {4, 20, 5, 21, 6, 22, 30, 63};
  auto cpu_in = cpu;
  kvpager_cpu_swap_blocks(cpu_in.data(), nb, host_ref.data(), nb, static_cast<int64_t>(block_bytes), in_pairs.data(), 4);
  check(kvpager_cuda_swap_blocks(dc, nb, pinned, nb, static_cast<int64_t>(block_bytes), in_pairs.data(), 4, nullptr) == 0 &&
            to_host(dc, cache.size()) == cpu_in,
        "swap_blocks pinned host -> device bit-exact");
  const std::vector<int64_t> bad_pairs = {0, 1, 2, nb};  // the first pair is fine, the second is not
  const std::vector<unsigned char> pinned_before(static_cast<unsigned char*>(pinned), static_cast<unsigned char*>(pinned) + nb * block_bytes);
  check(kvpager_cuda_swap_blocks(pinned, nb, dc, nb, static_cast<int64_t>(block_bytes), bad_pairs.data(), 2, nullptr) ==
                KVPAGER_STATUS_INVALID_BLOCK &&
            cudaDeviceSynchronize() == cudaSuccess &&
            std::memcmp(pinned, pinned_before.data(), pinned_before.size()) == 0,
        "swap_blocks refuses a block id outside the pool, nothing copied");
  cudaFreeHost(pinned);
  for (void* p : {static_cast<void*>(dc), static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(ds),
                  static_cast<void*>(dptrs), static_cast<void*>(dpairs)})
    cudaFree(p);
  return results;
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
