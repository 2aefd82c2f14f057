// SPDX-License-Identifier: Apache-2.0
#pragma once
// The paged run: a workload through kvpager::scheduler over a paged_kv_cache composition, measured every step with
// the library's monitor (take_snapshot into a metrics_recorder, health_check over it) and, with --compute cpu,
// computed by attention_compute on the CPU kernels.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kvpager/monitor/health.hpp>
#include <kvpager/monitor/metrics.hpp>
#include <kvpager/monitor/recorder.hpp>
#include <kvpager/sched/scheduler.hpp>

#include "compute.hpp"
#include "events.hpp"
#include "metrics.hpp"
#include "workload.hpp"

namespace kvsim {

struct paged_options {
  kvpager::scheduler_config sched{};
  std::int64_t bytes_per_block = 0;  ///< KV bytes of a block over all layers (the monitor's byte figures)
  std::int64_t max_steps = 0;        ///< 0: until done
  /// Simulated time of one step (the recorder's clock, over which the health check counts swaps in its window).
  std::chrono::nanoseconds step_time = std::chrono::milliseconds(20);
  attention_compute* compute = nullptr;  ///< --compute cpu
  kv_event_sink* events = nullptr;       ///< --kv-events: the cache reports into it; flushed once per step
  std::int64_t progress_every = 0;       ///< steps between progress calls (0: none)
  std::function<void(std::int64_t step, std::int64_t done, std::int64_t total)> progress;
};

/// What a paged run leaves beside its summary: the last step's snapshot and the block size advice.
struct paged_extras {
  kvpager::metrics_snapshot last{};
  std::optional<std::int32_t> advised_block_size;
  std::int64_t dropped_forks = 0;
  std::string error;  ///< a compute error ("" when none)
  std::int64_t cached_at_end = 0;  ///< the cache's cached blocks after the run
};

template <class Cache>
run_summary run_paged(const workload& w, Cache& cache, const paged_options& o, step_history& samples,
                      paged_extras& extras) {
  const auto start_time = std::chrono::steady_clock::now();
  using kvpager::seq_id;
  struct state {
    std::uint64_t gen_seed = 0;
    std::int32_t outputs = 0;
    std::int32_t max_new = 1;
    const sim_request* parent = nullptr;  // children to fork after the first output
  };
  run_summary s;
  s.system = "paged";
  kvpager::scheduler<Cache> sched(cache, o.sched);
  auto recorder = *kvpager::metrics_recorder::create(1 << 16);
  const kvpager::health_check health;
  std::unordered_map<seq_id, state> live;
  std::int64_t total = 0;
  for (const sim_request& r : w.requests) total += 1 + static_cast<std::int64_t>(r.child_ids.size());
  std::size_t next = 0;
  std::int64_t step = 0;
  idle_skipper idle;
  for (;;) {
    const kvpager::scheduler_stats before = sched.stats();
    if (next == w.requests.size() && before.running + before.waiting + before.swapped == 0 &&
        sched.pending_forks().empty())
      break;
    if (o.max_steps > 0 && step >= o.max_steps) break;
    while (next < w.requests.size() && w.requests[next].arrival <= static_cast<double>(step)) {
      const sim_request& r = w.requests[next++];
      const auto a = sched.add_request(r.id, r.prompt, 0);
      if (!a || *a == kvpager::admission::never) {
        s.aborted += 1 + static_cast<std::int64_t>(r.child_ids.size());
        continue;
      }
      live[r.id] = {r.gen_seed, 0, r.max_new, r.child_ids.empty() ? nullptr : &r};
    }
    // An idle stretch before the next arrival: simulated step by step for a while (the health check's window sees
    // it), then skipped as one sample spanning the rest (issue 21, point 4: --rate 1e-6 leaves millions of steps).
    if (const kvpager::scheduler_stats now = sched.stats();
        next < w.requests.size() &&
        idle.skip(now.running + now.waiting + now.swapped == 0 && sched.pending_forks().empty(), step,
                  w.requests[next].arrival, o.max_steps, samples))
      continue;
    const kvpager::step_output& out = sched.schedule();
    std::int64_t batched = 0;
    for (const auto& e : out.scheduled) batched += e.num_tokens;
    if (o.compute != nullptr) {
      extras.error = o.compute->step(step, out);
      if (!extras.error.empty()) break;
    }
    for (const auto& f : out.finished) {  // finished by the scheduler: too long, cache error
      ++s.aborted;
      live.erase(f.id);
      if (o.compute != nullptr) o.compute->forget(f.id);
    }
    for (const seq_id c : out.dropped_forks) {
      ++extras.dropped_forks;
      ++s.aborted;
      live.erase(c);
    }
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const auto& e = out.scheduled[i];
      if (!e.last_chunk) continue;
      const auto it = live.find(e.id);
      if (it == live.end()) continue;
      state& st = it->second;
      const kvpager::token_id tok = token_of(st.gen_seed, static_cast<std::uint64_t>(st.outputs));
      ++st.outputs;
      const bool fin = st.outputs >= st.max_new;
      if (fin && o.compute != nullptr) o.compute->finish(e.id, sched.tokens(e.id));
      if (!sched.complete_scheduled(i, tok, fin)) continue;
      const sim_request* parent = st.parent;
      const std::int32_t outputs = st.outputs;
      st.parent = nullptr;
      if (fin) {
        ++s.completed;
        s.output_tokens += outputs;
        live.erase(it);
      }
      if (parent == nullptr) continue;
      // Parallel sampling: the other samples fork from the first one, sharing its prompt blocks and its first
      // token (copy-on-write of the partial block at their first write).
      for (std::size_t c = 0; c < parent->child_ids.size(); ++c) {
        if (fin || !sched.fork(e.id, parent->child_ids[c])) {
          ++s.completed;  // a one-token request: its samples are the same token, done
          s.output_tokens += outputs;
          continue;
        }
        live[parent->child_ids[c]] = {parent->child_seeds[c], 1, parent->max_new, nullptr};
      }
    }
    if (o.events != nullptr) {
      o.events->flush([&cache] {
        std::int64_t count = 0;
        std::uint64_t sum = 0;
        for (kvpager::block_id b = 0; b < cache.config().num_blocks; ++b)
          if (cache.sharing().is_cached(b)) {
            ++count;
            sum += cache.sharing().block_hash(b);
          }
        return std::pair<std::int64_t, std::uint64_t>{count, sum};
      });
    }
    // Measure the step with the library's monitor.
    const kvpager::metrics_snapshot m = kvpager::take_snapshot(cache, sched, o.bytes_per_block);
    (void)recorder.record(m, o.step_time * step);
    const auto cs = cache.stats();
    step_sample x;
    x.step = step;
    x.running = m.running;
    x.waiting = m.waiting;
    x.swapped = m.swapped;
    x.batched_tokens = batched;
    x.allocated_slots = (cs.logical + cs.swapped_logical) * cs.block_size;
    x.stored_tokens = cs.tokens;
    x.pool_slots = std::int64_t{cs.total} * cs.block_size;
    x.kv_usage = m.kv_cache_usage;
    // Free blocks no allocation can use: none, whatever the layout (any free block serves any request).
    x.external_fragmentation =
        cs.total > 0 ? static_cast<double>(cs.free + cs.evictable - cache.available_blocks()) / cs.total : 0.0;
    x.completed = s.completed;
    x.preemptions = m.preemptions();
    x.swaps = m.swap_events();
    x.health = health.check(recorder).level;
    samples.add(x);
    idle.stepped(x);
    extras.last = m;
    ++step;
    if (o.progress && o.progress_every > 0 && step % o.progress_every == 0) o.progress(step, s.completed, total);
  }
  // Requests still running when --max-steps stopped the run: their rows so far are checked too.
  if (o.compute != nullptr && extras.error.empty())
    for (const auto& [id, st] : live) o.compute->finish(id, sched.tokens(id));
  samples.summarize(s);
  extras.cached_at_end = cache.stats().cached;
  const kvpager::scheduler_stats fin = sched.stats();
  s.preemptions_swap = fin.preempted_swap;
  s.preemptions_recompute = fin.preempted_recompute;
  s.preemptions = fin.preempted_swap + fin.preempted_recompute;
  s.swap_outs = extras.last.swap_outs;
  s.swap_ins = extras.last.swap_ins;
  s.prefix_hit_tokens = fin.prefix.hit_tokens;
  s.prefix_query_tokens = fin.prefix.query_tokens;
  s.prefix_hit_tokens_host = fin.prefix.host_hit_tokens;
  s.prefix_hit_tokens_device = fin.prefix.hit_tokens - fin.prefix.host_hit_tokens;
  {
    const kvpager::cache_stats cs = cache.stats();
    s.tier_loads = cs.tier_loaded_blocks;
    s.tier_stores = cs.tier_stored_blocks;
  }
  s.bytes_per_block = o.bytes_per_block;
  // Served by either tier (the device's alone is the snapshot's, extras.last.prefix_hit_rate, as vLLM counts it).
  s.prefix_hit_rate = fin.prefix.query_tokens > 0 ? static_cast<double>(fin.prefix.hit_tokens) /
                                                        static_cast<double>(fin.prefix.query_tokens)
                                                  : 0.0;
  if (o.sched.advise_block_size) {
    if (const auto b = sched.tuning().block_sizes().recommend(); b) extras.advised_block_size = *b;
  }
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return s;
}

}  // namespace kvsim
