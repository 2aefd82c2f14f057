// SPDX-License-Identifier: Apache-2.0
#pragma once
// memcpy_executor: a memcpy model of the shipped block-move kernels (kvpager::step_executor runs the kernels
// themselves): a step plan applied to a device pool emulated in host RAM, in the kernels' layout (kv_layout), for
// tests whose pools the kernels do not run (block size 4, head_dim 4: a cache or scheduler property, not a kernel's).
// Order: swap-outs, swap-ins, copies, then the appended tokens' K/V through the slot mapping (negative slots
// skipped).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <kvpager/core/geometry.hpp>
#include <kvpager/core/status.hpp>
#include <kvpager/core/step_plan.hpp>
#include <kvpager/kernels/kv_layout.hpp>

namespace kvpager_testing {

using kvpager::block_copy;
using kvpager::block_id;
using kvpager::block_swap;
using kvpager::errc;
using kvpager::kv_geometry;
using kvpager::kv_layout;
using kvpager::ok_status;
using kvpager::status;
using kvpager::step_plan;

class memcpy_executor {
 public:
  /// A device pool of geometry `device` and a host pool of `num_host_blocks` blocks of the same shape, zero-filled.
  memcpy_executor(const kv_geometry& device, std::int32_t num_host_blocks)
      : memcpy_executor(kv_layout::of(device), num_host_blocks) {}
  /// A device pool of `device.num_blocks` blocks and a host pool of `num_host_blocks` blocks, zero-filled.
  memcpy_executor(kv_layout device, std::int32_t num_host_blocks)
      : layout_(device),
        num_host_blocks_(num_host_blocks),
        device_(static_cast<std::size_t>(device.pool_bytes())),
        host_(static_cast<std::size_t>(std::int64_t{num_host_blocks} * device.block_bytes())) {}

  [[nodiscard]] const kv_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::span<std::byte> device_bytes() noexcept { return device_; }
  [[nodiscard]] std::span<std::byte> host_bytes() noexcept { return host_; }

  /// Runs `plan`. `slots` is the plan's slot mapping; `k` and `v` hold the appended tokens' K and V in slot order,
  /// each [num_tokens, num_kv_heads, head_dim], in the pool's element type (copied as bytes: for an fp8 pool, the
  /// e4m3 codes, already quantized; kvpager_cpu_kv_append_fp8 quantizes from fp32/fp16/bf16). Validates every block id and slot before touching a byte:
  /// errc::invalid_block (out of range) or errc::buffer_too_small (k/v shorter than the mapping needs). Allocates
  /// nothing.
  status execute(const step_plan& plan, std::span<const std::int64_t> slots, std::span<const std::byte> k,
                 std::span<const std::byte> v) {
    const std::int64_t token_bytes = std::int64_t{layout_.num_kv_heads} * layout_.row_bytes();
    if (static_cast<std::int64_t>(k.size()) < static_cast<std::int64_t>(slots.size()) * token_bytes ||
        static_cast<std::int64_t>(v.size()) < static_cast<std::int64_t>(slots.size()) * token_bytes)
      return status{errc::buffer_too_small, "memcpy_executor::execute: k/v shorter than the slot mapping",
                    static_cast<std::int64_t>(slots.size()) * token_bytes};
    auto dev_ok = [&](block_id b) { return b >= 0 && b < layout_.num_blocks; };
    auto host_ok = [&](block_id b) { return b >= 0 && b < num_host_blocks_; };
    for (const block_swap& w : plan.swap_outs())
      if (!dev_ok(w.device) || !host_ok(w.host)) return status{errc::invalid_block, "memcpy_executor: swap-out block out of range"};
    for (const block_swap& w : plan.swap_ins())
      if (!dev_ok(w.device) || !host_ok(w.host)) return status{errc::invalid_block, "memcpy_executor: swap-in block out of range"};
    for (const block_copy& c : plan.copies())
      if (!dev_ok(c.src) || !dev_ok(c.dst)) return status{errc::invalid_block, "memcpy_executor: copy block out of range"};
    const std::int64_t max_slot = std::int64_t{layout_.num_blocks} * layout_.block_size;
    for (const std::int64_t s : slots)
      if (s >= max_slot) return status{errc::invalid_block, "memcpy_executor: slot out of range", s};

    const auto bb = static_cast<std::size_t>(layout_.block_bytes());
    for (const block_swap& w : plan.swap_outs())
      std::memcpy(host_.data() + static_cast<std::size_t>(w.host) * bb, device_.data() + static_cast<std::size_t>(w.device) * bb, bb);
    for (const block_swap& w : plan.swap_ins())
      std::memcpy(device_.data() + static_cast<std::size_t>(w.device) * bb, host_.data() + static_cast<std::size_t>(w.host) * bb, bb);
    for (const block_copy& c : plan.copies())
      std::memcpy(device_.data() + static_cast<std::size_t>(c.dst) * bb, device_.data() + static_cast<std::size_t>(c.src) * bb, bb);
    const auto row = static_cast<std::size_t>(layout_.row_bytes());
    for (std::size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      const auto b = static_cast<block_id>(slots[t] / layout_.block_size);
      const auto pos = static_cast<std::int32_t>(slots[t] % layout_.block_size);
      for (std::int32_t h = 0; h < layout_.num_kv_heads; ++h) {
        const std::size_t src = (t * static_cast<std::size_t>(layout_.num_kv_heads) + static_cast<std::size_t>(h)) * row;
        std::memcpy(device_.data() + layout_.offset(b, 0, h, pos), k.data() + src, row);
        std::memcpy(device_.data() + layout_.offset(b, 1, h, pos), v.data() + src, row);
      }
    }
    return ok_status();
  }

  /// K (kv = 0) or V (kv = 1) of one head of the token at `pos` of a sequence with block table `table`, in the
  /// device pool (or, with `host`, the host pool).
  [[nodiscard]] std::span<const std::byte> token(std::span<const block_id> table, std::int32_t pos, std::int32_t kv,
                                                 std::int32_t head, bool host = false) const noexcept {
    const block_id b = table[static_cast<std::size_t>(pos / layout_.block_size)];
    const auto& pool = host ? host_ : device_;
    return std::span<const std::byte>(pool).subspan(
        static_cast<std::size_t>(layout_.offset(b, kv, head, pos % layout_.block_size)),
        static_cast<std::size_t>(layout_.row_bytes()));
  }

 private:
  kv_layout layout_;
  std::int32_t num_host_blocks_;
  std::vector<std::byte> device_;
  std::vector<std::byte> host_;
};

}  // namespace kvpager_testing
