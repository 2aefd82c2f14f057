// SPDX-License-Identifier: Apache-2.0
#pragma once
// The contiguous baseline: the allocation paged KV management replaces (FasterTransformer, Orca and the systems the
// vLLM paper measured). Each admitted request reserves max_model_len tokens of KV as one contiguous byte range,
// placed first fit in a pool of the same size as the paged one, and holds it until it finishes. It is the seed's
// MemoryFragmentationSimulator done right: one unit throughout (bytes; a token's KV over all layers is
// bytes_per_token), a pool the requests can actually fit in, and requests that come and go over time so that
// external fragmentation (free bytes in holes too small for a reservation) can appear.
//
// The step model is the scheduler's, minus what contiguous allocation cannot do: continuous batching within the
// same token budget and max_num_seqs, decodes first, then prompt chunks, then FCFS admissions while a reservation
// fits (head of line: the first that does not fit stops admission). No preemption is ever needed (the reservation
// covers the longest sequence), no prefix sharing, and a parallel sample is a request of its own that recomputes
// the prompt (no copy-on-write).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include <kvpager/monitor/health.hpp>

#include "metrics.hpp"
#include "workload.hpp"

namespace kvsim {

/// A first-fit allocator over a byte range [0, capacity).
class first_fit_range {
 public:
  explicit first_fit_range(std::int64_t capacity) : capacity_(capacity) {}

  /// The start of a new range of `bytes`, the lowest that fits, or -1.
  std::int64_t allocate(std::int64_t bytes) {
    std::int64_t at = 0;
    std::size_t i = 0;
    for (; i < used_.size(); ++i) {
      if (used_[i].first - at >= bytes) break;
      at = used_[i].second;
    }
    if (i == used_.size() && capacity_ - at < bytes) return -1;
    used_.insert(used_.begin() + static_cast<std::ptrdiff_t>(i), {at, at + bytes});
    return at;
  }

  void release(std::int64_t start) {
    const auto it = std::find_if(used_.begin(), used_.end(), [&](const auto& r) { return r.first == start; });
    if (it != used_.end()) used_.erase(it);
  }

  /// Free bytes in holes smaller than `bytes` (unusable for a reservation of that size).
  [[nodiscard]] std::int64_t unusable_free(std::int64_t bytes) const noexcept {
    std::int64_t at = 0, sum = 0;
    for (const auto& [s, e] : used_) {
      if (s - at < bytes) sum += s - at;
      at = e;
    }
    if (capacity_ - at < bytes) sum += capacity_ - at;
    return sum;
  }
  [[nodiscard]] std::int64_t used_bytes() const noexcept {
    std::int64_t sum = 0;
    for (const auto& [s, e] : used_) sum += e - s;
    return sum;
  }

