#pragma once
/// \file
/// The swap_policy concept: what happens to a sequence preempted under memory pressure, and the host (CPU) block
/// pool that swapped-out blocks go to.
///
/// | expression             | result              | noexcept | complexity | semantics                                     |
/// |------------------------|---------------------|----------|------------|-----------------------------------------------|
/// | `W{}`                  | `W`                 | -        | O(1)       |                                               |
/// | `w.reset(g)`           | `void`              | no       | O(capacity)| empty host pool, for device pool geometry `g`; may allocate |
/// | `cw.action(n)`         | `preempt_action`    | yes      | O(1)       | what to do with a victim holding `n` device blocks now |
/// | `cw.host_capacity()`   | `std::int32_t`      | yes      | O(1)       | host blocks in all                            |
/// | `cw.host_free()`       | `std::int32_t`      | yes      | O(1)       | host blocks free now                          |
/// | `w.allocate_host(out)` | `bool`              | yes      | O(out.size()) | fills `out` with host blocks, all or nothing (false: too few, nothing taken) |
/// | `w.release_host(b)`    | `void`              | yes      | O(1)       | returns host block `b`                        |
///
/// `out` is a `std::span<block_id>`. The cache plans (device, host) copies; it never moves bytes.

#include <concepts>
#include <cstdint>
#include <span>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// How a preempted sequence gives back its device blocks.
enum class preempt_action {
  unsupported,  ///< the composition does not preempt
  recompute,    ///< drop the blocks; the sequence's tokens are computed again when it resumes
  swap,         ///< copy the blocks to host memory and bring them back later
};

template <class W>
concept swap_policy = std::default_initializable<W> && std::movable<W> &&
                      requires(W& w, const W& cw, const pool_geometry& g, std::int32_t n, block_id b,
                               std::span<block_id> out) {
                        { w.reset(g) } -> std::same_as<void>;
                        { cw.action(n) } noexcept -> std::same_as<preempt_action>;
                        { cw.host_capacity() } noexcept -> std::same_as<std::int32_t>;
                        { cw.host_free() } noexcept -> std::same_as<std::int32_t>;
                        { w.allocate_host(out) } noexcept -> std::same_as<bool>;
                        { w.release_host(b) } noexcept -> std::same_as<void>;
                      };

/// The smallest swap policy: declarations only, for concept tests and as a template to copy.
struct swap_policy_archetype {
  void reset(const pool_geometry& g);
  [[nodiscard]] preempt_action action(std::int32_t n) const noexcept;
  [[nodiscard]] std::int32_t host_capacity() const noexcept;
  [[nodiscard]] std::int32_t host_free() const noexcept;
  bool allocate_host(std::span<block_id> out) noexcept;
  void release_host(block_id b) noexcept;
};

KVPAGER_NAMESPACE_END
