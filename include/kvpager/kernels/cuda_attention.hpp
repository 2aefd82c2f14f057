// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// C++ interface of the CUDA paged attention: the same decode_params and prefill_params as the CPU operations
/// (attention.hpp, prefill.hpp), with every pointer in device memory, plus where the call runs (cuda_launch), and the
/// same kvpager::status answers (kernel_status of the C ABI's codes). The CUDA kernels read the default layout
/// (paged_kv_view::hnd, contiguous) through a dense block table; another view (NHD, other strides) or CSR pages is
/// errc::unsupported before anything else is checked. Everything the host can check is checked as the CPU operation
/// checks it (same codes, same order, through the C functions kvpager_cuda_paged_attention_decode_split_ex /
/// _decode_fp8_split_ex / _prefill / _prefill_fp8, which these fill and call); block ids, lengths and query rows live in
/// device memory and are flagged by the kernels in launch.error_flag, as kvpager/c/kernels.h describes. num_threads is
/// the CPU's and is ignored here. Without a device: errc::no_device (kernel_status(NO_DEVICE)), after the host checks;
/// in a build without CUDA, no_device for every call (the stubs check nothing) except the two answers these functions
/// give themselves before forwarding: an unreadable view (unsupported) and, over a plain pool, a query dtype that is
/// neither -1 nor the pool's (UNSUPPORTED_DTYPE, as on the CPU). Implemented in libkvpager_kernels.

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/export.hpp"
#include "kvpager/kernels/prefill.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Where a CUDA attention call runs.
struct cuda_launch {
  void* stream = nullptr;              ///< cudaStream_t; nullptr = the default stream
  std::int32_t* error_flag = nullptr;  ///< device int32 the kernels set to a KVPAGER_STATUS_* code; may be nullptr
  /// Prefill only: the grid, >= 1, from kvpager_cuda_plan_prefill (any value gives the same result); below 1 is
  /// invalid_argument, as the C function answers it.
  std::int32_t num_ctas = 0;
  /// Prefill only: kvpager_cuda_prefill_workspace_size bytes of 8-byte aligned device memory (num_seqs > 0).
  void* prefill_workspace = nullptr;
  std::int64_t prefill_workspace_bytes = 0;
};

/// Decode on the GPU. p.num_splits: >= 1 (plan it with kvpager_cuda_plan_decode from the longest sequence, which the
/// host knows and the device pages do not say); 0 runs without splits (1). p.workspace / workspace_bytes: device
/// memory of kvpager_cuda_decode_workspace_size bytes for p.num_splits > 1. p.lse: nullptr or device memory.
[[nodiscard]] KVPAGER_KERNELS_EXPORT status paged_attention_decode_cuda(const decode_params& p,
                                                                       const cuda_launch& launch) noexcept;

/// Prefill on the GPU, launch.num_ctas CTAs (>= 1) over launch.prefill_workspace.
[[nodiscard]] KVPAGER_KERNELS_EXPORT status paged_attention_prefill_cuda(const prefill_params& p,
                                                                        const cuda_launch& launch) noexcept;

KVPAGER_NAMESPACE_END
