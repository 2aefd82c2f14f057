// SPDX-License-Identifier: Apache-2.0
#pragma once
// What kvpager-sim measures, the same way for the paged cache and the contiguous baseline: one sample per step,
// and the run's summary computed from the samples.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <kvpager/monitor/health.hpp>

namespace kvsim {

/// One scheduler step of one system. Fractions are of the pool's token slots.
struct step_sample {
  std::int64_t step = 0;
  std::int32_t running = 0;  ///< requests with KV on the device, scheduled or not
  std::int32_t waiting = 0;
  std::int32_t swapped = 0;
  std::int64_t batched_tokens = 0;  ///< tokens computed in the step
  std::int64_t allocated_slots = 0;  ///< token slots reserved (paged: block-table slots of live sequences)
  std::int64_t stored_tokens = 0;    ///< of those, slots holding a token's KV
  std::int64_t pool_slots = 0;       ///< token slots of the pool
  double kv_usage = 0;               ///< share of the pool allocated (paged: used blocks / usable blocks)
  double external_fragmentation = 0;  ///< share of the pool free but too fragmented to serve a request
  std::int64_t completed = 0;    ///< requests (samples) finished so far
  std::int64_t preemptions = 0;  ///< so far
  std::int64_t swaps = 0;        ///< swap events (outs and ins) so far
  kvpager::health_level health = kvpager::health_level::ok;
};

/// A run of one system, summarized.
struct run_summary {
  std::string system;  ///< "paged" or "contiguous"
  std::int64_t steps = 0;
  std::int64_t completed = 0;
  std::int64_t aborted = 0;  ///< finished by the scheduler (too long, cache error) or rejected
  std::int32_t peak_batch = 0;
  double mean_batch = 0;            ///< running requests, mean over steps
  double completed_per_step = 0;    ///< completed / steps
  double mean_kv_usage = 0;         ///< mean over steps
  /// Tokens whose KV the sequences hold, as a share of the pool's token slots, mean over steps (a block shared by
  /// several sequences counts once per sequence: the capacity sharing gives).
  double mean_token_share = 0;
  double internal_waste = 0;        ///< 1 - stored / allocated, token slots summed over steps
  double mean_external_fragmentation = 0;
  double peak_external_fragmentation = 0;
  std::int64_t preemptions = 0, preemptions_swap = 0, preemptions_recompute = 0;
  std::int64_t swap_outs = 0, swap_ins = 0;
  double prefix_hit_rate = 0;
  std::int64_t prefix_hit_tokens = 0, prefix_query_tokens = 0;
  std::array<std::int64_t, 4> health_steps{};  ///< steps at each health level (OK, GOOD, WARNING, CRITICAL)
  double wall_s = 0;
};

/// The summary fields that follow from the samples.
inline void summarize_samples(const std::vector<step_sample>& samples, run_summary& s) {
  s.steps = static_cast<std::int64_t>(samples.size());
  double batch = 0, usage = 0, ext = 0, share = 0;
  std::int64_t alloc = 0, stored = 0;
  for (const step_sample& x : samples) {
    s.peak_batch = std::max(s.peak_batch, x.running);
    batch += x.running;
    usage += x.kv_usage;
    share += x.pool_slots > 0 ? static_cast<double>(x.stored_tokens) / static_cast<double>(x.pool_slots) : 0.0;
    ext += x.external_fragmentation;
    s.peak_external_fragmentation = std::max(s.peak_external_fragmentation, x.external_fragmentation);
    alloc += x.allocated_slots;
    stored += x.stored_tokens;
    ++s.health_steps[static_cast<std::size_t>(x.health)];
  }
  if (!samples.empty()) {
    const auto n = static_cast<double>(samples.size());
    s.mean_batch = batch / n;
    s.mean_kv_usage = usage / n;
    s.mean_token_share = share / n;
    s.mean_external_fragmentation = ext / n;
    s.completed_per_step = static_cast<double>(s.completed) / n;
  }
  s.internal_waste = alloc > 0 ? 1.0 - static_cast<double>(stored) / static_cast<double>(alloc) : 0.0;
}

/// "OK GOOD WARNING" style list of the levels seen.
[[nodiscard]] inline std::string levels_seen(const run_summary& s) {
  std::string out;
  for (std::size_t i = 0; i < s.health_steps.size(); ++i)
    if (s.health_steps[i] > 0) {
      if (!out.empty()) out += ' ';
      out += kvpager::to_string(static_cast<kvpager::health_level>(i));
    }
  return out.empty() ? "-" : out;
}

}  // namespace kvsim
