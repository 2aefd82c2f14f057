// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// metrics_snapshot: one step's view of a paged_kv_cache and the scheduler that drives it, in the numbers an
/// operator watches (the seed's 3.3.5 "key metrics", with vLLM's definitions where vLLM has the metric). Taking a
/// snapshot is O(1) and allocates nothing: it reads cache.stats() and scheduler.stats().
///
/// \code
///   const std::int64_t bpb = kvpager::kv_bytes_per_block(geometry, num_layers);
///   kvpager::metrics_snapshot m = kvpager::take_snapshot(cache, sched, bpb);
///   if (m.kv_cache_usage > 0.9) ...
/// \endcode
/// Gauges describe now; counters (`_total` in the Prometheus text) are cumulative since the cache and the scheduler
/// were created.

#include <cstdint>

#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Bytes one block holds over all `num_layers` layers (K and V): core's block_bytes(g, num_layers), 0 (take_snapshot
/// then reports no bytes) for a non-positive dimension or layer count and for a block that does not fit in int64.
[[nodiscard]] constexpr std::int64_t kv_bytes_per_block(const kv_geometry& g, std::int32_t num_layers = 1) noexcept {
  return block_bytes(g, num_layers);
}

/// kv_bytes_per_block with its errors: core's checked_block_bytes.
[[nodiscard]] inline result<std::int64_t> checked_kv_bytes_per_block(const kv_geometry& g,
                                                                     std::int32_t num_layers = 1) noexcept {
  return checked_block_bytes(g, num_layers);
}

/// The numbers of one snapshot. A plain value: copy it, compare it, keep it (metrics_recorder keeps a history).
struct metrics_snapshot {
  // --- the pool (gauges, in blocks) ---
  std::int32_t block_size = 0;      ///< tokens per block
  std::int64_t bytes_per_block = 0; ///< as given to take_snapshot (0: bytes are not reported)
  std::int32_t usable_blocks = 0;   ///< num_blocks - reserved_blocks
  /// Blocks an allocation cannot take now: usable - free - evictable (in use, or unreferenced but still read by a
  /// copy planned in this step). Cached, unreferenced blocks count as free, as vLLM counts them.
  std::int32_t used_blocks = 0;
  std::int32_t free_blocks = 0;       ///< blocks in the allocator's free set
  std::int32_t evictable_blocks = 0;  ///< cached, unreferenced blocks (reclaimable: free for usage)
  std::int32_t cached_blocks = 0;     ///< blocks whose content the prefix cache can find (in use or not)
  /// vLLM's kv_cache_usage_perc, a fraction in [0, 1] despite the name: used_blocks / usable_blocks
  /// (= 1 - (free + evictable) / usable, BlockPool.get_usage).
  double kv_cache_usage = 0.0;

  // --- requests (gauges) ---
  std::int32_t running = 0;  ///< requests with their blocks on the device
  std::int32_t waiting = 0;  ///< requests queued for admission (including recompute victims)
  std::int32_t swapped = 0;  ///< requests swapped out to the host pool

  // --- swaps (counters) ---
  std::int64_t swap_outs = 0;          ///< sequences swapped out (events)
  std::int64_t swap_ins = 0;           ///< sequences swapped in (events)
  std::int64_t swapped_out_blocks = 0; ///< device blocks copied to the host pool
  std::int64_t swapped_in_blocks = 0;  ///< host blocks copied back to the device
  std::int64_t swapped_out_bytes = 0;  ///< swapped_out_blocks x bytes_per_block (saturated at INT64_MAX)
  std::int64_t swapped_in_bytes = 0;   ///< swapped_in_blocks x bytes_per_block (saturated at INT64_MAX)

  // --- preemptions (counters), by mode ---
  std::int64_t preemptions_recompute = 0;  ///< victims freed for recompute (includes swap fallbacks)
  std::int64_t preemptions_swap = 0;       ///< victims swapped out
  std::int64_t swap_fallback_recompute = 0;  ///< of preemptions_recompute: a swap the host pool refused

