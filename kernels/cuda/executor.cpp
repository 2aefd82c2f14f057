// cuda_executor: step plans on a CUDA stream (include/kvpager/kernels/cuda_executor.hpp).
#include "kvpager/kernels/cuda_executor.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../common/checks.hpp"

KVPAGER_NAMESPACE_BEGIN

result<std::unique_ptr<cuda_executor>> cuda_executor::create(const cuda_executor_config& cfg) {
  int32_t n = 0;
  if (kvpager_cuda_device_count(&n) != KVPAGER_STATUS_OK) return status{errc::unsupported, "cuda_executor: no CUDA device"};
  if (cfg.device_pool == nullptr || cfg.layout.num_blocks <= 0 || cfg.max_copies <= 0 || cfg.max_tokens <= 0 ||
      (cfg.num_host_blocks > 0 && cfg.host_pool == nullptr))
    return status{errc::invalid_argument, "cuda_executor: bad configuration"};
  // The geometry every kernel checks (kv_append would refuse each step otherwise), and element bytes to match dtype.
  if (kvpager_kernels::check_kv_geometry(cfg.layout.num_kv_heads, cfg.layout.head_dim, cfg.layout.block_size, cfg.dtype,
                                         cfg.layout.num_blocks) != KVPAGER_STATUS_OK ||
      cfg.layout.elem_bytes != kvpager_kernels::elem_bytes(cfg.dtype) || cfg.num_host_blocks < 0 ||
      !kvpager_kernels::valid_pool(std::max(cfg.num_host_blocks, 1), cfg.layout.block_bytes()))
    return status{errc::invalid_argument, "cuda_executor: KV geometry the kernels do not support"};
  std::unique_ptr<cuda_executor> e(new cuda_executor(cfg));
  const auto pairs_bytes = static_cast<size_t>(cfg.max_copies) * 2 * sizeof(int64_t);
  const auto slot_bytes = static_cast<size_t>(cfg.max_tokens) * sizeof(int64_t);
  if (cudaMalloc(&e->dev_pairs_, pairs_bytes) != cudaSuccess || cudaMalloc(&e->dev_slots_, slot_bytes) != cudaSuccess ||
      cudaMalloc(&e->dev_caches_, sizeof(void*)) != cudaSuccess ||
      cudaMallocHost(&e->host_stage_, pairs_bytes + slot_bytes + sizeof(void*)) != cudaSuccess)
    return status{errc::unsupported, "cuda_executor: CUDA allocation failed"};
  cudaEvent_t ev = nullptr;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
    return status{errc::unsupported, "cuda_executor: CUDA event creation failed"};
  e->staged_ = ev;
  void* pool = cfg.device_pool;
  if (cudaMemcpy(e->dev_caches_, &pool, sizeof(void*), cudaMemcpyHostToDevice) != cudaSuccess)
    return status{errc::unsupported, "cuda_executor: CUDA copy failed"};
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
  const kv_layout& L = cfg_.layout;
  if (static_cast<std::int64_t>(plan.copies().size()) > cfg_.max_copies ||
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
  // (1) swap-outs and (2) swap-ins, consecutive runs merged by kvpager_cuda_swap_blocks.
  std::vector<std::int64_t> pairs;
  pairs.reserve(2 * std::max(plan.swap_outs().size(), plan.swap_ins().size()));
  for (const block_swap& w : plan.swap_outs()) {
    pairs.push_back(w.device);
    pairs.push_back(w.host);
  }
  if (!pairs.empty() && kvpager_cuda_swap_blocks(cfg_.host_pool, cfg_.num_host_blocks, cfg_.device_pool, L.num_blocks, bb,
                                                 pairs.data(), static_cast<int32_t>(pairs.size() / 2), cfg_.stream) != 0)
    return status{errc::unsupported, "cuda_executor::execute: swap-out failed"};
  pairs.clear();
  for (const block_swap& w : plan.swap_ins()) {
    pairs.push_back(w.host);
    pairs.push_back(w.device);
  }
  if (!pairs.empty() && kvpager_cuda_swap_blocks(cfg_.device_pool, L.num_blocks, cfg_.host_pool, cfg_.num_host_blocks, bb,
                                                 pairs.data(), static_cast<int32_t>(pairs.size() / 2), cfg_.stream) != 0)
    return status{errc::unsupported, "cuda_executor::execute: swap-in failed"};
  // (3) copies and (4) slot writes: staged through pinned memory, copied to the device on the stream. The previous
  // step's staging copies must have left the buffer before it is rewritten.
  if (cudaEventSynchronize(static_cast<cudaEvent_t>(staged_)) != cudaSuccess)
    return status{errc::unsupported, "cuda_executor::execute: waiting for the previous step failed"};
  auto* stage = static_cast<std::int64_t*>(host_stage_);
  const std::size_t ncopy = plan.copies().size();
  for (std::size_t i = 0; i < ncopy; ++i) {
    stage[2 * i] = plan.copies()[i].src;
    stage[2 * i + 1] = plan.copies()[i].dst;
  }
  std::int64_t* slot_stage = stage + 2 * static_cast<std::size_t>(cfg_.max_copies);
  std::memcpy(slot_stage, slots.data(), slots.size() * sizeof(std::int64_t));
  if (ncopy > 0) {
    if (cudaMemcpyAsync(dev_pairs_, stage, ncopy * 2 * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
        kvpager_cuda_copy_blocks(static_cast<void* const*>(dev_caches_), 1, static_cast<const int64_t*>(dev_pairs_),
                                 static_cast<int32_t>(ncopy), L.num_blocks, bb, nullptr, cfg_.stream) != 0)
      return status{errc::unsupported, "cuda_executor::execute: copy failed"};
  }
  if (!slots.empty()) {
    if (cudaMemcpyAsync(dev_slots_, slot_stage, slots.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
        kvpager_cuda_kv_append(cfg_.device_pool, k, v, static_cast<const int64_t*>(dev_slots_),
                               static_cast<int32_t>(slots.size()), L.num_kv_heads, L.head_dim, L.block_size, L.num_blocks,
                               cfg_.dtype, nullptr, cfg_.stream) != 0)
      return status{errc::unsupported, "cuda_executor::execute: kv_append failed"};
  }
  if (cudaEventRecord(static_cast<cudaEvent_t>(staged_), stream) != cudaSuccess)
    return status{errc::unsupported, "cuda_executor::execute: event record failed"};
  return ok_status();
}

KVPAGER_NAMESPACE_END
