// SPDX-License-Identifier: Apache-2.0
// kvpager::compositions: the named compositions of cache/compositions.hpp, instantiated once. A program that links
// this target gets KVPAGER_EXTERN_COMPOSITIONS=1 in every translation unit (core/config.hpp), so they do not
// instantiate these members themselves.
#include "kvpager/cache/compositions.hpp"

#if !KVPAGER_EXTERN_COMPOSITIONS
#error "instances/ is compiled with KVPAGER_EXTERN_COMPOSITIONS=1 (the kvpager::compositions target defines it)"
#endif

KVPAGER_NAMESPACE_BEGIN

template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, no_swap>;
template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>;
template class paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, host_swap>;
template class paged_kv_cache<free_list_allocator, no_eviction, refcount_sharing, no_swap>;

KVPAGER_NAMESPACE_END
