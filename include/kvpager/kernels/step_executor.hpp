// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// step_executor: runs a step's plan (core/step_plan.hpp) over a model's KV pools, every layer, through the shipped
/// CPU kernels (kernels/block_moves.hpp, the operations behind the C ABI's functions): the swap-outs and swap-ins
/// with swap_blocks_cpu (kvpager_cpu_swap_blocks), the copies with copy_blocks_cpu (all layers in one call), and each
/// layer's appended K/V with kv_append_cpu (quantized with the layer's scales into an fp8 E4M3 pool). An engine step over it (docs/architecture.md, "One step"):
/// \code
///   const kvpager::step_output& out = sched.schedule();
///   if (auto st = exec.run_plan(*out.plan); !st) ...;          // before the forward pass: swaps, then copies
///   for (layer = 0; layer < L; ++layer) {                       // in the forward pass, layer by layer
///     exec.append(layer, out.slot_mapping, k, v);               // this step's K/V into the layer's pool
///     attention over exec.view(layer) with out.decode and out.prefill (paged_attention_decode_cpu, ..._prefill_cpu)
///   }
/// \endcode
/// The pools are the engine's (one device pool and one host pool per layer, all of one geometry); the executor keeps
/// their addresses and two scratch lists that grow to the largest plan, so a warm step allocates nothing. Needs
/// libkvpager_kernels (kvpager::kernels). The CUDA counterpart of one layer is cuda_executor.

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/c/kernels.h"
#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/block_moves.hpp"
#include "kvpager/kernels/can_implement.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kvpager/kernels/kv_layout.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A model's KV memory: one geometry for every layer, each layer's device pool (geometry.num_blocks blocks of
/// block_bytes(geometry)) and, for swapping, its host pool (num_host_blocks blocks of the same size). With
/// kv_pool_layout::block_major, `device` and `host` hold one pool each (the host none without host blocks) with
/// every layer of `num_layers`.
struct kv_pools {
  kv_geometry geometry{};
  std::int32_t num_host_blocks = 0;
  std::span<void* const> device{};  ///< one pool per layer (at least one layer)
  std::span<void* const> host{};    ///< one pool per layer, or empty when num_host_blocks is 0
  /// Each layer's KV cache group (a hybrid_kv_cache's group index, in [0, 64)), or empty: a copy or swap of the
  /// plan then moves only the layers of the group it names (block_copy::group, block_swap::group; a block id
  /// belongs to one group at a time, so the other groups' layers hold nothing there). Empty: every entry moves
  /// every layer (one group, or an engine that keeps its groups' layers apart itself).
  std::span<const std::int32_t> layer_groups{};
  kv_pool_layout layout = kv_pool_layout::per_layer;
  std::int32_t num_layers = 0;  ///< block_major: the layers the one pool holds (per_layer: device.size())
};

/// How an fp8 E4M3 pool stores appended K/V (ignored for the other dtypes): the dtype of the K/V given to append
/// (KVPAGER_DTYPE_FP32, _FP16, _BF16) and the layer's per-tensor scales (vLLM's k_scale, v_scale).
struct fp8_append {
  std::int32_t src_dtype = KVPAGER_DTYPE_FP16;
  float k_scale = 1.0F, v_scale = 1.0F;
};

