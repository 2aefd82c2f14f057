#pragma once
/// \file
/// no_swap: no host pool and no preemption; under pressure the engine waits or frees sequences itself.
/// Stateless.

#include <cstdint>
#include <span>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct no_swap {
  void reset(const pool_geometry& /*g*/) noexcept {}
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/) const noexcept {
    return preempt_action::unsupported;
  }
  [[nodiscard]] std::int32_t host_capacity() const noexcept { return 0; }
  [[nodiscard]] std::int32_t host_free() const noexcept { return 0; }
  bool allocate_host(std::span<block_id> out) noexcept { return out.empty(); }
  void release_host(block_id /*b*/) noexcept {}
};

KVPAGER_NAMESPACE_END
