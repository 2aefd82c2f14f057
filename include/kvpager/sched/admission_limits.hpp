// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// admission_limits: the scheduler's admission arithmetic, apart from its queues. From the cache's fixed figures
/// (usable blocks, block size, max_blocks_per_seq) and a scheduler_config: the blocks the watermark keeps free, the
/// limits past which a request can never be computed, and the OK / LATER / NEVER answer for a prompt. No state
/// besides those figures; every member is O(1) and noexcept.

#include <algorithm>
#include <cstdint>
#include <optional>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sched/scheduler_config.hpp"
#include "kvpager/sched/step_output.hpp"

KVPAGER_NAMESPACE_BEGIN

struct admission_limits {
  std::int64_t usable_blocks = 0;        ///< the cache's usable blocks (cache_stats::total)
  std::int32_t block_size = 16;          ///< tokens per block
  std::int32_t max_blocks_per_seq = 0;   ///< the cache's length cap in blocks (0: none)

  /// Blocks `num_tokens` tokens occupy (without prefix hits).
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept {
    return blocks_for_tokens(num_tokens, block_size);
  }

  /// Blocks the watermark keeps free: watermark_permille of the usable blocks (clamped to 0-1000 permille).
  [[nodiscard]] std::int64_t watermark_blocks(const scheduler_config& cfg) const noexcept {
    const std::int64_t permille = std::clamp<std::int64_t>(cfg.watermark_permille, 0, 1000);
    return usable_blocks * permille / 1000;
  }

  /// Blocks to keep free for an admission or swap-in: the watermark, unless nothing runs (`idle`) and
  /// watermark_when_idle is off (then a request is let in if it fits at all: nothing else could ever free blocks).
  [[nodiscard]] std::int64_t blocks_to_keep(const scheduler_config& cfg, bool idle) const noexcept {
    return idle && !cfg.watermark_when_idle ? 0 : watermark_blocks(cfg);
  }

  /// Why a request of `n` tokens can never be computed (again), whatever else runs; none if it can. `whole`: its
  /// uncached tokens must fit one step (a (re-)admission with chunked prefill off). Without reject_impossible,
  /// only the length cap and the 2^31-1 token limit count.
  [[nodiscard]] std::optional<finish_reason> limit_reached(const scheduler_config& cfg, std::int64_t n,
                                                           bool whole) const noexcept {
    if (n > INT32_MAX) return finish_reason::too_long;
    const std::int64_t need = blocks_needed(n);
    if (max_blocks_per_seq > 0 && need > max_blocks_per_seq) return finish_reason::length_cap;
    if (!cfg.reject_impossible) return std::nullopt;
    if (need > usable_blocks) return finish_reason::too_long;
    if (whole && !cfg.chunked_prefill && n > cfg.max_num_batched_tokens) return finish_reason::too_long;
    return std::nullopt;
  }

  /// The answer for a prompt of `num_tokens` tokens (without prefix hits) when `available` blocks are free or
  /// evictable: never if it can never run (see limit_reached, a configuration that runs nothing, or more blocks
  /// than the usable ones less the watermark), ok if it fits now with the watermark kept, later otherwise.
  [[nodiscard]] admission check(const scheduler_config& cfg, std::int64_t num_tokens,
                                std::int64_t available) const noexcept {
    if (num_tokens < 1 || cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1 ||
        limit_reached(cfg, num_tokens, true))
      return admission::never;
    const std::int64_t need = blocks_needed(num_tokens);
    if (need + watermark_blocks(cfg) > usable_blocks) return admission::never;
    return available - need >= watermark_blocks(cfg) ? admission::ok : admission::later;
  }
};

KVPAGER_NAMESPACE_END
