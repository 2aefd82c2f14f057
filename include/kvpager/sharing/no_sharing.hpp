// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// no_sharing: every block has exactly one owner. Fork gives the child fresh blocks and plans a copy of each of
/// the parent's blocks (all or nothing), so no block is ever referenced twice. Stateless.

#include <cstdint>

#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct no_sharing {
  static constexpr fork_mode fork = fork_mode::copy;
  void reset(const pool_geometry& /*g*/) noexcept {}
  [[nodiscard]] bool is_cached(block_id /*b*/) const noexcept { return false; }
  void uncache(block_id /*b*/) noexcept {}
};

KVPAGER_NAMESPACE_END
