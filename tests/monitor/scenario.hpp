// SPDX-License-Identifier: Apache-2.0
#pragma once
// A real serving run that gives every metric a non-trivial value: a prefix-caching cache with LRU eviction and a
// small host pool, a scheduler that preempts by swap (falling back to recompute when the host pool is full),
// requests sharing a system prompt, more requests than fit (waiting, LATER answers), one that can never run (a
// NEVER answer) and requests finishing (their cached blocks evictable, then evicted). Used by the monitor tests and
// by the exposition program the Prometheus parser test runs.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace kvtest_monitor {

using cache_t = kvpager::paged_kv_cache<kvpager::free_list_allocator, kvpager::lru_eviction, kvpager::prefix_caching,
                                        kvpager::host_swap>;
using sched_t = kvpager::scheduler<cache_t>;

/// 64 blocks of 16 tokens (one reserved), 6 host blocks; layers of 8 KV heads x 128 x fp16.
inline constexpr kvpager::kv_geometry geometry{64, 16, 8, 128, kvpager::kv_dtype::f16};
inline constexpr std::int32_t num_layers = 4;

inline cache_t make_cache() {
  return std::move(*cache_t::create(kvpager::cache_config_for(geometry, {.reserved_blocks = 1, .num_host_blocks = 6})));
}

inline kvpager::scheduler_config sched_config() {
  kvpager::scheduler_config c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 256;
  c.preemption = kvpager::preemption_mode::swap;
  return c;
}

/// A prompt of `n` tokens starting with the shared 40-token system prompt (two full blocks and a half), then
/// tokens of its own.
inline std::vector<kvpager::token_id> prompt(std::int32_t n, kvpager::token_id own) {
  std::vector<kvpager::token_id> p;
  for (std::int32_t i = 0; i < n; ++i) p.push_back(i < 40 ? 1000 + i : own * 10000 + i);
  return p;
}

/// Runs `steps` steps: three requests arrive every other step (each generates 30 + 3 * id % 17 tokens), and one of
/// 2000 tokens, answered NEVER. `each_step(step)` is called after every schedule() (e.g. to take a
/// snapshot).
template <class F>
void run(cache_t& cache, sched_t& s, int steps, F&& each_step) {
  std::vector<std::int32_t> generated(1000, 0);
  kvpager::seq_id next = 0;
  (void)s.add_request(999, prompt(2000, 999));  // more than the pool: NEVER
  for (int step = 0; step < steps; ++step) {
    if (step % 2 == 0) {
      for (int k = 0; k < 3 && next < 900; ++k, ++next)
        (void)s.add_request(next, prompt(60 + 7 * static_cast<std::int32_t>(next % 5), static_cast<kvpager::token_id>(next)));
    }
    const kvpager::step_output& out = s.schedule();
    for (const kvpager::scheduled_sequence& x : out.scheduled) {
      if (!x.last_chunk) continue;
      const auto i = static_cast<std::size_t>(x.id);
      const bool done = ++generated[i] >= 30 + 3 * static_cast<std::int32_t>(x.id) % 17;
      (void)s.complete(x.id, static_cast<kvpager::token_id>(7 + generated[i]), done);
    }
    each_step(step);
  }
  (void)cache;
}

}  // namespace kvtest_monitor
