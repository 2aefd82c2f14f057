// SPDX-License-Identifier: Apache-2.0
// kvpager::compositions: the kv_groups compositions (hybrid_kv_cache, cache/compositions.hpp) and their schedulers,
// instantiated once (see caches.cpp).
#include "kvpager/cache/compositions.hpp"
#include "kvpager/sched/scheduler.hpp"

#if !KVPAGER_EXTERN_COMPOSITIONS
#error "instances/ is compiled with KVPAGER_EXTERN_COMPOSITIONS=1 (the kvpager::compositions target defines it)"
#endif

KVPAGER_NAMESPACE_BEGIN

template class hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, no_swap>;
template class hybrid_kv_cache<any_group_kind, free_list_allocator, no_eviction, refcount_sharing, no_swap>;
template class hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
template class scheduler<kv_groups_cache>;
template class scheduler<kv_groups_no_caching_cache>;
template class scheduler<kv_groups_swap_cache>;

KVPAGER_NAMESPACE_END
