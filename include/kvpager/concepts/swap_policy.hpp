// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The swap_policy concept: the decision taken for a sequence preempted under memory pressure, swap it to host
/// memory or drop its blocks for recompute. The policy only decides: the host (CPU) block pool swapped-out
/// blocks go to is the cache's own (a block_pool<lifo_allocator> of cache_config::num_host_blocks blocks, kept by
/// its swap_book), so a policy is a small, usually stateless type.
///
/// | expression                | result           | noexcept | complexity | semantics                                 |
/// |---------------------------|------------------|----------|------------|-------------------------------------------|
/// | `W{}`                     | `W`              | -        | O(1)       |                                           |
/// | `cw.action(n, host_free)` | `preempt_action` | yes      | O(1)       | what to do with a victim holding `n` device blocks when `host_free` host blocks are free now (0 without a host pool) |
///
/// preempt_action::swap with too few free host blocks makes paged_kv_cache::preempt fail with
/// errc::host_pool_full (nothing changed); the scheduler then preempts by recompute.
///
/// Changed in 0.2.0: the host pool left the concept (`reset`, `host_capacity`, `host_free`, `allocate_host`,
/// `release_host` are gone) and `action` receives the free host blocks.

#include <concepts>
#include <cstdint>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// How a preempted sequence gives back its device blocks.
enum class preempt_action {
  unsupported,  ///< the composition does not preempt
  recompute,    ///< drop the blocks; the sequence's tokens are computed again when it resumes
  swap,         ///< copy the blocks to host memory and bring them back later
};

template <class W>
concept swap_policy = detail::default_value<W> && detail::movable_value<W> &&
                      requires(const W& cw, std::int32_t n, std::int32_t host_free) {
                        { cw.action(n, host_free) } noexcept -> std::same_as<preempt_action>;
                      };

/// The smallest swap policy: declarations only, for concept tests and as a template to copy.
struct swap_policy_archetype {
  [[nodiscard]] preempt_action action(std::int32_t num_blocks, std::int32_t host_free) const noexcept;
};

KVPAGER_NAMESPACE_END
