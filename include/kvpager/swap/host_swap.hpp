// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// host_swap: a preempted sequence is swapped out to the cache's host pool (cache_config::num_host_blocks);
/// preempt fails with errc::host_pool_full, nothing changed, if fewer host blocks than it needs are free.
/// Swapping moves bytes only through the step plan (swap_outs, swap_ins): the engine copies them (pinned host
/// memory, merged runs) with swap_blocks. Stateless.

#include <cstdint>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct host_swap {
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/, std::int32_t /*host_free*/) const noexcept {
    return preempt_action::swap;
  }
};

KVPAGER_NAMESPACE_END
