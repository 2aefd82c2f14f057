// SPDX-License-Identifier: Apache-2.0
// CUDA entry points of paged prefill (extend) attention: the workspace query, the host-side plan and the call itself
// (host checks, then two kernels queued on the stream: prefill_prepare_kernel turns qo_indptr into tile offsets in
// the workspace, then the attention kernel walks the tiles). The device code is in device_prefill.cuh. Same
// semantics as the CPU backend's kvpager_cpu_paged_attention_prefill: tests/kernels/cuda_test.cpp compares them on a
// GPU, tests/kernels/cuda_prefill_emulation_test.cpp runs the device code on CPU threads everywhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kernels/common/checks.hpp"
#include "kernels/cuda/cuda_status.hpp"
#include "kernels/cuda/device_prefill.cuh"

namespace {

using namespace kvpager::kernels::detail;

/// The tensor-core kernel for query type T over a pool of KV (T, or uint8_t for fp8 E4M3), one instantiation per
/// supported head dim.
template <class T, class KV = T>
void launch_mma(const prefill_params& a, unsigned ctas, cudaStream_t s) {
  switch (a.d) {
    case 64: prefill_mma_kernel<T, 64, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case 80: prefill_mma_kernel<T, 80, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case 96: prefill_mma_kernel<T, 96, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case 112: prefill_mma_kernel<T, 112, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case 128: prefill_mma_kernel<T, 128, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    default: prefill_mma_kernel<T, 256, KV><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
  }
}

}  // namespace

extern "C" {

int32_t kvpager_cuda_plan_prefill(int32_t total_q_rows, int32_t num_q_heads, int32_t num_kv_heads, int32_t device,
                                  int32_t* num_ctas) {
  if (const int32_t rc = check_prefill_plan_args(total_q_rows, num_q_heads, num_kv_heads, device, num_ctas);
      rc != KVPAGER_STATUS_OK)
    return rc;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    return KVPAGER_STATUS_NO_DEVICE;
  }
  *num_ctas = plan_prefill_ctas(total_q_rows, num_q_heads, sms);
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cuda_paged_attention_prefill(void* out, float* lse, const void* query, const void* kv_cache,
                                             const int32_t* qo_indptr, const int32_t* block_table,
                                             const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads,
                                             int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                             int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                             int32_t window_left, float logits_soft_cap, int32_t dtype,
                                             int32_t num_ctas, void* workspace, int64_t workspace_bytes,
                                             int32_t* error_flag, void* stream) {
  if (num_ctas < 1 || workspace_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_dense_prefill(out, query, kv_cache, qo_indptr, block_table, seq_lens, num_seqs,
                                            num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq,
                                            num_blocks, scale, window_left, logits_soft_cap, dtype, dtype, 1.0F, 1.0F);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  if (workspace == nullptr || workspace_bytes < prefill_workspace_bytes(num_seqs)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const prefill_params a{out, query, kv_cache, qo_indptr, block_table, seq_lens, static_cast<int64_t*>(workspace),
                         num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks,
                         scale, window_left, logits_soft_cap, error_flag, lse, 1.0F};
  auto s = static_cast<cudaStream_t>(stream);
  prefill_prepare_kernel<kPrefillPrepThreads><<<1, kPrefillPrepThreads, 0, s>>>(a);
  const auto ctas = static_cast<unsigned>(num_ctas);
  switch (dtype) {
    case KVPAGER_DTYPE_FP32: prefill_simt_kernel<float><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case KVPAGER_DTYPE_FP16: launch_mma<__half>(a, ctas, s); break;
    default: launch_mma<__nv_bfloat16>(a, ctas, s); break;
  }
  return launch_status();
}

int32_t kvpager_cuda_paged_attention_prefill_fp8(void* out, float* lse, const void* query, const void* kv_cache,
                                                 const int32_t* qo_indptr, const int32_t* block_table,
                                                 const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads,
                                                 int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                                 int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                                 int32_t window_left, float logits_soft_cap, int32_t q_dtype,
                                                 float k_scale, float v_scale, int32_t num_ctas, void* workspace,
                                                 int64_t workspace_bytes, int32_t* error_flag, void* stream) {
  if (num_ctas < 1 || workspace_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = check_dense_prefill(out, query, kv_cache, qo_indptr, block_table, seq_lens, num_seqs,
                                            num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq,
                                            num_blocks, scale, window_left, logits_soft_cap, KVPAGER_DTYPE_FP8_E4M3,
                                            fp8_entry_io_dtype(q_dtype), k_scale, v_scale);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  if (workspace == nullptr || workspace_bytes < prefill_workspace_bytes(num_seqs)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  // k_scale folded into the score scale (before the soft cap, which sees the true score), v_scale into the output.
  const prefill_params a{out, query, kv_cache, qo_indptr, block_table, seq_lens, static_cast<int64_t*>(workspace),
                         num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks,
                         scale * k_scale, window_left, logits_soft_cap, error_flag, lse, v_scale};
  auto s = static_cast<cudaStream_t>(stream);
  prefill_prepare_kernel<kPrefillPrepThreads><<<1, kPrefillPrepThreads, 0, s>>>(a);
  const auto ctas = static_cast<unsigned>(num_ctas);
  switch (q_dtype) {
    case KVPAGER_DTYPE_FP32: prefill_simt_kernel<uint8_t><<<ctas, kPrefillWarps * 32, 0, s>>>(a); break;
    case KVPAGER_DTYPE_FP16: launch_mma<__half, uint8_t>(a, ctas, s); break;
    default: launch_mma<__nv_bfloat16, uint8_t>(a, ctas, s); break;
  }
  return launch_status();
}

}  // extern "C"
