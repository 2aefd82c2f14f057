// SPDX-License-Identifier: Apache-2.0
// cuda_executor: step plans on a CUDA stream (include/kvpager/kernels/cuda_executor.hpp). Every C entry point's code
// and every CUDA runtime error go through the one mapping (kernel_status, cuda_status): a device fault is
// errc::device_error, never errc::unsupported.
#include "kvpager/kernels/cuda_executor.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/can_implement.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/cuda/cuda_status.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace {

/// The status of a CUDA runtime call, through the one C-code mapping.
status runtime_status(cudaError_t err) noexcept { return kernel_status(kernels::detail::cuda_status(err)); }

}  // namespace

result<std::unique_ptr<cuda_executor>> cuda_executor::create(const cuda_executor_config& cfg) {
  int32_t n = 0;
  if (const int32_t rc = kvpager_cuda_device_count(&n); rc != KVPAGER_STATUS_OK) return kernel_status(rc);  // unsupported
  // The geometry every kernel checks (kv_append would refuse each step otherwise).
  if (const status g = can_implement(cfg.geometry); !g.ok()) return g;
  // An fp8 pool needs its per-tensor scales at every append (kvpager_cuda_kv_append_fp8); the executor's plans carry
  // none, so it runs fp32/fp16/bf16 pools only.
  if (cfg.geometry.dtype == kv_dtype::fp8_e4m3)
    return status{errc::unsupported, "cuda_executor: fp8 KV pools are appended with kvpager_cuda_kv_append_fp8 (scales)"};
  const kv_layout layout = kv_layout::of(cfg.geometry);
  if (cfg.device_pool == nullptr || cfg.max_copies <= 0 || cfg.max_tokens <= 0 || cfg.max_swaps <= 0 ||
      cfg.num_host_blocks < 0 || (cfg.num_host_blocks > 0 && cfg.host_pool == nullptr) ||
      !kernels::detail::valid_pool(std::max(cfg.num_host_blocks, 1), layout.block_bytes()))
    return status{errc::invalid_argument, "cuda_executor: bad configuration"};
  std::unique_ptr<cuda_executor> e(new (std::nothrow) cuda_executor(cfg));
  if (!e) return status{errc::out_of_memory, "cuda_executor: out of host memory"};
  e->swap_pairs_.reset(new (std::nothrow) std::int64_t[2 * static_cast<std::size_t>(cfg.max_swaps)]);
  if (!e->swap_pairs_) return status{errc::out_of_memory, "cuda_executor: out of host memory"};
  const auto pairs_bytes = static_cast<size_t>(cfg.max_copies) * 2 * sizeof(int64_t);
  const auto slot_bytes = static_cast<size_t>(cfg.max_tokens) * sizeof(int64_t);
  cudaError_t err = cudaMalloc(&e->dev_pairs_, pairs_bytes);
  if (err == cudaSuccess) err = cudaMalloc(&e->dev_slots_, slot_bytes);
  if (err == cudaSuccess) err = cudaMalloc(&e->dev_caches_, sizeof(void*));
  if (err == cudaSuccess) err = cudaMallocHost(&e->host_stage_, pairs_bytes + slot_bytes + sizeof(void*));
  cudaEvent_t ev = nullptr;
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  e->staged_ = ev;
  void* pool = cfg.device_pool;
  if (err == cudaSuccess) err = cudaMemcpy(e->dev_caches_, &pool, sizeof(void*), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return runtime_status(err);
  return e;
}

cuda_executor::~cuda_executor() {
  cudaFree(dev_pairs_);
  cudaFree(dev_slots_);
  cudaFree(dev_caches_);
  cudaFreeHost(host_stage_);
  if (staged_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(staged_));
}

status cuda_executor::execute(const step_plan& plan, std::span<const std::int64_t> slots, const void* k, const void* v) {
  const kv_layout& L = layout_;
  const std::int32_t dtype = static_cast<std::int32_t>(cfg_.geometry.dtype);
  if (static_cast<std::int64_t>(plan.copies().size()) > cfg_.max_copies ||
      static_cast<std::int64_t>(plan.swap_outs().size()) > cfg_.max_swaps ||
      static_cast<std::int64_t>(plan.swap_ins().size()) > cfg_.max_swaps ||
      static_cast<std::int64_t>(slots.size()) > cfg_.max_tokens)
    return status{errc::buffer_too_small, "cuda_executor::execute: plan larger than the configured capacity"};
  for (const block_swap& w : plan.swap_outs())
    if (w.device < 0 || w.device >= L.num_blocks || w.host < 0 || w.host >= cfg_.num_host_blocks)
      return status{errc::invalid_block, "cuda_executor::execute: swap-out block out of range"};
  for (const block_swap& w : plan.swap_ins())
    if (w.device < 0 || w.device >= L.num_blocks || w.host < 0 || w.host >= cfg_.num_host_blocks)
      return status{errc::invalid_block, "cuda_executor::execute: swap-in block out of range"};
  for (const block_copy& c : plan.copies())
    if (c.src < 0 || c.src >= L.num_blocks || c.dst < 0 || c.dst >= L.num_blocks)
      return status{errc::invalid_block, "cuda_executor::execute: copy block out of range"};
  const auto stream = static_cast<cudaStream_t>(cfg_.stream);
  const std::int64_t bb = L.block_bytes();
  // (1) swap-outs and (2) swap-ins, consecutive runs merged by kvpager_cuda_swap_blocks; the pair list is the buffer
  // allocated at creation (kvpager_cuda_swap_blocks reads it on the host before returning).
  std::int64_t* pairs = swap_pairs_.get();
  std::size_t n = 0;
  for (const block_swap& w : plan.swap_outs()) {
    pairs[n++] = w.device;
    pairs[n++] = w.host;
  }
  if (n > 0) {
    if (const status s = kernel_status(kvpager_cuda_swap_blocks(cfg_.host_pool, cfg_.num_host_blocks, cfg_.device_pool,
                                                                L.num_blocks, bb, pairs, static_cast<int32_t>(n / 2),
                                                                cfg_.stream));
        !s.ok())
      return s;
  }
  n = 0;
  for (const block_swap& w : plan.swap_ins()) {
    pairs[n++] = w.host;
    pairs[n++] = w.device;
  }
  if (n > 0) {
    if (const status s = kernel_status(kvpager_cuda_swap_blocks(cfg_.device_pool, L.num_blocks, cfg_.host_pool,
                                                                cfg_.num_host_blocks, bb, pairs,
                                                                static_cast<int32_t>(n / 2), cfg_.stream));
        !s.ok())
      return s;
  }
  // (3) copies and (4) slot writes: staged through pinned memory, copied to the device on the stream. The previous
  // step's staging copies must have left the buffer before it is rewritten.
  if (const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(staged_)); err != cudaSuccess)
    return runtime_status(err);
  auto* stage = static_cast<std::int64_t*>(host_stage_);
  const std::size_t ncopy = plan.copies().size();
  for (std::size_t i = 0; i < ncopy; ++i) {
    stage[2 * i] = plan.copies()[i].src;
    stage[2 * i + 1] = plan.copies()[i].dst;
  }
  std::int64_t* slot_stage = stage + 2 * static_cast<std::size_t>(cfg_.max_copies);
  if (!slots.empty()) std::memcpy(slot_stage, slots.data(), slots.size() * sizeof(std::int64_t));
  if (ncopy > 0) {
    if (const cudaError_t err =
            cudaMemcpyAsync(dev_pairs_, stage, ncopy * 2 * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream);
        err != cudaSuccess)
      return runtime_status(err);
    if (const status s = kernel_status(kvpager_cuda_copy_blocks(static_cast<void* const*>(dev_caches_), 1,
                                                                static_cast<const int64_t*>(dev_pairs_),
                                                                static_cast<int32_t>(ncopy), L.num_blocks, bb, nullptr,
                                                                cfg_.stream));
        !s.ok())
      return s;
  }
  if (!slots.empty()) {
    if (const cudaError_t err = cudaMemcpyAsync(dev_slots_, slot_stage, slots.size() * sizeof(std::int64_t),
                                                cudaMemcpyHostToDevice, stream);
        err != cudaSuccess)
      return runtime_status(err);
    if (const status s = kernel_status(kvpager_cuda_kv_append(cfg_.device_pool, k, v, static_cast<const int64_t*>(dev_slots_),
                                                              static_cast<int32_t>(slots.size()), L.num_kv_heads,
                                                              L.head_dim, L.block_size, L.num_blocks, dtype, nullptr,
                                                              cfg_.stream));
        !s.ok())
      return s;
  }
  if (const cudaError_t err = cudaEventRecord(static_cast<cudaEvent_t>(staged_), stream); err != cudaSuccess)
    return runtime_status(err);
  return ok_status();
}

KVPAGER_NAMESPACE_END
