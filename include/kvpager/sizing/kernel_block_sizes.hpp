// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kernels_run_block_size: the block sizes the compiled kernels run, as a predicate for
/// block_size_advisor::recommend, asked of kvpager::can_implement (the same check every decode and kv_append call
/// makes), so the advisor never recommends a block size the kernels would refuse. Needs libkvpager_kernels
/// (kvpager::kernels); the advisor itself does not.

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/kernels/can_implement.hpp"

KVPAGER_NAMESPACE_BEGIN

/// True for a block size with which the kernels run `geometry` (its other fields as given; a num_blocks <= 0 is
/// taken as 1, so a predicate built before the pool is sized still answers for the block size).
struct kernels_run_block_size {
  kv_geometry geometry{};

  [[nodiscard]] bool operator()(std::int32_t block_size) const noexcept {
    kv_geometry g = geometry;
    g.block_size = block_size;
    if (g.num_blocks <= 0) g.num_blocks = 1;
    return can_implement(g).ok();
  }
};

KVPAGER_NAMESPACE_END
