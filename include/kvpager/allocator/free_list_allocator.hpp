// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// free_list_allocator: a FIFO free queue (vLLM's FreeKVCacheBlockQueue). Freed blocks go to the tail, allocation
/// takes the head, a hit on a cached free block unlinks it from the middle. Initially ordered by block id.
/// Combined with lazy eviction (retention_mode::in_free_list) the queue is the LRU order of cached blocks.
/// Complexity: every operation O(1), no allocation after reset.

#include "kvpager/allocator/detail/list_allocator.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

using free_list_allocator = detail::list_allocator<free_order::fifo>;

KVPAGER_NAMESPACE_END
