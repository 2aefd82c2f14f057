// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// hybrid_swap: a preempted sequence is swapped out while the cache's host pool has room for all its blocks,
/// and freed for recompute otherwise. Stateless.

#include <cstdint>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct hybrid_swap {
  [[nodiscard]] preempt_action action(std::int32_t num_blocks, std::int32_t host_free) const noexcept {
    return num_blocks <= host_free ? preempt_action::swap : preempt_action::recompute;
  }
};

KVPAGER_NAMESPACE_END