class step_executor {
 public:
  /// An executor over `pools`. Errors: can_implement(pools.geometry)'s; errc::invalid_argument for no layer, a null
  /// pool, a negative num_host_blocks, host pools that are not one per layer (none with num_host_blocks 0), or
  /// layer_groups neither empty nor one group in [0, 64) per layer; block_major: not one device pool (and one host
  /// pool with host blocks), num_layers < 1, layer_groups given, or a pool's size beyond int64.
  [[nodiscard]] static result<step_executor> create(const kv_pools& pools) {
    if (const status st = can_implement(pools.geometry); !st) return st;
    if (pools.device.empty()) return status{errc::invalid_argument, "step_executor::create: no layer"};
    if (pools.num_host_blocks < 0)
      return status{errc::invalid_argument, "step_executor::create: num_host_blocks must not be negative",
                    pools.num_host_blocks};
    if (pools.layout == kv_pool_layout::block_major) return create_block_major(pools);
    const std::size_t hosts = pools.num_host_blocks > 0 ? pools.device.size() : 0;
    if (pools.host.size() != hosts)
      return status{errc::invalid_argument,
                    "step_executor::create: host pools must be one per layer (none without host blocks)",
                    static_cast<std::int64_t>(pools.host.size())};
    for (void* const p : pools.device)
      if (p == nullptr) return status{errc::invalid_argument, "step_executor::create: a device pool is null"};
    for (void* const p : pools.host)
      if (p == nullptr) return status{errc::invalid_argument, "step_executor::create: a host pool is null"};
    if (!pools.layer_groups.empty() && pools.layer_groups.size() != pools.device.size())
      return status{errc::invalid_argument, "step_executor::create: layer_groups must be empty or one per layer",
                    static_cast<std::int64_t>(pools.layer_groups.size())};
    for (const std::int32_t g : pools.layer_groups)
      if (g < 0 || g >= max_groups)
        return status{errc::invalid_argument, "step_executor::create: a layer's group is outside [0, 64)", g};
    step_executor e;
    e.geometry_ = pools.geometry;
    e.num_host_blocks_ = pools.num_host_blocks;
    e.block_bytes_ = block_bytes(pools.geometry);
    e.device_.assign(pools.device.begin(), pools.device.end());
    e.host_.assign(pools.host.begin(), pools.host.end());
    for (std::size_t l = 0; l < pools.layer_groups.size(); ++l) {
      const auto g = static_cast<std::size_t>(pools.layer_groups[l]);
      if (e.groups_.size() <= g) e.groups_.resize(g + 1);
      e.groups_[g].layers.push_back(l);
      e.groups_[g].device.push_back(e.device_[l]);
    }
    return e;
  }

  [[nodiscard]] const kv_geometry& geometry() const noexcept { return geometry_; }
  [[nodiscard]] std::int32_t num_layers() const noexcept { return static_cast<std::int32_t>(device_.size()); }
  [[nodiscard]] std::int32_t num_host_blocks() const noexcept { return num_host_blocks_; }
  [[nodiscard]] kv_pool_layout layout() const noexcept { return layout_; }
  /// Layer `layer`'s device pool as the attention kernels read it (the default HND layout; block_major: its blocks
  /// num_layers blocks apart). layer in [0, num_layers()).
  [[nodiscard]] paged_kv_view view(std::int32_t layer) const noexcept {
    paged_kv_view v = paged_kv_view::hnd(device_[static_cast<std::size_t>(layer)], geometry_);
    if (layout_ == kv_pool_layout::block_major) v.stride_block *= num_layers();
    return v;
  }

  /// Swap-outs (device to host), swap-ins (host to device), then copies of `plan`, on every layer (with
  /// layer_groups: on the layers of the group each entry names). Every block id is checked first:
  /// errc::invalid_block (outside its pool; a swap with no host pool; with layer_groups, an entry naming a group no
  /// layer has) and nothing moved. Allocates nothing once the scratch lists have grown to the largest plan.
  status run_plan(const step_plan& plan) {
    const auto dev_ok = [this](block_id b) { return b >= 0 && b < geometry_.num_blocks; };
    const auto host_ok = [this](block_id b) { return b >= 0 && b < num_host_blocks_; };
    for (const block_swap& w : plan.swap_outs())
      if (!dev_ok(w.device) || !host_ok(w.host))
        return status{errc::invalid_block, "step_executor::run_plan: a swap-out block is outside its pool"};
    for (const block_swap& w : plan.swap_ins())
      if (!dev_ok(w.device) || !host_ok(w.host))
        return status{errc::invalid_block, "step_executor::run_plan: a swap-in block is outside its pool"};
    for (const block_copy& c : plan.copies())
      if (!dev_ok(c.src) || !dev_ok(c.dst))
        return status{errc::invalid_block, "step_executor::run_plan: a copied block is outside the pool"};
    if (!groups_.empty()) return run_grouped(plan);
    if (layout_ == kv_pool_layout::block_major) return run_block_major(plan);
    if (!plan.swap_outs().empty()) {
      fill_pairs(plan.swap_outs(), /*to_host=*/true);
      for (std::size_t l = 0; l < device_.size(); ++l)
        if (const status st = swap(host_[l], num_host_blocks_, device_[l], geometry_.num_blocks); !st) return st;
    }
    if (!plan.swap_ins().empty()) {
      fill_pairs(plan.swap_ins(), /*to_host=*/false);
      for (std::size_t l = 0; l < device_.size(); ++l)
        if (const status st = swap(device_[l], geometry_.num_blocks, host_[l], num_host_blocks_); !st) return st;
    }
    if (!plan.copies().empty()) {
      pairs_.clear();
      for (const block_copy& c : plan.copies()) {
        pairs_.push_back(c.src);
        pairs_.push_back(c.dst);
      }
      return copy_blocks_cpu({device_.data(), num_layers(), pairs_.data(),
                              static_cast<std::int32_t>(plan.copies().size()), geometry_.num_blocks, block_bytes_});
    }
    return ok_status();
  }

