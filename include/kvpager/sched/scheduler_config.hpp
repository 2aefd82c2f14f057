// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The scheduler's run-time configuration: the policy enums, scheduler_config, and the named presets that reproduce
/// an engine's step (scheduler_config::vllm_v1()). Engines start from a preset and change one knob at a time.

#include <cstdint>

#include "kvpager/core/config.hpp"

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
  preemption_order victim = preemption_order::newest_first;
  /// A waiting request gains one priority level per `aging_steps` steps it waits (0 = no aging). Priority plus
  /// aging saturates at INT32_MAX.
  std::int32_t aging_steps = 0;
  /// Chunked prefill (vLLM v1's default): a prompt longer than the step's remaining token budget is computed over
  /// several steps. Off: a prompt is computed in one step, and one longer than max_num_batched_tokens is NEVER.
  bool chunked_prefill = true;
  preemption_mode preemption = preemption_mode::cache_policy;
  admission_order order = admission_order::priority;
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
