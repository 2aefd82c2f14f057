// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The scheduler's run-time configuration: the policy enums, scheduler_config, and the named presets that reproduce
/// an engine's step (scheduler_config::vllm_v1()). Engines start from a preset and change one knob at a time.
/// The auto-tuning policies (kvpager/tuning/) are configured here too, each off by default.

#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/tuning/batch_size_tuner.hpp"
#include "kvpager/tuning/block_size_advisor.hpp"
#include "kvpager/tuning/priority_aging.hpp"
#include "kvpager/tuning/swap_cost_model.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Answer of an admission check.
enum class admission {
  ok,     ///< fits now, watermark kept
  later,  ///< does not fit now; may once other requests finish
  never,  ///< can never run (cache, max_blocks_per_seq, token budget without chunked prefill): rejected
};

/// Which running request is preempted first when blocks run out.
enum class preemption_order {
  newest_first,    ///< the most recently admitted (vLLM's FCFS victim: the tail of the running queue)
  lowest_priority  ///< the lowest (aged) priority, newest among equals (vLLM's PRIORITY policy)
};

/// How a preempted request gives its device blocks back. Whatever the mode, a victim the cache cannot swap (no
/// host pool, host pool full, a policy that does not preempt) is preempted by recompute: the scheduler frees it
/// and re-queues it, so preemption works over every cache composition.
enum class preemption_mode {
  cache_policy,  ///< as the cache's swap policy decides (cache.preempt: host_swap swaps, hybrid_swap while room)
  recompute,     ///< always recompute (vLLM v1): free the blocks, compute the request's tokens again on resume
  swap,          ///< swap out to the host pool whatever the policy's choice, where the cache has one
  /// Per victim, the cheaper of swap and recompute by scheduler_config::swap_cost (adaptive_preemption: transfer
  /// time over the host link against recompute time, with a penalty that grows with the recent swap rate).
  adaptive,
};

/// How many free blocks an admission (or a swap-in) must leave.
enum class admission_rule {
  /// A share of the pool stays free: watermark_permille of the usable blocks (vLLM V0's watermark).
  watermark,
  /// A buffer relative to the request (the seed's GlobalBlockPool.admit_request): free blocks >= needed x (1 +
  /// headroom_permille / 1000); 100 permille is the seed's "free >= 1.1 x needed".
  request_headroom,
};

/// In which order waiting requests are admitted.
enum class admission_order {
  priority,  ///< highest (aged) priority first, first come first served among equals (vLLM's PRIORITY policy)
  fcfs,      ///< arrival order only (vLLM's FCFS policy); priorities still pick victims with lowest_priority
};

