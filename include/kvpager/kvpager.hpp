#pragma once
/// \file
/// kvpager: paged KV-cache memory management for LLM inference engines. This header gives the whole host-side
/// API: core (status, block_pool), the policy concepts and every shipped policy, and paged_kv_cache.

#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/allocator/lifo_allocator.hpp"
#include "kvpager/allocator/lowest_id_allocator.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/sharing/no_sharing.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/no_swap.hpp"

#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/cache/step_plan.hpp"
