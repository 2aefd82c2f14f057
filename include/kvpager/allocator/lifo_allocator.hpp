// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lifo_allocator: a free stack. The most recently freed block is handed out first, so its bytes are likely
/// still in the GPU's L2 and the host's page tables are warm. Initially pops the highest id first (blocks are
/// pushed in id order), which is the order of the seed's `free_blocks.pop()` demo.
/// Complexity: every operation O(1), no allocation after reset.

#include "kvpager/allocator/detail/list_allocator.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

using lifo_allocator = detail::list_allocator<free_order::lifo>;

KVPAGER_NAMESPACE_END
