// SPDX-License-Identifier: Apache-2.0
#pragma once
// What kvpager-sim measures, the same way for the paged cache and the contiguous baseline: one sample per step,
// and the run's summary computed from the samples.

#include <algorithm>
#include <array>
#include <cmath>
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
  /// Steps this sample stands for: 1, or the length of an idle stretch skipped to the next arrival (every step of
  /// it the same: nothing running, waiting or swapped).
  std::int64_t span = 1;
};

/// A run of one system, summarized.
struct run_summary {
  std::string system;  ///< "paged" or "contiguous"
  std::int64_t steps = 0;
  std::int64_t completed = 0;
  std::int64_t aborted = 0;  ///< finished by the scheduler (too long, cache error) or rejected
  std::int64_t output_tokens = 0;  ///< output tokens of the completed samples (a fork child counts the shared first)
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
  /// The prefix hits by tier (prefix_hit_tokens = device + host), and the host tier's block moves (paged, with
  /// --host-tier-blocks): loads (host to device, each a reused block) and stores (device to host).
  std::int64_t prefix_hit_tokens_device = 0, prefix_hit_tokens_host = 0;
  std::int64_t tier_loads = 0, tier_stores = 0;
  std::int64_t bytes_per_block = 0;  ///< KV bytes of a block over all layers (what a load or store moves)
  std::array<std::int64_t, 4> health_steps{};  ///< steps at each health level (OK, GOOD, WARNING, CRITICAL)
  double wall_s = 0;
};

/// The samples of one run: the summary's sums over every step (each sample weighted by its span), and a bounded
/// history for the report. Whatever the run's length the history keeps at most `capacity` samples: when it is full,
/// every other one is dropped and from then on only every stride-th sample is kept (stride 1, 2, 4, ...), so a run
/// of any length takes bounded memory (issue 21, point 4). The last sample is always in samples().
class step_history {
 public:
  explicit step_history(std::size_t capacity = std::size_t{1} << 17) : capacity_(std::max<std::size_t>(capacity, 2)) {}

  void add(const step_sample& x) {
    const auto w = static_cast<double>(x.span);
    steps_ += x.span;
    peak_batch_ = std::max(peak_batch_, x.running);
    batch_ += w * x.running;
    usage_ += w * x.kv_usage;
    share_ += x.pool_slots > 0 ? w * static_cast<double>(x.stored_tokens) / static_cast<double>(x.pool_slots) : 0.0;
    ext_ += w * x.external_fragmentation;
    peak_ext_ = std::max(peak_ext_, x.external_fragmentation);
    alloc_ += x.span * x.allocated_slots;
    stored_ += x.span * x.stored_tokens;
    health_steps_[static_cast<std::size_t>(x.health)] += x.span;
    last_ = x;
    if (added_++ % stride_ == 0) kept_.push_back(x);
    if (kept_.size() >= capacity_) {
      std::size_t k = 0;
      for (std::size_t i = 0; i < kept_.size(); i += 2) kept_[k++] = kept_[i];
      kept_.resize(k);
      stride_ *= 2;
    }
  }

  /// Every stride()-th sample in order, and the last one.
  [[nodiscard]] std::vector<step_sample> samples() const {
    std::vector<step_sample> v = kept_;
    if (added_ > 0 && (v.empty() || v.back().step != last_.step)) v.push_back(last_);
    return v;
  }
  /// 1 while every sample is kept; 2^k once the history was thinned k times.
  [[nodiscard]] std::int64_t stride() const noexcept { return stride_; }
  /// Steps so far (the spans summed).
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  /// The summary fields that follow from the samples.
  void summarize(run_summary& s) const {
    s.steps = steps_;
    s.peak_batch = peak_batch_;
    s.peak_external_fragmentation = peak_ext_;
    s.health_steps = health_steps_;
    if (steps_ > 0) {
      const auto n = static_cast<double>(steps_);
      s.mean_batch = batch_ / n;
      s.mean_kv_usage = usage_ / n;
      s.mean_token_share = share_ / n;
      s.mean_external_fragmentation = ext_ / n;
      s.completed_per_step = static_cast<double>(s.completed) / n;
    }
    s.internal_waste = alloc_ > 0 ? 1.0 - static_cast<double>(stored_) / static_cast<double>(alloc_) : 0.0;
  }

 private:
  std::size_t capacity_;
  std::vector<step_sample> kept_;
  step_sample last_{};
  std::int64_t added_ = 0, stride_ = 1, steps_ = 0, alloc_ = 0, stored_ = 0;
  std::int32_t peak_batch_ = 0;
  double batch_ = 0, usage_ = 0, share_ = 0, ext_ = 0, peak_ext_ = 0;
  std::array<std::int64_t, 4> health_steps_{};
};

/// Steps an idle stretch (nothing running, waiting or swapped, the next arrival ahead) is simulated one by one
/// before the rest of it is skipped as one sample: enough for the health check's window to see the idle steps.
inline constexpr std::int64_t idle_steps_simulated = 1024;

/// The idle skipping both runs share: after idle_steps_simulated consecutive idle steps (nothing running, waiting
/// or swapped, an arrival ahead), the rest of the stretch becomes one sample spanning it, a copy of the last step's.
class idle_skipper {
 public:
  /// Called at `step` once its arrivals are queued: `idle` whether nothing is live. When the stretch is long enough,
  /// adds the spanning sample to `h`, moves `step` to the next arrival (at most `max_steps`, 0: no limit) and
  /// returns true: the caller skips the step.
  bool skip(bool idle, std::int64_t& step, double next_arrival, std::int64_t max_steps, step_history& h) {
    if (!idle) {
      idle_ = 0;
      return false;
    }
    if (++idle_ <= idle_steps_simulated) return false;
    const double cap = 4.0e18;  // within int64, far beyond any run the options allow
    auto to = static_cast<std::int64_t>(std::ceil(std::min(next_arrival, cap)));
    if (max_steps > 0) to = std::min(to, max_steps);
    if (to <= step) return false;
    step_sample x = last_;
    x.step = step;
    x.span = to - step;
    x.batched_tokens = 0;
    h.add(x);
    step = to;
    return true;
  }
  /// The step ran and gave sample `x`.
  void stepped(const step_sample& x) { last_ = x; }

 private:
  std::int64_t idle_ = 0;
  step_sample last_{};
};

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
