// SPDX-License-Identifier: Apache-2.0
// kvpager::compositions: the scheduler over each named composition (cache/compositions.hpp), instantiated once
// (see caches.cpp).
#include "kvpager/cache/compositions.hpp"
#include "kvpager/sched/scheduler.hpp"

#if !KVPAGER_EXTERN_COMPOSITIONS
#error "instances/ is compiled with KVPAGER_EXTERN_COMPOSITIONS=1 (the kvpager::compositions target defines it)"
#endif

KVPAGER_NAMESPACE_BEGIN

template class scheduler<vllm_v1_cache>;
template class scheduler<hybrid_swap_cache>;
template class scheduler<host_swap_cache>;
template class scheduler<vllm_v1_no_caching_cache>;

KVPAGER_NAMESPACE_END
