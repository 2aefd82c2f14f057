// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// refcount_sharing: fork shares the parent's blocks by reference count; the first write into a shared, partly
/// filled block copies it (copy-on-write, recorded as a (src, dst) pair in the step plan). Full blocks are never
/// written again, so they stay shared for free. Keeps no content cache. Stateless.

#include <cstdint>

#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct refcount_sharing {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(const pool_geometry& /*g*/) noexcept {}
  [[nodiscard]] bool is_cached(block_id /*b*/) const noexcept { return false; }
  void uncache(block_id /*b*/) noexcept {}
};

KVPAGER_NAMESPACE_END
