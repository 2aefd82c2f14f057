// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Named compositions for common engines, so users start from a known behaviour and change one policy at a time.
/// Every composition the library's tools, benchmarks and examples run is named here (kvpager-sim, kvpager-replay):
/// the two families are vLLM v1's manager with prefix caching and the same without it, each with a choice of what a
/// preemption does with the victim's blocks (no_swap: recompute; host_swap: swap to the host pool; hybrid_swap: swap
/// while the host pool has room, else recompute). docs/policies.md describes the policies. The kv_groups family is
/// the same manager over KV cache groups (hybrid_kv_cache of any_group_kind: full attention, sliding window, chunked
/// local, in the conventions chosen at create), vLLM's hybrid manager with hybrid_conventions::vllm.

#include <type_traits>

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/hybrid_kv_cache.hpp"
#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/eviction/lru_eviction.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/groups/group_kind_variant.hpp"
#include "kvpager/sharing/prefix_caching.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/host_swap.hpp"
#include "kvpager/swap/hybrid_swap.hpp"
#include "kvpager/swap/no_swap.hpp"
#include "kvpager/tier/arc_tier.hpp"
#include "kvpager/tier/lru_tier.hpp"

KVPAGER_NAMESPACE_BEGIN

/// vLLM v1's KV-cache manager with swap policy `Swap`: one FIFO free queue that is also the LRU of cached blocks (lazy
/// eviction, tail-first release), automatic prefix caching with chained block hashes.
template <class Swap>
using vllm_v1_cache_with = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, Swap>;

/// vLLM v1's manager with prefix caching off (`enable_caching 0`): the same free queue, blocks shared only by
/// reference count (forks), nothing kept after a free.
template <class Swap>
using no_caching_cache_with = paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, Swap>;

/// vLLM v1's KV-cache manager. Create it with reserved_blocks = 1 for vLLM's null block. Preemption is by recompute
/// (the engine frees and re-adds the sequence).
using vllm_v1_cache = vllm_v1_cache_with<no_swap>;
/// vllm_v1_cache with a host pool: a victim is swapped out while the host pool has room, else recomputed
/// (kvpager-sim's default).
using hybrid_swap_cache = vllm_v1_cache_with<hybrid_swap>;
/// vllm_v1_cache with a host pool that every victim is swapped to (refused when it is full).
using host_swap_cache = vllm_v1_cache_with<host_swap>;
/// vllm_v1_cache_with<Swap> with a host tier below the device pool (cache_config::host_tier; docs/host_tier.md), its
/// eviction decided by `Tier` as vLLM's CPU offloading manager decides it (kvpager-sim --host-tier-blocks).
template <class Tier, class Swap = hybrid_swap>
using tiered_cache_with = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, Swap, Tier>;
/// hybrid_swap_cache with an LRU host tier (vLLM's offloading connector with its default LRU policy).
using lru_tier_cache = tiered_cache_with<lru_tier>;
/// hybrid_swap_cache with an ARC host tier (vLLM's offloading connector with `eviction_policy: arc`).
using arc_tier_cache = tiered_cache_with<arc_tier>;
/// vLLM v1's manager without prefix caching (kvpager-replay's `enable_caching 0`).
using vllm_v1_no_caching_cache = no_caching_cache_with<no_swap>;

/// vLLM's hybrid KV-cache manager (HybridKVCacheCoordinator with hybrid_conventions::vllm): one block table per
/// request and KV cache group, every group of any kind drawing from vLLM v1's free queue, prefix caching agreed
/// across groups; preemption by recompute (kvpager-replay's traces with `group` records).
using kv_groups_cache = hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, no_swap>;
/// kv_groups_swap_cache (with swap policy `Swap`) with a host tier below the device pool, its eviction decided by
/// `Tier`: each group's blocks kept under hybrid_kv_cache::cached_key(hash, group) (docs/host_tier.md, "KV cache
/// groups"; kvpager-sim --layers with --host-tier-blocks).
template <class Tier, class Swap = hybrid_swap>
using groups_tiered_cache_with =
    hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, Swap, Tier>;
/// kv_groups_swap_cache with an LRU host tier.
using kv_groups_lru_tier_cache = groups_tiered_cache_with<lru_tier>;
/// kv_groups_swap_cache with an ARC host tier.
using kv_groups_arc_tier_cache = groups_tiered_cache_with<arc_tier>;
/// kv_groups_cache with prefix caching off (`enable_caching 0`).
using kv_groups_no_caching_cache =
    hybrid_kv_cache<any_group_kind, free_list_allocator, no_eviction, refcount_sharing, no_swap>;
/// kv_groups_cache with a host pool: a victim's tables (every group's) are swapped out while the host pool has room,
/// else it is recomputed (kvpager-sim --layers, kvpager-generate --composition kv_groups).
using kv_groups_swap_cache =
    hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;

#if KVPAGER_EXTERN_COMPOSITIONS
// Compiled once in kvpager::compositions (instances/), which defines
// KVPAGER_EXTERN_COMPOSITIONS for the programs that link it (core/config.hpp).
extern template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, no_swap>;
extern template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
extern template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, host_swap>;
extern template class paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, no_swap>;
extern template class hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, no_swap>;
extern template class hybrid_kv_cache<any_group_kind, free_list_allocator, no_eviction, refcount_sharing, no_swap>;
extern template class hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
// An explicit instantiation cannot name an alias: the types above are the aliases', spelled out, and stay so.
static_assert(std::is_same_v<vllm_v1_cache,
                             paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, no_swap>>);
static_assert(std::is_same_v<hybrid_swap_cache,
                             paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>>);
static_assert(std::is_same_v<host_swap_cache,
                             paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, host_swap>>);
static_assert(std::is_same_v<vllm_v1_no_caching_cache,
                             paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, no_swap>>);
static_assert(std::is_same_v<kv_groups_cache, hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction,
                                                               prefix_caching, no_swap>>);
static_assert(std::is_same_v<kv_groups_no_caching_cache, hybrid_kv_cache<any_group_kind, free_list_allocator,
                                                                          no_eviction, refcount_sharing, no_swap>>);
static_assert(std::is_same_v<kv_groups_swap_cache, hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction,
                                                                    prefix_caching, hybrid_swap>>);
#endif

KVPAGER_NAMESPACE_END
