#pragma once
/// \file
/// Swap policies with a host (CPU) block pool, and recompute.
///
/// | policy        | preempting a sequence with n device blocks                                  | host pool |
/// |---------------|-----------------------------------------------------------------------------|-----------|
/// | `host_swap`   | swap out (errc::host_pool_full, nothing changed, if fewer than n host blocks are free) | yes |
/// | `recompute`   | drop the blocks; the engine computes the sequence's tokens again on resume  | no        |
/// | `hybrid_swap` | swap out while the host pool has room for it, else recompute                | yes       |
///
/// The host pool hands out host block ids [0, num_host_blocks) most recently freed first; O(1) per block, storage
/// allocated once by reset. Swapping moves bytes only through the step plan (swap_outs, swap_ins): the engine
/// copies them (pinned host memory, merged runs) with swap_blocks.

#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Size of the host (swap) pool, in blocks of the device pool's geometry.
struct host_pool_config {
  std::int32_t num_host_blocks = 0;
};

namespace detail {
/// The host pool shared by host_swap and hybrid_swap.
class host_block_pool {
 public:
  host_block_pool() = default;
  explicit host_block_pool(host_pool_config cfg) : cfg_(cfg) {}
  void reset(const pool_geometry& /*device*/) {
    free_.clear();
    free_.reserve(static_cast<std::size_t>(cfg_.num_host_blocks > 0 ? cfg_.num_host_blocks : 0));
    for (block_id b = cfg_.num_host_blocks - 1; b >= 0; --b) free_.push_back(b);
  }
  [[nodiscard]] std::int32_t host_capacity() const noexcept { return cfg_.num_host_blocks > 0 ? cfg_.num_host_blocks : 0; }
  [[nodiscard]] std::int32_t host_free() const noexcept { return static_cast<std::int32_t>(free_.size()); }
  bool allocate_host(std::span<block_id> out) noexcept {
    if (out.size() > free_.size()) return false;
    for (block_id& b : out) {
      b = free_.back();
      free_.pop_back();
    }
    return true;
  }
  void release_host(block_id b) noexcept { free_.push_back(b); }  // capacity reserved: never reallocates

 private:
  host_pool_config cfg_{};
  std::vector<block_id> free_;
};
}  // namespace detail

/// Preemption by swapping to a host pool of fixed size.
class host_swap : public detail::host_block_pool {
 public:
  using detail::host_block_pool::host_block_pool;
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/) const noexcept { return preempt_action::swap; }
};

/// Preemption by recompute: no host pool.
struct recompute {
  void reset(const pool_geometry& /*g*/) noexcept {}
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/) const noexcept { return preempt_action::recompute; }
  [[nodiscard]] std::int32_t host_capacity() const noexcept { return 0; }
  [[nodiscard]] std::int32_t host_free() const noexcept { return 0; }
  bool allocate_host(std::span<block_id> out) noexcept { return out.empty(); }
  void release_host(block_id /*b*/) noexcept {}
};

/// Swap while the host pool has room, recompute otherwise.
class hybrid_swap : public detail::host_block_pool {
 public:
  using detail::host_block_pool::host_block_pool;
  [[nodiscard]] preempt_action action(std::int32_t num_blocks) const noexcept {
    return num_blocks <= host_free() ? preempt_action::swap : preempt_action::recompute;
  }
};

KVPAGER_NAMESPACE_END