  /// Writes this step's K and V of layer `layer` through `slots` (the step's slot mapping; a negative slot is
  /// skipped): `k` and `v` hold [slots.size(), num_kv_heads, head_dim] elements in the pool's dtype, or for an fp8
  /// pool in `fp8.src_dtype`, quantized with its scales. Errors (nothing written): errc::invalid_argument (layer out of
  /// range, more than 2^31-1 slots), the kernel's (kvpager_cpu_kv_append, _fp8: errc::invalid_block for a slot
  /// outside the pool, bad scales).
  status append(std::int32_t layer, std::span<const std::int64_t> slots, const void* k, const void* v,
                const fp8_append& fp8 = {}) const noexcept {
    if (layer < 0 || layer >= num_layers())
      return status{errc::invalid_argument, "step_executor::append: no such layer", layer};
    if (slots.size() > static_cast<std::size_t>(INT32_MAX))
      return status{errc::invalid_argument, "step_executor::append: more than 2^31-1 slots"};
    append_params p;
    p.kv = view(layer);
    p.key = k;
    p.value = v;
    p.slot_mapping = slots.data();
    p.num_tokens = static_cast<std::int32_t>(slots.size());
    if (geometry_.dtype == kv_dtype::fp8_e4m3) {
      p.src_dtype = fp8.src_dtype;
      p.k_scale = fp8.k_scale;
      p.v_scale = fp8.v_scale;
    }
    return kv_append_cpu(p);
  }

 private:
  static constexpr std::int32_t max_groups = 64;
  /// The layers of one KV cache group, and their device pools (for one copy_blocks_cpu call).
  struct group_layers {
    std::vector<std::size_t> layers;
    std::vector<void*> device;
  };

  step_executor() = default;

  static result<step_executor> create_block_major(const kv_pools& pools) {
    if (pools.device.size() != 1 || pools.host.size() != (pools.num_host_blocks > 0 ? 1U : 0U))
      return status{errc::invalid_argument,
                    "step_executor::create: block_major pools are one device pool (and one host pool with host blocks)",
                    static_cast<std::int64_t>(pools.device.size())};
    if (pools.num_layers < 1)
      return status{errc::invalid_argument, "step_executor::create: block_major needs num_layers >= 1",
                    pools.num_layers};
    if (!pools.layer_groups.empty())
      return status{errc::invalid_argument,
                    "step_executor::create: block_major pools hold every layer of a block (no layer_groups)"};
    if (pools.device[0] == nullptr || (!pools.host.empty() && pools.host[0] == nullptr))
      return status{errc::invalid_argument, "step_executor::create: a pool is null"};
    const std::int64_t bb = block_bytes(pools.geometry);
    const auto run = checked_mul(bb, pools.num_layers);
    if (!run || !checked_mul(*run, pools.geometry.num_blocks) || !checked_mul(*run, pools.num_host_blocks))
      return status{errc::invalid_argument, "step_executor::create: a block_major pool's size overflows int64",
                    pools.num_layers};
    step_executor e;
    e.geometry_ = pools.geometry;
    e.num_host_blocks_ = pools.num_host_blocks;
    e.block_bytes_ = bb;
    e.layout_ = kv_pool_layout::block_major;
    for (std::int32_t l = 0; l < pools.num_layers; ++l) {
      e.device_.push_back(static_cast<std::byte*>(pools.device[0]) + std::int64_t{l} * bb);
      if (!pools.host.empty()) e.host_.push_back(static_cast<std::byte*>(pools.host[0]) + std::int64_t{l} * bb);
    }
    return e;
  }

