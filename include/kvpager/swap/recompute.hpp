// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// recompute: a preempted sequence is freed; the engine computes its tokens again when it resumes (vLLM v1).
/// Needs no host pool. Stateless.

#include <cstdint>

#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct recompute {
  [[nodiscard]] preempt_action action(std::int32_t /*num_blocks*/, std::int32_t /*host_free*/) const noexcept {
    return preempt_action::recompute;
  }
};

KVPAGER_NAMESPACE_END
