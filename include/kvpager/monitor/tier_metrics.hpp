// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A host tier's figures (tier/host_tier.hpp, host_tier_stats) in the Prometheus text format, appended after
/// write_prometheus's: vLLM's names where vLLM has the metric, under `kvpager:` as every kvpager family is:
///   - `kvpager:external_prefix_cache_queries_total`, `..._hits_total`: tokens looked up in and served by the tier
///     (vLLM's connector prefix cache counters, which its offloading connector feeds; blocks x block size);
///   - `kvpager:kv_offload_total_bytes_total{transfer_type="gpu_to_cpu"|"cpu_to_gpu"}`: bytes the tier's stores and
///     loads move (vLLM's offloading counter and labels; blocks x bytes per block, as planned);
/// and the tier's own: blocks held, being written and being read, its capacity, evictions, failed and refused
/// stores, failed loads, blocks kept out by the retention-priority floor, lookups that found a store still being written. Appends
/// to a caller's string (nothing allocated once it has grown). Dependency-free.
///
/// \code
///   kvpager::write_prometheus(body, kvpager::take_snapshot(cache, sched, bytes_per_block));
///   kvpager::append_tier_prometheus(body, tier.stats(), cache.block_size(), bytes_per_block);
/// \endcode

#include <charconv>
#include <cstdint>
#include <string>

#include "kvpager/core/config.hpp"
#include "kvpager/tier/host_tier.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Appends the families above for tier figures `s`, a tier of blocks of `block_size` tokens and `bytes_per_block`
/// bytes (all layers; the monitor's kv_bytes_per_block).
inline void append_tier_prometheus(std::string& out, const host_tier_stats& s, std::int32_t block_size,
                                   std::int64_t bytes_per_block) {
  const auto number = [&out](std::int64_t v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  };
  const auto family = [&out](const char* name, const char* type, const char* help) {
    out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" ");
    out.append(type).append("\n");
  };
  const auto sample = [&out, &number](const char* name, const char* labels, std::int64_t v) {
    out.append(name).append(labels);
    out.push_back(' ');
    number(v);
    out.push_back('\n');
  };
  const auto single = [&family, &sample](const char* name, const char* type, const char* help, std::int64_t v) {
    family(name, type, help);
    sample(name, "", v);
  };
  const std::int64_t bs = block_size;
  single("kvpager:external_prefix_cache_queries_total", "counter",
         "Tokens looked up in the host tier (blocks looked up x block size), vLLM's external prefix cache queries.",
         s.lookups * bs);
  single("kvpager:external_prefix_cache_hits_total", "counter",
         "Tokens the host tier had ready when looked up (blocks x block size), vLLM's external prefix cache hits.",
         s.hits * bs);
  family("kvpager:kv_offload_total_bytes_total", "counter",
         "Bytes the host tier's stores (gpu_to_cpu) and loads (cpu_to_gpu) move, as planned.");
  sample("kvpager:kv_offload_total_bytes_total", "{transfer_type=\"gpu_to_cpu\"}", s.stored * bytes_per_block);
  sample("kvpager:kv_offload_total_bytes_total", "{transfer_type=\"cpu_to_gpu\"}", s.loads * bytes_per_block);
  single("kvpager:host_tier_capacity_blocks", "gauge",
         "Host blocks of the tier.", s.num_blocks);
  family("kvpager:host_tier_blocks", "gauge", "Host blocks holding content, by state (written: ready or being read).");
  sample("kvpager:host_tier_blocks", "{state=\"held\"}", s.held);
  sample("kvpager:host_tier_blocks", "{state=\"writing\"}", s.writing);
  sample("kvpager:host_tier_blocks", "{state=\"reading\"}", s.reading);
  single("kvpager:host_tier_stored_blocks_total", "counter",
         "Blocks whose store completed.", s.stored);
  single("kvpager:host_tier_loaded_blocks_total", "counter",
         "Blocks loads were prepared for.", s.loads);
  single("kvpager:host_tier_evictions_total", "counter",
         "Ready blocks evicted to make room for stores.", s.evicted);
  single("kvpager:host_tier_failed_stores_total", "counter",
         "Blocks whose store failed (forgotten; recomputed).", s.failed_stores);
  single("kvpager:host_tier_failed_loads_total", "counter",
         "Blocks whose load failed (their tokens recomputed).", s.failed_loads);
  single("kvpager:host_tier_refused_stores_total", "counter",
         "Stores refused for want of evictable blocks.", s.refused_stores);
  single("kvpager:host_tier_pending_hits_total", "counter",
         "Lookups that found a block whose store was not complete.", s.pending_hits);
  single("kvpager:host_tier_moved_up_blocks_total", "counter",
         "Blocks an exclusive tier let go when their load completed.", s.moved_up);
  single("kvpager:host_tier_below_priority_blocks_total", "counter",
         "Blocks not stored for their request's retention priority.", s.below_priority);
}

KVPAGER_NAMESPACE_END