  /// run_plan over block_major pools (ids checked by the caller): each swap and copy moves a block's every layer as
  /// one run of num_layers x block_bytes.
  status run_block_major(const step_plan& plan) {
    const std::int64_t run = block_bytes_ * num_layers();
    const auto move = [&](void* dst, std::int32_t dst_blocks, const void* src, std::int32_t src_blocks) {
      return swap_blocks_cpu({dst, dst_blocks, src, src_blocks, run, pairs_.data(),
                              static_cast<std::int32_t>(pairs_.size() / 2)});
    };
    if (fill_pairs(plan.swap_outs(), /*to_host=*/true))
      if (const status st = move(host_[0], num_host_blocks_, device_[0], geometry_.num_blocks); !st) return st;
    if (fill_pairs(plan.swap_ins(), /*to_host=*/false))
      if (const status st = move(device_[0], geometry_.num_blocks, host_[0], num_host_blocks_); !st) return st;
    if (plan.copies().empty()) return ok_status();
    pairs_.clear();
    for (const block_copy& c : plan.copies()) {
      pairs_.push_back(c.src);
      pairs_.push_back(c.dst);
    }
    void* const base = device_[0];
    return copy_blocks_cpu({&base, 1, pairs_.data(), static_cast<std::int32_t>(plan.copies().size()),
                            geometry_.num_blocks, run});
  }

  /// run_plan with layer_groups: each group's entries over that group's layers (ids checked by the caller).
  status run_grouped(const step_plan& plan) {
    const auto known = [this](std::int32_t g) {
      return g >= 0 && static_cast<std::size_t>(g) < groups_.size() && !groups_[static_cast<std::size_t>(g)].layers.empty();
    };
    for (const block_swap& w : plan.swap_outs())
      if (!known(w.group)) return status{errc::invalid_block, "step_executor::run_plan: a swap names no layer's group", w.group};
    for (const block_swap& w : plan.swap_ins())
      if (!known(w.group)) return status{errc::invalid_block, "step_executor::run_plan: a swap names no layer's group", w.group};
    for (const block_copy& c : plan.copies())
      if (!known(c.group)) return status{errc::invalid_block, "step_executor::run_plan: a copy names no layer's group", c.group};
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const group_layers& gl = groups_[g];
      if (fill_pairs(plan.swap_outs(), /*to_host=*/true, static_cast<std::int32_t>(g)))
        for (const std::size_t l : gl.layers)
          if (const status st = swap(host_[l], num_host_blocks_, device_[l], geometry_.num_blocks); !st) return st;
    }
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const group_layers& gl = groups_[g];
      if (fill_pairs(plan.swap_ins(), /*to_host=*/false, static_cast<std::int32_t>(g)))
        for (const std::size_t l : gl.layers)
          if (const status st = swap(device_[l], geometry_.num_blocks, host_[l], num_host_blocks_); !st) return st;
    }
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const group_layers& gl = groups_[g];
      pairs_.clear();
      for (const block_copy& c : plan.copies())
        if (c.group == static_cast<std::int32_t>(g)) {
          pairs_.push_back(c.src);
          pairs_.push_back(c.dst);
        }
      if (pairs_.empty()) continue;
      if (const status st = copy_blocks_cpu({gl.device.data(), static_cast<std::int32_t>(gl.device.size()),
                                             pairs_.data(), static_cast<std::int32_t>(pairs_.size() / 2),
                                             geometry_.num_blocks, block_bytes_});
          !st)
        return st;
    }
    return ok_status();
  }

  /// The (source, destination) pairs of `swaps` (of group `group` only, when not -1) into pairs_; whether any.
  bool fill_pairs(std::span<const block_swap> swaps, bool to_host, std::int32_t group = -1) {
    pairs_.clear();
    for (const block_swap& w : swaps) {
      if (group >= 0 && w.group != group) continue;
      pairs_.push_back(to_host ? w.device : w.host);
      pairs_.push_back(to_host ? w.host : w.device);
    }
    return !pairs_.empty();
  }

  [[nodiscard]] status swap(void* dst, std::int32_t dst_blocks, const void* src, std::int32_t src_blocks) const {
    return swap_blocks_cpu({dst, dst_blocks, src, src_blocks, block_bytes_, pairs_.data(),
                            static_cast<std::int32_t>(pairs_.size() / 2)});
  }

  kv_geometry geometry_{};
  std::int32_t num_host_blocks_ = 0;
  std::int64_t block_bytes_ = 0;
  kv_pool_layout layout_ = kv_pool_layout::per_layer;
  std::vector<void*> device_, host_;  ///< each layer's first block (block_major: all in one pool)
  std::vector<group_layers> groups_;  ///< per group index (layer_groups given), else empty
  std::vector<std::int64_t> pairs_;   ///< scratch: [n, 2] (source, destination) of one kind of move
};