  // --- sharing (gauges) ---
  std::int32_t shared_blocks = 0;    ///< physical blocks referenced by more than one sequence
  std::int64_t logical_blocks = 0;   ///< block references of device block tables (sum of their lengths)
  std::int32_t referenced_blocks = 0;  ///< physical blocks with at least one reference
  /// The seed's page sharing rate: shared_blocks / usable_blocks.
  double shared_fraction = 0.0;
  /// Logical references served by sharing: 1 - referenced_blocks / logical_blocks (0 when nothing is shared).
  double sharing_ratio = 0.0;

  // --- prefix cache (counters, in tokens; first admissions, as vLLM's prefix_cache_queries / hits) ---
  std::int64_t prefix_queries = 0;          ///< tokens of first admissions looked up
  std::int64_t prefix_hits = 0;             ///< of those, tokens served from the (device) prefix cache
  std::int64_t resumed_prefix_queries = 0;  ///< the same for re-admissions of preempted requests
  std::int64_t resumed_prefix_hits = 0;
  double prefix_hit_rate = 0.0;             ///< prefix_hits / prefix_queries (0 before any query)
  std::int64_t evictions = 0;               ///< cached blocks whose content was discarded to reuse the block

  // --- internal fragmentation (gauges; the seed's 3.3.1 measure) ---
  /// Token slots allocated to live sequences (device and host block tables) minus the tokens they store: at most
  /// block_size - 1 per sequence.
  std::int64_t internal_waste_tokens = 0;
  std::int64_t internal_waste_bytes = 0;  ///< internal_waste_tokens x bytes_per_block / block_size (saturated)

  // --- admission answers of add_request (counters) ---
  std::int64_t admission_ok = 0;     ///< fits now
  std::int64_t admission_later = 0;  ///< queued, does not fit now
  std::int64_t admission_never = 0;  ///< rejected: can never run
  std::int64_t admitted = 0;         ///< admissions into the running queue (first or resumed)
  std::int64_t steps = 0;            ///< scheduler steps

  // --- the host tier (a cache with one; 0 otherwise; the tier's own figures: monitor/tier_metrics.hpp) ---
  std::int32_t loading = 0;              ///< requests waiting for host tier loads (gauge; async transfers)
  std::int64_t prefix_host_hits = 0;     ///< of prefix_queries, tokens loaded from the host tier (counter)
  std::int32_t tier_in_flight = 0;       ///< host tier loads and stores not complete (gauge)
  std::int64_t tier_failed_loads = 0;    ///< loads reported failed: their tokens recomputed (counter)
  std::int64_t tier_failed_stores = 0;   ///< stores reported failed: no host copy (counter)
  std::int64_t tier_load_timeouts = 0;   ///< sequences whose loads passed the timeout (counter)

  friend bool operator==(const metrics_snapshot&, const metrics_snapshot&) = default;

  /// Preemptions of either mode (vLLM's num_preemptions), saturated at INT64_MAX.
  [[nodiscard]] std::int64_t preemptions() const noexcept {
    return saturating_add(preemptions_recompute, preemptions_swap);
  }
  /// Swap events of either direction (the seed's "swap_events", which the health check counts in its window),
  /// saturated at INT64_MAX.
  [[nodiscard]] std::int64_t swap_events() const noexcept { return saturating_add(swap_outs, swap_ins); }
};

namespace detail {
[[nodiscard]] constexpr double metrics_ratio(double num, double den) noexcept { return den > 0 ? num / den : 0.0; }
}  // namespace detail

