// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// scheduler_tuners: the auto-tuning policies (kvpager/tuning/) one scheduler runs, built from its
/// scheduler_config and fed once per step: the dynamic max batch size (batch_size_tuner) and the adaptive
/// swap-or-recompute choice (adaptive_preemption, with preemption_mode::adaptive), and the block size advisor. Priority aging needs no state
/// beyond each request's counters (scheduler_config::aging()). Off by default; off, they change no decision and the
/// step pays a branch. Nothing here allocates.

#include <algorithm>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/sched/admission_limits.hpp"
#include "kvpager/sched/scheduler_config.hpp"
#include "kvpager/sched/step_output.hpp"
#include "kvpager/tuning/batch_size_tuner.hpp"
#include "kvpager/tuning/block_size_advisor.hpp"
#include "kvpager/tuning/swap_cost_model.hpp"

KVPAGER_NAMESPACE_BEGIN

class scheduler_tuners {
 public:
  /// The tuners `cfg` configures. A batch_tuning that fails validation gives a disabled tuner, a swap_cost that
  /// does a policy that always recomputes (scheduler_config::validate and scheduler::create report both).
  explicit scheduler_tuners(const scheduler_config& cfg) noexcept
      : batch_(cfg.batch_tuning), preemption_(cfg.swap_cost), block_sizes_(cfg.block_size_advice) {}

  /// The dynamic max batch size (disabled unless scheduler_config::batch_tuning.enabled).
  [[nodiscard]] const batch_size_tuner& batch() const noexcept { return batch_; }
  /// The swap-or-recompute policy of preemption_mode::adaptive. The engine reports what it measures through it
  /// (observe_transfer: host copies; observe_prefill: prefill time per token).
  [[nodiscard]] adaptive_preemption& preemption() noexcept { return preemption_; }
  [[nodiscard]] const adaptive_preemption& preemption() const noexcept { return preemption_; }

  /// The block size advisor, fed with scheduler_config::advise_block_size: recommend() says which block size the
  /// finished requests' lengths favour (a cache's block size is fixed: this advises the next deployment).
  [[nodiscard]] const block_size_advisor& block_sizes() const noexcept { return block_sizes_; }

  /// The engine finished a request of `prompt_len` prompt tokens and `num_tokens` tokens in all.
  void finished(const scheduler_config& cfg, std::int64_t prompt_len, std::int64_t num_tokens) noexcept {
    if (cfg.advise_block_size) (void)block_sizes_.observe(prompt_len, num_tokens - prompt_len);
  }

  /// Running requests allowed now: max_num_seqs, capped by the batch size tuner's limit when it is enabled.
  [[nodiscard]] std::int64_t max_running(const scheduler_config& cfg) const noexcept {
    return std::min<std::int64_t>(cfg.max_num_seqs, batch_.limit());
  }

  /// Whether a victim with `computed` tokens in the cache (their blocks by `limits`' block size) is swapped out
  /// (the scheduler's own choice; preemption_mode::cache_policy asks the cache instead): always with
  /// preemption_mode::swap, when the cost model says so with preemption_mode::adaptive, never otherwise.
  [[nodiscard]] bool swaps(const scheduler_config& cfg, const admission_limits& limits,
                           std::int64_t computed) const noexcept {
    if (cfg.preemption == preemption_mode::swap) return true;
    return cfg.preemption == preemption_mode::adaptive &&
           preemption_.choose(limits.blocks_needed(computed), computed) == preempt_choice::swap;
  }

  /// End of step `out` with `used` of `usable` blocks in use: the batch size tuner follows the utilization and the
  /// step's preemptions, the swap rate its swap-outs.
  void end_step(const scheduler_config& cfg, std::int64_t used, std::int64_t usable, const step_output& out) noexcept {
    const auto swap_outs = static_cast<std::int32_t>(out.swapped_out.size());
    if (batch_.enabled()) {
      const double u = usable > 0 ? static_cast<double>(used) / static_cast<double>(usable) : 1.0;
      (void)batch_.update(u, swap_outs + static_cast<std::int32_t>(out.preempted_recompute.size()));
    }
    if (cfg.preemption == preemption_mode::adaptive) preemption_.end_step(swap_outs);
  }

  /// Replaces `cfg`'s batch_tuning with `t` and restarts the tuner from t's initial limit. Errors (nothing
  /// changed): batch_size_tuning::validate's (checked even with `t.enabled` off).
  status set_batch_tuning(scheduler_config& cfg, const batch_size_tuning& t) noexcept {
    if (const status st = t.validate(); !st) return st;
    cfg.batch_tuning = t;
    batch_ = batch_size_tuner(t);
    return ok_status();
  }

  /// Replaces `cfg`'s swap_cost with `m` (its configured bandwidth and prefill time replace the measured ones; the
  /// swap rate is kept). Errors (nothing changed): swap_cost_model::validate's.
  status set_swap_cost(scheduler_config& cfg, const swap_cost_model& m) noexcept {
    if (const status st = m.validate(); !st) return st;
    cfg.swap_cost = m;
    const double rate = preemption_.swap_rate();
    preemption_ = adaptive_preemption(m);
    preemption_.restore_swap_rate(rate);
    return ok_status();
  }

 private:
  batch_size_tuner batch_;
  adaptive_preemption preemption_;
  block_size_advisor block_sizes_;
};

KVPAGER_NAMESPACE_END
