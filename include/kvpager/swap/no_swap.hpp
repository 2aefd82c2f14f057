// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// no_swap: no preemption; under pressure the engine waits or frees sequences itself (paged_kv_cache::preempt
/// answers errc::unsupported). swap_out and swap_in still work when the cache has a host pool. Stateless.

#include <cstdint>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct no_swap {
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/, std::int32_t /*host_free*/) const noexcept {
    return preempt_action::unsupported;
  }
};

KVPAGER_NAMESPACE_END