/// A snapshot of `cache` alone (the request and admission fields stay 0; swaps and preemptions as the cache
/// counts them: its own swap_out / swap_in / preempt calls). `bytes_per_block`: kv_bytes_per_block(geometry,
/// layers), or 0 to leave the byte fields 0. O(1), allocates nothing.
template <class Cache>
[[nodiscard]] metrics_snapshot take_snapshot(const Cache& cache, std::int64_t bytes_per_block = 0) noexcept {
  const auto c = cache.stats();
  metrics_snapshot m;
  m.block_size = c.block_size;
  m.bytes_per_block = bytes_per_block > 0 ? bytes_per_block : 0;
  m.usable_blocks = c.total;
  m.free_blocks = c.free;
  m.evictable_blocks = c.evictable;
  m.used_blocks = c.total - c.available();
  m.cached_blocks = c.cached;
  m.kv_cache_usage = detail::metrics_ratio(double(m.used_blocks), double(m.usable_blocks));
  m.swapped = c.swapped;
  m.swap_outs = c.swap_outs;
  m.swap_ins = c.swap_ins;
  m.swapped_out_blocks = c.swapped_out_blocks;
  m.swapped_in_blocks = c.swapped_in_blocks;
  m.swapped_out_bytes = saturating_mul(c.swapped_out_blocks, m.bytes_per_block);
  m.swapped_in_bytes = saturating_mul(c.swapped_in_blocks, m.bytes_per_block);
  m.preemptions_recompute = c.preempted_recompute;
  m.preemptions_swap = c.preempted_swap;
  m.shared_blocks = c.shared;
  m.logical_blocks = c.logical;
  m.referenced_blocks = c.used;
  m.shared_fraction = detail::metrics_ratio(double(c.shared), double(c.total));
  m.sharing_ratio = c.sharing_ratio();
  m.prefix_queries = c.prefix_query_tokens;
  m.prefix_hits = c.prefix_hit_tokens;
  m.prefix_hit_rate = c.prefix_hit_rate();
  m.evictions = c.evictions;
  m.internal_waste_tokens = c.internal_waste_tokens();
  m.internal_waste_bytes = saturating_mul_div(m.internal_waste_tokens, m.bytes_per_block, c.block_size);
  m.prefix_host_hits = c.prefix_hit_tokens_host;
  m.tier_in_flight = c.tier_in_flight;
  m.tier_failed_loads = c.tier_failed_loads;
  m.tier_failed_stores = c.tier_failed_stores;
  m.tier_load_timeouts = c.tier_load_timeouts;
  return m;
}

/// A snapshot of `cache` and the `sched`uler that drives it: the cache's pool, swap and sharing figures, the
/// scheduler's queues, preemptions (whatever the preemption mode, as the scheduler counts them), prefix lookups of
/// its admissions (first admissions apart from resumed ones, as vLLM) and admission answers. O(1), allocates
/// nothing.
template <class Cache, class Sched>
  requires requires(const Sched& s) { s.stats().answered_later; }
[[nodiscard]] metrics_snapshot take_snapshot(const Cache& cache, const Sched& sched,
                                             std::int64_t bytes_per_block = 0) noexcept {
  metrics_snapshot m = take_snapshot(cache, bytes_per_block);
  const auto s = sched.stats();
  m.running = s.running;
  m.waiting = s.waiting;
  m.swapped = s.swapped;
  m.preemptions_recompute = s.preempted_recompute;
  m.preemptions_swap = s.preempted_swap;
  m.swap_fallback_recompute = s.swap_fallback_recompute;
  m.prefix_queries = s.prefix.query_tokens;
  // The device prefix cache's hits, as vLLM's prefix_cache_hits: a host tier's loads are its external hits
  // (monitor/tier_metrics.hpp), counted apart.
  m.prefix_hits = s.prefix.hit_tokens - s.prefix.host_hit_tokens;
  m.resumed_prefix_queries = s.resumed_prefix.query_tokens;
  m.resumed_prefix_hits = s.resumed_prefix.hit_tokens - s.resumed_prefix.host_hit_tokens;
  m.prefix_hit_rate = detail::metrics_ratio(double(m.prefix_hits), double(m.prefix_queries));
  m.prefix_host_hits = s.prefix.host_hit_tokens;
  m.loading = s.loading;
  m.admission_ok = s.answered_ok;
  m.admission_later = s.answered_later;
  m.admission_never = s.rejected;
  m.admitted = s.admitted;
  m.steps = s.steps;
  return m;
}

KVPAGER_NAMESPACE_END
