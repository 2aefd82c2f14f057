// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// no_eviction: keep nothing. When the last reference to a block is dropped its content is forgotten and the block
/// returns to the allocator clean, so a content cache only shares blocks between live sequences. Costs nothing.

#include <cstdint>

#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

struct no_eviction {
  static constexpr retention_mode retention = retention_mode::none;
  void reset(const pool_geometry& /*g*/) noexcept {}
};

KVPAGER_NAMESPACE_END
