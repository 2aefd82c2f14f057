// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// admission_limits: the scheduler's admission arithmetic, apart from its queues. From the cache's fixed figures
/// (usable blocks, block size, max_blocks_per_seq) and a scheduler_config: the blocks the watermark keeps free, the
/// limits past which a request can never be computed, and the OK / LATER / NEVER answer for a prompt. Blocks kept
/// free follow scheduler_config::admit_rule: vLLM's watermark (a share of the pool) or the seed's headroom (a share
/// of the request). No state
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
  std::int32_t block_size = default_block_size;  ///< tokens per block
  std::int32_t max_blocks_per_seq = 0;   ///< the cache's length cap in blocks per block table (0: none)
  std::int32_t num_groups = 1;           ///< block tables per sequence (the KV cache groups of a hybrid cache)

  /// Blocks `num_tokens` tokens occupy (without prefix hits): a table's worth in every group (an admission takes
  /// the whole prompt in every group).
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept {
    return blocks_for_tokens(num_tokens, block_size) * num_groups;
  }

  /// Blocks the watermark keeps free: watermark_permille of the usable blocks (clamped to 0-1000 permille).
  [[nodiscard]] std::int64_t watermark_blocks(const scheduler_config& cfg) const noexcept {
    const std::int64_t permille = std::clamp<std::int64_t>(cfg.watermark_permille, 0, 1000);
    return usable_blocks * permille / 1000;
  }

  /// Blocks the seed's rule keeps free beside a request of `need` blocks: ceil(need x headroom_permille / 1000)
  /// (so free >= need x 1.1 at 100 permille; clamped to 0-10000 permille).
  [[nodiscard]] static std::int64_t headroom_blocks(const scheduler_config& cfg, std::int64_t need) noexcept {
    const std::int64_t permille = std::clamp<std::int64_t>(cfg.headroom_permille, 0, 10000);
    return need <= 0 ? 0 : (need * permille + 999) / 1000;
  }

  /// Blocks an admission or swap-in of `need` blocks must leave free by the configured rule (the watermark, or the
  /// request's headroom), unless nothing runs (`idle`) and watermark_when_idle is off (then a request is let in if
  /// it fits at all: nothing else could ever free blocks).
  [[nodiscard]] std::int64_t blocks_to_keep(const scheduler_config& cfg, bool idle, std::int64_t need) const noexcept {
    if (idle && !cfg.watermark_when_idle) return 0;
    return cfg.admit_rule == admission_rule::request_headroom ? headroom_blocks(cfg, need) : watermark_blocks(cfg);
  }

  /// Whether blocks_to_keep can be positive for some request: the admission must know its need to decide.
  [[nodiscard]] bool keeps_blocks(const scheduler_config& cfg, bool idle) const noexcept {
    if (idle && !cfg.watermark_when_idle) return false;
    return cfg.admit_rule == admission_rule::request_headroom ? cfg.headroom_permille > 0 : watermark_blocks(cfg) > 0;
  }

  /// Why a request of `n` tokens can never be computed (again), whatever else runs; none if it can. `whole`: its
  /// uncached tokens must fit one step (a (re-)admission with chunked prefill off). Without reject_impossible,
  /// only the length cap and the 2^31-1 token limit count.
  [[nodiscard]] std::optional<finish_reason> limit_reached(const scheduler_config& cfg, std::int64_t n,
                                                           bool whole) const noexcept {
    if (n > INT32_MAX) return finish_reason::too_long;
    const std::int64_t need = blocks_needed(n);
    if (max_blocks_per_seq > 0 && blocks_for_tokens(n, block_size) > max_blocks_per_seq)
      return finish_reason::length_cap;
    if (!cfg.reject_impossible) return std::nullopt;
    if (need > usable_blocks) return finish_reason::too_long;
    if (whole && !cfg.chunked_prefill && n > cfg.max_num_batched_tokens) return finish_reason::too_long;
    return std::nullopt;
  }

  /// The answer for a prompt of `num_tokens` tokens (without prefix hits) when `available` blocks are free or
  /// evictable: never if it can never run (see limit_reached, a configuration that runs nothing, or more blocks
  /// than the usable ones less what the admission rule keeps), ok if it fits now with the rule's blocks kept
  /// (the watermark, or the request's headroom), later otherwise.
  [[nodiscard]] admission check(const scheduler_config& cfg, std::int64_t num_tokens,
                                std::int64_t available) const noexcept {
    if (num_tokens < 1 || cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1 ||
        limit_reached(cfg, num_tokens, true))
      return admission::never;
    const std::int64_t need = blocks_needed(num_tokens);
    const std::int64_t keep = blocks_to_keep(cfg, false, need);
    if (need + keep > usable_blocks) return admission::never;
    return available - need >= keep ? admission::ok : admission::later;
  }
};

KVPAGER_NAMESPACE_END
