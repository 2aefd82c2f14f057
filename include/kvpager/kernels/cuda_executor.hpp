// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// cuda_executor: applies the cache's step plans to a device KV pool and a pinned host pool on one CUDA stream, with
/// the same order as step_executor: swap-outs, swap-ins, copies, then the appended tokens' K/V through the slot
/// mapping. All staging memory (device mapping and slot buffers, pinned staging, the host list of swap pairs) is
/// allocated once at creation; execute() allocates nothing; it waits only for the previous step's staging copies (an event) before reusing the
/// pinned staging buffer. Implemented in libkvpager_kernels when built with CUDA;
/// otherwise create() returns errc::unsupported. No CUDA header is needed to use it. A CUDA runtime failure (an
/// allocation, a copy, a launch) is errc::device_error, never errc::unsupported.

#include <cstdint>
#include <memory>
#include <span>

#include "kvpager/core/step_plan.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/kernels/export.hpp"
#include "kvpager/kernels/kv_layout.hpp"

KVPAGER_NAMESPACE_BEGIN

struct cuda_executor_config {
  kv_geometry geometry{};           ///< device pool geometry (one layer); must pass can_implement
  void* device_pool = nullptr;      ///< kv_layout::of(geometry).pool_bytes() of device memory
  void* host_pool = nullptr;        ///< num_host_blocks blocks of pinned host memory (cudaMallocHost)
  std::int32_t num_host_blocks = 0;
  void* stream = nullptr;           ///< cudaStream_t; nullptr = default stream
  std::int32_t max_copies = 4096;   ///< capacity of one plan's copies
  std::int32_t max_swaps = 4096;    ///< capacity of one plan's swap-outs, and of its swap-ins
  std::int32_t max_tokens = 65536;  ///< capacity of one plan's slot mapping
};

class cuda_executor {
 public:
  /// errc::unsupported without CUDA or a device, and for an fp8_e4m3 geometry (its appends need the per-tensor
  /// scales of kvpager_cuda_kv_append_fp8); errc::invalid_argument for a bad configuration, including a geometry the
  /// kernels reject (can_implement, whose status it returns); errc::device_error when a CUDA allocation fails.
  KVPAGER_KERNELS_EXPORT static result<std::unique_ptr<cuda_executor>> create(const cuda_executor_config& cfg);
  KVPAGER_KERNELS_EXPORT ~cuda_executor();
  cuda_executor(const cuda_executor&) = delete;
  cuda_executor& operator=(const cuda_executor&) = delete;

  /// Enqueues `plan` on the stream. `slots` (host) is the plan's slot mapping; `k` and `v` are device buffers
  /// [slots.size(), kv_heads, head_dim]. errc::buffer_too_small beyond the configured capacities,
  /// errc::invalid_block for an id outside the pools (checked on the host before anything is enqueued);
  /// errc::device_error when the CUDA runtime refuses a copy or a launch (what was enqueued before stays enqueued).
  KVPAGER_KERNELS_EXPORT status execute(const step_plan& plan, std::span<const std::int64_t> slots, const void* k, const void* v);

 private:
  explicit cuda_executor(const cuda_executor_config& cfg) : cfg_(cfg), layout_(kv_layout::of(cfg.geometry)) {}
  cuda_executor_config cfg_;
  kv_layout layout_;
  std::unique_ptr<std::int64_t[]> swap_pairs_;  ///< host int64 [max_swaps, 2], read by kvpager_cuda_swap_blocks
  void* dev_pairs_ = nullptr;    ///< device int64 [max_copies, 2]
  void* dev_slots_ = nullptr;    ///< device int64 [max_tokens]
  void* dev_caches_ = nullptr;   ///< device void* [1]
  void* host_stage_ = nullptr;   ///< pinned int64 [2 * max_copies + max_tokens]
  void* staged_ = nullptr;       ///< cudaEvent_t recorded after the staging copies of the last execute()
};

KVPAGER_NAMESPACE_END