struct scheduler_config {
  std::int32_t max_num_seqs = 256;             ///< running requests at most (< 1: every request is NEVER)
  std::int64_t max_num_batched_tokens = 8192;  ///< tokens computed per step at most (< 1: every request is NEVER)
  /// Blocks kept free when admitting or swapping in, in permille of the usable blocks (10 = 1%, vLLM V0's
  /// default; the seed's example keeps 100 = 10%). Not kept when nothing is running (unless
  /// watermark_when_idle), so no request waits forever.
  std::int32_t watermark_permille = 10;
  /// Whether admissions keep the watermark (above) or a headroom relative to each request (the seed's rule).
  admission_rule admit_rule = admission_rule::watermark;
  /// admission_rule::request_headroom: a request of n blocks is admitted when at least n + ceil(n x
  /// headroom_permille / 1000) blocks are free (100 = the seed's 1.1 x); not kept when nothing runs (unless
  /// watermark_when_idle). 0 to 10000.
  std::int32_t headroom_permille = 100;
  preemption_order victim = preemption_order::newest_first;
  /// A waiting request gains one priority level per `aging_steps` steps it waits (0 = no aging): the linear
  /// priority_aging policy (aging()), whose wait_bound() bounds the longest wait. Priority plus aging saturates at
  /// INT32_MAX.
  std::int32_t aging_steps = 0;
  /// Chunked prefill (vLLM v1's default): a prompt longer than the step's remaining token budget is computed over
  /// several steps. Off: a prompt is computed in one step, and one longer than max_num_batched_tokens is NEVER.
  bool chunked_prefill = true;
  preemption_mode preemption = preemption_mode::cache_policy;
  admission_order order = admission_order::priority;
  /// Priority preemption (the seed's 3.3.3, vLLM V0's _schedule_priority_preemption): at the start of a step, a
  /// waiting request at the head of the (priority-ordered) queue that cannot be admitted now, for lack of blocks
  /// or of a running slot, preempts running requests whose (aged) priority is strictly below its own priority,
  /// lowest first and newest among equals, by the configured mode, until it fits; it is then admitted in that step.
  /// With it on, a request keeps the priority it gained waiting when it is admitted (aging is not reset), and a
  /// swapped-out request ages as a waiting one does: a request
  /// that aged above every priority that arrives can no longer be displaced (so priority_aging's bound still ends
  /// its wait), and no two requests can displace each other in turn. Needs admission_order::priority. Off by
  /// default.
  bool priority_preemption = false;
  /// A request that can never run is rejected by add_request (admission::never), and a queued request that can no
  /// longer be computed (more blocks than the cache has, a recompute longer than the budget without chunked
  /// prefill) is finished with finish_reason::too_long. Off (vLLM): every request is queued; one that cannot fit
  /// stays at the head of the waiting queue, failing admission in every step (scheduler_stats::admit_fail or
  /// admit_budget_stop), and one that outgrows the cache preempts itself. finish_reason::length_cap
  /// (max_blocks_per_seq) applies either way.
  bool reject_impossible = true;
  /// Keep the watermark even when nothing runs (vLLM V0's can_allocate). Off: a request that fits at all is let
  /// in when the running queue is empty.
  bool watermark_when_idle = false;
  /// Copy each step's slot mapping into step_output::slot_mapping. Off: an engine that exports it from the cache
  /// itself (cache.export_slot_mapping), or a replay that needs none, saves the copy.
  bool export_slot_mapping = true;
  /// Fill what a model runner consumes into the step_output: the step's input_ids, positions, query_start_loc, and
  /// the decode and prefill groups' page tables (dense and CSR, step_tables). Off: a replay that runs no model
  /// saves the export (one lookup per scheduled sequence).
  bool export_tables = true;
  /// Dynamic max batch size (batch_size_tuner): off by default. When on, the running requests are capped at the
  /// tuner's limit as well as max_num_seqs; the scheduler feeds it each step's KV utilization and preemptions.
  batch_size_tuning batch_tuning{};
  /// The cost model of preemption_mode::adaptive (adaptive_preemption); unused by the other modes.
  swap_cost_model swap_cost{};
  /// Feed every request that finishes (its prompt and sampled lengths) to a block_size_advisor
  /// (scheduler::tuning().block_sizes()): which block size would have wasted least. Off: nothing observed.
  bool advise_block_size = false;
  block_size_advisor_config block_size_advice{};  ///< the advisor's tolerance, metadata bytes and decay

  /// The aging policy aging_steps configures.
  [[nodiscard]] constexpr priority_aging aging() const noexcept { return priority_aging{aging_steps}; }

  /// errc::invalid_argument with the first bad field's message: aging_steps < 0, headroom_permille outside
  /// [0, 10000], batch_tuning (when enabled) failing batch_size_tuning::validate, swap_cost (with
  /// preemption_mode::adaptive) failing swap_cost_model::validate, priority_preemption with FCFS admission. The other fields are never invalid: their
  /// out-of-range values have a documented meaning (max_num_seqs < 1 runs nothing, the watermark is clamped).
  [[nodiscard]] status validate() const noexcept {
    if (const status st = aging().validate(); !st) return st;
    if (headroom_permille < 0 || headroom_permille > 10000)
      return status{errc::invalid_argument, "scheduler_config: headroom_permille must be in [0, 10000]",
                    headroom_permille};
    if (batch_tuning.enabled) {
      if (const status st = batch_tuning.validate(); !st) return st;
    }
    if (preemption == preemption_mode::adaptive) {
      if (const status st = swap_cost.validate(); !st) return st;
    }
    if (priority_preemption && order != admission_order::priority)
      return status{errc::invalid_argument, "scheduler_config: priority_preemption needs admission_order::priority"};
    return ok_status();
  }

  /// vLLM v1's step as docs/KVTRACE.md specifies it ("One run step"): FCFS admission, no chunked prefill (a
  /// prompt is computed whole, or admission stops), the newest running request is the victim, preemption by
  /// recompute, no watermark, no aging, and nothing rejected up front (a request that cannot fit fails admission
  /// in every step, as vLLM's allocate_slots does). kvpager-replay runs it and matches vLLM count for count.
  [[nodiscard]] static constexpr scheduler_config vllm_v1() noexcept {
    scheduler_config c;
    c.watermark_permille = 0;
    c.victim = preemption_order::newest_first;
    c.aging_steps = 0;
    c.chunked_prefill = false;
    c.preemption = preemption_mode::recompute;
    c.order = admission_order::fcfs;
    c.reject_impossible = false;
    c.watermark_when_idle = true;
    return c;
  }
};

KVPAGER_NAMESPACE_END