/// KV pools in host memory with their step_executor: the CPU backend's pools for an engine or a test that has none
/// of its own (the tools, tp_cpu_executors). `num_layers` device pools of `geometry` and as many host pools of
/// `num_host_blocks` blocks, zero-filled, in the kernels' default layout (kv_layout); `layer_groups` as
/// kv_pools::layer_groups. Move-only (the executor holds the pools' addresses, which a move keeps).
class host_kv_pools {
 public:
  /// Errors: step_executor::create's (can_implement(geometry), num_host_blocks < 0), errc::invalid_argument
  /// (num_layers < 1, a host pool whose size overflows int64), errc::out_of_memory (the pools could not be allocated; built without exceptions, a failed
  /// allocation ends the program instead).
  [[nodiscard]] static result<host_kv_pools> create(const kv_geometry& geometry, std::int32_t num_host_blocks,
                                                    std::int32_t num_layers = 1,
                                                    std::span<const std::int32_t> layer_groups = {},
                                                    kv_pool_layout pool_layout = kv_pool_layout::per_layer) {
    if (num_layers < 1)
      return status{errc::invalid_argument, "host_kv_pools::create: num_layers must be positive", num_layers};
    if (const status st = can_implement(geometry); !st) return st;
    if (num_host_blocks < 0)
      return status{errc::invalid_argument, "host_kv_pools::create: num_host_blocks must not be negative",
                    num_host_blocks};
    // The device pool's size fits in int64 (can_implement); the host pool's is checked here. So no vector below can
    // exceed max_size (PTRDIFF_MAX): std::length_error cannot come from here, std::bad_alloc can.
    if (!checked_mul(block_bytes(geometry), num_host_blocks))
      return status{errc::invalid_argument, "host_kv_pools::create: the host pool's size overflows int64",
                    num_host_blocks};
    const bool major = pool_layout == kv_pool_layout::block_major;
    if (major && (!checked_mul(block_bytes(geometry) * num_host_blocks, num_layers) ||
                  !checked_mul(block_bytes(geometry) * geometry.num_blocks, num_layers)))
      return status{errc::invalid_argument, "host_kv_pools::create: a block_major pool's size overflows int64",
                    num_layers};
    const auto block = static_cast<std::size_t>(block_bytes(geometry)) * (major ? static_cast<std::size_t>(num_layers) : 1);
    const std::size_t pools = major ? 1 : static_cast<std::size_t>(num_layers);
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      host_kv_pools out;
      out.major_ = major;
      out.num_layers_ = num_layers;
      out.device_.resize(pools);
      out.host_.resize(num_host_blocks > 0 ? pools : 0);
      for (auto& d : out.device_) d.resize(block * static_cast<std::size_t>(geometry.num_blocks));
      for (auto& h : out.host_) h.resize(block * static_cast<std::size_t>(num_host_blocks));
      std::vector<void*> dev, host;
      for (auto& d : out.device_) dev.push_back(d.data());
      for (auto& h : out.host_) host.push_back(h.data());
      result<step_executor> e = step_executor::create(
          {geometry, num_host_blocks, detail::span_of(dev), detail::span_of(host), layer_groups, pool_layout,
           num_layers});
      if (!e) return e.error();
      out.exec_.emplace(std::move(*e));
      return out;
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      return status{errc::out_of_memory, "host_kv_pools::create: not enough host memory for the pools",
                    geometry.num_blocks};
    }
#endif
  }

  host_kv_pools(host_kv_pools&&) noexcept = default;
  host_kv_pools& operator=(host_kv_pools&&) noexcept = default;
  host_kv_pools(const host_kv_pools&) = delete;
  host_kv_pools& operator=(const host_kv_pools&) = delete;

  [[nodiscard]] step_executor& executor() noexcept { return *exec_; }
  [[nodiscard]] const step_executor& executor() const noexcept { return *exec_; }
  [[nodiscard]] const kv_geometry& geometry() const noexcept { return exec_->geometry(); }
  [[nodiscard]] kv_layout layout() const noexcept { return kv_layout::of(geometry()); }
  [[nodiscard]] kv_pool_layout pool_layout() const noexcept {
    return major_ ? kv_pool_layout::block_major : kv_pool_layout::per_layer;
  }
  /// Layer `layer`'s device pool (block_major: the one pool of every layer, whatever `layer`).
  [[nodiscard]] std::span<std::byte> device_bytes(std::int32_t layer = 0) noexcept {
    return detail::span_of(device_[major_ ? 0 : static_cast<std::size_t>(layer)]);
  }
  [[nodiscard]] std::span<std::byte> host_bytes(std::int32_t layer = 0) noexcept {
    return host_.empty() ? std::span<std::byte>{} : detail::span_of(host_[major_ ? 0 : static_cast<std::size_t>(layer)]);
  }
  [[nodiscard]] paged_kv_view view(std::int32_t layer = 0) const noexcept { return exec_->view(layer); }

  /// One layer's step, checked whole before anything moves: the plan (every layer's pools), then layer `layer`'s
  /// K/V of the slot mapping `slots`, given as bytes in the pool's dtype ([slots.size(), kv_heads, head_dim]).
  /// Errors (nothing moved): errc::buffer_too_small (k or v shorter than the mapping needs; detail = bytes needed),
  /// errc::invalid_block (a block id or slot outside the pools), errc::invalid_argument (no such layer),
  /// errc::unsupported for an fp8 pool (its appends quantize: executor().append with the layer's fp8_append).
  status execute(const step_plan& plan, std::span<const std::int64_t> slots, std::span<const std::byte> k,
                 std::span<const std::byte> v, std::int32_t layer = 0) {
    const kv_layout l = layout();
    const std::int64_t need = static_cast<std::int64_t>(slots.size()) * l.num_kv_heads * l.row_bytes();
    if (static_cast<std::int64_t>(k.size()) < need || static_cast<std::int64_t>(v.size()) < need)
      return status{errc::buffer_too_small, "host_kv_pools::execute: k/v shorter than the slot mapping", need};
    if (layer < 0 || layer >= exec_->num_layers())
      return status{errc::invalid_argument, "host_kv_pools::execute: no such layer", layer};
    if (geometry().dtype == kv_dtype::fp8_e4m3)
      return status{errc::unsupported, "host_kv_pools::execute: an fp8 pool's appends quantize (executor().append)"};
    const std::int64_t max_slot = std::int64_t{l.num_blocks} * l.block_size;
    for (const std::int64_t s : slots)
      if (s >= max_slot) return status{errc::invalid_block, "host_kv_pools::execute: slot outside the pool", s};
    if (const status st = exec_->run_plan(plan); !st) return st;
    if (slots.empty()) return ok_status();
    return exec_->append(layer, slots, k.data(), v.data());
  }

  /// K (kv = 0) or V (kv = 1) of one head of the token at `pos` of a sequence with block table `table`, in layer
  /// `layer`'s device pool (or, with `host`, its host pool).
  [[nodiscard]] std::span<const std::byte> token(std::span<const block_id> table, std::int32_t pos, std::int32_t kv,
                                                 std::int32_t head, bool host = false,
                                                 std::int32_t layer = 0) const noexcept {
    const kv_layout l = layout();
    std::int64_t b = table[static_cast<std::size_t>(pos / l.block_size)];
    std::size_t pool_index = static_cast<std::size_t>(layer);
    if (major_) {  // block b of layer `layer` is block b x num_layers + layer of the one pool (in int64)
      b = b * num_layers_ + layer;
      pool_index = 0;
    }
    const auto& pool = host ? host_[pool_index] : device_[pool_index];
    const std::int64_t at = b * l.block_bytes() + l.offset(0, kv, head, pos % l.block_size);
    return detail::span_of(pool).subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(l.row_bytes()));
  }

 private:
  host_kv_pools() = default;
  bool major_ = false;
  std::int32_t num_layers_ = 1;
  std::vector<std::vector<std::byte>> device_, host_;
  std::optional<step_executor> exec_;
};

KVPAGER_NAMESPACE_END
