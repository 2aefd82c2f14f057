// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kvpager: paged KV-cache memory management for LLM inference engines. This header gives the whole host-side
/// API: core (status, block_pool), the policy concepts and every shipped policy, and paged_kv_cache.
/// prefix_caching (and the compositions built on it, such as vllm_v1_cache) hash blocks with xxHash: they are
/// included when <xxhash.h> is available (Debian: libxxhash-dev), which is the core's only external header.
///
/// Monitoring: the snapshot (monitor/metrics.hpp: metrics_snapshot, take_snapshot) is included here. The parts
/// whose standard headers would cost every consumer's compile (bench/RESULTS.md, "Consumer build") are included
/// on their own by the code that uses them:
///   #include <kvpager/monitor/health.hpp>      // health_check and metrics_recorder (<chrono>, which in C++20
///                                              // brings <sstream>); monitor/recorder.hpp for the recorder alone
///   #include <kvpager/monitor/prometheus.hpp>  // write_prometheus (<charconv>, <string>)
///   #include <kvpager/monitor/json.hpp>        // metrics_json_writer (nlohmann-json)

#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"
#include "kvpager/core/indexed_heap.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/core/types.hpp"

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"

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
#include "kvpager/tuning/batch_size_tuner.hpp"
#include "kvpager/tuning/priority_aging.hpp"
#include "kvpager/tuning/swap_cost_model.hpp"

#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/kernels/step_executor.hpp"
#include "kvpager/kernels/kv_layout.hpp"
#include "kvpager/sched/scheduler.hpp"
#include "kvpager/monitor/metrics.hpp"
#include "kvpager/tuning/block_size_advisor.hpp"
#include "kvpager/sizing/kv_sizing.hpp"
#include "kvpager/sizing/model_shape.hpp"
#include "kvpager/sizing/tensor_parallel.hpp"

#if __has_include(<xxhash.h>)
#include "kvpager/cache/compositions.hpp"
#include "kvpager/sharing/prefix_caching.hpp"
#include "kvpager/sharing/xxh3_hasher.hpp"
#endif
