// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA prefill on a GPU against the fp64 reference of a prefill_problem, and the prefill benchmark setup: shared
// by tests/kernels/cuda_test.cpp, bench/cuda_bench.cpp and tools/gpu_check (kvpager-gpu-check).
#include <kvpager/c/kernels.h>

#include <cuda_runtime.h>

#include "kvpager_testing/cuda_compare.hpp"
#include "kvpager_testing/prefill_problem.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace kvpager_gpu_check {

/// Dense bf16 tensor-core peak of an H100/H200 SXM (989 TFLOP/s without sparsity), the yardstick of issue 12.
inline constexpr double kH200DenseBf16Flops = 989.4e12;

struct prefill_vs_ref {
  bool calls_ok = true;  ///< the plan, the call and the synchronization returned OK
  int32_t device_error = 0;
  double out = 0;  ///< worst relative difference against the fp64 reference
  double lse = 0;  ///< worst absolute difference of the LSE against the reference's
  std::vector<unsigned char> output;  ///< the GPU's output (for a comparison with the CPU backend)
};

/// One prefill problem on the GPU (num_ctas 0: as kvpager_cuda_plan_prefill plans it) against its fp64 reference,
/// with the LSE output; over the fp8 pool (kvpager_cuda_paged_attention_prefill_fp8) when the problem has one.
inline prefill_vs_ref run_prefill_case(const prefill_problem& pr, int32_t num_ctas = 0) {
  prefill_vs_ref r;
  const bool fp8 = !pr.kv8.empty();
  auto* dkv = fp8 ? to_device(pr.kv8) : to_device(pr.kv);
  std::vector<float> lse(static_cast<size_t>(pr.rows) * static_cast<size_t>(pr.hq), -1.0F);
  auto* dlse = to_device(lse);
  auto* dq = to_device(pr.q);
  auto* di = to_device(pr.indptr);
  auto* dt = to_device(pr.table);
  auto* dl = to_device(pr.lens);
  std::vector<unsigned char> out(pr.q.size(), 0xFF);
  auto* dout = to_device(out);
  auto* derr = to_device(std::vector<int32_t>{0});
  int64_t ws_bytes = 0;
  void* ws = nullptr;
  r.calls_ok = kvpager_cuda_prefill_workspace_size(pr.S, &ws_bytes) == KVPAGER_STATUS_OK &&
               cudaMalloc(&ws, static_cast<size_t>(std::max<int64_t>(ws_bytes, 8))) == cudaSuccess;
  if (num_ctas == 0) r.calls_ok &= kvpager_cuda_plan_prefill(pr.rows, pr.hq, pr.hkv, 0, &num_ctas) == KVPAGER_STATUS_OK;
  r.calls_ok &= (fp8 ? kvpager_cuda_paged_attention_prefill_fp8(
                           dout, dlse, dq, dkv, di, dt, dl, pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb, pr.scale,
                           pr.window_left, pr.cap, pr.dtype, pr.k_scale, pr.v_scale, num_ctas, ws, ws_bytes, derr, nullptr)
                     : kvpager_cuda_paged_attention_prefill(dout, dlse, dq, dkv, di, dt, dl, pr.S, pr.hq, pr.hkv, pr.d,
                                                            pr.bs, pr.maxb, pr.nb, pr.scale, pr.window_left, pr.cap,
                                                            pr.dtype, num_ctas, ws, ws_bytes, derr, nullptr)) ==
                    KVPAGER_STATUS_OK;
  r.calls_ok &= cudaDeviceSynchronize() == cudaSuccess;
  out = to_host(dout, out.size());
  r.device_error = to_host(derr, 1)[0];
  r.out = pr.compare(out);
  r.lse = pr.compare_lse(to_host(dlse, lse.size()));
  r.output = std::move(out);
  for (void* p : {static_cast<void*>(dlse), static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(di), static_cast<void*>(dt),
                  static_cast<void*>(dl), static_cast<void*>(dout), static_cast<void*>(derr), ws})
    cudaFree(p);
  return r;
}

/// The prefill benchmark setup shared by bench_cuda and kvpager-gpu-check: a bf16 pool holding `batch` sequences of
/// `ctx` tokens behind shuffled block ids (32 query heads over 8 KV heads, head_dim 128, block 16), of which the last
/// q_len are the new tokens (q_len = ctx: a whole prompt; less: an extension over a cached prefix), causal, grid planned
/// and workspace allocated up front as an engine would before the step.
struct prefill_bench {
  static constexpr int32_t hq = 32, hkv = 8, d = 128, bs = 16;
  int32_t ctx, q_len, batch, maxb, nb, rows, ctas = 0;
  int64_t ws_bytes = 0;
  void *kv = nullptr, *q = nullptr, *out = nullptr, *ws = nullptr;
  int32_t *table = nullptr, *lens = nullptr, *indptr = nullptr;
  bool ok = false;

  prefill_bench(int32_t context, int32_t new_tokens, int32_t sequences)
      : ctx(context), q_len(new_tokens), batch(sequences), maxb((context + bs - 1) / bs), nb(sequences * maxb),
        rows(sequences * new_tokens) {
    const size_t kv_bytes = static_cast<size_t>(nb) * 2 * hkv * bs * d * 2, qbytes = static_cast<size_t>(rows) * hq * d * 2;
    ok = cudaMalloc(&kv, kv_bytes) == cudaSuccess && cudaMalloc(&q, qbytes) == cudaSuccess &&
         cudaMalloc(&out, qbytes) == cudaSuccess && cudaMemset(kv, 0, kv_bytes) == cudaSuccess &&
         cudaMemset(q, 0, qbytes) == cudaSuccess;
    std::vector<int32_t> ids(static_cast<size_t>(nb)), offsets(static_cast<size_t>(batch) + 1);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
    for (size_t s = 0; s < offsets.size(); ++s) offsets[s] = static_cast<int32_t>(s) * q_len;
    table = to_device(ids);
    lens = to_device(std::vector<int32_t>(static_cast<size_t>(batch), ctx));
    indptr = to_device(offsets);
    ok = ok && table != nullptr && lens != nullptr && indptr != nullptr &&
         kvpager_cuda_plan_prefill(rows, hq, hkv, 0, &ctas) == KVPAGER_STATUS_OK &&
         kvpager_cuda_prefill_workspace_size(batch, &ws_bytes) == KVPAGER_STATUS_OK &&
         cudaMalloc(&ws, static_cast<size_t>(ws_bytes)) == cudaSuccess;
  }
  prefill_bench(const prefill_bench&) = delete;
  prefill_bench& operator=(const prefill_bench&) = delete;
  ~prefill_bench() {
    for (void* p : {kv, q, out, ws, static_cast<void*>(table), static_cast<void*>(lens), static_cast<void*>(indptr)})
      cudaFree(p);
  }
  /// FLOPs of one call: 4 x (query, key) pairs the causal mask keeps x heads x head_dim (QK^T and PV).
  [[nodiscard]] double flops() const {
    const double prefix = ctx - q_len;
    const double pairs = static_cast<double>(q_len) * prefix + static_cast<double>(q_len) * (q_len + 1) / 2.0;
    return 4.0 * pairs * hq * d * batch;
  }
  /// Queues one prefill; returns its status.
  int32_t run() const {
    return kvpager_cuda_paged_attention_prefill(out, nullptr, q, kv, indptr, table, lens, batch, hq, hkv, d, bs, maxb, nb, 0.088F,
                                                -1, 0.0F, KVPAGER_DTYPE_BF16, ctas, ws, ws_bytes, nullptr, nullptr);
  }
};

}  // namespace kvpager_gpu_check
