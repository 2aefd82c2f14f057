// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Named compositions for common engines, so users start from a known behaviour and change one policy at a time.

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/eviction/lru_eviction.hpp"
#include "kvpager/sharing/prefix_caching.hpp"
#include "kvpager/swap/no_swap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// vLLM v1's KV-cache manager: one FIFO free queue that is also the LRU of cached blocks (lazy eviction, tail-first
/// release), automatic prefix caching with chained block hashes. Create it with reserved_blocks = 1 for vLLM's
/// null block. Preemption is by recompute (the engine frees and re-adds the sequence).
using vllm_v1_cache = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, no_swap>;

KVPAGER_NAMESPACE_END
