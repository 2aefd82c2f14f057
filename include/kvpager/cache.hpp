// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The cache layer and everything below it: core (status, block_pool, geometry, the step plan), the policy
/// concepts, every shipped policy, paged_kv_cache, hybrid_kv_cache (KV cache groups) and the named compositions (cache/compositions.hpp). Header-only:
/// nothing to link. Prefix caching (and the compositions over it, such as vllm_v1_cache) is included with
/// KVPAGER_HAS_XXHASH (core/config.hpp; CMake's KVPAGER_WITH_XXHASH, on by default). The cache's parts
/// (cache/detail/) are implementation, not API. Layers: docs/architecture.md.

#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/dtype.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"
#include "kvpager/core/indexed_heap.hpp"
#include "kvpager/core/splitmix.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/core/types.hpp"

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/concepts/tier_policy.hpp"

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/allocator/lifo_allocator.hpp"
#include "kvpager/allocator/lowest_id_allocator.hpp"
#include "kvpager/eviction/fifo_eviction.hpp"
#include "kvpager/eviction/lfu_eviction.hpp"
#include "kvpager/eviction/lru_eviction.hpp"
#include "kvpager/eviction/lru_index_eviction.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/eviction/priority_lru.hpp"
#include "kvpager/sharing/no_sharing.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/host_swap.hpp"
#include "kvpager/swap/hybrid_swap.hpp"
#include "kvpager/swap/no_swap.hpp"
#include "kvpager/swap/recompute.hpp"
#include "kvpager/tier/arc_tier.hpp"
#include "kvpager/tier/host_tier.hpp"
#include "kvpager/tier/lru_tier.hpp"
#include "kvpager/groups/agreed_hit.hpp"
#include "kvpager/groups/group_kind_variant.hpp"
#include "kvpager/groups/group_kinds.hpp"
#include "kvpager/groups/layer_grouping.hpp"
#include "kvpager/groups/vllm_hit.hpp"

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/paged_kv_cache.hpp"

#if KVPAGER_HAS_XXHASH
#include "kvpager/cache/compositions.hpp"
#include "kvpager/cache/hybrid_kv_cache.hpp"
#include "kvpager/sharing/prefix_caching.hpp"
#include "kvpager/sharing/xxh3_hasher.hpp"
#endif