 private:
  std::int64_t capacity_;
  std::vector<std::pair<std::int64_t, std::int64_t>> used_;  // sorted by start
};

struct contiguous_options {
  std::int64_t pool_tokens = 0;      ///< the pool's token slots (the paged pool's usable blocks x block size)
  std::int64_t bytes_per_token = 0;  ///< KV bytes of one token over all layers
  std::int32_t max_model_len = 2048;
  std::int32_t max_num_seqs = 256;
  std::int64_t max_num_batched_tokens = 8192;
  std::int64_t max_steps = 0;  ///< 0: until done
};

/// Runs `w` over contiguous allocation; one sample per step into `samples` (an idle stretch before the next arrival
/// is skipped as one sample after idle_steps_simulated steps, as the paged run does).
inline run_summary run_contiguous(const workload& w, const contiguous_options& o, step_history& samples) {
  const auto start_time = std::chrono::steady_clock::now();
  struct live {
    std::vector<kvpager::token_id> tokens;
    std::int64_t computed = 0;
    std::int32_t outputs = 0;
    std::int32_t max_new = 1;
    std::uint64_t gen_seed = 0;
    const sim_request* parent = nullptr;  // children to fork after the first output (nullptr: none)
    std::int64_t where = -1;              // start of its reservation
  };
  run_summary s;
  s.system = "contiguous";
  const std::int64_t reserve = std::int64_t{o.max_model_len} * o.bytes_per_token;
  first_fit_range pool(o.pool_tokens * o.bytes_per_token);
  std::deque<live> waiting;
  std::vector<live> running;
  const kvpager::health_check health;
  std::size_t next = 0;
  std::int64_t step = 0;
  std::vector<std::pair<std::size_t, std::int64_t>> scheduled;  // running index, tokens
  idle_skipper idle;
  while (next < w.requests.size() || !waiting.empty() || !running.empty()) {
    if (o.max_steps > 0 && step >= o.max_steps) break;
    while (next < w.requests.size() && w.requests[next].arrival <= static_cast<double>(step)) {
      const sim_request& r = w.requests[next++];
      if (static_cast<std::int64_t>(r.prompt.size()) >= o.max_model_len || o.max_model_len > o.pool_tokens) {
        s.aborted += 1 + static_cast<std::int64_t>(r.child_ids.size());  // can never run
        continue;
      }
      waiting.push_back({r.prompt, 0, 0, r.max_new, r.gen_seed, r.child_ids.empty() ? nullptr : &r, -1});
    }
    if (next < w.requests.size() &&
        idle.skip(waiting.empty() && running.empty(), step, w.requests[next].arrival, o.max_steps, samples))
      continue;
    std::int64_t budget = o.max_num_batched_tokens;
    scheduled.clear();
    for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
      const std::int64_t pending = static_cast<std::int64_t>(running[i].tokens.size()) - running[i].computed;
      if (pending <= 0) continue;
      const std::int64_t n = std::min(pending, budget);
      scheduled.emplace_back(i, n);
      budget -= n;
    }
    while (!waiting.empty() && budget > 0 && static_cast<std::int64_t>(running.size()) < o.max_num_seqs) {
      const std::int64_t at = pool.allocate(reserve);
      if (at < 0) break;
      live r = std::move(waiting.front());
      waiting.pop_front();
      r.where = at;
      const std::int64_t n = std::min(static_cast<std::int64_t>(r.tokens.size()), budget);
      running.push_back(std::move(r));
      scheduled.emplace_back(running.size() - 1, n);
      budget -= n;
    }
    // The step ran: every request whose pending tokens are all computed samples its next token.
    std::int64_t batched = 0;
    std::vector<live> children;
    for (const auto& [i, n] : scheduled) {
      live& r = running[i];
      r.computed += n;
      batched += n;
      if (r.computed < static_cast<std::int64_t>(r.tokens.size())) continue;
      r.tokens.push_back(token_of(r.gen_seed, static_cast<std::uint64_t>(r.outputs)));
      ++r.outputs;
      if (r.outputs == 1 && r.parent != nullptr) {
        for (std::size_t c = 0; c < r.parent->child_ids.size(); ++c)
          children.push_back({r.tokens, 0, 1, r.max_new, r.parent->child_seeds[c], nullptr, -1});
        r.parent = nullptr;
      }
    }
    // Finished requests give their reservation back; children queue first (their group already runs).
    std::int64_t stored = 0, alloc = 0;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < running.size(); ++i) {
      live& r = running[i];
      if (r.outputs >= r.max_new) {
        pool.release(r.where);
        ++s.completed;
        s.output_tokens += r.outputs;
        continue;
      }
      stored += r.computed;
      alloc += o.max_model_len;
      if (kept != i) running[kept] = std::move(r);
      ++kept;
    }
    running.resize(kept);
    for (auto it = children.rbegin(); it != children.rend(); ++it) waiting.push_front(std::move(*it));
    step_sample x;
    x.step = step;
    x.running = static_cast<std::int32_t>(running.size());
    x.waiting = static_cast<std::int32_t>(waiting.size());
    x.batched_tokens = batched;
    x.allocated_slots = alloc;
    x.stored_tokens = stored;
    x.pool_slots = o.pool_tokens;
    const auto pool_bytes = static_cast<double>(o.pool_tokens * o.bytes_per_token);
    x.kv_usage = static_cast<double>(pool.used_bytes()) / pool_bytes;
    x.external_fragmentation = static_cast<double>(pool.unusable_free(reserve)) / pool_bytes;
    x.completed = s.completed;
    x.health = health.check(x.kv_usage, x.waiting, 0).level;
    samples.add(x);
    idle.stepped(x);
    ++step;
  }
  samples.summarize(s);
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return s;
}

}  // namespace kvsim
